// e4m3 (float8_e4m3fn) attention without a GPU (issue 31, "FP8"): the dtype and its
// conversions, what forward/sm90a_wgmma's FJ_FWD_FP8 path serves and refuses, NVRTC compiles of
// its configs for sm_90a (no spills), the errors of calls that cannot take e4m3, and the CPU
// backend's reference on dequantized inputs. The GPU numerics: tests/gpu/test_fp8.cpp.
#include <flexjit/attention.h>
#include <flexjit/cpu.h>
#include <flexjit/dsl.h>
#include <flexjit/error.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>
#include <flexjit/paged_kv.h>

#include "Pipeline.h"
#include "codegen/cuda/Wgmma.h"
#include "device/TensorMap.h"
#include "ir/Evaluate.h"
#include "kernels/Registry.h"
#include "kernels/forward/Forward.h"
#include "kernels/forward/Sm90Wgmma.h"
#include "support/KernelDescs.h"
#include "support/Parallel.h"

#include <flexjit_abi.h>
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <random>
#include <set>
#include <vector>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

KernelDesc fp8_desc(int dqk, int dv, const Params& overrides = {}, int gqa_ratio = 1) {
  return test::forward_desc("sm_90a", DType::E4M3, dqk, dv, gqa_ratio, "sm90a_wgmma", overrides);
}

KernelDesc fp8_problem(const char* arch, int dqk = 128, int dv = 128) {
  return forward_problem(cuda::Arch::parse(arch), DType::E4M3, dqk, dv, 1, false, true);
}

// The key that V^T column k of a 32-key group holds, straight from the two fragment layouts
// (CUTLASS CLayout_64xN and ALayout_64x32): A's byte e of register r of lane (t = lane % 4) is k
// index 4 t + e + 16 (r / 2); pack_a_e4m3 fills it from accumulator tile 2 (r / 2) + (e / 2),
// element e % 2 of the row half r % 2, i.e. key 8 (2 (r / 2) + e / 2) + 2 t + e % 2.
int key_from_layouts(int k) {
  const int t = (k % 16) / 4, e = k % 4, r2 = k / 16;
  return 8 * (2 * r2 + e / 2) + 2 * t + e % 2;
}

}  // namespace

TEST_CASE("e4m3: the dtype, its names and its conversions", "[fp8]") {
  CHECK(to_string(DType::E4M3) == "e4m3");
  CHECK(framework_name(DType::E4M3) == "float8_e4m3fn");
  CHECK(parse_dtype("e4m3") == DType::E4M3);
  CHECK(parse_dtype("float8_e4m3fn") == DType::E4M3);
  CHECK(dtype_size(DType::E4M3) == 1);
  CHECK(load_type(DType::E4M3) == ScalarType::F32);
  CHECK(attention_out_dtype(DType::E4M3) == DType::BF16);
  CHECK(attention_out_dtype(DType::F16) == DType::F16);
  // OCP e4m3fn: bias 7, max 448 (0x7e), no infinities, NaN 0x7f / 0xff, subnormals of 2^-9.
  CHECK(ir::e4m3_bits_to_float(0x7e) == 448.0f);
  CHECK(ir::e4m3_bits_to_float(0x01) == std::ldexp(1.0f, -9));
  CHECK(ir::e4m3_bits_to_float(0x08) == std::ldexp(1.0f, -6));
  CHECK(ir::e4m3_bits_to_float(0x38) == 1.0f);
  CHECK(ir::e4m3_bits_to_float(0xb8) == -1.0f);
  CHECK(std::isnan(ir::e4m3_bits_to_float(0x7f)));
  CHECK(std::isnan(ir::e4m3_bits_to_float(0xff)));
  // Every finite code round-trips; rounding is to nearest even; out of range saturates.
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    const float x = ir::e4m3_bits_to_float(static_cast<uint8_t>(b));
    INFO("code " << b << " = " << x);
    if (x == 0.0f) {
      CHECK(ir::e4m3_bits_to_float(ir::float_to_e4m3_bits(x)) == 0.0f);
    } else {
      CHECK(ir::float_to_e4m3_bits(x) == b);
    }
  }
  CHECK(ir::float_to_e4m3_bits(1.0625f) == 0x38);  // halfway 1 / 1.125: the even one, 1
  CHECK(ir::float_to_e4m3_bits(1.1875f) == 0x3a);  // halfway 1.125 / 1.25: the even one, 1.25
  CHECK(ir::float_to_e4m3_bits(1.07f) == 0x39);
  CHECK(ir::float_to_e4m3_bits(1000.0f) == 0x7e);
  CHECK(ir::float_to_e4m3_bits(-1e30f) == 0xfe);
  CHECK(ir::float_to_e4m3_bits(std::ldexp(1.0f, -11)) == 0x00);  // below half a subnormal
  CHECK(ir::float_to_e4m3_bits(std::ldexp(3.0f, -10)) == 0x02);  // 1.5 subnormals: even, 2
  CHECK(ir::float_to_e4m3_bits(std::nanf("")) == 0x7f);
  // Captured buffers take no e4m3.
  CHECK_THROWS_AS(Buffer("scales", DType::E4M3, {"H"}), UnsupportedError);
  CHECK_THROWS_WITH(parse_mods("buffer s: e4m3[H]\nscore_mod = score * s[h]", "t"),
                    Catch::Contains("buffer 's' is e4m3"));
}

