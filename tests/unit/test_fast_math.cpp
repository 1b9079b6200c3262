// Math modes (docs/math.md): the fast_math flag from MathMode and FLEXJIT_MATH to the kernel
// description, its hash and the generated source; the approximate prelude functions in the
// score_mod and its derivatives, never in the mask_mod; NVRTC compiles of both modes; the CLI's
// --math. The numerics are in tests/gpu/test_fast_math.cpp ([gpu][fastmath]).
#include <flexjit/attention.h>
#include <flexjit/error.h>
#include <flexjit/kernel.h>

#include "Pipeline.h"
#include "codegen/cuda/ModCodegen.h"
#include "kernels/KernelQuery.h"
#include "kernels/MathMode.h"
#include "kernels/Registry.h"
#include "kernels/backward/Backward.h"
#include "kernels/decode/Decode.h"
#include "kernels/forward/Forward.h"
#include "support/CacheTest.h"
#include "support/CliPath.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

using namespace flexjit;

namespace {

// The body of fj_score_mod / fj_mask_mod / fj_dscore in a generated source.
std::string function_body(const std::string& src, const std::string& name) {
  const size_t at = src.find(name + "(const FjModParams& mp");
  REQUIRE(at != std::string::npos);
  const size_t open = src.find('{', at);
  const size_t close = src.find("\n}", open);
  REQUIRE(close != std::string::npos);
  return src.substr(open, close - open);
}

KernelQuery query(const std::string& family, const std::string& arch, DType dtype, MathMode math) {
  KernelQuery q;
  q.family = family;
  q.arch = arch;
  q.dtype = dtype;
  q.math = math;
  return q;
}

// A mod with every transcendental the DSL has, in the score_mod and in the mask_mod.
Mods every_function() {
  return parse_mods(
      "param cap: f32 = 5.0\n"
      "score_mod = cap * tanh(score / cap) + 0.25 * log(1.0 + exp(score)) - 0.1 * log2(1.0 + "
      "exp2(-abs(score))) + 0.5 * sigmoid(score)\n"
      "mask_mod = tanh(float(q_idx - kv_idx)) > -0.5 && exp(float(kv_idx - q_idx)) < 1e30\n");
}

}  // namespace

TEST_CASE("math modes: Auto is approx for bf16 / f16 and exact for f32", "[fastmath]") {
  test::ScopedEnv unset("FLEXJIT_MATH", nullptr);
  const cuda::Arch arch = cuda::Arch::parse("sm_90a");
  CHECK(kernels::default_fast_math(DType::BF16));
  CHECK(kernels::default_fast_math(DType::F16));
  CHECK_FALSE(kernels::default_fast_math(DType::F32));
  for (auto [dtype, flag] :
       {std::pair{DType::BF16, 1}, std::pair{DType::F16, 1}, std::pair{DType::F32, 0}}) {
    INFO(to_string(dtype));
    CHECK(kernels::forward_problem(arch, dtype, 128, 128, 1, false, true).flags.at("fast_math") ==
          flag);
    CHECK(kernels::backward_problem(kernels::Family::BackwardDkDv, arch, dtype, 128, 128, 1, true)
              .flags.at("fast_math") == flag);
    CHECK(kernels::backward_problem(kernels::Family::BackwardDq, arch, dtype, 128, 128, 1, true)
              .flags.at("fast_math") == flag);
    CHECK(kernels::decode_split_problem(arch, dtype, 128, 128, 4, 16, 0, true)
              .flags.at("fast_math") == flag);
  }
  // The kernels without a score_mod have no math mode.
  CHECK_FALSE(kernels::backward_problem(kernels::Family::BackwardPreprocess, arch, DType::BF16, 128,
                                        128, 1, true)
                  .flags.has("fast_math"));
  CHECK_FALSE(kernels::decode_combine_problem(arch, DType::BF16, 128).flags.has("fast_math"));

  // An explicit mode wins over the dtype, both ways.
  kernels::KernelDesc d = kernels::forward_problem(arch, DType::F32, 64, 64, 1, false, true);
  kernels::set_math_mode(d, MathMode::Approx);
  CHECK(d.flags.at("fast_math") == 1);
  kernels::set_math_mode(d, MathMode::Exact);
  CHECK(d.flags.at("fast_math") == 0);
  CHECK(kernels::math_functions(d) == cuda::MathFunctions::Exact);
  d.flags.set("fast_math", 1);
  CHECK(kernels::math_functions(d) == cuda::MathFunctions::Approx);
  kernels::KernelDesc b = kernels::forward_problem(arch, DType::BF16, 64, 64, 1, false, true);
  kernels::set_math_mode(b, MathMode::Exact);
  CHECK(b.flags.at("fast_math") == 0);
  CHECK(kernels::math_functions(b) == cuda::MathFunctions::Exact);
  kernels::set_math_mode(b, MathMode::Auto);
  CHECK(b.flags.at("fast_math") == 1);
}

