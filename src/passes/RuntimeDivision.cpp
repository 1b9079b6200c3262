#include "passes/RuntimeDivision.h"

#include "ir/Visitor.h"

namespace flexjit::passes {

bool divides_by_runtime_value(const Expr& e) {
  if (!e.defined()) return false;
  bool found = false;
  ir::for_each_node(e, [&](const Expr& n) {
    found = found || ((n->op == ir::Op::Div || n->op == ir::Op::Mod) &&
                      n->type == ScalarType::I32 && n->args[1]->op != ir::Op::IntImm);
  });
  return found;
}

}  // namespace flexjit::passes