TEST_CASE("e4m3: V^T's key permutation is the accumulator-to-A-fragment map", "[fp8]") {
  std::set<int> seen;
  for (int k = 0; k < 32; ++k) {
    INFO("k = " << k);
    CHECK(fj_fp8_vt_key(k) == key_from_layouts(k));
    seen.insert(fj_fp8_vt_key(k));
  }
  CHECK(seen.size() == 32);  // a permutation of the group's keys
}

TEST_CASE("sm90a_wgmma serves e4m3 q, k, v and says why not elsewhere", "[sm90][fp8][kernels]") {
  const ForwardSm90Wgmma v;
  CHECK_FALSE(v.unsupported(fp8_problem("sm_90a"), {}).has_value());
  CHECK_FALSE(v.unsupported(fp8_problem("sm_90a", 64, 64), {}).has_value());
  CHECK_FALSE(v.unsupported(fp8_problem("sm_90a", 256, 128), {}).has_value());
  CHECK_FALSE(v.unsupported(fp8_problem("sm_90a", 80, 48), {}).has_value());
  CHECK(v.unsupported(fp8_problem("sm_90"), {}).value() ==
        "wgmma and setmaxnreg need sm_90a, not sm_90");
  CHECK(v.unsupported(fp8_problem("sm_90a", 72, 128), {}).value() ==
        "forward/sm90a_wgmma with e4m3 inputs does not support head_dim_qk = 72; supported: "
        "multiples of 16 from 16 to 256");
  CHECK_THAT(v.unsupported(fp8_problem("sm_90a", 128, 256), {}).value(),
             Catch::Contains("head_dim_v = 256") && Catch::Contains("from 16 to 128"));
  InputFacts mask64;
  mask64.mask_q_block = 128;
  mask64.mask_kv_block = 64;
  CHECK_THAT(v.unsupported(fp8_problem("sm_90a"), mask64).value(),
             Catch::Contains("kv block size 64") && Catch::Contains("e4m3"));
  // sm80_mma and the backward name what takes e4m3.
  CHECK(fp8_desc(128, 128).variant == "sm90a_wgmma");
  CHECK_THROWS_WITH(test::forward_desc("sm_80", DType::E4M3, 128, 128, 1, "sm80_mma"),
                    Catch::Contains("e4m3 q, k, v are supported only by forward/sm90a_wgmma"));
  KernelDesc bwd = fp8_problem("sm_90a");
  bwd.family = Family::BackwardDkDv;
  CHECK_THAT(wgmma_problem_reason(bwd, kSm90ForwardTileDims).value(),
             Catch::Contains("e4m3 inputs run only in the forward"));
}

