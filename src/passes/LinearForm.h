// Linear forms in the query and key positions: whether an i32 expression is
//
//     a * q_idx + c * kv_idx + r
//
// with constant a and c and a rest r that reads neither q_idx nor kv_idx (b, h, params,
// constants, loads at such indices). passes::depends_only_on_position_difference
// (PositionDifference.h) builds on it to find the diagonal sites of the sm_90a kernels (a
// relative-position bias read at q_idx - kv_idx + offset, or at a function of that).
//
// The rules are syntactic, over + - (binary and unary) and * by an integer constant; anything
// else that reads q_idx or kv_idx (min, max, select, division, casts from f32, loads) is not a
// linear form. i32 arithmetic wraps, and the identity holds in wrapping arithmetic too: the
// value at (q, kv) is the value at (q0, kv0) plus a * (q - q0) + c * (kv - kv0), mod 2^32.
#pragma once

#include "ir/IR.h"

#include <cstdint>
#include <optional>

namespace flexjit::passes {

struct QkvCoefficients {
  int64_t q = 0;   // a: the coefficient of q_idx
  int64_t kv = 0;  // c: the coefficient of kv_idx
};

// The coefficients when `e` (i32) is a linear form in q_idx and kv_idx; nullopt otherwise.
// Coefficients that leave [-2^31, 2^31) give nullopt.
std::optional<QkvCoefficients> qkv_linear_form(const Expr& e);

// Whether `e` reads q_idx or kv_idx.
bool reads_positions(const Expr& e);

}  // namespace flexjit::passes
