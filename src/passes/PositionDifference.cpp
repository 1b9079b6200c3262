#include "passes/PositionDifference.h"

#include "passes/LinearForm.h"

namespace flexjit::passes {

bool depends_only_on_position_difference(const Expr& e) {
  if (!e.defined() || !reads_positions(e)) return true;
  if (const auto f = qkv_linear_form(e); f && f->q == -f->kv) return true;
  const ir::Node& n = *e.get();
  if (n.op == ir::Op::Var) return false;  // a bare q_idx or kv_idx
  for (const Expr& a : n.args)
    if (!depends_only_on_position_difference(a)) return false;
  return true;
}

}  // namespace flexjit::passes
