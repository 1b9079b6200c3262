// The reference interpreter pins the language's semantics (src/ir/Evaluate.h); each case here
// is one row of the semantics table in docs/passes.md.
#include <flexjit/dsl.h>
#include <flexjit/mods.h>

#include "ir/Evaluate.h"
#include "ir/IR.h"

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <limits>

using namespace flexjit;
using ir::EvalEnv;
using ir::evaluate;
using ir::Value;

namespace {

constexpr int32_t kIntMin = std::numeric_limits<int32_t>::min();
constexpr int32_t kIntMax = std::numeric_limits<int32_t>::max();
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

EvalEnv env_qk(int32_t q, int32_t kv) {
  EvalEnv env;
  env.q_idx = q;
  env.kv_idx = kv;
  return env;
}

int32_t eval_i(const Expr& e, const EvalEnv& env = {}) {
  Value v = evaluate(e, env);
  REQUIRE(v.type == ScalarType::I32);
  return v.i;
}

float eval_f(const Expr& e, const EvalEnv& env = {}) {
  Value v = evaluate(e, env);
  REQUIRE(v.type == ScalarType::F32);
  return v.f;
}

bool eval_b(const Expr& e, const EvalEnv& env = {}) {
  Value v = evaluate(e, env);
  REQUIRE(v.type == ScalarType::Bool);
  return v.as_bool();
}

}  // namespace

TEST_CASE("i32 division is floor division, modulo follows the divisor's sign", "[passes][eval]") {
  Expr q = q_idx(), kv = kv_idx();
  struct Case {
    int32_t a, b, div, mod;
  };
  const Case cases[] = {
      {7, 2, 3, 1},
      {-7, 2, -4, 1},
      {7, -2, -4, -1},
      {-7, -2, 3, -1},
      {6, 3, 2, 0},
      {-6, 3, -2, 0},
      {5, 0, 0, 0},
      {-5, 0, 0, 0},
      {kIntMin, -1, kIntMin, 0},
      {kIntMin, 1, kIntMin, 0},
      {kIntMax, -1, -kIntMax, 0},
      {kIntMin, 2, kIntMin / 2, 0},
      {-1, kIntMin, 0, -1},
      {1, kIntMin, -1, kIntMin + 1},
  };
  for (const Case& c : cases) {
    INFO(c.a << " / " << c.b);
    CHECK(eval_i(q / kv, env_qk(c.a, c.b)) == c.div);
    CHECK(eval_i(q % kv, env_qk(c.a, c.b)) == c.mod);
  }
}

TEST_CASE("i32 + - * and negation wrap mod 2^32, abs(INT_MIN) wraps", "[passes][eval]") {
  Expr q = q_idx(), kv = kv_idx();
  CHECK(eval_i(q + kv, env_qk(kIntMax, 1)) == kIntMin);
  CHECK(eval_i(q - kv, env_qk(kIntMin, 1)) == kIntMax);
  CHECK(eval_i(q * kv, env_qk(65536, 65536)) == 0);
  CHECK(eval_i(q * kv, env_qk(kIntMax, 2)) == -2);
  CHECK(eval_i(-q, env_qk(kIntMin, 0)) == kIntMin);
  CHECK(eval_i(abs(q), env_qk(kIntMin, 0)) == kIntMin);
  CHECK(eval_i(abs(q), env_qk(-5, 0)) == 5);
  CHECK(eval_i(min(q, kv), env_qk(-3, 2)) == -3);
  CHECK(eval_i(max(q, kv), env_qk(-3, 2)) == 2);
}

TEST_CASE("int(x) truncates toward zero, saturates and maps NaN to 0", "[passes][eval]") {
  auto as_int = [](float f) {
    EvalEnv env;
    env.score = f;
    return eval_i(to_int(score()), env);
  };
  CHECK(as_int(2.9f) == 2);
  CHECK(as_int(-2.9f) == -2);
  CHECK(as_int(3e9f) == kIntMax);
  CHECK(as_int(-3e9f) == kIntMin);
  CHECK(as_int(kInf) == kIntMax);
  CHECK(as_int(-kInf) == kIntMin);
  CHECK(as_int(kNaN) == 0);
  CHECK(as_int(2147483520.0f) == 2147483520);  // the largest float below 2^31
  CHECK(eval_f(to_float(q_idx() >= kv_idx()), env_qk(3, 1)) == 1.0f);
  CHECK(eval_i(to_int(q_idx() >= kv_idx()), env_qk(1, 3)) == 0);
  // i32 -> f32 rounds to nearest: 2^24 + 1 is not representable.
  CHECK(eval_f(to_float(q_idx()), env_qk(16777217, 0)) == 16777216.0f);
}