TEST_CASE("math modes: FLEXJIT_MATH sets what Auto means; explicit modes win", "[fastmath]") {
  {
    // exact forces the exact functions on the dtypes whose default is approx.
    test::ScopedEnv env("FLEXJIT_MATH", "exact");
    CHECK_FALSE(kernels::resolve_fast_math(MathMode::Auto, DType::BF16));
    CHECK_FALSE(kernels::resolve_fast_math(MathMode::Auto, DType::F16));
    CHECK_FALSE(kernels::resolve_fast_math(MathMode::Auto, DType::F32));
    CHECK(kernels::resolve_fast_math(MathMode::Approx, DType::BF16));
    kernels::KernelDesc d = kernels::forward_problem(cuda::Arch::parse("sm_90a"), DType::BF16, 128,
                                                     128, 1, false, true);
    CHECK(d.flags.at("fast_math") == 0);
  }
  {
    test::ScopedEnv env("FLEXJIT_MATH", "approx");
    CHECK(kernels::resolve_fast_math(MathMode::Auto, DType::F32));
    CHECK_FALSE(kernels::resolve_fast_math(MathMode::Exact, DType::F32));
  }
  {
    test::ScopedEnv env("FLEXJIT_MATH", "auto");
    CHECK(kernels::resolve_fast_math(MathMode::Auto, DType::BF16));
    CHECK(kernels::resolve_fast_math(MathMode::Auto, DType::F16));
    CHECK_FALSE(kernels::resolve_fast_math(MathMode::Auto, DType::F32));
    CHECK_FALSE(kernels::resolve_fast_math(MathMode::Exact, DType::F16));
  }
  {
    // An unknown value: one warning naming it, the accepted values and what auto means, then
    // auto.
    test::ScopedEnv env("FLEXJIT_MATH", "fastest-test-value");
    test::CaptureStderr err;
    CHECK(kernels::resolve_fast_math(MathMode::Auto, DType::BF16));
    CHECK(kernels::resolve_fast_math(MathMode::Auto, DType::F16));
    CHECK_FALSE(kernels::resolve_fast_math(MathMode::Auto, DType::F32));
    CHECK_THAT(err.text(), Catch::Contains("FLEXJIT_MATH='fastest-test-value'") &&
                               Catch::Contains("auto, exact, approx") &&
                               Catch::Contains("approx for bf16 / f16, exact for f32"));
  }
  CHECK(parse_math_mode("approx") == MathMode::Approx);
  CHECK(parse_math_mode("exact") == MathMode::Exact);
  CHECK(parse_math_mode("auto") == MathMode::Auto);
  CHECK_FALSE(parse_math_mode("fast").has_value());
  CHECK_FALSE(parse_math_mode("Approx").has_value());
  for (MathMode m : {MathMode::Auto, MathMode::Exact, MathMode::Approx})
    CHECK(parse_math_mode(to_string(m)) == m);
}