TEST_CASE("sm90a_wgmma e4m3 configs: defaults, the space, and precise refusals",
          "[sm90][fp8][kernels]") {
  const ForwardSm90Wgmma v;
  for (auto [dqk, dv] : {std::pair{128, 128}, {64, 64}, {256, 128}, {96, 32}, {16, 16}}) {
    INFO("d=" << dqk << "/" << dv);
    const KernelDesc d = fp8_desc(dqk, dv);
    CHECK(d.variant == "sm90a_wgmma");
    CHECK(d.config.at("block_m") == 128);
    CHECK(d.config.at("block_n") == 128);
    CHECK(d.config.at("q_tiles") == 1);
    CHECK(d.config.at("persistent") == 0);
    CHECK_NOTHROW(v.validate(d));
    const std::vector<Params> space = v.config_space(d);
    CHECK(std::find(space.begin(), space.end(), d.config) != space.end());
    for (const Params& c : space) {
      KernelDesc e = d;
      e.config = c;
      CHECK(v.smem_bytes(e) <= 232448u);
    }
  }
  // d 128: 4 stages of 16 KB K and 16 KB V^T tiles and a 32 KB Q / O buffer.
  CHECK(ForwardSm90Wgmma().smem_bytes(fp8_desc(128, 128)) ==
        static_cast<unsigned>(fj_forward_sm90_fp8_smem_bytes(128, 128, 128, 128, 4)));
  for (const Params& bad : {Params{{"block_n", 64}}, Params{{"q_tiles", 2}},
                            Params{{"persistent", 1}, {"q_tiles", 2}}}) {
    INFO(bad.str());
    CHECK_THROWS_WITH(fp8_desc(128, 128, bad),
                      Catch::Contains("e4m3 inputs runs block_m = 128 or 192, block_n = 128"));
  }
  // Persistent CTAs claiming single tiles (each with its head's descales): two Q / O buffers.
  const KernelDesc p1 = fp8_desc(128, 128, {{"persistent", 1}});
  CHECK(p1.config.at("persistent") == 1);
  CHECK(ForwardSm90Wgmma().smem_bytes(p1) ==
        static_cast<unsigned>(fj_forward_sm90_fp8_smem_bytes(
            128, 128, 128, 128, static_cast<int>(p1.config.at("num_stages")), 2)));
  CHECK(fj_forward_sm90_fp8_smem_bytes(192, 128, 128, 128, 4, 2) ==
        1024 + 2 * 192 * 256 + 4 * 128 * 256 + 128 + 32);
  CHECK(fj_forward_sm90_fp8_smem_bytes(192, 128, 128, 128, 4, 2) <= 232448);
  // 192 rows (three consumers, the serial loop; over a block mask the union schedule): by
  // default where they cover at most an eighth more rows than 128-row tiles, not where the
  // mask_mod divides by a run-time value.
  CHECK(fp8_desc(128, 128, {{"block_m", 192}}).config.at("block_m") == 192);
  InputFacts main_shape;
  main_shape.seqlen_q = 4096;
  main_shape.seqlen_kv = 4096;
  CHECK(v.resolve_config(fp8_problem("sm_90a"), {}, main_shape).at("block_m") == 192);
  // ... with persistent CTAs and as many of 4 stages as fit beside two 48 KB Q / O buffers.
  CHECK(v.resolve_config(fp8_problem("sm_90a"), {}, main_shape).at("persistent") == 1);
  CHECK(v.resolve_config(fp8_problem("sm_90a"), {}, main_shape).at("num_stages") == 4);
  CHECK(v.resolve_config(fp8_problem("sm_90a", 64, 64), {}, main_shape).at("block_m") == 192);
  CHECK(v.resolve_config(fp8_problem("sm_90a", 96, 96), {}, main_shape).at("block_m") == 128);
  CHECK(v.resolve_config(fp8_problem("sm_90a", 256, 128), {}, main_shape).at("block_m") == 128);
  CHECK(v.resolve_config(fp8_problem("sm_90a"), {{"block_m", 128}}, main_shape).at("block_m") ==
        128);
  InputFacts short_q = main_shape;
  short_q.seqlen_q = 256;  // 384 rows in 192-row tiles against 256
  CHECK(v.resolve_config(fp8_problem("sm_90a"), {}, short_q).at("block_m") == 128);
  CHECK(v.resolve_config(fp8_problem("sm_90a"), {}, short_q).at("persistent") == 0);
  InputFacts masked = main_shape;
  masked.mask_mod = true;
  masked.mask_q_block = 128;
  masked.mask_kv_block = 128;
  CHECK(v.resolve_config(fp8_problem("sm_90a"), {}, masked).at("block_m") == 192);
  CHECK(v.resolve_config(fp8_problem("sm_90a"), {}, masked).at("persistent") == 1);
  InputFacts divides = masked;
  divides.mask_mod_divides = true;
  CHECK(v.resolve_config(fp8_problem("sm_90a"), {}, divides).at("block_m") == 128);
  CHECK(v.resolve_config(fp8_problem("sm_90a"), {{"block_m", 192}}, divides).at("block_m") == 192);
  InputFacts no_mask_mod = masked;  // a block mask without the mods' mask_mod
  no_mask_mod.mask_mod = false;
  CHECK(v.resolve_config(fp8_problem("sm_90a"), {}, no_mask_mod).at("block_m") == 128);
  // The union schedule is the companion's kernel, not the forward's.
  const KernelDesc d192 = fp8_desc(128, 128, {{"block_m", 192}});
  CHECK_THAT(v.generate(standard_mods("causal"), d192).source,
             !Catch::Contains("flexjit_forward_union_schedule(const") &&
                 Catch::Contains("#define FJ_FWD_FP8 1"));
  // e4m3's V^T pre-pass, then the union schedule (tests/unit/test_companions.cpp).
  REQUIRE(v.companions(d192, standard_mods("causal")).size() == 2);
  CHECK(v.companions(d192, standard_mods("causal"))[0].family == Family::ForwardFp8Vt);
  CHECK(v.companions(d192, standard_mods("causal"))[1].family == Family::ForwardSchedule);
  CHECK(v.companions(d192, standard_mods("noop")).size() == 1);
}

