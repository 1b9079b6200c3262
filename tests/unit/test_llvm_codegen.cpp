// The LLVM CPU backend's mod functions against the reference interpreter (ir/Evaluate.h), bit
// for bit, on random mods and environments; plus the JIT cache and the load-safety guarantee.
#include <catch2/catch.hpp>

#include <flexjit/mods.h>

#include "codegen/llvm/CpuModParams.h"
#include "codegen/llvm/LlvmCodegen.h"
#include "codegen/llvm/OrcJit.h"
#include "ir/Evaluate.h"
#include "ir/Printer.h"
#include "ir/Visitor.h"
#include "support/HostBindings.h"
#include "support/PassesEnv.h"
#include "support/RandomExpr.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

using namespace flexjit;

namespace {

using llvmjit::CpuModFunctions;

// The interpreter's value, or nullopt where it throws (an out-of-bounds load: the JIT clamps).
std::optional<ir::Value> interpret(ir::Evaluator& ev, const ir::EvalEnv& env) {
  try {
    return ev.run(env);
  } catch (const RuntimeError&) {
    return std::nullopt;
  }
}

std::string describe(const Mods& m, const ir::EvalEnv& env) {
  return fmt::format("{}\nat score={} b={} h={} q={} kv={}", m.to_text(), env.score, env.b, env.h,
                     env.q_idx, env.kv_idx);
}

// Which (op, operand type) pairs a test has compared, to check every node kind was exercised.
std::string coverage_key(const Expr& n) {
  const ScalarType t = n->args.empty() ? n->type : n->args[0]->type;
  return fmt::format("{}:{}", ir::op_name(n->op), to_string(t));
}

}  // namespace

TEST_CASE("JIT'ed mods equal the interpreter bit for bit on random mods", "[llvm]") {
  std::set<std::string> covered;
  int compared = 0;
  for (uint64_t seed = 1; seed <= 250; ++seed) {
    test::RandomExprGen gen(seed);
    Mods mods = gen.mods(4);
    test::PassesEnv envs(gen, seed * 7919);
    const CpuModFunctions fns = llvmjit::compile_cpu_mods(mods);
    std::optional<ir::Evaluator> score_ev, mask_ev;
    if (mods.score_mod.defined()) score_ev.emplace(mods.score_mod);
    if (mods.mask_mod.defined()) mask_ev.emplace(mods.mask_mod);
    bool any = false;
    for (int trial = 0; trial < 24; ++trial) {
      const ir::EvalEnv& env = envs.next();
      const std::vector<uint64_t> params =
          llvmjit::pack_cpu_mod_params(mods, test::host_bindings(mods, env));
      if (score_ev) {
        auto want = interpret(*score_ev, env);
        if (want) {
          const float got =
              fns.score(params.data(), env.score, env.b, env.h, env.q_idx, env.kv_idx);
          INFO(describe(mods, env)
               << "\ninterpreter " << want->str() << " jit " << ir::Value::of_f32(got).str());
          REQUIRE(ir::identical(*want, ir::Value::of_f32(got)));
          ++compared;
          any = true;
        }
      } else {
        // No score_mod: the identity.
        const float got = fns.score(params.data(), env.score, env.b, env.h, env.q_idx, env.kv_idx);
        REQUIRE(ir::identical(ir::Value::of_f32(env.score), ir::Value::of_f32(got)));
      }
      if (mask_ev) {
        auto want = interpret(*mask_ev, env);
        if (want) {
          const int got = fns.mask(params.data(), env.b, env.h, env.q_idx, env.kv_idx);
          INFO(describe(mods, env) << "\ninterpreter " << want->str() << " jit " << got);
          REQUIRE(want->as_bool() == (got != 0));
          ++compared;
          any = true;
        }
      } else {
        REQUIRE(fns.mask(params.data(), env.b, env.h, env.q_idx, env.kv_idx) == 1);
      }
    }
    if (any) {
      for (const Expr& root : {mods.score_mod, mods.mask_mod}) {
        if (root.defined())
          ir::for_each_node(root, [&](const Expr& n) { covered.insert(coverage_key(n)); });
      }
    }
  }
  INFO("compared " << compared << " evaluations");
  REQUIRE(compared >= 3000);
  // Every node kind, and the arithmetic ops on both i32 and f32, was compared at least once.
  std::vector<std::string> required = {
      "IntImm:i32",  "FloatImm:f32", "BoolImm:bool", "Var:f32",  "Var:i32",  "Param:f32",
      "Param:i32",   "Param:bool",   "Load:i32",     "Cast:i32", "Cast:f32", "Cast:bool",
      "Select:bool", "Not:bool",     "And:bool",     "Or:bool",  "EQ:bool",  "NE:bool"};
  for (const char* op : {"Neg", "Abs", "Add", "Sub", "Mul", "Div", "Mod", "Min", "Max", "EQ", "NE",
                         "LT", "LE", "GT", "GE"}) {
    required.push_back(fmt::format("{}:i32", op));
    required.push_back(fmt::format("{}:f32", op));
  }
  for (const char* op :
       {"Exp", "Exp2", "Log", "Log2", "Tanh", "Sigmoid", "Sqrt", "Rsqrt", "Floor", "Ceil", "Pow"}) {
    required.push_back(fmt::format("{}:f32", op));
  }
  for (const std::string& k : required) {
    INFO("node kind never compared: " << k);
    CHECK(covered.count(k) == 1);
  }
}

