// Mods: construction from C++ functions, checking, printing, hashing, combining.
// Parsing lives in src/dsl/Parser.cpp; the standard mods in src/dsl/StandardMods.cpp.
#include <flexjit/mods.h>

#include "ir/IR.h"
#include "ir/Operators.h"
#include "ir/Printer.h"
#include "ir/Visitor.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <unordered_set>

namespace flexjit {

namespace {

// Appends the buffers and params `e` uses, in order of first use, skipping known names.
void collect_decls(const Expr& e, std::vector<Buffer>& buffers, std::vector<Param>& params) {
  std::vector<Expr> nodes;
  ir::for_each_node(e, [&](const Expr& n) { nodes.push_back(n); });
  for (const Expr& n : nodes) {
    if (n->op == ir::Op::Load) {
      bool known = false;
      for (const auto& b : buffers) {
        if (b.name() != n->buffer->name) continue;
        if (!ir::equal(*b.decl(), *n->buffer)) {
          throw CompileError(
              fmt::format("buffer '{}' is declared twice with different types", b.name()));
        }
        known = true;
      }
      if (!known) buffers.emplace_back(n->buffer);
    } else if (n->op == ir::Op::Param) {
      bool known = false;
      for (const auto& p : params) {
        if (p.name() != n->param->name) continue;
        if (!ir::equal(*p.decl(), *n->param)) {
          throw CompileError(
              fmt::format("param '{}' is declared twice with different types", p.name()));
        }
        known = true;
      }
      if (!known) params.emplace_back(n->param);
    }
  }
}

bool uses_score(const Expr& e) {
  return ir::reads_var(e, ir::VarKind::Score);
}

std::string dims_text(const ir::BufferDecl& d) {
  std::string s;
  for (size_t i = 0; i < d.dims.size(); ++i)
    s += (i ? ", " : "") + d.dims[i];
  return s;
}

}  // namespace

Mods Mods::from(const ScoreModFn& score_fn, const MaskModFn& mask_fn, const SinkModFn& sink_fn) {
  Mods m;
  m.name = "<c++>";
  if (score_fn) m.score_mod = score_fn(score(), b_idx(), h_idx(), q_idx(), kv_idx());
  if (mask_fn) m.mask_mod = mask_fn(b_idx(), h_idx(), q_idx(), kv_idx());
  if (sink_fn) m.sink_mod = sink_fn(b_idx(), h_idx(), q_idx());
  collect_decls(m.score_mod, m.buffers, m.params);
  collect_decls(m.mask_mod, m.buffers, m.params);
  collect_decls(m.sink_mod, m.buffers, m.params);
  m.check();
  return m;
}

Mods Mods::with_sink_mod(const SinkModFn& sink_fn) const {
  Mods m = *this;
  m.sink_mod = sink_fn ? sink_fn(b_idx(), h_idx(), q_idx()) : Expr();
  collect_decls(m.sink_mod, m.buffers, m.params);
  m.check();
  return m;
}

Mods Mods::from_mask(const MaskModFn& mask_fn) {
  return from({}, mask_fn);
}

void Mods::check() const {
  if (score_mod.defined() && score_mod.type() != ScalarType::F32) {
    throw CompileError(fmt::format("score_mod must return f32, but {} is {}",
                                   ir::describe(score_mod), to_string(score_mod.type())));
  }
  if (mask_mod.defined() && mask_mod.type() != ScalarType::Bool) {
    throw CompileError(
        fmt::format("mask_mod must return bool, but {} is {} (compare it, e.g. `... != 0`)",
                    ir::describe(mask_mod), to_string(mask_mod.type())));
  }
  if (mask_mod.defined() && uses_score(mask_mod)) {
    throw CompileError("mask_mod cannot use `score`: it receives only b, h, q_idx and kv_idx");
  }
  if (sink_mod.defined()) {
    if (sink_mod.type() != ScalarType::F32) {
      throw CompileError(fmt::format("sink_mod must return f32 (a logit), but {} is {}{}",
                                     ir::describe(sink_mod), to_string(sink_mod.type()),
                                     sink_mod.type() == ScalarType::I32 ? " (use float(x))" : ""));
    }
    for (ir::VarKind v : {ir::VarKind::Score, ir::VarKind::KvIdx}) {
      if (ir::reads_var(sink_mod, v)) {
        throw CompileError(fmt::format(
            "sink_mod cannot use `{}`: it receives only b, h and q_idx (one sink per row)",
            ir::to_string(v)));
      }
    }
  }
  std::vector<Buffer> used_buffers = buffers;
  std::vector<Param> used_params = params;
  collect_decls(score_mod, used_buffers, used_params);
  collect_decls(mask_mod, used_buffers, used_params);
  collect_decls(sink_mod, used_buffers, used_params);
  if (used_buffers.size() != buffers.size() || used_params.size() != params.size()) {
    throw CompileError("the mods use a buffer or param that is not in Mods::buffers/params");
  }
}

std::string Mods::to_text() const {
  std::string out;
  for (const auto& p : params) {
    out += fmt::format("param {}: {}", p.name(), to_string(p.type()));
    if (p.decl()->default_value) {
      double v = *p.decl()->default_value;
      if (p.type() == ScalarType::F32)
        out += " = " + ir::float_literal(v);
      else if (p.type() == ScalarType::I32)
        out += fmt::format(" = {}", static_cast<int64_t>(v));
      else
        out += v != 0 ? " = true" : " = false";
    }
    out += '\n';
  }
  for (const auto& b : buffers) {
    out += fmt::format("buffer {}: {}[{}]\n", b.name(), to_string(b.dtype()), dims_text(*b.decl()));
  }
  if (score_mod.defined()) out += "score_mod = " + ir::to_text(score_mod) + "\n";
  if (mask_mod.defined()) out += "mask_mod = " + ir::to_text(mask_mod) + "\n";
  if (sink_mod.defined()) out += "sink_mod = " + ir::to_text(sink_mod) + "\n";
  return out;
}

uint64_t Mods::hash() const {
  uint64_t h[4] = {ir::hash(score_mod), ir::hash(mask_mod), 0, 0};
  for (const auto& b : buffers) {
    h[2] = XXH64(b.name().data(), b.name().size(), h[2] + 1);
    h[2] = XXH64(dims_text(*b.decl()).data(), dims_text(*b.decl()).size(),
                 h[2] + static_cast<uint64_t>(b.dtype()));
  }
  for (const auto& p : params) {
    h[3] = XXH64(p.name().data(), p.name().size(), h[3] + 1 + static_cast<uint64_t>(p.type()));
  }
  uint64_t out = XXH64(h, sizeof h, 0x666c65786a6974ull);
  // Without a sink_mod the hash is what it was before sink_mods existed (cached kernels stay).
  if (sink_mod.defined()) {
    const uint64_t s[2] = {out, ir::hash(sink_mod)};
    out = XXH64(s, sizeof s, 0x73696e6bull);
  }
  return out;
}

bool equal(const Mods& a, const Mods& b) {
  if (a.score_mod.defined() != b.score_mod.defined()) return false;
  if (a.mask_mod.defined() != b.mask_mod.defined()) return false;
  if (a.sink_mod.defined() != b.sink_mod.defined()) return false;
  if (a.sink_mod.defined() && !ir::equal(a.sink_mod, b.sink_mod)) return false;
  if (a.score_mod.defined() && !ir::equal(a.score_mod, b.score_mod)) return false;
  if (a.mask_mod.defined() && !ir::equal(a.mask_mod, b.mask_mod)) return false;
  if (a.buffers.size() != b.buffers.size() || a.params.size() != b.params.size()) return false;
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    if (!ir::equal(*a.buffers[i].decl(), *b.buffers[i].decl())) return false;
  }
  for (size_t i = 0; i < a.params.size(); ++i) {
    if (!ir::equal(*a.params[i].decl(), *b.params[i].decl())) return false;
  }
  return true;
}