TEST_CASE("e4m3 wgmma wrappers: k32, no transpose operands", "[sm90][fp8][codegen]") {
  const std::string w = cuda::wgmma_wrappers(DType::E4M3, {128}, {128});
  CHECK_THAT(w, Catch::Contains("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"));
  CHECK_THAT(w, Catch::Contains("p, 1, 1;"));
  CHECK_THAT(w, !Catch::Contains("p, 1, 1, 0, 0"));
  CHECK_THAT(w, Catch::Contains("fj_wgmma_rs(float (&d)[16][4], const fj_u32 (&a)[4]"));
  CHECK_THROWS_AS(cuda::wgmma_wrappers(DType::E4M3, {128}, {128}, {64}), InternalError);
}

TEST_CASE("e4m3 tensors are read through TMA as 16-bit units", "[sm90][fp8][runtime]") {
  std::vector<uint8_t> bytes(2 * 4 * 64 * 128);
  const TensorRef t =
      TensorRef::contiguous(bytes.data(), DType::E4M3, {2, 4, 64, 128}, TensorRef::Device::CUDA);
  const TensorRef u = runtime::tma_unit_view(t);
  CHECK(u.dtype == DType::BF16);
  CHECK(u.shape == std::vector<int64_t>{2, 4, 64, 64});
  CHECK(u.strides == std::vector<int64_t>{16384, 4096, 64, 1});
  TensorRef odd =
      TensorRef::contiguous(bytes.data(), DType::E4M3, {1, 4, 64, 120}, TensorRef::Device::CUDA);
  CHECK_THAT(runtime::bhsd_tma_blocker(odd, "q").value(),
             Catch::Contains("head dim 120 (e4m3) is not a multiple of 16"));
}