TEST_CASE("math modes: the flag reaches the description text, JSON, hash and source",
          "[fastmath]") {
  test::ScopedEnv unset("FLEXJIT_MATH", nullptr);
  const Mods softcap = standard_mods("softcap");
  const KernelSource approx =
      emit_kernel(softcap, query("forward", "sm_90a", DType::BF16, MathMode::Approx));
  const KernelSource exact =
      emit_kernel(softcap, query("forward", "sm_90a", DType::BF16, MathMode::Exact));
  const KernelSource autom =
      emit_kernel(softcap, query("forward", "sm_90a", DType::BF16, MathMode::Auto));
  CHECK_THAT(approx.description, Catch::Contains(" fast_math=1 "));
  CHECK_THAT(exact.description, Catch::Contains(" fast_math=0 "));
  CHECK_THAT(approx.description_json, Catch::Contains("\"fast_math\":1"));
  CHECK(autom.description == approx.description);  // Auto is approx for bf16
  CHECK(autom.source_key == approx.source_key);
  CHECK(autom.source == approx.source);
  CHECK(approx.source_key != exact.source_key);

  const kernels::KernelDesc da = kernels::KernelDesc::parse(approx.description);
  const kernels::KernelDesc de = kernels::KernelDesc::parse(exact.description);
  CHECK(da.hash() != de.hash());
  CHECK(kernels::KernelDesc::parse(da.str()) == da);
  CHECK(kernels::KernelDesc::from_json(da.to_json()) == da);

  // What the score_mod calls, and the comment that says so.
  const std::string sa = function_body(approx.source, "fj_score_mod");
  const std::string se = function_body(exact.source, "fj_score_mod");
  CHECK_THAT(sa, Catch::Contains("fj_tanh_approx(") && Catch::Contains("fj_fdiv_approx("));
  CHECK_THAT(se, Catch::Contains("fj_tanh(") && !Catch::Contains("_approx") &&
                     Catch::Contains(" / "));  // score / cap: IEEE division
  CHECK_THAT(approx.source, Catch::Contains("// fast_math=1: the score_mod's"));
  CHECK_THAT(exact.source, !Catch::Contains("// fast_math=1"));
  // The prelude defines both; the approximation is the PTX instruction.
  CHECK_THAT(exact.source, Catch::Contains("asm(\"tanh.approx.f32 %0, %1;\""));

  // f16 under Auto is approx too; f32 under Auto is exact (the same kernel as Exact's).
  const KernelSource f16 =
      emit_kernel(softcap, query("forward", "sm_90a", DType::F16, MathMode::Auto));
  CHECK(f16.source_key ==
        emit_kernel(softcap, query("forward", "sm_90a", DType::F16, MathMode::Approx)).source_key);
  CHECK_THAT(function_body(f16.source, "fj_score_mod"), Catch::Contains("fj_tanh_approx("));
  const KernelSource f32 =
      emit_kernel(softcap, query("forward", "sm_90a", DType::F32, MathMode::Auto));
  CHECK_THAT(f32.description, Catch::Contains(" fast_math=0 "));
  CHECK(f32.source_key ==
        emit_kernel(softcap, query("forward", "sm_90a", DType::F32, MathMode::Exact)).source_key);
  CHECK_THAT(function_body(f32.source, "fj_score_mod"), !Catch::Contains("_approx"));

  // FLEXJIT_MATH=exact makes Auto exact for bf16: the kernel of an explicit Exact.
  test::ScopedEnv env("FLEXJIT_MATH", "exact");
  const KernelSource forced =
      emit_kernel(softcap, query("forward", "sm_90a", DType::BF16, MathMode::Auto));
  CHECK(forced.description == exact.description);
  CHECK(forced.source_key == exact.source_key);
}