Mods mask_only(const Mods& mods) {
  if (!mods.mask_mod.defined()) {
    throw CompileError(fmt::format("a block mask needs a mask_mod; mods '{}' have none",
                                   mods.name.empty() ? "<inline>" : mods.name));
  }
  std::unordered_set<const ir::BufferDecl*> buffers;
  std::unordered_set<const ir::ParamDecl*> params;
  ir::for_each_node(mods.mask_mod, [&](const Expr& e) {
    if (e->buffer) buffers.insert(e->buffer.get());
    if (e->param) params.insert(e->param.get());
  });
  Mods m;
  m.mask_mod = mods.mask_mod;
  m.name = mods.name;
  for (const Buffer& b : mods.buffers) {
    if (buffers.count(b.decl().get())) m.buffers.push_back(b);
  }
  for (const Param& p : mods.params) {
    if (params.count(p.decl().get())) m.params.push_back(p);
  }
  return m;
}

Mods combine(const Mods& a, const Mods& b) {
  if (a.score_mod.defined() && b.score_mod.defined()) {
    throw CompileError(
        fmt::format("cannot combine '{}' and '{}': both define a score_mod", a.name, b.name));
  }
  if (a.sink_mod.defined() && b.sink_mod.defined()) {
    throw CompileError(
        fmt::format("cannot combine '{}' and '{}': both define a sink_mod", a.name, b.name));
  }
  Mods m;
  m.name = a.name + "+" + b.name;
  m.score_mod = a.score_mod.defined() ? a.score_mod : b.score_mod;
  m.sink_mod = a.sink_mod.defined() ? a.sink_mod : b.sink_mod;
  if (a.mask_mod.defined() && b.mask_mod.defined()) {
    m.mask_mod = ir::build_binary(ir::Op::And, a.mask_mod, b.mask_mod);
  } else {
    m.mask_mod = a.mask_mod.defined() ? a.mask_mod : b.mask_mod;
  }
  m.buffers = a.buffers;
  m.params = a.params;
  for (const auto& buf : b.buffers) {
    bool known = false;
    for (const auto& x : m.buffers) {
      if (x.name() != buf.name()) continue;
      if (!ir::equal(*x.decl(), *buf.decl())) {
        throw CompileError(fmt::format("buffer '{}' is declared differently in '{}' and '{}'",
                                       buf.name(), a.name, b.name));
      }
      known = true;
    }
    if (!known) m.buffers.push_back(buf);
  }
  for (const auto& p : b.params) {
    bool known = false;
    for (const auto& x : m.params) {
      if (x.name() != p.name()) continue;
      if (!ir::equal(*x.decl(), *p.decl())) {
        throw CompileError(fmt::format("param '{}' is declared differently in '{}' and '{}'",
                                       p.name(), a.name, b.name));
      }
      known = true;
    }
    if (!known) m.params.push_back(p);
  }
  m.check();
  return m;
}

}  // namespace flexjit
