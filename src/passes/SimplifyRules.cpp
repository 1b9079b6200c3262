// The simplifier's rewrite rules, one per line, grouped by the root's op (as Halide's
// Simplify_Add.cpp and friends). Notation in the comments: x, y, z any expressions; c, c1, c2
// constants; "i32:" / "f32:" restrict a rule to that operand type. Each rule is exact under the
// semantics of ir/Evaluate.h: i32 rules use only arithmetic mod 2^32; f32 rules are IEEE
// identities that hold for every input, signed zeros, infinities and NaN included.
#include "passes/SimplifyRules.h"

#include "ir/Evaluate.h"
#include "passes/Interval.h"

#include <cmath>
#include <limits>

namespace flexjit::passes::simplify_rules {

namespace {

using ir::Op;
using ir::Value;
using passes::Interval;

constexpr int32_t kIntMin = std::numeric_limits<int32_t>::min();
constexpr int32_t kIntMax = std::numeric_limits<int32_t>::max();

// ---- matchers -------------------------------------------------------------------------------

bool is_const(const Expr& e) {
  return ir::const_value(e);
}

bool is_int(const Expr& e, int32_t* v = nullptr) {
  if (e->op != Op::IntImm) return false;
  if (v) *v = static_cast<int32_t>(e->ival);
  return true;
}
bool is_int_value(const Expr& e, int32_t v) {
  return e->op == Op::IntImm && e->ival == v;
}

// Exactly this float, sign of zero included.
bool is_float_value(const Expr& e, float v) {
  if (e->op != Op::FloatImm) return false;
  float f = static_cast<float>(e->fval);
  return f == v && std::signbit(f) == std::signbit(v);
}
bool is_nan_const(const Expr& e) {
  return e->op == Op::FloatImm && std::isnan(e->fval);
}

bool is_bool_value(const Expr& e, bool v) {
  return e->op == Op::BoolImm && (e->ival != 0) == v;
}

Op negate(Op op);

bool is_op(const Expr& e, Op op) {
  return e->op == op;
}
const Expr& arg(const Expr& e, int i) {
  return e->args[static_cast<size_t>(i)];
}

bool is_i32(const Expr& e) {
  return e.type() == ScalarType::I32;
}
bool is_f32(const Expr& e) {
  return e.type() == ScalarType::F32;
}

// x and !x, in either order.
bool negations(const Expr& x, const Expr& y) {
  return (is_op(y, Op::Not) && ir::equal(arg(y, 0), x)) ||
         (is_op(x, Op::Not) && ir::equal(arg(x, 0), y));
}

// Comparisons that are each other's negation: x < y and x >= y on i32 (not on f32, where both are
// false for NaN), x == y and x != y on any type.
bool complements(const Expr& x, const Expr& y) {
  if (!ir::is_comparison(x->op) || !ir::is_comparison(y->op)) return false;
  bool ordered = arg(x, 0).type() != ScalarType::F32;
  bool eq_ne = x->op == Op::EQ || x->op == Op::NE;
  if (!ordered && !eq_ne) return false;
  return y->op == negate(x->op) && ir::equal(arg(x, 0), arg(y, 0)) &&
         ir::equal(arg(x, 1), arg(y, 1));
}

// Every value of the i32 expression x converts to float exactly (|x| <= 2^24, by intervals).
bool fits_float_exactly(const Expr& x) {
  Interval r = bounds_of(x);
  return r.lo >= -(int64_t{1} << 24) && r.hi <= (int64_t{1} << 24);
}

// ---- builders -------------------------------------------------------------------------------

Expr bin(Op op, Expr a, Expr b) {
  return ir::make_binary(op, std::move(a), std::move(b));
}
Expr un(Op op, Expr a) {
  return ir::make_unary(op, std::move(a));
}
Expr i32(int64_t v) {
  return ir::make_int(static_cast<int32_t>(v));
}
// c1 op c2 folded with the language's semantics.
Expr fold(Op op, const Expr& a, const Expr& b) {
  Value x, y;
  ir::const_value(a, &x);
  ir::const_value(b, &y);
  return ir::make_const(ir::apply_binary(op, x, y));
}
Expr neg_const(const Expr& c) {
  Value v;
  ir::const_value(c, &v);
  return ir::make_const(ir::apply_unary(Op::Neg, v));
}

// The comparison with its operands swapped: a < b == b > a.
Op flip(Op op) {
  switch (op) {
    case Op::LT:
      return Op::GT;
    case Op::LE:
      return Op::GE;
    case Op::GT:
      return Op::LT;
    case Op::GE:
      return Op::LE;
    default:
      return op;  // EQ, NE
  }
}

// The comparison's logical negation on totally ordered operands (i32, bool): !(a < b) == a >= b.
Op negate(Op op) {
  switch (op) {
    case Op::LT:
      return Op::GE;
    case Op::LE:
      return Op::GT;
    case Op::GT:
      return Op::LE;
    case Op::GE:
      return Op::LT;
    case Op::EQ:
      return Op::NE;
    default:
      return Op::EQ;  // NE
  }
}

// ---- constant folding -----------------------------------------------------------------------

// Every operand a constant: evaluate. Select / And / Or with a constant first operand are rules.
Expr fold_constants(const Expr& e) {
  if (e->args.empty() || e->op == Op::Load) return e;
  std::vector<Value> v(e->args.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!ir::const_value(e->args[i], &v[i])) return e;
  }
  if (e->op == Op::Cast) return ir::make_const(ir::apply_cast(e.type(), v[0]));
  if (e->op == Op::Select) return v[0].as_bool() ? e->args[1] : e->args[2];
  if (ir::is_unary(e->op)) return ir::make_const(ir::apply_unary(e->op, v[0]));
  return ir::make_const(ir::apply_binary(e->op, v[0], v[1]));
}

// ---- rules by op ----------------------------------------------------------------------------

Expr rewrite_add(const Expr& e, const Expr& a, const Expr& b) {
  if (is_i32(e) && is_const(a)) return bin(Op::Add, b, a);                  // c + x -> x + c
  if (is_f32(e) && is_const(a) && !is_const(b)) return bin(Op::Add, b, a);  // f32: c + x -> x + c
  if (is_int_value(b, 0)) return a;                                         // i32: x + 0 -> x
  if (is_float_value(b, -0.0f)) return a;                                   // f32: x + -0.0 -> x
  if (is_op(b, Op::Neg)) return bin(Op::Sub, a, arg(b, 0));                 // x + -y -> x - y
  if (is_op(a, Op::Neg)) return bin(Op::Sub, b, arg(a, 0));                 // -x + y -> y - x
  if (!is_i32(e)) return e;
  if (is_op(a, Op::Add) && is_int(arg(a, 1)) && is_int(b))
    return bin(Op::Add, arg(a, 0), fold(Op::Add, arg(a, 1), b));  // (x + c1) + c2 -> x + (c1 + c2)
  if (is_op(a, Op::Sub) && is_int(arg(a, 0)) && is_int(b))
    return bin(Op::Sub, fold(Op::Add, arg(a, 0), b), arg(a, 1));  // (c1 - x) + c2 -> (c1 + c2) - x
  if (is_op(a, Op::Add) && is_int(arg(a, 1)) && !is_int(b))
    return bin(Op::Add, bin(Op::Add, arg(a, 0), b), arg(a, 1));  // (x + c) + y -> (x + y) + c
  if (is_op(b, Op::Add) && is_int(arg(b, 1)))
    return bin(Op::Add, bin(Op::Add, a, arg(b, 0)), arg(b, 1));        // x + (y + c) -> (x + y) + c
  if (is_op(a, Op::Sub) && ir::equal(arg(a, 1), b)) return arg(a, 0);  // (x - y) + y -> x
  if (is_op(b, Op::Sub) && ir::equal(arg(b, 1), a)) return arg(b, 0);  // y + (x - y) -> x
  return e;
}

Expr rewrite_sub(const Expr& e, const Expr& a, const Expr& b) {
  if (is_op(b, Op::Neg)) return bin(Op::Add, a, arg(b, 0));  // x - -y -> x + y
  if (is_float_value(b, 0.0f)) return a;                     // f32: x - 0.0 -> x
  if (is_float_value(a, -0.0f)) return un(Op::Neg, b);       // f32: -0.0 - x -> -x
  if (!is_i32(e)) return e;
  if (is_int(b)) return bin(Op::Add, a, neg_const(b));                 // x - c -> x + (-c)
  if (is_int_value(a, 0)) return un(Op::Neg, b);                       // 0 - x -> -x
  if (ir::equal(a, b)) return i32(0);                                  // x - x -> 0
  if (is_op(a, Op::Add) && ir::equal(arg(a, 0), b)) return arg(a, 1);  // (x + y) - x -> y
  if (is_op(a, Op::Add) && ir::equal(arg(a, 1), b)) return arg(a, 0);  // (x + y) - y -> x
  if (is_op(b, Op::Add) && ir::equal(arg(b, 0), a))
    return un(Op::Neg, arg(b, 1));  // x - (x + y) -> -y
  if (is_op(b, Op::Add) && ir::equal(arg(b, 1), a))
    return un(Op::Neg, arg(b, 0));  // x - (y + x) -> -y
  if (is_op(a, Op::Sub) && ir::equal(arg(a, 0), b))
    return un(Op::Neg, arg(a, 1));                                     // (x - y) - x -> -y
  if (is_op(b, Op::Sub) && ir::equal(arg(b, 0), a)) return arg(b, 1);  // x - (x - y) -> y
  if (is_op(a, Op::Add) && is_int(arg(a, 1)))
    return bin(Op::Add, bin(Op::Sub, arg(a, 0), b), arg(a, 1));  // (x + c) - y -> (x - y) + c
  if (is_op(b, Op::Add) && is_int(arg(b, 1)) && is_int(a))
    return bin(Op::Sub, fold(Op::Sub, a, arg(b, 1)), arg(b, 0));  // c1 - (x + c2) -> (c1 - c2) - x
  if (is_op(b, Op::Add) && is_int(arg(b, 1)))
    return bin(Op::Add, bin(Op::Sub, a, arg(b, 0)),
               neg_const(arg(b, 1)));  // x - (y + c) -> (x - y) + (-c)
  if (is_op(b, Op::Sub) && is_int(arg(b, 0)) && is_int(a))
    return bin(Op::Add, arg(b, 1), fold(Op::Sub, a, arg(b, 0)));  // c1 - (c2 - x) -> x + (c1 - c2)
  return e;
}

Expr rewrite_mul(const Expr& e, const Expr& a, const Expr& b) {
  if (is_const(a) && !is_const(b)) return bin(Op::Mul, b, a);                  // c * x -> x * c
  if (is_int_value(b, 1) || is_float_value(b, 1.0f)) return a;                 // x * 1 -> x
  if (is_int_value(b, -1) || is_float_value(b, -1.0f)) return un(Op::Neg, a);  // x * -1 -> -x
  if (is_int_value(b, 0)) return b;                                            // i32: x * 0 -> 0
  if (is_op(a, Op::Neg) && is_op(b, Op::Neg))
    return bin(Op::Mul, arg(a, 0), arg(b, 0));  // -x * -y -> x * y
  if (!is_i32(e)) return e;
  if (is_op(a, Op::Mul) && is_int(arg(a, 1)) && is_int(b))
    return bin(Op::Mul, arg(a, 0), fold(Op::Mul, arg(a, 1), b));  // (x * c1) * c2 -> x * (c1 * c2)
  if (is_op(a, Op::Mul) && is_int(arg(a, 1)) && !is_int(b))
    return bin(Op::Mul, bin(Op::Mul, arg(a, 0), b), arg(a, 1));  // (x * c) * y -> (x * y) * c
  return e;
}

Expr rewrite_div(const Expr& e, const Expr& a, const Expr& b) {
  if (is_int_value(b, 1) || is_float_value(b, 1.0f)) return a;  // x / 1 -> x
  if (is_int_value(b, -1) || is_float_value(b, -1.0f))
    return un(Op::Neg, a);  // x / -1 -> -x (i32: INT_MIN wraps both ways)
  if (!is_i32(e)) return e;
  if (is_int_value(b, 0)) return b;  // i32: x / 0 -> 0
  if (is_int_value(a, 0)) return a;  // i32: 0 / x -> 0
  int32_t c1, c2;
  if (is_op(a, Op::Div) && is_int(arg(a, 1), &c1) && is_int(b, &c2) && c1 > 0 && c2 > 0 &&
      static_cast<int64_t>(c1) * c2 <= kIntMax)
    return bin(Op::Div, arg(a, 0),
               i32(static_cast<int64_t>(c1) * c2));  // (x / c1) / c2 -> x / (c1 * c2), c1, c2 > 0
  return e;
}

Expr rewrite_mod(const Expr& e, const Expr& a, const Expr& b) {
  if (!is_i32(e)) return e;
  if (is_int_value(b, 1) || is_int_value(b, -1) || is_int_value(b, 0))
    return i32(0);                   // x % 1, x % -1, x % 0 -> 0
  if (is_int_value(a, 0)) return a;  // 0 % x -> 0
  if (is_op(a, Op::Mod) && is_int(b) && ir::equal(arg(a, 1), b)) return a;  // (x % c) % c -> x % c
  return e;
}

Expr rewrite_min_max(const Expr& e, const Expr& a, const Expr& b) {
  bool is_min = e->op == Op::Min;
  Op op = e->op;
  if (ir::equal(a, b)) return a;  // min(x, x) -> x
  if (is_nan_const(b)) return a;  // f32: min(x, nan) -> x (fminf)
  if (is_nan_const(a)) return b;  // f32: min(nan, x) -> x (fminf)
  if (!is_i32(e)) return e;
  if (is_const(a)) return bin(op, b, a);                      // min(c, x) -> min(x, c)
  if (is_int_value(b, is_min ? kIntMax : kIntMin)) return a;  // min(x, INT_MAX) -> x
  if (is_int_value(b, is_min ? kIntMin : kIntMax)) return b;  // min(x, INT_MIN) -> INT_MIN
  if (is_op(a, op) && is_int(arg(a, 1)) && is_int(b))
    return bin(op, arg(a, 0),
               fold(op, arg(a, 1), b));  // min(min(x, c1), c2) -> min(x, min(c1, c2))
  Op other = is_min ? Op::Max : Op::Min;
  if (is_op(b, other) && (ir::equal(arg(b, 0), a) || ir::equal(arg(b, 1), a)))
    return a;  // min(x, max(x, y)) -> x
  if (is_op(a, other) && (ir::equal(arg(a, 0), b) || ir::equal(arg(a, 1), b)))
    return b;  // min(max(x, y), x) -> x
  if (is_op(a, op) && (ir::equal(arg(a, 0), b) || ir::equal(arg(a, 1), b)))
    return a;  // min(min(x, y), x) -> min(x, y)
  if (is_op(b, op) && (ir::equal(arg(b, 0), a) || ir::equal(arg(b, 1), a)))
    return b;  // min(x, min(x, y)) -> min(x, y)
  return e;
}

// pow(x, 1) -> x is not here: C does not promise that powf(x, 1) is exactly x.
Expr rewrite_pow(const Expr& e, const Expr& a, const Expr& b) {
  if (is_float_value(b, 0.0f) || is_float_value(b, -0.0f))
    return ir::make_float(1.0);  // pow(x, 0) -> 1 (even for nan)
  return e;
}

Expr rewrite_compare(const Expr& e, const Expr& a, const Expr& b) {
  Op op = e->op;
  ScalarType t = a.type();
  if (is_const(a) && !is_const(b)) return bin(flip(op), b, a);  // c < x -> x > c
  if (t != ScalarType::F32 && ir::equal(a, b))
    return ir::make_bool(op == Op::EQ || op == Op::LE ||
                         op == Op::GE);  // i32/bool: x == x -> true, x < x -> false
  if (t == ScalarType::Bool) {
    if (is_bool_value(b, op == Op::EQ)) return a;               // x == true -> x; x != false -> x
    if (is_bool_value(b, op != Op::EQ)) return un(Op::Not, a);  // x == false -> !x; x != true -> !x
    return e;
  }
  if (t != ScalarType::I32) return e;
  if (is_int_value(b, kIntMin) && (op == Op::LT || op == Op::GE))
    return ir::make_bool(op == Op::GE);  // x < INT_MIN -> false; x >= INT_MIN -> true
  if (is_int_value(b, kIntMax) && (op == Op::GT || op == Op::LE))
    return ir::make_bool(op == Op::LE);  // x > INT_MAX -> false; x <= INT_MAX -> true
  return e;
}

Expr rewrite_not(const Expr& e, const Expr& a) {
  if (is_op(a, Op::Not)) return arg(a, 0);  // !!x -> x
  if (is_op(a, Op::EQ) || is_op(a, Op::NE))
    return bin(negate(a->op), arg(a, 0), arg(a, 1));  // !(x == y) -> x != y (exact for floats too)
  if (ir::is_comparison(a->op) && arg(a, 0).type() == ScalarType::I32)
    return bin(negate(a->op), arg(a, 0), arg(a, 1));  // i32: !(x < y) -> x >= y (not for f32: NaN)
  return e;
}

Expr rewrite_and_or(const Expr& e, const Expr& a, const Expr& b) {
  bool is_and = e->op == Op::And;
  if (is_bool_value(a, is_and)) return b;              // true && x -> x; false || x -> x
  if (is_bool_value(b, is_and)) return a;              // x && true -> x; x || false -> x
  if (is_bool_value(a, !is_and)) return a;             // false && x -> false; true || x -> true
  if (is_bool_value(b, !is_and)) return b;             // x && false -> false; x || true -> true
  if (ir::equal(a, b)) return a;                       // x && x -> x
  if (negations(a, b)) return ir::make_bool(!is_and);  // x && !x -> false; x || !x -> true
  if (complements(a, b))
    return ir::make_bool(!is_and);  // i32: x < y && x >= y -> false; x == y || x != y -> true
  if (is_op(b, e->op) && (ir::equal(arg(b, 0), a) || ir::equal(arg(b, 1), a)))
    return b;  // x && (x && y) -> x && y
  if (is_op(a, e->op) && (ir::equal(arg(a, 0), b) || ir::equal(arg(a, 1), b)))
    return a;  // (x && y) && x -> x && y
  return e;
}

Expr rewrite_select(const Expr& e, const Expr& c, const Expr& a, const Expr& b) {
  if (is_bool_value(c, true)) return a;   // where(true, x, y) -> x
  if (is_bool_value(c, false)) return b;  // where(false, x, y) -> y
  if (ir::equal(a, b)) return a;          // where(c, x, x) -> x
  if (is_op(c, Op::Not))
    return ir::make_select(arg(c, 0), b, a);  // where(!c, x, y) -> where(c, y, x)
  if (is_op(a, Op::Select) && ir::equal(arg(a, 0), c))
    return ir::make_select(c, arg(a, 1), b);  // where(c, where(c, x, y), z) -> where(c, x, z)
  if (is_op(b, Op::Select) && ir::equal(arg(b, 0), c))
    return ir::make_select(c, a, arg(b, 2));  // where(c, x, where(c, y, z)) -> where(c, x, z)
  if (e.type() != ScalarType::Bool) return e;
  if (is_bool_value(a, true) && is_bool_value(b, false)) return c;  // where(c, true, false) -> c
  if (is_bool_value(a, false) && is_bool_value(b, true))
    return un(Op::Not, c);                                 // where(c, false, true) -> !c
  if (is_bool_value(b, false)) return bin(Op::And, c, a);  // where(c, x, false) -> c && x
  if (is_bool_value(a, true)) return bin(Op::Or, c, b);    // where(c, true, y) -> c || y
  if (is_bool_value(a, false))
    return bin(Op::And, un(Op::Not, c), b);  // where(c, false, y) -> !c && y
  if (is_bool_value(b, true))
    return bin(Op::Or, un(Op::Not, c), a);  // where(c, x, true) -> !c || x
  return e;
}

Expr rewrite_unary(const Expr& e, const Expr& a) {
  switch (e->op) {
    case Op::Neg:
      if (is_op(a, Op::Neg)) return arg(a, 0);  // -(-x) -> x
      if (is_i32(e) && is_op(a, Op::Sub))
        return bin(Op::Sub, arg(a, 1), arg(a, 0));  // i32: -(x - y) -> y - x
      return e;
    case Op::Abs:
      if (is_op(a, Op::Abs)) return a;                       // abs(abs(x)) -> abs(x)
      if (is_op(a, Op::Neg)) return un(Op::Abs, arg(a, 0));  // abs(-x) -> abs(x)
      return e;
    case Op::Not:
      return rewrite_not(e, a);
    default:
      return e;
  }
}

Expr rewrite_cast(const Expr& e, const Expr& a) {
  if (is_op(a, Op::Cast) && arg(a, 0).type() == ScalarType::Bool)
    return ir::make_cast(
        e.type(), arg(a, 0));  // int(float(bool x)) -> int(x); float(int(bool x)) -> float(x)
  if (e.type() == ScalarType::I32 && is_op(a, Op::Cast) && is_i32(arg(a, 0)) &&
      fits_float_exactly(arg(a, 0)))
    return arg(a, 0);  // int(float(x)) -> x when |x| <= 2^24 (float holds it exactly)
  return e;
}

}  // namespace