TEST_CASE("JIT'ed row and tile functions equal per-element interpretation", "[llvm]") {
  for (uint64_t seed = 300; seed < 380; ++seed) {
    test::RandomExprGen gen(seed);
    Mods mods = gen.mods(3);
    test::PassesEnv envs(gen, seed);
    const CpuModFunctions fns = llvmjit::compile_cpu_mods(mods);
    ir::EvalEnv env = envs.next();
    env.q_idx = static_cast<int32_t>(seed % 16);
    const std::vector<uint64_t> params =
        llvmjit::pack_cpu_mod_params(mods, test::host_bindings(mods, env));
    const int n = 1 + static_cast<int>(seed % 37);
    const int kv0 = static_cast<int>(seed % 5) - 2;
    std::vector<float> row(static_cast<size_t>(n)), row_nomask(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i)
      row[static_cast<size_t>(i)] = row_nomask[static_cast<size_t>(i)] = envs.random_float();
    std::vector<float> input = row;
    std::vector<uint8_t> keep(static_cast<size_t>(n));
    fns.score_row(params.data(), row.data(), env.b, env.h, env.q_idx, kv0, n);
    fns.score_row_nomask(params.data(), row_nomask.data(), env.b, env.h, env.q_idx, kv0, n);
    fns.mask_row(params.data(), keep.data(), env.b, env.h, env.q_idx, kv0, n);
    for (int i = 0; i < n; ++i) {
      ir::EvalEnv e = env;
      e.kv_idx = kv0 + i;
      e.score = input[static_cast<size_t>(i)];
      ir::ModsValue want;
      try {
        want = ir::evaluate_mods(mods, e);
      } catch (const RuntimeError&) {
        continue;
      }
      INFO(describe(mods, e));
      const float masked = want.keep ? want.score : -std::numeric_limits<float>::infinity();
      REQUIRE(
          ir::identical(ir::Value::of_f32(masked), ir::Value::of_f32(row[static_cast<size_t>(i)])));
      REQUIRE(ir::identical(ir::Value::of_f32(want.score),
                            ir::Value::of_f32(row_nomask[static_cast<size_t>(i)])));
      REQUIRE((keep[static_cast<size_t>(i)] != 0) == want.keep);
    }
  }
}