TEST_CASE("sm90a_wgmma compiles its e4m3 configs for sm_90a without spills", "[sm90][fp8][nvrtc]") {
  struct Job {
    std::string mods;
    int dqk, dv, gqa;
    Params overrides;
  };
  const std::vector<Job> jobs = {
      {"noop", 128, 128, 1, {}},
      {"causal", 128, 128, 1, {}},
      {"alibi_causal", 128, 128, 4, {}},
      {"softcap", 128, 128, 1, {}},
      {"softcap_causal", 128, 128, 1, {}},
      {"document_causal", 128, 128, 1, {}},
      {"relative_bias_causal", 128, 128, 1, {}},
      {"causal", 64, 64, 1, {}},
      {"alibi", 256, 128, 1, {}},
      {"noop", 128, 128, 1, {{"num_stages", 2}}},
      {"noop", 128, 128, 1, {{"block_m", 192}}},
      {"alibi", 128, 128, 4, {{"block_m", 192}}},
      {"softcap", 128, 128, 1, {{"block_m", 192}}},
      {"relative_bias", 128, 128, 1, {{"block_m", 192}}},
      {"noop", 64, 64, 1, {{"block_m", 192}}},
      {"causal", 128, 128, 4, {{"block_m", 192}}},
      {"softcap_causal", 128, 128, 1, {{"block_m", 192}}},
      {"sliding_window", 128, 128, 1, {{"block_m", 192}}},
      {"alibi_causal", 128, 128, 4, {{"block_m", 192}}},
      {"relative_bias_causal", 128, 128, 1, {{"block_m", 192}}},
      {"causal", 96, 64, 2, {{"num_stages", 3}}},
      // Persistent CTAs (the 192-row default), each tile's descales.
      {"noop", 128, 128, 1, {{"block_m", 192}, {"persistent", 1}}},
      {"document_causal", 128, 128, 1, {{"block_m", 192}, {"persistent", 1}}},
      {"causal", 128, 128, 4, {{"block_m", 192}, {"persistent", 1}}},
      {"softcap_causal", 128, 128, 1, {{"block_m", 192}, {"persistent", 1}}},
      {"relative_bias_causal", 128, 128, 1, {{"block_m", 192}, {"persistent", 1}}},
      {"alibi", 128, 128, 4, {{"persistent", 1}}}};
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::mutex mu;
  std::vector<std::string> failures, report;
  test::run_parallel(jobs.size(), [&](size_t i) {
    const Job& j = jobs[i];
    try {
      const KernelDesc d = fp8_desc(j.dqk, j.dv, j.overrides, j.gqa);
      const BuiltKernel k = builder.build(standard_mods(j.mods), d);
      const auto& u = k.compiled.kernel->usage;
      std::lock_guard<std::mutex> lock(mu);
      report.push_back(fmt::format("{} {}: {} registers (launch bound), {} B spills, {} B smem",
                                   d.str(), j.mods, u.registers, u.spill_store_bytes,
                                   ForwardSm90Wgmma().smem_bytes(d)));
      if (u.spill_store_bytes > 0 || u.spill_load_bytes > 0) {
        failures.push_back(fmt::format("{} {}: {} / {} bytes of spill stores / loads", d.str(),
                                       j.mods, u.spill_store_bytes, u.spill_load_bytes));
      }
      for (const char* needle : {"#define FJ_FWD_FP8 1", "k32.f32.e4m3.e4m3",
                                 "cvt.rn.satfinite.e4m3x2.f32", "setmaxnreg.inc"}) {
        if (k.source->source.find(needle) == std::string::npos)
          failures.push_back(fmt::format("{} {}: source lacks {}", d.str(), j.mods, needle));
      }
      // V^T is written by the companion (forward_fp8_vt), the first one, not by this module.
      if (k.source->source.find("flexjit_forward_fp8_vt(const FjFp8VtArgs a)") !=
              std::string::npos ||
          k.companions.empty() || k.companions[0].desc.family != Family::ForwardFp8Vt ||
          k.companions[0].compiled.kernel->kernel_name != "flexjit_forward_fp8_vt") {
        failures.push_back(fmt::format("{} {}: V^T is not the first companion", d.str(), j.mods));
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(j.mods + ": " + e.what());
    }
  });
  std::sort(report.begin(), report.end());
  WARN(fmt::format("{}", fmt::join(report, "\n")));
  CHECK(failures.empty());
  for (const std::string& f : failures)
    FAIL_CHECK(f);
}

TEST_CASE("the bf16 sm90a_wgmma source has no e4m3 path compiled in", "[sm90][fp8][codegen]") {
  const KernelDesc d = test::forward_desc("sm_90a", DType::BF16, 128, 128, 1, "sm90a_wgmma");
  const std::string src = ForwardSm90Wgmma().generate(standard_mods("causal"), d).source;
  CHECK(src.find("#define FJ_FWD_FP8") == std::string::npos);
  CHECK(src.find("e4m3.e4m3") == std::string::npos);
  CHECK_THAT(src, Catch::Contains("k16.f32.bf16.bf16"));
}

TEST_CASE("e4m3 on the CPU backend: the f32 attention of the dequantized inputs", "[fp8][cpu]") {
  std::mt19937_64 rng(0xf8);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  const int64_t B = 1, Hq = 4, Hkv = 2, S = 70, D = 32;
  auto make = [&](int64_t H, std::vector<uint8_t>& bytes) {
    bytes.resize(static_cast<size_t>(B * H * S * D));
    for (uint8_t& b : bytes)
      b = ir::float_to_e4m3_bits(n01(rng) * 50.0f);
    return TensorRef::contiguous(bytes.data(), DType::E4M3, {B, H, S, D});
  };
  std::vector<uint8_t> qb, kb, vb;
  const TensorRef q = make(Hq, qb), k = make(Hkv, kb), v = make(Hkv, vb);
  // q per head, k per tensor, v per head.
  std::vector<float> qd = {0.02f, 0.01f, 0.03f, 0.015f}, kd = {0.025f}, vd = {0.05f, 0.1f};
  AttentionOptions o;
  o.mods = standard_mods("alibi_causal");
  std::vector<float> slopes(static_cast<size_t>(Hq));
  for (size_t h = 0; h < slopes.size(); ++h)
    slopes[h] = std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(Hq));
  o.bindings.buffers.emplace_back("slopes", TensorRef::contiguous(slopes.data(), DType::F32, {Hq}));
  o.descale.q = TensorRef::contiguous(qd.data(), DType::F32, {Hq});
  o.descale.k = TensorRef::contiguous(kd.data(), DType::F32, {1});
  o.descale.v = TensorRef::contiguous(vd.data(), DType::F32, {Hkv});
  const CpuAttentionResult got = flex_attention_cpu(q, k, v, o);
  // The same call on f32 tensors holding the dequantized values.
  auto deq = [](const std::vector<uint8_t>& bytes, int64_t H, const std::vector<float>& f) {
    std::vector<float> x(bytes.size());
    const size_t per_head = static_cast<size_t>(S * D);
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t h = (i / per_head) % static_cast<size_t>(H);
      x[i] = ir::e4m3_bits_to_float(bytes[i]) * f[f.size() == 1 ? 0 : h];
    }
    return x;
  };
  std::vector<float> qf = deq(qb, Hq, qd), kf = deq(kb, Hkv, kd), vf = deq(vb, Hkv, vd);
  AttentionOptions plain = o;
  plain.descale = {};
  const CpuAttentionResult want =
      flex_attention_cpu(TensorRef::contiguous(qf.data(), DType::F32, {B, Hq, S, D}),
                         TensorRef::contiguous(kf.data(), DType::F32, {B, Hkv, S, D}),
                         TensorRef::contiguous(vf.data(), DType::F32, {B, Hkv, S, D}), plain);
  REQUIRE(got.out.size() == want.out.size());
  CHECK(got.out == want.out);
  CHECK(got.lse == want.lse);
  // Misused factors say which and what they take.
  AttentionOptions bad = o;
  bad.descale.q = TensorRef::contiguous(qd.data(), DType::F32, {3});
  CHECK_THROWS_WITH(flex_attention_cpu(q, k, v, bad),
                    Catch::Contains("descale.q is f32[3]") &&
                        Catch::Contains("f32[1] (per tensor) or f32[4] (Hq = 4: per head)"));
  const TensorRef qf_ref = TensorRef::contiguous(qf.data(), DType::F32, {B, Hq, S, D});
  CHECK_THROWS_WITH(
      flex_attention_cpu(qf_ref, TensorRef::contiguous(kf.data(), DType::F32, {B, Hkv, S, D}),
                         TensorRef::contiguous(vf.data(), DType::F32, {B, Hkv, S, D}), o),
      Catch::Contains("descale factors were given for f32 inputs"));
  // Mixed dtypes and the backward's validation refuse e4m3 with the reason.
  CHECK_THROWS_WITH(
      validate_forward_qkv(q, TensorRef::contiguous(kf.data(), DType::F32, {B, Hkv, S, D}), v),
      Catch::Contains("q, k and v must share one dtype"));
  CHECK_THROWS_AS(validate_qkv(q, k, v), UnsupportedError);
  CHECK_THROWS_WITH(validate_qkv(q, k, v), Catch::Contains("run only in the forward"));
}

