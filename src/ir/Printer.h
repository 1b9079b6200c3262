// Prints IR as DSL text that the parser reads back to an equal expression.
//
// Operators print infix with the fewest parentheses C precedence allows; Select prints as
// where(c, a, b); casts as float(x) / int(x); loads as name[i][j]; a negated literal as -(3) so
// that it does not re-parse as the literal -3; floats in their shortest round-trip form, always
// with a '.' or exponent (inf and nan as `inf`, `nan`).
#pragma once

#include "ir/IR.h"

#include <string>

namespace flexjit::ir {

std::string to_text(const Expr& e);
std::string float_literal(double v);  // "1.0", "0.1", "-2.5e-08", "inf", "-inf", "nan"

// C precedence of an operator node as the printer and parser use it (higher binds tighter):
// || 1, && 2, == != 3, < <= > >= 4, + - 5, * / % 6, prefix - ! 7, everything else 8.
int precedence(Op op);

}  // namespace flexjit::ir