TEST_CASE("integer division and modulo edge cases match the interpreter", "[llvm]") {
  Mods mods = parse_mods(
      "param a: i32 = 0\nparam d: i32 = 0\n"
      "score_mod = float(a / d) * 1000.0 + float(a % d) + float(-a) + float(abs(a))");
  const CpuModFunctions fns = llvmjit::compile_cpu_mods(mods);
  const int32_t kMin = std::numeric_limits<int32_t>::min(),
                kMax = std::numeric_limits<int32_t>::max();
  const std::vector<int32_t> values = {kMin, kMin + 1, -7, -3, -1, 0, 1, 3, 7, kMax - 1, kMax};
  ir::Evaluator ev(mods.score_mod);
  for (int32_t a : values) {
    for (int32_t d : values) {
      ir::EvalEnv env;
      env.params = {{"a", a}, {"d", d}};
      const auto params = llvmjit::pack_cpu_mod_params(mods, test::host_bindings(mods, env));
      const float got = fns.score(params.data(), 0.0f, 0, 0, 0, 0);
      INFO("a=" << a << " d=" << d);
      REQUIRE(ir::identical(ev.run(env), ir::Value::of_f32(got)));
    }
  }
}

TEST_CASE("float min/max, casts and comparisons match on special values", "[llvm]") {
  Mods mods = parse_mods(
      "param x: f32 = 0\nparam y: f32 = 0\n"
      "score_mod = where(x < y || x != y, min(x, y), max(x, y)) + float(int(x)) * 0.0 + "
      "float(x % y >= 0.0)");
  const CpuModFunctions fns = llvmjit::compile_cpu_mods(mods);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> values = {
      0.0f,  -0.0f, 1.0f, -1.5f, 3e9f,
      -3e9f, inf,   -inf, nan,   std::numeric_limits<float>::denorm_min()};
  ir::Evaluator ev(mods.score_mod);
  for (float x : values) {
    for (float y : values) {
      ir::EvalEnv env;
      env.params = {{"x", x}, {"y", y}};
      const auto params = llvmjit::pack_cpu_mod_params(mods, test::host_bindings(mods, env));
      const float got = fns.score(params.data(), 0.0f, 0, 0, 0, 0);
      INFO("x=" << x << " y=" << y);
      REQUIRE(ir::identical(ev.run(env), ir::Value::of_f32(got)));
    }
  }
}

TEST_CASE("an out-of-bounds load in an unselected branch does not fault", "[llvm]") {
  Mods mods = parse_mods(
      "buffer bias: f32[4]\n"
      "score_mod = where(kv_idx >= 0 && kv_idx < 4, score + bias[kv_idx], score)\n"
      "mask_mod = kv_idx < 4 || bias[kv_idx - 1000000] > 0.0");
  const CpuModFunctions fns = llvmjit::compile_cpu_mods(mods);
  std::vector<float> bias = {1.0f, 2.0f, 3.0f, 4.0f};
  ir::EvalEnv env;
  env.buffers["bias"] = ir::BufferView{bias.data(), DType::F32, {4}, {}};
  const auto params = llvmjit::pack_cpu_mod_params(mods, test::host_bindings(mods, env));
  ir::Evaluator ev(mods.score_mod);
  for (int32_t kv : {-2000000000, -1, 0, 3, 4, 100000, 2000000000}) {
    env.kv_idx = kv;
    env.score = 0.5f;
    INFO("kv=" << kv);
    REQUIRE(
        ir::identical(ev.run(env), ir::Value::of_f32(fns.score(params.data(), 0.5f, 0, 0, 0, kv))));
  }
  REQUIRE(fns.mask(params.data(), 0, 0, 0, 2) == 1);
  // kv_idx >= 4 selects the load at kv_idx - 1000000: out of bounds, clamped to bias[0] = 1 > 0.
  REQUIRE(fns.mask(params.data(), 0, 0, 0, 10) == 1);
}

