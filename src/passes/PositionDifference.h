// Expressions that depend on the query and key positions only through their difference: e is
// such a function when
//
//     e(b, h, q_idx, kv_idx) == e(b, h, q_idx - kv_idx, 0)   for every q_idx, kv_idx
//
// (everything else, b, h, params, buffers, held fixed). Along each diagonal of a score tile
// (q_idx - kv_idx constant) it then takes one value, whatever it computes from the difference:
// a relative-position bias read at ±(q_idx - kv_idx) + offset, or at T5's bucket of it (abs,
// log, floor, min, select). The sm_90a kernels load such a site once per diagonal and sum its
// buffer gradient per diagonal (docs/kernels/forward_sm90.md, backward_sm90.md).
//
// The rules are syntactic (a sufficient condition, not a decision procedure):
//   - an expression that reads neither q_idx nor kv_idx: yes;
//   - an i32 linear form a * q_idx + c * kv_idx + r with a == -c (passes::qkv_linear_form): yes;
//   - a bare q_idx or kv_idx otherwise: no;
//   - anything else: yes iff every operand is (a pure function of functions of the difference).
// Exactness: the identity holds exactly, i32 wrap-around included. A linear form with a == -c
// is a * (q_idx - kv_idx) + r mod 2^32, and q_idx - kv_idx wraps the same way in the kernels
// (d = q_idx - kv_idx is formed in wrapping i32 arithmetic, then e is evaluated at (d, 0)); every
// other operator is a pure function of its operands (loads included: buffers do not change
// during a kernel), so equal operands give equal results, NaN and saturating casts included.
#pragma once

#include "ir/IR.h"

namespace flexjit::passes {

// Whether `e` (of any type) depends on q_idx and kv_idx only through q_idx - kv_idx (the rules
// above). True for an expression that reads neither.
bool depends_only_on_position_difference(const Expr& e);

}  // namespace flexjit::passes
