// Internal to passes/Simplify: the rewrite rules, one node at a time.
#pragma once

#include "ir/IR.h"

namespace flexjit::passes::simplify_rules {

// One rewrite step at the root of `e`, whose args are already simplified: returns a simpler
// equivalent expression, or `e` itself when no rule applies. The driver re-simplifies the
// result, so a rule may return nodes that other rules simplify further.
Expr rewrite(const Expr& e);

}  // namespace flexjit::passes::simplify_rules
