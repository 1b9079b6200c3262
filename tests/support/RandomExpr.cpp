#include "support/RandomExpr.h"

#include "ir/IR.h"
#include "ir/Operators.h"

#include <limits>

namespace flexjit::test {

using ir::Op;

namespace {

constexpr Op kMathOps[] = {Op::Exp,     Op::Exp2, Op::Log,   Op::Log2,  Op::Tanh,
                           Op::Sigmoid, Op::Sqrt, Op::Rsqrt, Op::Floor, Op::Ceil};
constexpr Op kArithOps[] = {Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Mod, Op::Min, Op::Max};
constexpr Op kCompareOps[] = {Op::EQ, Op::NE, Op::LT, Op::LE, Op::GT, Op::GE};

}  // namespace

RandomExprGen::RandomExprGen(uint64_t seed) : RandomExprGen(seed, Options{}) {}

RandomExprGen::RandomExprGen(uint64_t seed, Options options) : rng_(seed), options_(options) {
  // Every dtype and every rank 1..4 appears at least once.
  buffer_pool_ = {
      Buffer("slopes", DType::F32, {"H"}),
      Buffer("table", DType::F16, {"S"}),
      Buffer("grid", DType::BF16, {"H", "S"}),
      Buffer("doc_id", DType::I32, {"S"}),
      Buffer("keep", DType::Bool, {"B", "H"}),
      Buffer("cube", DType::F32, {"B", "H", "64"}),
      Buffer("hyper", DType::I32, {"B", "H", "S", "8"}),
      Buffer("bits", DType::Bool, {"2", "3", "4", "5"}),
  };
  param_pool_ = {
      Param("alpha", ScalarType::F32, 0.5),    Param("beta", ScalarType::F32),
      Param("window", ScalarType::I32, 128.0), Param("stride", ScalarType::I32),
      Param("enabled", ScalarType::Bool, 1.0),
  };
}

void RandomExprGen::clear_used() {
  buffers_.clear();
  params_.clear();
}

int RandomExprGen::uniform(int n) {
  // Hand-written so that the sequence does not depend on the standard library's distributions.
  return static_cast<int>(rng_() % static_cast<uint64_t>(n));
}

bool RandomExprGen::chance(int percent) {
  return uniform(100) < percent;
}

void RandomExprGen::use(const Buffer& b) {
  for (const auto& x : buffers_) {
    if (x.name() == b.name()) return;
  }
  buffers_.push_back(b);
}

void RandomExprGen::use(const Param& p) {
  for (const auto& x : params_) {
    if (x.name() == p.name()) return;
  }
  params_.push_back(p);
}

Expr RandomExprGen::literal(ScalarType type) {
  switch (type) {
    case ScalarType::Bool:
      return ir::make_bool(chance(50));
    case ScalarType::I32: {
      static constexpr int64_t kInts[] = {
          0, 1, -1, 2, 3, 7, -8, 1024, 4096, -300, 31, 2147483647, -2147483648LL};
      if (chance(70)) return ir::make_int(kInts[uniform(std::size(kInts))]);
      return ir::make_int(static_cast<int32_t>(rng_()));
    }
    case ScalarType::F32: {
      static constexpr double kFloats[] = {
          0.0, 1.0, -1.0, 0.5, 2.5, 0.1, -30.0, 1e-3, 3.0e38, 1.4426950408889634, 1e10, -7.25e-5};
      if (options_.allow_special_floats && chance(10)) {
        switch (uniform(5)) {
          case 0:
            return ir::make_float(std::numeric_limits<float>::infinity());
          case 1:
            return ir::make_float(-std::numeric_limits<float>::infinity());
          case 2:
            return ir::make_float(std::numeric_limits<float>::quiet_NaN());
          case 3:
            return ir::make_float(-0.0);
          default:
            return ir::make_float(std::numeric_limits<float>::denorm_min() * 3);
        }
      }
      if (chance(60)) return ir::make_float(kFloats[uniform(std::size(kFloats))]);
      // A random float of moderate magnitude with full mantissa bits.
      double mant = static_cast<double>(rng_() >> 11) / static_cast<double>(1ull << 53);
      double v = (mant * 2.0 - 1.0) * static_cast<double>(1 << uniform(24));
      return ir::make_float(v);
    }
  }
  return {};
}

Expr RandomExprGen::leaf(ScalarType type) {
  int r = uniform(100);
  if (type == ScalarType::F32) {
    if (options_.allow_score && !in_mask_ && r < 40) return score();
    if (options_.allow_params && r < 55) {
      const Param& p = param_pool_[uniform(2)];  // alpha, beta
      use(p);
      return p.expr();
    }
    return literal(type);
  }
  if (type == ScalarType::I32) {
    if (r < 60) {
      switch (uniform(4)) {
        case 0:
          return b_idx();
        case 1:
          return h_idx();
        case 2:
          return q_idx();
        default:
          return kv_idx();
      }
    }
    if (options_.allow_params && r < 75) {
      const Param& p = param_pool_[2 + uniform(2)];  // window, stride
      use(p);
      return p.expr();
    }
    return literal(type);
  }
  if (options_.allow_params && r < 30) {
    use(param_pool_[4]);
    return param_pool_[4].expr();
  }
  return literal(type);
}

Expr RandomExprGen::load(ScalarType type, int depth) {
  std::vector<const Buffer*> fits;
  for (const auto& b : buffer_pool_) {
    if (load_type(b.dtype()) == type) fits.push_back(&b);
  }
  const Buffer& buf = *fits[uniform(static_cast<int>(fits.size()))];
  std::vector<Expr> idx;
  for (int i = 0; i < buf.rank(); ++i)
    idx.push_back(expr(ScalarType::I32, depth - 1));
  use(buf);
  return buf(std::move(idx));
}

Expr RandomExprGen::numeric(int depth) {
  return expr(chance(50) ? ScalarType::F32 : ScalarType::I32, depth);
}

Expr RandomExprGen::unary(ScalarType type, int depth) {
  if (type == ScalarType::Bool) return !expr(ScalarType::Bool, depth - 1);
  if (type == ScalarType::I32 || chance(25)) {
    Expr a = expr(type, depth - 1);
    return chance(50) ? -a : abs(a);
  }
  // Math functions take f32; an i32 operand is promoted by the builder.
  Op op = kMathOps[uniform(std::size(kMathOps))];
  return ir::build_unary(op, numeric(depth - 1));
}

Expr RandomExprGen::binary(ScalarType type, int depth) {
  if (type == ScalarType::Bool) {
    int r = uniform(100);
    if (r < 35) {
      return ir::build_binary(chance(50) ? Op::And : Op::Or, expr(ScalarType::Bool, depth - 1),
                              expr(ScalarType::Bool, depth - 1));
    }
    if (r < 45) {
      return ir::build_binary(chance(50) ? Op::EQ : Op::NE, expr(ScalarType::Bool, depth - 1),
                              expr(ScalarType::Bool, depth - 1));
    }
    Op op = kCompareOps[uniform(std::size(kCompareOps))];
    return ir::build_binary(op, numeric(depth - 1), numeric(depth - 1));
  }
  if (type == ScalarType::I32) {
    Op op = kArithOps[uniform(std::size(kArithOps))];
    return ir::build_binary(op, expr(ScalarType::I32, depth - 1), expr(ScalarType::I32, depth - 1));
  }
  // f32: at least one operand is f32 (the other may be i32 and get promoted); pow is f32 only
  // but accepts i32 operands through promotion.
  Op op = chance(10) ? Op::Pow : kArithOps[uniform(std::size(kArithOps))];
  Expr a = expr(ScalarType::F32, depth - 1);
  Expr b = numeric(depth - 1);
  if (chance(50)) std::swap(a, b);
  return ir::build_binary(op, std::move(a), std::move(b));
}

Expr RandomExprGen::select(ScalarType type, int depth) {
  Expr c = expr(ScalarType::Bool, depth - 1);
  Expr a = expr(type, depth - 1);
  // A numeric select may mix i32 and f32 branches when the result is f32.
  Expr b = type == ScalarType::F32 ? numeric(depth - 1) : expr(type, depth - 1);
  if (chance(50)) std::swap(a, b);
  return ir::build_select(std::move(c), std::move(a), std::move(b));
}

Expr RandomExprGen::cast(ScalarType type, int depth) {
  // float(i32 | bool) or int(f32 | bool).
  ScalarType from =
      chance(30) ? ScalarType::Bool : (type == ScalarType::F32 ? ScalarType::I32 : ScalarType::F32);
  return ir::build_cast(type, expr(from, depth - 1));
}

Expr RandomExprGen::expr(ScalarType type, int depth) {
  if (depth <= 0 || chance(15)) return leaf(type);
  int r = uniform(100);
  if (options_.allow_buffers && r < 12) return load(type, depth);
  if (r < 30) return unary(type, depth);
  if (r < 75) return binary(type, depth);
  if (r < 87) return select(type, depth);
  if (type == ScalarType::Bool) return binary(type, depth);  // no cast to bool exists
  return cast(type, depth);
}

Mods RandomExprGen::mods(int depth) {
  clear_used();
  int which = uniform(3);  // 0: score_mod only, 1: mask_mod only, 2: both
  Expr s, m;
  if (which != 1) s = expr(ScalarType::F32, depth);
  if (which != 0) {
    in_mask_ = true;
    m = expr(ScalarType::Bool, depth);
    in_mask_ = false;
  }
  ScoreModFn sf;
  MaskModFn mf;
  if (s.defined()) sf = [&](Expr, Expr, Expr, Expr, Expr) { return s; };
  if (m.defined()) mf = [&](Expr, Expr, Expr, Expr) { return m; };
  Mods mods = Mods::from(sf, mf);
  mods.name = "<random>";
  buffers_ = mods.buffers;
  params_ = mods.params;
  return mods;
}

}  // namespace flexjit::test
