#include "passes/Interval.h"

#include "ir/Evaluate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>

namespace flexjit::passes {

namespace {

using ir::Op;

constexpr int64_t kIntMin = std::numeric_limits<int32_t>::min();
constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Exact floor division / modulo on 64-bit values (b != 0).
int64_t fdiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t fmod64(int64_t a, int64_t b) {
  return a - b * fdiv(a, b);
}

Interval hull(std::initializer_list<int64_t> v) {
  return Interval::int_range(std::min(v), std::max(v));
}

// ---- i32 ------------------------------------------------------------------------------------

Interval int_div(const Interval& a, const Interval& b) {
  std::optional<Interval> r;
  auto add = [&](const Interval& x) { r = r ? join(*r, x) : x; };
  if (b.lo <= 0 && b.hi >= 0) add(Interval::int_range(0, 0));  // x / 0 == 0
  // floor(a / b) is monotone in a and in b on each sign of b: the extremes are at corners.
  for (auto [lo, hi] : {std::pair{std::max<int64_t>(b.lo, 1), b.hi},
                        std::pair{b.lo, std::min<int64_t>(b.hi, -1)}}) {
    if (lo > hi) continue;
    add(hull({fdiv(a.lo, lo), fdiv(a.lo, hi), fdiv(a.hi, lo), fdiv(a.hi, hi)}));
  }
  return *r;
}

Interval int_mod(const Interval& a, const Interval& b) {
  std::optional<Interval> r;
  auto add = [&](const Interval& x) { r = r ? join(*r, x) : x; };
  if (b.lo <= 0 && b.hi >= 0) add(Interval::int_range(0, 0));  // x % 0 == 0
  if (b.hi >= 1) {                                             // positive divisors
    int64_t p = std::max<int64_t>(b.lo, 1), q = b.hi;
    if (p == q && fdiv(a.lo, p) == fdiv(a.hi, p)) {
      add(Interval::int_range(fmod64(a.lo, p), fmod64(a.hi, p)));  // one quotient: monotone
    } else if (a.lo >= 0 && a.hi < p) {
      add(Interval::int_range(a.lo, a.hi));  // 0 <= a < b: a % b == a
    } else {
      add(Interval::int_range(0, a.lo >= 0 ? std::min(q - 1, a.hi) : q - 1));
    }
  }
  if (b.lo <= -1) {  // negative divisors
    int64_t c = b.lo, d = std::min<int64_t>(b.hi, -1);
    if (c == d && fdiv(a.lo, c) == fdiv(a.hi, c)) {
      add(Interval::int_range(fmod64(a.lo, c), fmod64(a.hi, c)));
    } else if (a.hi <= 0 && a.lo > d) {
      add(Interval::int_range(a.lo, a.hi));  // b < a <= 0: a % b == a
    } else {
      add(Interval::int_range(a.hi <= 0 ? std::max(c + 1, a.lo) : c + 1, 0));
    }
  }
  return *r;
}

Interval int_binary(Op op, const Interval& a, const Interval& b) {
  switch (op) {
    case Op::Add:
      return Interval::int_range(a.lo + b.lo, a.hi + b.hi);
    case Op::Sub:
      return Interval::int_range(a.lo - b.hi, a.hi - b.lo);
    case Op::Mul:
      return hull({a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi});
    case Op::Div:
      return int_div(a, b);
    case Op::Mod:
      return int_mod(a, b);
    case Op::Min:
      return Interval::int_range(std::min(a.lo, b.lo), std::min(a.hi, b.hi));
    case Op::Max:
      return Interval::int_range(std::max(a.lo, b.lo), std::max(a.hi, b.hi));
    case Op::LT:
      return Interval::booleans(a.hi >= b.lo, a.lo < b.hi);
    case Op::LE:
      return Interval::booleans(a.hi > b.lo, a.lo <= b.hi);
    case Op::GT:
      return Interval::booleans(a.lo <= b.hi, a.hi > b.lo);
    case Op::GE:
      return Interval::booleans(a.lo < b.hi, a.hi >= b.lo);
    case Op::EQ:
    case Op::NE: {
      bool overlap = a.lo <= b.hi && b.lo <= a.hi;
      bool same_point = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
      bool can_eq = overlap, can_ne = !same_point;
      return op == Op::EQ ? Interval::booleans(can_ne, can_eq) : Interval::booleans(can_eq, can_ne);
    }
    default:
      return Interval::full(ScalarType::I32);
  }
}

Interval int_unary(Op op, const Interval& a) {
  if (a.lo == kIntMin) return Interval::full(ScalarType::I32);  // -INT_MIN wraps
  switch (op) {
    case Op::Neg:
      return Interval::int_range(-a.hi, -a.lo);
    case Op::Abs:
      if (a.lo >= 0) return a;
      if (a.hi <= 0) return Interval::int_range(-a.hi, -a.lo);
      return Interval::int_range(0, std::max(-a.lo, a.hi));
    default:
      return Interval::full(ScalarType::I32);
  }
}

// ---- f32 ------------------------------------------------------------------------------------

bool finite(const Interval& a) {
  return !a.nan && std::isfinite(a.flo) && std::isfinite(a.fhi);
}

// Corners of a float op that rounds monotonically in each operand (IEEE + - * /).
Interval float_corners(Op op, const Interval& a, const Interval& b) {
  float v[4];
  int k = 0;
  for (float x : {a.flo, a.fhi}) {
    for (float y : {b.flo, b.fhi}) {
      v[k++] = ir::apply_binary(op, ir::Value::of_f32(x), ir::Value::of_f32(y)).f;
    }
  }
  float lo = v[0], hi = v[0];
  for (float x : v) {
    if (std::isnan(x)) return Interval::full(ScalarType::F32);
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  return Interval::float_range(lo, hi, false);
}

Interval float_compare(Op op, const Interval& a, const Interval& b) {
  bool nan = a.nan || b.nan;  // any comparison with NaN is false, except != which is true
  bool t = false, f = false;
  switch (op) {
    case Op::LT:
      t = a.flo < b.fhi;
      f = a.fhi >= b.flo;
      break;
    case Op::LE:
      t = a.flo <= b.fhi;
      f = a.fhi > b.flo;
      break;
    case Op::GT:
      t = a.fhi > b.flo;
      f = a.flo <= b.fhi;
      break;
    case Op::GE:
      t = a.fhi >= b.flo;
      f = a.flo < b.fhi;
      break;
    case Op::EQ:
    case Op::NE: {
      bool overlap = a.flo <= b.fhi && b.flo <= a.fhi;
      bool same_point = a.flo == a.fhi && b.flo == b.fhi && a.flo == b.flo;
      t = overlap;
      f = !same_point;
      if (op == Op::NE) std::swap(t, f);
      return Interval::booleans(f || (nan && op == Op::EQ), t || (nan && op == Op::NE));
    }
    default:
      break;
  }
  return Interval::booleans(f || nan, t);
}

Interval float_binary(Op op, const Interval& a, const Interval& b) {
  if (ir::is_comparison(op)) return float_compare(op, a, b);
  switch (op) {
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
      if (!finite(a) || !finite(b)) return Interval::full(ScalarType::F32);
      return float_corners(op, a, b);
    case Op::Div:
      if (!finite(a) || !finite(b) || (b.flo <= 0.0f && b.fhi >= 0.0f)) {
        return Interval::full(ScalarType::F32);
      }
      return float_corners(op, a, b);
    case Op::Min:
    case Op::Max:
      if (!a.nan && !b.nan) {
        return op == Op::Min
                   ? Interval::float_range(std::min(a.flo, b.flo), std::min(a.fhi, b.fhi), false)
                   : Interval::float_range(std::max(a.flo, b.flo), std::max(a.fhi, b.fhi), false);
      }
      // fminf with a NaN operand returns the other one.
      return Interval::float_range(std::min(a.flo, b.flo), std::max(a.fhi, b.fhi), a.nan && b.nan);
    default:
      return Interval::full(ScalarType::F32);
  }
}

Interval float_unary(Op op, const Interval& a) {
  switch (op) {
    case Op::Neg:
      return Interval::float_range(-a.fhi, -a.flo, a.nan);
    case Op::Abs:
      if (a.flo >= 0.0f) return Interval::float_range(0.0f, a.fhi, a.nan);  // -0.0 becomes 0.0
      if (a.fhi <= 0.0f) return Interval::float_range(-a.fhi, -a.flo, a.nan);
      return Interval::float_range(0.0f, std::max(-a.flo, a.fhi), a.nan);
    case Op::Floor:
      return Interval::float_range(floorf(a.flo), floorf(a.fhi), a.nan);
    case Op::Ceil:
      return Interval::float_range(ceilf(a.flo), ceilf(a.fhi), a.nan);
    default:
      return Interval::full(ScalarType::F32);
  }
}

Interval cast(ScalarType to, const Interval& a) {
  if (a.type == ScalarType::Bool) {
    int64_t lo = a.can_false ? 0 : 1, hi = a.can_true ? 1 : 0;
    if (to == ScalarType::I32) return Interval::int_range(lo, hi);
    return Interval::float_range(static_cast<float>(lo), static_cast<float>(hi), false);
  }
  if (to == ScalarType::F32) {  // i32 -> f32 rounds monotonically
    return Interval::float_range(static_cast<float>(a.lo), static_cast<float>(a.hi), false);
  }
  // f32 -> i32 truncates and saturates monotonically; NaN gives 0.
  auto conv = [](float f) { return ir::apply_cast(ScalarType::I32, ir::Value::of_f32(f)).i; };
  Interval r = Interval::int_range(conv(a.flo), conv(a.fhi));
  return a.nan ? join(r, Interval::int_range(0, 0)) : r;
}

Interval leaf_range(const IntRange& r) {
  return Interval::int_range(r.lo, r.hi);
}

class Bounder {
 public:
  explicit Bounder(const LeafBounds& leaves) : leaves_(leaves) {}

  Interval run(const Expr& e) {
    auto it = memo_.find(e.get());
    if (it != memo_.end()) return it->second;
    Interval r = compute(e);
    memo_.emplace(e.get(), r);
    return r;
  }

 private:
  Interval compute(const Expr& e) {
    const ir::Node& n = *e.get();
    switch (n.op) {
      case Op::IntImm:
        return Interval::int_range(n.ival, n.ival);
      case Op::FloatImm: {
        float f = static_cast<float>(n.fval);
        return Interval::float_range(f, f, false);  // NaN gives full()
      }
      case Op::BoolImm:
        return Interval::booleans(n.ival == 0, n.ival != 0);
      case Op::Var:
        switch (n.var) {
          case ir::VarKind::B:
            return leaf_range(leaves_.b);
          case ir::VarKind::H:
            return leaf_range(leaves_.h);
          case ir::VarKind::QIdx:
            return leaf_range(leaves_.q_idx);
          case ir::VarKind::KvIdx:
            return leaf_range(leaves_.kv_idx);
          case ir::VarKind::Score:
            return Interval::full(ScalarType::F32);
        }
        break;
      case Op::Param: {
        auto it = leaves_.params.find(n.param->name);
        if (it == leaves_.params.end()) return Interval::full(n.type);
        ir::EvalEnv env;
        env.params = leaves_.params;
        ir::Value v = ir::evaluate(e, env);
        switch (v.type) {
          case ScalarType::I32:
            return Interval::int_range(v.i, v.i);
          case ScalarType::F32:
            return Interval::float_range(v.f, v.f, false);
          case ScalarType::Bool:
            return Interval::booleans(!v.as_bool(), v.as_bool());
        }
        break;
      }
      case Op::Load:
        return Interval::full(n.type);
      case Op::Cast:
        return cast(n.type, run(n.args[0]));
      case Op::Select: {
        Interval c = run(n.args[0]);
        if (c.is_true()) return run(n.args[1]);
        if (c.is_false()) return run(n.args[2]);
        return join(run(n.args[1]), run(n.args[2]));
      }
      case Op::Not: {
        Interval a = run(n.args[0]);
        return Interval::booleans(a.can_true, a.can_false);
      }
      case Op::And:
      case Op::Or: {
        Interval a = run(n.args[0]), b = run(n.args[1]);
        if (n.op == Op::And) {
          return Interval::booleans(a.can_false || b.can_false, a.can_true && b.can_true);
        }
        return Interval::booleans(a.can_false && b.can_false, a.can_true || b.can_true);
      }
      default:
        break;
    }
    if (ir::is_unary(n.op)) {
      Interval a = run(n.args[0]);
      return a.type == ScalarType::I32 ? int_unary(n.op, a) : float_unary(n.op, a);
    }
    Interval a = run(n.args[0]), b = run(n.args[1]);
    if (a.type == ScalarType::Bool) {  // == and != on bools
      bool can_eq = (a.can_true && b.can_true) || (a.can_false && b.can_false);
      bool can_ne = (a.can_true && b.can_false) || (a.can_false && b.can_true);
      return n.op == Op::EQ ? Interval::booleans(can_ne, can_eq)
                            : Interval::booleans(can_eq, can_ne);
    }
    return a.type == ScalarType::I32 ? int_binary(n.op, a, b) : float_binary(n.op, a, b);
  }

  const LeafBounds& leaves_;
  std::unordered_map<const ir::Node*, Interval> memo_;
};

}  // namespace

Interval Interval::full(ScalarType t) {
  switch (t) {
    case ScalarType::I32:
      return int_range(kIntMin, kIntMax);
    case ScalarType::F32:
      return float_range(-kInf, kInf, true);
    case ScalarType::Bool:
      return booleans(true, true);
  }
  FJ_ASSERT(false, "bad ScalarType");
}

Interval Interval::int_range(int64_t lo, int64_t hi) {
  FJ_ASSERT(lo <= hi, "empty interval");
  Interval r;
  r.type = ScalarType::I32;
  bool fits = lo >= kIntMin && hi <= kIntMax;
  r.lo = fits ? lo : kIntMin;
  r.hi = fits ? hi : kIntMax;
  return r;
}

Interval Interval::float_range(float lo, float hi, bool nan) {
  Interval r;
  r.type = ScalarType::F32;
  if (std::isnan(lo) || std::isnan(hi)) return full(ScalarType::F32);
  FJ_ASSERT(lo <= hi, "empty float interval");
  r.flo = lo;
  r.fhi = hi;
  r.nan = nan;
  return r;
}

Interval Interval::booleans(bool can_false, bool can_true) {
  FJ_ASSERT(can_false || can_true, "empty bool set");
  Interval r;
  r.type = ScalarType::Bool;
  r.can_false = can_false;
  r.can_true = can_true;
  return r;
}

std::string Interval::str() const {
  switch (type) {
    case ScalarType::I32:
      return fmt::format("[{}, {}]", lo, hi);
    case ScalarType::F32:
      return fmt::format("[{}, {}]{}", flo, fhi, nan ? " or nan" : "");
    case ScalarType::Bool:
      return can_false && can_true ? "{false, true}" : can_true ? "{true}" : "{false}";
  }
  FJ_ASSERT(false, "bad ScalarType");
}

Interval join(const Interval& a, const Interval& b) {
  FJ_ASSERT(a.type == b.type, "join of intervals of different types");
  switch (a.type) {
    case ScalarType::I32:
      return Interval::int_range(std::min(a.lo, b.lo), std::max(a.hi, b.hi));
    case ScalarType::F32:
      return Interval::float_range(std::min(a.flo, b.flo), std::max(a.fhi, b.fhi), a.nan || b.nan);
    case ScalarType::Bool:
      return Interval::booleans(a.can_false || b.can_false, a.can_true || b.can_true);
  }
  FJ_ASSERT(false, "bad ScalarType");
}

Interval bounds_of(const Expr& e, const LeafBounds& leaves) {
  FJ_ASSERT(e.defined(), "bounds_of an undefined expression");
  return Bounder(leaves).run(e);
}

}  // namespace flexjit::passes