TEST_CASE("a call on a KV cache refuses the forward's descale factors, naming them", "[fp8][cpu]") {
  // An e4m3 cache carries its own per-kv-head scales (KvCache::k_scale / v_scale); descale
  // factors given beside one used to be ignored by the GPU path.
  const int64_t B = 1, Hq = 2, Hkv = 1, Sq = 1, S = 16, D = 16;
  std::vector<uint16_t> qb(static_cast<size_t>(B * Hq * Sq * D), 0x3f80);        // bf16 1.0
  std::vector<uint8_t> kb(static_cast<size_t>(B * Hkv * S * D), 0x38), vb = kb;  // e4m3 1.0
  std::vector<int32_t> lens = {static_cast<int32_t>(S)};
  std::vector<float> ks = {0.5f}, vs = {2.0f}, one = {1.0f};
  const TensorRef q = TensorRef::contiguous(qb.data(), DType::BF16, {B, Hq, Sq, D});
  const TensorRef k = TensorRef::contiguous(kb.data(), DType::E4M3, {B, Hkv, S, D});
  const TensorRef v = TensorRef::contiguous(vb.data(), DType::E4M3, {B, Hkv, S, D});
  KvCache cache;
  cache.seq_lens = TensorRef::contiguous(lens.data(), DType::I32, {B});
  cache.k_scale = TensorRef::contiguous(ks.data(), DType::F32, {Hkv});
  cache.v_scale = TensorRef::contiguous(vs.data(), DType::F32, {Hkv});
  AttentionOptions o;
  o.kv_cache = &cache;
  // Every value is 1 * v_scale: out is 2 everywhere.
  const CpuAttentionResult good = flex_attention_cpu(q, k, v, o);
  for (float x : good.out)
    REQUIRE(x == 2.0f);
  o.descale.k = TensorRef::contiguous(one.data(), DType::F32, {1});
  CHECK_THROWS_WITH(flex_attention_cpu(q, k, v, o),
                    Catch::Contains("descale.k was given with a KV cache") &&
                        Catch::Contains("KvCache::k_scale / v_scale"));
  o.descale = {};
  o.descale.q = TensorRef::contiguous(one.data(), DType::F32, {1});
  CHECK_THROWS_WITH(flex_attention_cpu(q, k, v, o),
                    Catch::Contains("descale.q was given with a KV cache"));
}
