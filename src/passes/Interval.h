// Interval arithmetic over the mod language: a sound over-approximation of the values an
// expression takes when its leaves range over given bounds.
//
// i32 values are ranges [lo, hi] computed exactly in 64 bits; a result that could leave the i32
// range (and so wrap) becomes the full range. Floor division and modulo follow ir/Evaluate.h
// (x / 0 == 0, x % 0 == 0). f32 values are a numeric range (-0.0 == +0.0, as comparisons see
// them) plus a "may be NaN" flag; only operations whose float results are monotone in each
// operand are tracked (+ - * /, min/max, floor/ceil, casts), the rest give the full range. Bools
// are the set of possible values. Loads give their type's full range; Select joins its branches
// unless the condition is decided.
#pragma once

#include "ir/IR.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>

namespace flexjit::passes {

// Inclusive range of an i32 leaf.
struct IntRange {
  int32_t lo = std::numeric_limits<int32_t>::min();
  int32_t hi = std::numeric_limits<int32_t>::max();
};

// What is known of the leaves. Unset ranges are the full i32 range; `score` is unknown;
// parameters not in `params` are unknown (parameter values are runtime arguments: a default
// value is not a known value).
struct LeafBounds {
  IntRange b, h, q_idx, kv_idx;
  std::unordered_map<std::string, double> params;
};

struct Interval {
  ScalarType type = ScalarType::I32;
  int64_t lo = 0, hi = 0;                    // I32
  float flo = 0.0f, fhi = 0.0f;              // F32 numeric part (never NaN)
  bool nan = false;                          // F32: may be NaN
  bool can_false = false, can_true = false;  // Bool

  static Interval full(ScalarType t);
  static Interval int_range(int64_t lo, int64_t hi);          // full() if it leaves the i32 range
  static Interval float_range(float lo, float hi, bool nan);  // full() if lo or hi is NaN
  static Interval booleans(bool can_false, bool can_true);

  bool is_true() const { return type == ScalarType::Bool && can_true && !can_false; }
  bool is_false() const { return type == ScalarType::Bool && can_false && !can_true; }
  std::string str() const;  // "[0, 7]", "[-inf, inf] or nan", "{false, true}"
};

Interval join(const Interval& a, const Interval& b);

// Bounds of `e` over every point of `leaves`.
Interval bounds_of(const Expr& e, const LeafBounds& leaves = {});

}  // namespace flexjit::passes
