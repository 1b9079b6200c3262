#include "cp/GlobalPositions.h"

#include <flexjit/error.h>

#include "ir/IR.h"
#include "ir/Visitor.h"

#include <fmt/format.h>

#include <string>
#include <unordered_map>

namespace flexjit::cp {

namespace {

void refuse_reserved(const Mods& mods) {
  for (std::string_view reserved : {kQOffsetParam, kKvOffsetParam}) {
    for (const Param& p : mods.params) {
      if (p.name() == reserved) {
        throw CompileError(fmt::format(
            "the mods '{}' declare a parameter '{}'; context parallelism reserves the names {} "
            "and {} for the shard offsets (docs/context_parallel.md): rename it",
            mods.name, reserved, kQOffsetParam, kKvOffsetParam));
      }
    }
    for (const Buffer& b : mods.buffers) {
      if (b.name() == reserved) {
        throw CompileError(fmt::format(
            "the mods '{}' declare a buffer '{}'; context parallelism reserves the names {} and "
            "{} for the shard offsets (docs/context_parallel.md): rename it",
            mods.name, reserved, kQOffsetParam, kKvOffsetParam));
      }
    }
  }
}

// Appends the params of `e` that `params` does not have yet, in order of first use.
void add_params(const Expr& e, std::vector<Param>& params) {
  if (!e.defined()) return;
  ir::for_each_node(e, [&](const Expr& n) {
    if (n->op != ir::Op::Param) return;
    for (const Param& p : params)
      if (p.name() == n->param->name) return;
    params.emplace_back(n->param);
  });
}

}  // namespace

Mods with_global_positions(const Mods& mods) {
  refuse_reserved(mods);
  const Param q_off(std::string(kQOffsetParam), ScalarType::I32, 0.0);
  const Param kv_off(std::string(kKvOffsetParam), ScalarType::I32, 0.0);
  const std::unordered_map<ir::VarKind, Expr> shift = {
      {ir::VarKind::QIdx, ir::make_binary(ir::Op::Add, ir::make_var(ir::VarKind::QIdx), q_off)},
      {ir::VarKind::KvIdx, ir::make_binary(ir::Op::Add, ir::make_var(ir::VarKind::KvIdx), kv_off)},
  };
  Mods out = mods;
  auto rewrite = [&](const Expr& e) { return e.defined() ? ir::substitute_vars(e, shift) : e; };
  out.score_mod = rewrite(mods.score_mod);
  out.mask_mod = rewrite(mods.mask_mod);
  out.sink_mod = rewrite(mods.sink_mod);
  // The user's params keep their order; the offsets follow, each where some mod reads it.
  out.params = mods.params;
  add_params(out.score_mod, out.params);
  add_params(out.mask_mod, out.params);
  add_params(out.sink_mod, out.params);
  out.check();
  return out;
}

ModBindings with_offsets(const ModBindings& bindings, const Mods& shifted, int64_t q_offset,
                         int64_t kv_offset) {
  ModBindings out = bindings;
  for (const Param& p : shifted.params) {
    if (p.name() == kQOffsetParam) {
      out.params.emplace_back(p.name(), static_cast<double>(q_offset));
    } else if (p.name() == kKvOffsetParam) {
      out.params.emplace_back(p.name(), static_cast<double>(kv_offset));
    }
  }
  return out;
}

}  // namespace flexjit::cp
