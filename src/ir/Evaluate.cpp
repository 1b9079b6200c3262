#include "ir/Evaluate.h"

#include "ir/Printer.h"
#include "ir/Visitor.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <unordered_map>

namespace flexjit::ir {

namespace {

constexpr int32_t kIntMin = std::numeric_limits<int32_t>::min();
constexpr int32_t kIntMax = std::numeric_limits<int32_t>::max();

int32_t wrap(uint32_t v) {
  return static_cast<int32_t>(v);
}  // modular since C++20
uint32_t u(int32_t v) {
  return static_cast<uint32_t>(v);
}

int32_t floor_div(int32_t a, int32_t b) {
  if (b == 0) return 0;
  if (a == kIntMin && b == -1) return kIntMin;
  int32_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int32_t floor_mod(int32_t a, int32_t b) {
  if (b == 0 || b == -1) return 0;  // b == -1 also avoids INT_MIN % -1
  int32_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

float float_mod(float a, float b) {
  // Separate statements keep each step a float operation (no contraction into an fma).
  float q = floorf(a / b);
  float p = b * q;
  return a - p;
}

bool is_number(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

std::string Value::str() const {
  switch (type) {
    case ScalarType::Bool:
      return i ? "true" : "false";
    case ScalarType::I32:
      return fmt::format("{}", i);
    case ScalarType::F32:
      return float_literal(f);
  }
  FJ_ASSERT(false, "bad ScalarType");
}

bool identical(const Value& a, const Value& b) {
  if (a.type != b.type) return false;
  if (a.type != ScalarType::F32) return a.i == b.i;
  if (std::isnan(a.f) && std::isnan(b.f)) return true;
  return std::bit_cast<uint32_t>(a.f) == std::bit_cast<uint32_t>(b.f);
}

Expr make_const(const Value& v) {
  switch (v.type) {
    case ScalarType::Bool:
      return make_bool(v.i != 0);
    case ScalarType::I32:
      return make_int(v.i);
    case ScalarType::F32:
      return make_float(v.f);
  }
  FJ_ASSERT(false, "bad ScalarType");
}

bool const_value(const Expr& e, Value* out) {
  if (!e.defined()) return false;
  Value v;
  switch (e->op) {
    case Op::IntImm:
      v = Value::of_i32(static_cast<int32_t>(e->ival));
      break;
    case Op::BoolImm:
      v = Value::of_bool(e->ival != 0);
      break;
    case Op::FloatImm:
      v = Value::of_f32(static_cast<float>(e->fval));
      break;
    default:
      return false;
  }
  if (out) *out = v;
  return true;
}

Value apply_unary(Op op, const Value& a) {
  if (op == Op::Not) {
    FJ_ASSERT(a.type == ScalarType::Bool, "Not of non-bool");
    return Value::of_bool(!a.as_bool());
  }
  if (a.type == ScalarType::I32) {
    switch (op) {
      case Op::Neg:
        return Value::of_i32(wrap(0u - u(a.i)));
      case Op::Abs:
        return Value::of_i32(a.i < 0 ? wrap(0u - u(a.i)) : a.i);
      default:
        FJ_ASSERT(false, "math function of i32");
    }
  }
  FJ_ASSERT(a.type == ScalarType::F32, "unary op of bool");
  float x = a.f;
  switch (op) {
    case Op::Neg:
      return Value::of_f32(-x);
    case Op::Abs:
      return Value::of_f32(fabsf(x));
    case Op::Exp:
      return Value::of_f32(expf(x));
    case Op::Exp2:
      return Value::of_f32(exp2f(x));
    case Op::Log:
      return Value::of_f32(logf(x));
    case Op::Log2:
      return Value::of_f32(log2f(x));
    case Op::Tanh:
      return Value::of_f32(tanhf(x));
    case Op::Sigmoid: {
      float d = 1.0f + expf(-x);
      return Value::of_f32(1.0f / d);
    }
    case Op::Sqrt:
      return Value::of_f32(sqrtf(x));
    case Op::Rsqrt:
      return Value::of_f32(1.0f / sqrtf(x));
    case Op::Floor:
      return Value::of_f32(floorf(x));
    case Op::Ceil:
      return Value::of_f32(ceilf(x));
    default:
      break;
  }
  FJ_ASSERT(false, "apply_unary of a non-unary op");
}

Value apply_binary(Op op, const Value& a, const Value& b) {
  FJ_ASSERT(a.type == b.type, "binary op of mismatched value types");
  if (op == Op::And) return Value::of_bool(a.as_bool() && b.as_bool());
  if (op == Op::Or) return Value::of_bool(a.as_bool() || b.as_bool());
  if (a.type == ScalarType::Bool) {
    if (op == Op::EQ) return Value::of_bool(a.i == b.i);
    if (op == Op::NE) return Value::of_bool(a.i != b.i);
    FJ_ASSERT(false, "arithmetic or ordering on bool");
  }
  if (a.type == ScalarType::I32) {
    int32_t x = a.i, y = b.i;
    switch (op) {
      case Op::Add:
        return Value::of_i32(wrap(u(x) + u(y)));
      case Op::Sub:
        return Value::of_i32(wrap(u(x) - u(y)));
      case Op::Mul:
        return Value::of_i32(wrap(u(x) * u(y)));
      case Op::Div:
        return Value::of_i32(floor_div(x, y));
      case Op::Mod:
        return Value::of_i32(floor_mod(x, y));
      case Op::Min:
        return Value::of_i32(x < y ? x : y);
      case Op::Max:
        return Value::of_i32(x > y ? x : y);
      case Op::EQ:
        return Value::of_bool(x == y);
      case Op::NE:
        return Value::of_bool(x != y);
      case Op::LT:
        return Value::of_bool(x < y);
      case Op::LE:
        return Value::of_bool(x <= y);
      case Op::GT:
        return Value::of_bool(x > y);
      case Op::GE:
        return Value::of_bool(x >= y);
      default:
        FJ_ASSERT(false, "pow of i32");
    }
  }
  float x = a.f, y = b.f;
  switch (op) {
    case Op::Add:
      return Value::of_f32(x + y);
    case Op::Sub:
      return Value::of_f32(x - y);
    case Op::Mul:
      return Value::of_f32(x * y);
    case Op::Div:
      return Value::of_f32(x / y);
    case Op::Mod:
      return Value::of_f32(float_mod(x, y));
    case Op::Min:
      return Value::of_f32(fminf(x, y));
    case Op::Max:
      return Value::of_f32(fmaxf(x, y));
    case Op::Pow:
      return Value::of_f32(powf(x, y));
    case Op::EQ:
      return Value::of_bool(x == y);
    case Op::NE:
      return Value::of_bool(x != y);
    case Op::LT:
      return Value::of_bool(x < y);
    case Op::LE:
      return Value::of_bool(x <= y);
    case Op::GT:
      return Value::of_bool(x > y);
    case Op::GE:
      return Value::of_bool(x >= y);
    default:
      break;
  }
  FJ_ASSERT(false, "apply_binary of a non-binary op");
}

Value apply_cast(ScalarType to, const Value& a) {
  switch (to) {
    case ScalarType::F32:
      if (a.type == ScalarType::F32) return a;
      return Value::of_f32(static_cast<float>(a.i));  // bool is 0 / 1; i32 rounds to nearest
    case ScalarType::I32:
      if (a.type != ScalarType::F32) return Value::of_i32(a.i);
      if (std::isnan(a.f)) return Value::of_i32(0);
      if (a.f >= 2147483648.0f) return Value::of_i32(kIntMax);
      if (a.f <= -2147483648.0f) return Value::of_i32(kIntMin);
      return Value::of_i32(static_cast<int32_t>(a.f));  // truncates toward zero
    case ScalarType::Bool:
      break;
  }
  FJ_ASSERT(false, "cast to bool");
}

float f16_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float mag = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal, exact
    return std::bit_cast<float>(std::bit_cast<uint32_t>(mag) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t float_to_f16_bits(float v) {
  // Round to nearest even (F. Giesen's float_to_half_fast3_rtne).
  uint32_t x = std::bit_cast<uint32_t>(v);
  uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint32_t o;
  if (x >= (143u << 23)) {  // 65536.0 and above, inf, NaN
    o = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (x < (113u << 23)) {  // the result is a subnormal or zero: let the FPU round
    const uint32_t magic = 126u << 23;
    float f = std::bit_cast<float>(x) + std::bit_cast<float>(magic);
    o = std::bit_cast<uint32_t>(f) - magic;
  } else {
    uint32_t mant_odd = (x >> 13) & 1u;
    x += (0u - (112u << 23)) + 0xfffu;
    x += mant_odd;
    o = x >> 13;
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

float bf16_bits_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t float_to_bf16_bits(float v) {
  uint32_t x = std::bit_cast<uint32_t>(v);
  if (std::isnan(v)) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float e4m3_bits_to_float(uint8_t bits) {
  const int sign = bits >> 7, exp = (bits >> 3) & 0xf, mant = bits & 0x7;
  float v;
  if (exp == 0xf && mant == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant * 2^-6 / 8
  } else {
    v = std::ldexp(static_cast<float>(mant + 8), exp - 10);  // (1 + mant/8) * 2^(exp-7)
  }
  return sign ? -v : v;
}

uint8_t float_to_e4m3_bits(float v) {
  if (std::isnan(v)) return 0x7f;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const float a = std::fabs(v);
  if (a >= 448.0f) return sign | 0x7e;  // saturate (448 = 0x7e)
  // Smallest normal is 2^-6; below it the spacing is 2^-9 (subnormals).
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the leading bit is 2^(e-1)
  const int exp = std::max(e - 1, -6);
  const float ulp = std::ldexp(1.0f, exp - 3);
  const float q = std::nearbyint(a / ulp) * ulp;  // round half to even (default rounding mode)
  if (q >= 448.0f) return sign | 0x7e;
  if (q == 0.0f) return sign;
  int qe;
  const float qm = std::frexp(q, &qe);
  if (qe - 1 < -6) return sign | static_cast<uint8_t>(std::lround(q / std::ldexp(1.0f, -9)));
  const int mant = static_cast<int>(std::lround((qm * 2.0f - 1.0f) * 8.0f));
  return sign | static_cast<uint8_t>(((qe - 1 + 7) << 3) | mant);
}

Evaluator::Evaluator(const Expr& e) : expr_(e) {
  FJ_ASSERT(e.defined(), "evaluate of an undefined expression");
  std::unordered_map<const Node*, int> index;
  for_each_node(e, [&](const Expr& n) {
    Instr ins{n.get(), {}};
    for (const auto& a : n->args)
      ins.args.push_back(index.at(a.get()));
    index.emplace(n.get(), static_cast<int>(code_.size()));
    code_.push_back(std::move(ins));
  });
  values_.resize(code_.size());
  stamp_.assign(code_.size(), 0);
}

Value Evaluator::param(const ParamDecl& p, const EvalEnv& env) const {
  auto it = env.params.find(p.name);
  double v;
  if (it != env.params.end()) {
    v = it->second;
  } else if (p.default_value) {
    v = *p.default_value;
  } else {
    throw RuntimeError(fmt::format("no value for param '{}' ({}) and it has no default", p.name,
                                   to_string(p.type)));
  }
  switch (p.type) {
    case ScalarType::F32:
      return Value::of_f32(static_cast<float>(v));
    case ScalarType::I32:
      if (!(v == std::floor(v) && v >= kIntMin && v <= kIntMax)) {
        throw RuntimeError(fmt::format("param '{}' is i32 but its value {} is not", p.name, v));
      }
      return Value::of_i32(static_cast<int32_t>(v));
    case ScalarType::Bool:
      if (v != 0.0 && v != 1.0) {
        throw RuntimeError(fmt::format("param '{}' is bool but its value is {}", p.name, v));
      }
      return Value::of_bool(v != 0.0);
  }
  FJ_ASSERT(false, "bad ScalarType");
}

void Evaluator::check_buffer(const BufferDecl& decl, const BufferView& view) const {
  if (view.data == nullptr) {
    throw RuntimeError(fmt::format("buffer '{}' is bound to a null pointer", decl.name));
  }
  if (view.dtype != decl.dtype) {
    throw RuntimeError(fmt::format("buffer '{}' is declared {} but bound to {} data", decl.name,
                                   to_string(decl.dtype), to_string(view.dtype)));
  }
  if (static_cast<int>(view.shape.size()) != decl.rank() ||
      (!view.strides.empty() && view.strides.size() != view.shape.size())) {
    throw RuntimeError(fmt::format("buffer '{}' has {} dims but is bound to a tensor of {}",
                                   decl.name, decl.rank(), view.shape.size()));
  }
  for (int d = 0; d < decl.rank(); ++d) {
    if (is_number(decl.dims[d]) && std::to_string(view.shape[d]) != decl.dims[d]) {
      throw RuntimeError(fmt::format("buffer '{}' dim {} is declared {} but bound with extent {}",
                                     decl.name, d, decl.dims[d], view.shape[d]));
    }
  }
}

Value Evaluator::load(const Node& n, const std::vector<Value>& idx, const EvalEnv& env) const {
  const BufferDecl& decl = *n.buffer;
  auto it = env.buffers.find(decl.name);
  if (it == env.buffers.end()) {
    throw RuntimeError(fmt::format("no data bound to buffer '{}'", decl.name));
  }
  const BufferView& view = it->second;
  check_buffer(decl, view);
  int64_t offset = 0;
  int64_t stride = 1;
  for (int d = decl.rank() - 1; d >= 0; --d) {
    int64_t i = idx[d].i;
    if (i < 0 || i >= view.shape[d]) {
      std::string at;
      for (const auto& v : idx)
        at += fmt::format("[{}]", v.i);
      throw RuntimeError(
          fmt::format("buffer '{}': index {} is out of bounds for dim {} of extent {} (at {}{})",
                      decl.name, i, d, view.shape[d], decl.name, at));
    }
    int64_t s = view.strides.empty() ? stride : view.strides[d];
    offset += i * s;
    stride *= view.shape[d];
  }
  switch (decl.dtype) {
    case DType::F32:
      return Value::of_f32(static_cast<const float*>(view.data)[offset]);
    case DType::F16:
      return Value::of_f32(f16_bits_to_float(static_cast<const uint16_t*>(view.data)[offset]));
    case DType::BF16:
      return Value::of_f32(bf16_bits_to_float(static_cast<const uint16_t*>(view.data)[offset]));
    case DType::I32:
      return Value::of_i32(static_cast<const int32_t*>(view.data)[offset]);
    case DType::Bool:
      return Value::of_bool(static_cast<const uint8_t*>(view.data)[offset] != 0);
    case DType::E4M3:
      return Value::of_f32(e4m3_bits_to_float(static_cast<const uint8_t*>(view.data)[offset]));
  }
  FJ_ASSERT(false, "bad DType");
}

Value Evaluator::run(const EvalEnv& env) {
  if (++generation_ == 0) {
    stamp_.assign(stamp_.size(), 0);
    generation_ = 1;
  }
  auto ready = [&](int i) { return stamp_[i] == generation_; };
  auto set = [&](int i, Value v) {
    values_[i] = v;
    stamp_[i] = generation_;
  };
  // Iterative, so that deep expressions cannot overflow the stack. A frame's state counts the
  // steps already taken; Select / And / Or pick the operand to evaluate next lazily.
  struct Frame {
    int idx;
    int state;
  };
  std::vector<Frame> stack{{static_cast<int>(code_.size()) - 1, 0}};
  std::vector<Value> idx;
  while (!stack.empty()) {
    int i = stack.back().idx;
    int state = stack.back().state;
    if (ready(i)) {
      stack.pop_back();
      continue;
    }
    const Instr& ins = code_[i];
    const Node& n = *ins.node;
    const std::vector<int>& a = ins.args;
    if (n.op == Op::Select || n.op == Op::And || n.op == Op::Or) {
      if (state == 0) {
        stack.back().state = 1;
        stack.push_back({a[0], 0});
        continue;
      }
      bool c = values_[a[0]].as_bool();
      int next;
      if (n.op == Op::Select) {
        next = c ? a[1] : a[2];
      } else if ((n.op == Op::And && !c) || (n.op == Op::Or && c)) {
        set(i, Value::of_bool(c));
        continue;
      } else {
        next = a[1];
      }
      if (state == 1) {
        stack.back().state = 2;
        stack.push_back({next, 0});
        continue;
      }
      set(i, values_[next]);
      continue;
    }
    if (state == 0 && !a.empty()) {
      stack.back().state = 1;
      for (auto it = a.rbegin(); it != a.rend(); ++it) {
        if (!ready(*it)) stack.push_back({*it, 0});
      }
      continue;
    }
    switch (n.op) {
      case Op::IntImm:
      case Op::FloatImm:
      case Op::BoolImm: {
        Value v;
        if (n.op == Op::IntImm)
          v = Value::of_i32(static_cast<int32_t>(n.ival));
        else if (n.op == Op::BoolImm)
          v = Value::of_bool(n.ival != 0);
        else
          v = Value::of_f32(static_cast<float>(n.fval));
        set(i, v);
        break;
      }
      case Op::Var:
        switch (n.var) {
          case VarKind::Score:
            set(i, Value::of_f32(env.score));
            break;
          case VarKind::B:
            set(i, Value::of_i32(env.b));
            break;
          case VarKind::H:
            set(i, Value::of_i32(env.h));
            break;
          case VarKind::QIdx:
            set(i, Value::of_i32(env.q_idx));
            break;
          case VarKind::KvIdx:
            set(i, Value::of_i32(env.kv_idx));
            break;
        }
        break;
      case Op::Param:
        set(i, param(*n.param, env));
        break;
      case Op::Load:
        idx.clear();
        for (int j : a)
          idx.push_back(values_[j]);
        set(i, load(n, idx, env));
        break;
      case Op::Cast:
        set(i, apply_cast(n.type, values_[a[0]]));
        break;
      default:
        if (is_unary(n.op)) {
          set(i, apply_unary(n.op, values_[a[0]]));
        } else {
          FJ_ASSERT(is_binary(n.op), "evaluate: unknown node");
          set(i, apply_binary(n.op, values_[a[0]], values_[a[1]]));
        }
        break;
    }
  }
  return values_.back();
}

Value evaluate(const Expr& e, const EvalEnv& env) {
  return Evaluator(e).run(env);
}

ModsValue evaluate_mods(const Mods& mods, const EvalEnv& env) {
  ModsValue r{env.score, true};
  if (mods.score_mod.defined()) r.score = evaluate(mods.score_mod, env).f;
  if (mods.mask_mod.defined()) r.keep = evaluate(mods.mask_mod, env).as_bool();
  return r;
}

}  // namespace flexjit::ir