Expr rewrite(const Expr& e) {
  Expr folded = fold_constants(e);
  if (!folded.same_as(e)) return folded;
  const auto& args = e->args;
  switch (e->op) {
    case Op::Add:
      return rewrite_add(e, args[0], args[1]);
    case Op::Sub:
      return rewrite_sub(e, args[0], args[1]);
    case Op::Mul:
      return rewrite_mul(e, args[0], args[1]);
    case Op::Div:
      return rewrite_div(e, args[0], args[1]);
    case Op::Mod:
      return rewrite_mod(e, args[0], args[1]);
    case Op::Min:
    case Op::Max:
      return rewrite_min_max(e, args[0], args[1]);
    case Op::Pow:
      return rewrite_pow(e, args[0], args[1]);
    case Op::EQ:
    case Op::NE:
    case Op::LT:
    case Op::LE:
    case Op::GT:
    case Op::GE:
      return rewrite_compare(e, args[0], args[1]);
    case Op::And:
    case Op::Or:
      return rewrite_and_or(e, args[0], args[1]);
    case Op::Select:
      return rewrite_select(e, args[0], args[1], args[2]);
    case Op::Cast:
      return rewrite_cast(e, args[0]);
    default:
      break;
  }
  if (ir::is_unary(e->op)) return rewrite_unary(e, args[0]);
  return e;
}

}  // namespace flexjit::passes::simplify_rules
