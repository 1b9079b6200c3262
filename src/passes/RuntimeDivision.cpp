#include "passes/RuntimeDivision.h"

#include "ir/Visitor.h"

namespace flexjit::passes {

bool divides_by_runtime_value(const Expr& e) {
  return ir::any_node(e, [](const Expr& n) {
    return (n->op == ir::Op::Div || n->op == ir::Op::Mod) && n->type == ScalarType::I32 &&
           n->args[1]->op != ir::Op::IntImm;
  });
}

}  // namespace flexjit::passes