TEST_CASE(
    "math modes: every transcendental of the score_mod and its derivatives, never the "
    "mask_mod",
    "[fastmath][codegen]") {
  const Mods m = lower_mods(every_function());
  const std::string approx = cuda::generate_mod_functions(m, cuda::MathFunctions::Approx);
  const std::string exact = cuda::generate_mod_functions(m, cuda::MathFunctions::Exact);
  const std::string score = function_body(approx, "fj_score_mod");
  for (const char* fn : {"fj_tanh_approx(", "fj_exp_approx(", "fj_log_approx(", "fj_exp2_approx(",
                         "fj_log2_approx(", "fj_sigmoid_approx("}) {
    INFO(fn);
    CHECK_THAT(score, Catch::Contains(fn));
  }
  CHECK_THAT(function_body(exact, "fj_score_mod"), !Catch::Contains("_approx"));
  // The mask_mod is exact in both modes, and identical.
  const std::string mask = function_body(approx, "fj_mask_mod");
  CHECK_THAT(mask, Catch::Contains("fj_tanh(") && Catch::Contains("fj_exp(") &&
                       !Catch::Contains("_approx"));
  CHECK(mask == function_body(exact, "fj_mask_mod"));
  // The exact source of a mods set is what it was before math modes existed (the goldens).
  CHECK(cuda::generate_mod_functions(m) == exact);

  // The backward's derivative: softcap's 1 - tanh^2 in the forward's mode.
  const Mods softcap = lower_mods(standard_mods("softcap"));
  const std::string ga = cuda::generate_mod_grad_functions(softcap, cuda::MathFunctions::Approx);
  const std::string ge = cuda::generate_mod_grad_functions(softcap, cuda::MathFunctions::Exact);
  CHECK_THAT(function_body(ga, "fj_dscore"), Catch::Contains("fj_tanh_approx("));
  CHECK_THAT(function_body(ge, "fj_dscore"),
             Catch::Contains("fj_tanh(") && !Catch::Contains("_approx"));
}

TEST_CASE("math modes: descriptions with a bad fast_math are precise errors", "[fastmath]") {
  test::ScopedEnv unset("FLEXJIT_MATH", nullptr);
  for (const char* family : {"forward", "backward_dkdv", "backward_dq", "decode_split"}) {
    INFO(family);
    kernels::KernelDesc d =
        kernels::desc_for_query(query(family, "sm_80", DType::BF16, MathMode::Auto));
    d.flags.set("fast_math", 2);
    const kernels::Variant& v = variant_of(d);
    CHECK_THROWS_AS(v.validate(d), UnsupportedError);
    CHECK_THROWS_WITH(v.validate(d), Catch::Contains("flag 'fast_math' must be 0") &&
                                         Catch::Contains("not 2") &&
                                         Catch::Contains(d.family_variant()));
    // A description without the flag (written before it existed) is exact, and valid.
    d.flags = [&] {
      kernels::Params p;
      for (const auto& [name, value] : d.flags.items())
        if (name != "fast_math") p.set(name, value);
      return p;
    }();
    CHECK_NOTHROW(v.validate(d));
    CHECK(kernels::math_functions(d) == cuda::MathFunctions::Exact);
  }
  // A math mode for a kernel without a score_mod says where it applies.
  for (const char* family : {"block_mask", "backward_preprocess", "decode_combine"}) {
    INFO(family);
    CHECK_THROWS_WITH(
        emit_kernel(standard_mods("causal"), query(family, "sm_80", DType::BF16, MathMode::Approx)),
        Catch::Contains(
            fmt::format("math mode 'approx' does not apply to the {} kernel", family)) &&
            Catch::Contains("forward, backward_dkdv, backward_dq and decode_split"));
    CHECK_NOTHROW(
        emit_kernel(standard_mods("causal"), query(family, "sm_80", DType::BF16, MathMode::Auto)));
  }
}

TEST_CASE("math modes: softcap kernels compile in both modes on sm_80 and sm_90a",
          "[fastmath][nvrtc]") {
  test::ScopedEnv unset("FLEXJIT_MATH", nullptr);
  jit::CacheSettings settings;
  settings.enabled = false;  // real NVRTC compiles
  KernelBuilder builder(settings);
  const Mods softcap = standard_mods("softcap_causal");
  const Mods every = every_function();
  struct Job {
    std::string family;
    DType dtype;
    const Mods* mods;
  };
  const std::vector<Job> jobs = {
      {"forward", DType::BF16, &softcap},  {"forward", DType::F16, &every},
      {"forward", DType::F32, &softcap},   {"backward_dkdv", DType::BF16, &softcap},
      {"backward_dq", DType::F16, &every}, {"decode_split", DType::BF16, &softcap}};
  for (const char* arch : {"sm_80", "sm_90a"}) {
    for (const Job& j : jobs) {
      // sm_90a: the bf16 kernels (the H100's default mode); sm_80: all of them.
      if (std::string(arch) == "sm_90a" && j.dtype != DType::BF16) continue;
      for (MathMode math : {MathMode::Exact, MathMode::Approx}) {
        const kernels::KernelDesc d = kernels::desc_for_query(query(j.family, arch, j.dtype, math));
        INFO(d.str());
        const BuiltKernel k = builder.build(*j.mods, d);
        const jit::ResourceUsage& u = k.compiled.kernel->usage;
        CHECK(u.registers > 0);
        CHECK(u.registers <= 255);
        // Registers and spills of both modes, printed to compare them (nvcc 13.0: within a few
        // registers of each other, spills unchanged).
        std::printf("  %s: %s\n", d.str().substr(0, d.str().find(" |")).c_str(), u.str().c_str());
      }
    }
  }
}