TEST_CASE("f32 arithmetic is float precision, % is a - b*floor(a/b)", "[passes][eval]") {
  EvalEnv env;
  env.score = 0.1f;
  // In double, 0.1f + 0.2f rounds differently from float addition.
  CHECK(eval_f(score() + Expr(0.2f), env) == 0.1f + 0.2f);
  CHECK(eval_f(score() / Expr(0.0f), env) == kInf);
  env.score = -7.5f;
  CHECK(eval_f(score() % Expr(2.0f), env) == 0.5f);
  CHECK(eval_f(score() % Expr(-2.0f), env) == -1.5f);
  env.score = 7.5f;
  CHECK(eval_f(score() % Expr(-2.0f), env) == -0.5f);
  CHECK(std::isnan(eval_f(score() % Expr(0.0f), env)));
  env.score = kNaN;
  CHECK(eval_f(min(score(), Expr(3.0f)), env) == 3.0f);  // fminf: NaN yields the other operand
  CHECK(eval_f(max(Expr(3.0f), score()), env) == 3.0f);
  CHECK_FALSE(eval_b(score() == score(), env));
  CHECK(eval_b(score() != score(), env));
}

TEST_CASE("math functions follow their float definitions", "[passes][eval]") {
  EvalEnv env;
  env.score = 2.0f;
  CHECK(eval_f(sigmoid(score()), env) == 1.0f / (1.0f + expf(-2.0f)));
  CHECK(eval_f(rsqrt(score()), env) == 1.0f / sqrtf(2.0f));
  CHECK(eval_f(exp2(score()), env) == 4.0f);
  CHECK(eval_f(log2(score()), env) == 1.0f);
  CHECK(eval_f(pow(score(), Expr(10.0f)), env) == 1024.0f);
  CHECK(eval_f(tanh(score()), env) == tanhf(2.0f));
  env.score = -2.5f;
  CHECK(eval_f(floor(score()), env) == -3.0f);
  CHECK(eval_f(ceil(score()), env) == -2.0f);
  CHECK(eval_f(abs(score()), env) == 2.5f);
  CHECK(std::isnan(eval_f(sqrt(score()), env)));
}

TEST_CASE("where, && and || evaluate only what they select", "[passes][eval]") {
  Buffer doc("doc", DType::I32, {"4"});
  int32_t data[4] = {10, 11, 12, 13};
  EvalEnv env = env_qk(2, 9);
  env.buffers["doc"] = ir::BufferView{data, DType::I32, {4}, {}};
  Expr in_range = kv_idx() < 4;
  CHECK(eval_i(where(in_range, doc[kv_idx()], Expr(-1)), env) == -1);
  CHECK_FALSE(eval_b(in_range && doc[kv_idx()] == 3, env));
  CHECK(eval_b(!in_range || doc[kv_idx()] == 3, env));
  CHECK(eval_i(doc[q_idx()], env) == 12);
  // Without the guard the load is out of bounds: an error naming the buffer and index.
  CHECK_THROWS_AS(evaluate(doc[kv_idx()], env), RuntimeError);
  CHECK_THROWS_WITH(evaluate(doc[kv_idx()], env), Catch::Contains("buffer 'doc'") &&
                                                      Catch::Contains("index 9") &&
                                                      Catch::Contains("doc[9]"));
  CHECK_THROWS_WITH(evaluate(doc[q_idx() - 3], env), Catch::Contains("index -1"));
}

TEST_CASE("buffers: strides, dtypes, and binding errors", "[passes][eval]") {
  Buffer bias("bias", DType::F32, {"H", "S"});
  // A 3x4 view of a 3x8 array (row stride 8).
  float data[24];
  for (int i = 0; i < 24; ++i)
    data[i] = static_cast<float>(i);
  EvalEnv env;
  env.buffers["bias"] = ir::BufferView{data, DType::F32, {3, 4}, {8, 1}};
  env.h = 2;
  env.kv_idx = 3;
  CHECK(eval_f(bias[h_idx()][kv_idx()], env) == 19.0f);
  env.buffers["bias"].strides = {};
  CHECK(eval_f(bias[h_idx()][kv_idx()], env) == 11.0f);
  env.buffers["bias"].dtype = DType::F16;
  CHECK_THROWS_WITH(evaluate(bias[h_idx()][kv_idx()], env),
                    Catch::Contains("'bias' is declared f32 but bound to f16"));
  env.buffers["bias"] = ir::BufferView{data, DType::F32, {24}, {}};
  CHECK_THROWS_WITH(evaluate(bias[h_idx()][kv_idx()], env), Catch::Contains("has 2 dims"));
  env.buffers.clear();
  CHECK_THROWS_WITH(evaluate(bias[h_idx()][kv_idx()], env),
                    Catch::Contains("no data bound to buffer 'bias'"));

  Buffer halves("halves", DType::F16, {"2"});
  Buffer brains("brains", DType::BF16, {"2"});
  Buffer flags("flags", DType::Bool, {"2"});
  uint16_t h16[2] = {0x3c00, 0xc500};  // 1.0, -5.0
  uint16_t b16[2] = {0x3f80, 0x4049};  // 1.0, 3.140625
  uint8_t fl[2] = {0, 7};
  env.buffers["halves"] = ir::BufferView{h16, DType::F16, {2}, {}};
  env.buffers["brains"] = ir::BufferView{b16, DType::BF16, {2}, {}};
  env.buffers["flags"] = ir::BufferView{fl, DType::Bool, {2}, {}};
  env.kv_idx = 1;
  CHECK(eval_f(halves[kv_idx()], env) == -5.0f);
  CHECK(eval_f(brains[kv_idx()], env) == 3.140625f);
  CHECK(eval_b(flags[kv_idx()], env));
  CHECK_FALSE(eval_b(flags[kv_idx() - 1], env));
  // A numeric extent in the declaration must match the bound tensor.
  env.buffers["halves"].shape = {3};
  CHECK_THROWS_WITH(evaluate(halves[kv_idx()], env), Catch::Contains("declared 2"));
}

