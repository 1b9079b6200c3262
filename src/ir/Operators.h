// Typed construction of IR: the rules of the language's type system, shared by both front ends
// (the C++ operators in src/dsl/Dsl.cpp and the text parser).
//
// Each function promotes i32 to f32 where the language allows it (inserting Cast nodes) and
// throws CompileError naming the offending sub-expression where it does not. The error carries
// no source location; the text parser adds one.
#pragma once

#include "ir/IR.h"

#include <vector>

namespace flexjit::ir {

Expr build_unary(Op op, Expr a);            // Neg Not Abs and the math functions
Expr build_binary(Op op, Expr a, Expr b);   // arithmetic, comparisons, And, Or, Min, Max, Pow
Expr build_select(Expr c, Expr a, Expr b);  // where(c, a, b)
Expr build_cast(ScalarType to, Expr a);     // float(x), int(x); a no-op when already `to`
Expr build_load(const std::shared_ptr<const BufferDecl>& buf, std::vector<Expr> indices);

// "`q_idx - kv_idx` (i32)": how diagnostics name a sub-expression (text cut at ~60 chars).
std::string describe(const Expr& e);

}  // namespace flexjit::ir
