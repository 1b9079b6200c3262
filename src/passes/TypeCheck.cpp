#include "passes/TypeCheck.h"

#include "ir/Operators.h"
#include "ir/Visitor.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <set>
#include <unordered_set>

namespace flexjit::passes {

namespace {

using ir::Op;

// Whether the printer can print `e`: it dereferences payloads and args without checking.
bool printable(const Expr& e) {
  bool ok = true;
  ir::for_each_node(e, [&](const Expr& n) {
    for (const auto& a : n->args)
      ok = ok && a.defined();
    if (n->op == Op::Load)
      ok = ok && n->buffer && n->buffer->rank() == static_cast<int>(n->args.size());
    else
      ok = ok && static_cast<int>(n->args.size()) == ir::op_arity(n->op);
    if (n->op == Op::Param) ok = ok && n->param != nullptr;
  });
  return ok;
}

// describe() prints the node; a node broken badly enough (a null payload) cannot be printed.
std::string name_of(const Expr& e) {
  if (!printable(e)) return fmt::format("a {} node", ir::op_name(e->op));
  try {
    return ir::describe(e);
  } catch (const InternalError&) {
    return fmt::format("a {} node", ir::op_name(e->op));
  }
}

[[noreturn]] void broken(const Expr& e, const std::string& what) {
  throw InternalError(
      fmt::format("type check: {} in {}. This is a bug in flexjit.", what, name_of(e)));
}

std::string_view tname(ScalarType t) {
  return to_string(t);
}

// The same node rebuilt through make_*, whose structural hash must match the cached one.
Expr rebuild(const Expr& e) {
  const ir::Node& n = *e.get();
  switch (n.op) {
    case Op::IntImm:
      return ir::make_int(n.ival);
    case Op::FloatImm:
      return ir::make_float(n.fval);
    case Op::BoolImm:
      return ir::make_bool(n.ival != 0);
    case Op::Var:
      return ir::make_var(n.var);
    case Op::Param:
      return ir::make_param(n.param);
    case Op::Load:
      return ir::make_load(n.buffer, n.args);
    case Op::Cast:
      return ir::make_cast(n.type, n.args[0]);
    case Op::Select:
      return ir::make_select(n.args[0], n.args[1], n.args[2]);
    default:
      break;
  }
  if (ir::is_unary(n.op)) return ir::make_unary(n.op, n.args[0]);
  return ir::make_binary(n.op, n.args[0], n.args[1]);
}

void verify_node(const Expr& e) {
  const ir::Node& n = *e.get();
  for (const auto& a : n.args) {
    if (!a.defined()) broken(e, "an undefined argument");
  }
  int arity = ir::op_arity(n.op);
  if (n.op == Op::Load) {
    if (!n.buffer) broken(e, "a Load without a buffer declaration");
    arity = n.buffer->rank();
  }
  if (static_cast<int>(n.args.size()) != arity) {
    broken(e, fmt::format("{} with {} arguments (expected {})", ir::op_name(n.op), n.args.size(),
                          arity));
  }
  auto arg_type = [&](size_t i) { return n.args[i].type(); };
  switch (n.op) {
    case Op::IntImm:
      if (n.type != ScalarType::I32) broken(e, "an IntImm that is not i32");
      if (n.ival < std::numeric_limits<int32_t>::min() ||
          n.ival > std::numeric_limits<int32_t>::max()) {
        broken(e, fmt::format("an IntImm out of the i32 range ({})", n.ival));
      }
      break;
    case Op::FloatImm:
      if (n.type != ScalarType::F32) broken(e, "a FloatImm that is not f32");
      if (!std::isnan(n.fval) && static_cast<double>(static_cast<float>(n.fval)) != n.fval) {
        broken(e, fmt::format("a FloatImm not representable as f32 ({})", n.fval));
      }
      break;
    case Op::BoolImm:
      if (n.type != ScalarType::Bool || (n.ival != 0 && n.ival != 1)) broken(e, "a bad BoolImm");
      break;
    case Op::Var:
      if (n.type != ir::var_type(n.var)) {
        broken(e, fmt::format("leaf {} typed {}", ir::to_string(n.var), tname(n.type)));
      }
      break;
    case Op::Param:
      if (!n.param) broken(e, "a Param without a declaration");
      if (n.type != n.param->type) {
        broken(e, fmt::format("param '{}' declared {} but typed {}", n.param->name,
                              tname(n.param->type), tname(n.type)));
      }
      break;
    case Op::Load:
      if (arity < 1 || arity > 4) broken(e, fmt::format("a buffer of rank {}", arity));
      for (size_t i = 0; i < n.args.size(); ++i) {
        if (arg_type(i) != ScalarType::I32) {
          broken(e,
                 fmt::format("index {} of '{}' typed {}", i, n.buffer->name, tname(arg_type(i))));
        }
      }
      if (n.type != load_type(n.buffer->dtype)) {
        broken(e, fmt::format("a load from {} buffer '{}' typed {}", to_string(n.buffer->dtype),
                              n.buffer->name, tname(n.type)));
      }
      break;
    case Op::Cast:
      if (n.type == ScalarType::Bool) broken(e, "a cast to bool");
      if (arg_type(0) == n.type) broken(e, fmt::format("a cast from {} to itself", tname(n.type)));
      break;
    case Op::Select:
      if (arg_type(0) != ScalarType::Bool) broken(e, "a select with a non-bool condition");
      if (arg_type(1) != arg_type(2) || arg_type(1) != n.type) {
        broken(e, fmt::format("a select of {} with branches {} and {}", tname(n.type),
                              tname(arg_type(1)), tname(arg_type(2))));
      }
      break;
    default:
      if (ir::is_unary(n.op)) {
        ScalarType t = arg_type(0);
        bool ok = n.type == t && (n.op == Op::Not                      ? t == ScalarType::Bool
                                  : n.op == Op::Neg || n.op == Op::Abs ? t != ScalarType::Bool
                                                                       : t == ScalarType::F32);
        if (!ok) {
          broken(e, fmt::format("{} of {} typed {}", ir::op_name(n.op), tname(t), tname(n.type)));
        }
        break;
      }
      FJ_ASSERT(ir::is_binary(n.op), "type check: unknown node kind");
      ScalarType a = arg_type(0), b = arg_type(1);
      if (a != b) {
        broken(e, fmt::format("{} of mismatched types {} and {}", ir::op_name(n.op), tname(a),
                              tname(b)));
      }
      ScalarType want = a;
      bool ok;
      if (n.op == Op::And || n.op == Op::Or) {
        ok = a == ScalarType::Bool;
      } else if (ir::is_comparison(n.op)) {
        ok = a != ScalarType::Bool || n.op == Op::EQ || n.op == Op::NE;
        want = ScalarType::Bool;
      } else if (n.op == Op::Pow) {
        ok = a == ScalarType::F32;
      } else {
        ok = a != ScalarType::Bool;
      }
      if (!ok) broken(e, fmt::format("{} of {} operands", ir::op_name(n.op), tname(a)));
      if (n.type != want) {
        broken(e, fmt::format("{} typed {} (expected {})", ir::op_name(n.op), tname(n.type),
                              tname(want)));
      }
      break;
  }
  if (rebuild(e)->hash != n.hash) broken(e, "a stale structural hash");
}

bool is_leaf_name(const std::string& s) {
  return s == "score" || s == "b" || s == "h" || s == "q_idx" || s == "kv_idx";
}

void check_decls(const Mods& mods) {
  std::set<std::string> names;
  for (const Buffer& b : mods.buffers) {
    const ir::BufferDecl& d = *b.decl();
    if (is_leaf_name(d.name)) {
      throw CompileError(fmt::format("buffer '{}' has the name of a mod argument", d.name));
    }
    if (!names.insert(d.name).second) {
      throw CompileError(fmt::format("'{}' is declared more than once", d.name));
    }
    if (d.rank() < 1 || d.rank() > 4) {
      throw CompileError(
          fmt::format("buffer '{}' has {} dims; buffers have 1 to 4", d.name, d.rank()));
    }
    for (const auto& dim : d.dims) {
      if (dim.empty()) throw CompileError(fmt::format("buffer '{}' has an unnamed dim", d.name));
    }
  }
  for (const Param& p : mods.params) {
    const ir::ParamDecl& d = *p.decl();
    if (is_leaf_name(d.name)) {
      throw CompileError(fmt::format("param '{}' has the name of a mod argument", d.name));
    }
    if (!names.insert(d.name).second) {
      throw CompileError(fmt::format("'{}' is declared more than once", d.name));
    }
    if (!d.default_value) continue;
    double v = *d.default_value;
    if (d.type == ScalarType::I32 &&
        !(v == std::floor(v) && v >= std::numeric_limits<int32_t>::min() &&
          v <= std::numeric_limits<int32_t>::max())) {
      throw CompileError(fmt::format("param '{}' is i32 but its default {} is not", d.name, v));
    }
    if (d.type == ScalarType::Bool && v != 0.0 && v != 1.0) {
      throw CompileError(fmt::format("param '{}' is bool but its default is {}", d.name, v));
    }
  }
}

// Every buffer / param used by `e` is declared, with the same declaration.
void check_uses(const Mods& mods, const Expr& e, std::string_view which) {
  ir::for_each_node(e, [&](const Expr& n) {
    if (n->op == Op::Load) {
      for (const Buffer& b : mods.buffers) {
        if (b.name() != n->buffer->name) continue;
        if (ir::equal(*b.decl(), *n->buffer)) return;
        throw CompileError(
            fmt::format("{} loads buffer '{}' with a declaration that differs from "
                        "the one in the mods ({})",
                        which, n->buffer->name, name_of(n)));
      }
      throw CompileError(fmt::format("{} uses buffer '{}', which the mods do not declare ({})",
                                     which, n->buffer->name, name_of(n)));
    }
    if (n->op == Op::Param) {
      for (const Param& p : mods.params) {
        if (p.name() != n->param->name) continue;
        if (ir::equal(*p.decl(), *n->param)) return;
        throw CompileError(fmt::format("{} uses param '{}' as {}, but the mods declare it {}",
                                       which, n->param->name, tname(n->param->type),
                                       tname(p.type())));
      }
      throw CompileError(
          fmt::format("{} uses param '{}', which the mods do not declare", which, n->param->name));
    }
  });
}

}  // namespace

void verify(const Expr& e) {
  if (!e.defined()) return;
  // for_each_node (and the printer) assume defined args: check that first, without them.
  std::vector<const ir::Node*> stack{e.get()};
  std::unordered_set<const ir::Node*> seen{e.get()};
  while (!stack.empty()) {
    const ir::Node* n = stack.back();
    stack.pop_back();
    for (const auto& a : n->args) {
      if (!a.defined()) {
        throw InternalError(
            fmt::format("type check: a {} node with an undefined argument. This "
                        "is a bug in flexjit.",
                        ir::op_name(n->op)));
      }
      if (seen.insert(a.get()).second) stack.push_back(a.get());
    }
  }
  ir::for_each_node(e, verify_node);
}

void type_check(const Mods& mods) {
  verify(mods.score_mod);
  verify(mods.mask_mod);
  if (mods.score_mod.defined() && mods.score_mod.type() != ScalarType::F32) {
    throw CompileError(fmt::format("score_mod must return f32, but {} is {}",
                                   ir::describe(mods.score_mod), tname(mods.score_mod.type())));
  }
  if (mods.mask_mod.defined()) {
    if (mods.mask_mod.type() != ScalarType::Bool) {
      throw CompileError(
          fmt::format("mask_mod must return bool, but {} is {} (compare it, e.g. `... != 0`)",
                      ir::describe(mods.mask_mod), tname(mods.mask_mod.type())));
    }
    ir::for_each_node(mods.mask_mod, [&](const Expr& n) {
      if (n->op == Op::Var && n->var == ir::VarKind::Score) {
        throw CompileError(
            fmt::format("mask_mod cannot use `score` (it receives only b, h, "
                        "q_idx and kv_idx), but {} does",
                        ir::describe(mods.mask_mod)));
      }
    });
  }
  verify(mods.sink_mod);
  if (mods.sink_mod.defined()) {
    if (mods.sink_mod.type() != ScalarType::F32) {
      throw CompileError(fmt::format("sink_mod must return f32 (a logit), but {} is {}",
                                     ir::describe(mods.sink_mod), tname(mods.sink_mod.type())));
    }
    ir::for_each_node(mods.sink_mod, [&](const Expr& n) {
      if (n->op == Op::Var && (n->var == ir::VarKind::Score || n->var == ir::VarKind::KvIdx)) {
        throw CompileError(
            fmt::format("sink_mod cannot use `{}` (it receives only b, h and q_idx), but {} does",
                        ir::to_string(n->var), ir::describe(mods.sink_mod)));
      }
    });
  }
  check_decls(mods);
  check_uses(mods, mods.score_mod, "score_mod");
  check_uses(mods, mods.mask_mod, "mask_mod");
  check_uses(mods, mods.sink_mod, "sink_mod");
}

}  // namespace flexjit::passes