TEST_CASE("f16 and bf16 conversions round to nearest even and round-trip", "[passes][eval]") {
  int failures = 0;
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    float f = ir::f16_bits_to_float(static_cast<uint16_t>(bits));
    if (std::isnan(f)) {
      failures += !std::isnan(ir::f16_bits_to_float(ir::float_to_f16_bits(f)));
      continue;
    }
    failures += ir::float_to_f16_bits(f) != bits;
    float g = ir::bf16_bits_to_float(static_cast<uint16_t>(bits));
    if (!std::isnan(g)) failures += ir::float_to_bf16_bits(g) != bits;
  }
  CHECK(failures == 0);
  CHECK(ir::f16_bits_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(ir::f16_bits_to_float(0x7bff) == 65504.0f);
  CHECK(ir::float_to_f16_bits(65520.0f) == 0x7c00);  // rounds up to inf
  CHECK(ir::float_to_f16_bits(65519.0f) == 0x7bff);
  CHECK(ir::float_to_f16_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie to even
  CHECK(ir::float_to_f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  CHECK(ir::float_to_f16_bits(std::ldexp(1.0f, -25)) == 0x0000);  // tie to even (zero)
  CHECK(ir::float_to_f16_bits(std::ldexp(3.0f, -26)) == 0x0001);
  CHECK(ir::float_to_f16_bits(-0.0f) == 0x8000);
  CHECK(ir::float_to_bf16_bits(1.00390625f) == 0x3f80);  // 1 + 2^-8: tie to even
  CHECK(ir::float_to_bf16_bits(1.01171875f) == 0x3f82);  // 1 + 3*2^-8: tie to even (up)
  CHECK(std::isnan(ir::bf16_bits_to_float(ir::float_to_bf16_bits(kNaN))));
}

TEST_CASE("params: value by name, else the default, else an error", "[passes][eval]") {
  Param cap("cap", ScalarType::F32, 30.0);
  Param window("window", ScalarType::I32);
  EvalEnv env;
  env.score = 60.0f;
  CHECK(eval_f(score() / cap, env) == 2.0f);
  env.params["cap"] = 10.0;
  CHECK(eval_f(score() / cap, env) == 6.0f);
  CHECK_THROWS_WITH(evaluate(q_idx() - kv_idx() <= window, env),
                    Catch::Contains("no value for param 'window'"));
  env.params["window"] = 2.5;
  CHECK_THROWS_WITH(evaluate(q_idx() - kv_idx() <= window, env),
                    Catch::Contains("'window' is i32"));
  env.params["window"] = 4;
  env.q_idx = 9;
  env.kv_idx = 5;
  CHECK(eval_b(q_idx() - kv_idx() <= window, env));
}

TEST_CASE("evaluate_mods: undefined mods are identity and keep-all", "[passes][eval]") {
  Mods causal = Mods::from_mask([](Expr, Expr, Expr q, Expr kv) { return q >= kv; });
  EvalEnv env = env_qk(3, 5);
  env.score = 1.5f;
  ir::ModsValue v = ir::evaluate_mods(causal, env);
  CHECK(v.score == 1.5f);
  CHECK_FALSE(v.keep);
  Mods softcap = Mods::from([](Expr s, Expr, Expr, Expr, Expr) { return s * 2.0f; });
  v = ir::evaluate_mods(softcap, env);
  CHECK(v.score == 3.0f);
  CHECK(v.keep);
}

TEST_CASE("shared sub-expressions are evaluated once; deep chains do not overflow",
          "[passes][eval]") {
  // 2^60 tree nodes, 61 distinct ones: only memoised evaluation finishes.
  Expr e = q_idx();
  for (int i = 0; i < 60; ++i)
    e = e + e;
  CHECK(eval_i(e, env_qk(1, 0)) == 0);  // 2^60 wraps to 0
  Expr f = q_idx();
  for (int i = 0; i < 30; ++i)
    f = f + f;
  CHECK(eval_i(f, env_qk(3, 0)) == static_cast<int32_t>(3u << 30));
  // A long chain is evaluated iteratively. (Longer chains overflow in ~Node, which destroys
  // its children recursively; see the report to the lead.)
  Expr chain = kv_idx();
  for (int i = 0; i < 20000; ++i)
    chain = chain + 1;
  ir::Evaluator ev(chain);
  CHECK(ev.run(env_qk(0, 5)).i == 20005);
  CHECK(ev.run(env_qk(0, -5)).i == 19995);  // reusable across environments
}