TEST_CASE("flexjit emit / compile / run / bench --math", "[fastmath][cli]") {
  std::string out;
  const std::string base = "emit --mods softcap --arch sm_80";
  REQUIRE(test::run_cli(base + " --math approx", &out, "FLEXJIT_MATH=") == 0);
  CHECK_THAT(out, Catch::Contains("fast_math=1") && Catch::Contains("fj_tanh_approx(t"));
  REQUIRE(test::run_cli(base + " --math exact", &out, "FLEXJIT_MATH=") == 0);
  CHECK_THAT(out, Catch::Contains("fast_math=0") && !Catch::Contains("fj_tanh_approx(t"));
  // auto: the dtype rule, or FLEXJIT_MATH; --math exact wins over the environment.
  REQUIRE(test::run_cli(base, &out, "FLEXJIT_MATH=") == 0);
  CHECK_THAT(out, Catch::Contains("fast_math=1") && Catch::Contains("fj_tanh_approx(t"));
  REQUIRE(test::run_cli(base + " --dtype f16", &out, "FLEXJIT_MATH=") == 0);
  CHECK_THAT(out, Catch::Contains("fast_math=1"));
  REQUIRE(test::run_cli(base + " --dtype f32", &out, "FLEXJIT_MATH=") == 0);
  CHECK_THAT(out, Catch::Contains("fast_math=0") && !Catch::Contains("fj_tanh_approx(t"));
  REQUIRE(test::run_cli(base, &out, "FLEXJIT_MATH=exact") == 0);
  CHECK_THAT(out, Catch::Contains("fast_math=0") && !Catch::Contains("fj_tanh_approx(t"));
  REQUIRE(test::run_cli(base + " --dtype f32", &out, "FLEXJIT_MATH=approx") == 0);
  CHECK_THAT(out, Catch::Contains("fast_math=1"));
  REQUIRE(test::run_cli(base + " --math exact", &out, "FLEXJIT_MATH=approx") == 0);
  CHECK_THAT(out, Catch::Contains("fast_math=0"));
  REQUIRE(test::run_cli("emit --kernel backward_dkdv --mods softcap --arch sm_90a --math approx",
                        &out) == 0);
  CHECK_THAT(out, Catch::Contains("fast_math=1") && Catch::Contains("fj_tanh_approx("));
  REQUIRE(test::run_cli("emit --help", &out) == 0);
  CHECK_THAT(out, Catch::Contains("--math") && Catch::Contains("auto|exact|approx") &&
                      Catch::Contains("else approx for bf16"));

  // Bad values: exit 1, the value and what is accepted, for every subcommand that takes it.
  for (const char* cmd :
       {"emit --arch sm_80", "compile --arch sm_80", "bench --compile --arch sm_80",
        "run --device cpu --mods noop --random 1,1,16,64"}) {
    INFO(cmd);
    CHECK(test::run_cli(std::string(cmd) + " --math fast", &out) == 1);
    CHECK_THAT(out, Catch::Contains("--math") &&
                        Catch::Contains("'fast' is not a math mode; use auto, exact or approx"));
    CHECK_THAT(out, !Catch::Contains("terminate called"));
  }
  CHECK(test::run_cli("emit --kernel block_mask --mask-mod causal --arch sm_80 --math approx",
                      &out) == 1);
  CHECK_THAT(out, Catch::Contains("does not apply to the block_mask kernel"));
}