TEST_CASE("f16, bf16, bool and strided buffers load as the interpreter's", "[llvm]") {
  Mods mods = parse_mods(
      "buffer hb: f16[4, 3]\nbuffer bb: bf16[4, 3]\nbuffer flags: bool[4]\n"
      "score_mod = where(flags[q_idx], hb[q_idx, kv_idx], bb[q_idx, kv_idx]) + score");
  const CpuModFunctions fns = llvmjit::compile_cpu_mods(mods);
  // Column-major 4x3 views (strides {1, 4}) of random bit patterns, NaNs and subnormals included.
  std::vector<uint16_t> hb(12), bb(12);
  std::mt19937 rng(5);
  for (int i = 0; i < 12; ++i) {
    hb[static_cast<size_t>(i)] = static_cast<uint16_t>(rng());
    bb[static_cast<size_t>(i)] = static_cast<uint16_t>(rng());
  }
  hb[0] = 0x0001;  // smallest f16 subnormal
  hb[1] = 0x7c01;  // NaN
  std::vector<uint8_t> flags = {1, 0, 7, 0};
  ir::EvalEnv env;
  env.buffers["hb"] = ir::BufferView{hb.data(), DType::F16, {4, 3}, {1, 4}};
  env.buffers["bb"] = ir::BufferView{bb.data(), DType::BF16, {4, 3}, {1, 4}};
  env.buffers["flags"] = ir::BufferView{flags.data(), DType::Bool, {4}, {}};
  const auto params = llvmjit::pack_cpu_mod_params(mods, test::host_bindings(mods, env));
  ir::Evaluator ev(mods.score_mod);
  for (int q = 0; q < 4; ++q) {
    for (int kv = 0; kv < 3; ++kv) {
      env.q_idx = q;
      env.kv_idx = kv;
      env.score = 0.25f;
      INFO("q=" << q << " kv=" << kv);
      REQUIRE(ir::identical(ev.run(env),
                            ir::Value::of_f32(fns.score(params.data(), 0.25f, 0, 0, q, kv))));
    }
  }
}

TEST_CASE("bad bindings are RuntimeErrors naming the buffer or param", "[llvm]") {
  Mods mods = standard_mods("alibi");
  ir::EvalEnv env;
  REQUIRE_THROWS_WITH(llvmjit::pack_cpu_mod_params(mods, test::host_bindings(mods, env)),
                      Catch::Contains("slopes"));
  std::vector<int32_t> wrong(8);
  env.buffers["slopes"] = ir::BufferView{wrong.data(), DType::I32, {8}, {}};
  REQUIRE_THROWS_WITH(llvmjit::pack_cpu_mod_params(mods, test::host_bindings(mods, env)),
                      Catch::Contains("slopes"));
  Mods sw = standard_mods("sliding_window");
  ir::EvalEnv penv;
  penv.params["window"] = 2.5;
  REQUIRE_THROWS_WITH(llvmjit::pack_cpu_mod_params(sw, test::host_bindings(sw, penv)),
                      Catch::Contains("window"));
}

TEST_CASE("the JIT cache is keyed by structure, not by object or name", "[llvm]") {
  auto& jit = llvmjit::OrcJit::instance();
  Mods a = parse_mods("param cap: f32 = 30.0\nscore_mod = cap * tanh(score / cap)", "a.fx");
  Mods b = parse_mods("param cap: f32 = 50.0\nscore_mod = cap * tanh(score / cap)", "b.fx");
  Mods c = parse_mods("param cap: f32 = 30.0\nscore_mod = cap * tanh(score / cap) + 1.0");
  const auto before = jit.stats();
  const CpuModFunctions fa = llvmjit::compile_cpu_mods(a);
  const CpuModFunctions fb = llvmjit::compile_cpu_mods(b);  // same structure, other default
  const CpuModFunctions fc = llvmjit::compile_cpu_mods(c);
  const auto after = jit.stats();
  REQUIRE(fa.module == fb.module);
  REQUIRE(fa.module != fc.module);
  REQUIRE(after.misses - before.misses <= 2);
  REQUIRE(after.hits - before.hits >= 1);
  // Each module computes its own function, and the param value is an argument, not baked in.
  ir::EvalEnv env;
  env.params["cap"] = 10.0;
  const auto p = llvmjit::pack_cpu_mod_params(a, test::host_bindings(a, env));
  REQUIRE(fa.score(p.data(), 100.0f, 0, 0, 0, 0) == Approx(10.0f * std::tanh(10.0f)));
  REQUIRE(fc.score(p.data(), 100.0f, 0, 0, 0, 0) == Approx(10.0f * std::tanh(10.0f) + 1.0f));
  // Compiling a small mod takes milliseconds, not seconds.
  WARN("compile time of a softcap mod: " << fc.module->compile_ms() << " ms");
  REQUIRE(fc.module->compile_ms() < 2000.0);
}
