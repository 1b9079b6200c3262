// Head dims below the tile dims without a GPU (issue 28): the sm_80 forward, backward and decode
// variants take every multiple of 8 from 8 to 256, qk and v independently (kernels/HeadDims.h);
// a dim none takes is an UnsupportedError naming the rule; the generated configs carry the tile
// and the real dims; NVRTC compiles the new configs ([nvrtc]); the CPU backend's forward and
// backward at d = 80 and 192 / 128 agree with its fp64 reference mode and the interpreter's
// reference. The GPU numerics are in tests/gpu/test_head_dims.cpp.
#include <flexjit/error.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "cpu/BackwardKernel.h"
#include "cpu/ForwardKernel.h"
#include "kernels/HeadDims.h"
#include "kernels/Registry.h"
#include "kernels/backward/Backward.h"
#include "kernels/decode/Decode.h"
#include "kernels/forward/Forward.h"
#include "support/HostBindings.h"
#include "support/Parallel.h"
#include "support/ReferenceAttention.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <mutex>
#include <random>
#include <string>
#include <vector>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

const cuda::Arch kSm80 = cuda::Arch::parse("sm_80");

// The (qk, v) pairs every variant must take: qk = v at every multiple of 8, and qk != v both
// ways across tiles.
std::vector<std::pair<int, int>> all_pairs() {
  std::vector<std::pair<int, int>> out;
  for (int d = kHeadDimQuantum; d <= kMaxHeadDim; d += kHeadDimQuantum)
    out.push_back({d, d});
  for (auto p : {std::pair{192, 128}, {96, 64}, {128, 64}, {40, 200}, {256, 8}})
    out.push_back(p);
  return out;
}

KernelDesc forward_desc(const cuda::Arch& arch, DType dtype, int dqk, int dv, int page = -1) {
  KernelDesc p = forward_problem(arch, dtype, dqk, dv, 1, /*divisible=*/false,
                                 /*full_blocks=*/true);
  if (page >= 0) set_kv_cache_flags(p, page);
  return Registry::global().complete(p, InputFacts{}, {}, "sm80_mma");
}

KernelDesc backward_desc(Family f, DType dtype, int dqk, int dv, bool dq_atomic = false) {
  const KernelDesc p = backward_problem(f, kSm80, dtype, dqk, dv, 1, true);
  if (f == Family::BackwardPreprocess) return Registry::global().complete(p, {}, {});
  if (f == Family::BackwardDq && dq_atomic) {
    return Registry::global().complete(p, {}, {{"dq_layout", 0}}, "atomic_convert");
  }
  if (f == Family::BackwardDkDv && dq_atomic) {
    return Registry::global().complete(p, {}, {{"dq_atomic", 1}}, "sm80_mma");
  }
  return Registry::global().complete(p, {}, {}, "sm80_mma");
}

KernelDesc split_desc(int dqk, int dv, int gqa, int sq, int page, const std::string& variant = "") {
  return Registry::global().complete(
      decode_split_problem(kSm80, DType::BF16, dqk, dv, gqa, decode_rows(gqa, sq), page, true),
      InputFacts{}, {}, variant);
}

KernelDesc combine_desc(DType dtype, int dv, const std::string& variant = "") {
  return Registry::global().complete(decode_combine_problem(kSm80, dtype, dv), InputFacts{}, {},
                                     variant);
}

}  // namespace

TEST_CASE("head dims: tile_head_dim picks the smallest tile and head_dim_reason names the rule",
          "[head_dims]") {
  CHECK(tile_head_dim(8, {64, 128, 256}) == 64);
  CHECK(tile_head_dim(64, {64, 128, 256}) == 64);
  CHECK(tile_head_dim(80, {64, 128, 256}) == 128);
  CHECK(tile_head_dim(136, {64, 128, 256}) == 256);
  CHECK(tile_head_dim(160, {64, 128, 192, 256}) == 192);
  CHECK_FALSE(tile_head_dim(100, {64, 128, 256}));  // not a multiple of 8
  CHECK_FALSE(tile_head_dim(0, {64, 128, 256}));
  CHECK_FALSE(tile_head_dim(264, {64, 128, 256}));  // past every tile
  CHECK_FALSE(head_dim_reason("forward/sm80_mma", "head_dim_qk", 72, {64, 128, 256}));
  CHECK(head_dim_reason("forward/sm80_mma", "head_dim_v", 264, {64, 128, 256}) ==
        "forward/sm80_mma does not support head_dim_v = 264; supported: multiples of 8 from 8 to "
        "256 (computed in tiles of 64, 128, 256)");
}

TEST_CASE(
    "head dims: the sm_80 forward, backward and decode variants take every multiple of 8 "
    "up to 256, qk and v independently",
    "[head_dims]") {
  for (auto [dqk, dv] : all_pairs()) {
    INFO("d=" << dqk << "/" << dv);
    for (DType dt : {DType::BF16, DType::F32}) {
      const KernelDesc f = forward_desc(kSm80, dt, dqk, dv);
      CHECK(f.variant == "sm80_mma");
      CHECK(f.head_dim_qk == dqk);  // the description keeps the real dims
      CHECK(f.head_dim_v == dv);
      CHECK_NOTHROW(forward_desc(kSm80, dt, dqk, dv, 16));  // chunked prefill on pages
      for (Family fam : {Family::BackwardPreprocess, Family::BackwardDkDv, Family::BackwardDq})
        CHECK_NOTHROW(backward_desc(fam, dt, dqk, dv));
      CHECK_NOTHROW(backward_desc(Family::BackwardDkDv, dt, dqk, dv, /*dq_atomic=*/true));
      CHECK_NOTHROW(backward_desc(Family::BackwardDq, dt, dqk, dv, /*dq_atomic=*/true));
    }
    for (int page : {0, 16}) {
      for (const char* v : {"sm80_mma", "sm80_ef", "sm80_ef256"})
        CHECK(split_desc(dqk, dv, 4, 1, page, v).variant == v);
    }
    for (const char* v : {"warp_per_row", "warp_batched"})
      CHECK(combine_desc(DType::BF16, dv, v).variant == v);
  }
  // The config follows the tile dim: 80 runs in the 128 tile's default config.
  CHECK(forward_desc(kSm80, DType::BF16, 80, 80).config ==
        forward_desc(kSm80, DType::BF16, 128, 128).config);
  CHECK(split_desc(160, 160, 4, 1, 0).config == split_desc(256, 256, 4, 1, 0).config);
}

TEST_CASE("head dims: a dim no variant takes is an UnsupportedError naming the rule",
          "[head_dims][errors]") {
  const std::string rule = "supported: multiples of 8 from 8 to 256";
  for (auto [dqk, dv] : {std::pair{100, 100}, {264, 264}, {128, 100}, {128, 264}, {4, 4}}) {
    const std::string what =
        dqk != 128 ? fmt::format("head_dim_qk = {}", dqk) : fmt::format("head_dim_v = {}", dv);
    INFO("d=" << dqk << "/" << dv);
    const KernelDesc fp = forward_problem(kSm80, DType::BF16, dqk, dv, 1, false, true);
    CHECK_THROWS_AS(Registry::global().complete(fp, InputFacts{}), UnsupportedError);
    CHECK_THROWS_WITH(
        Registry::global().complete(fp, InputFacts{}, {}, "sm80_mma"),
        Catch::Contains("forward/sm80_mma does not support " + what) && Catch::Contains(rule));
    for (Family f : {Family::BackwardPreprocess, Family::BackwardDkDv, Family::BackwardDq}) {
      CHECK_THROWS_WITH(backward_desc(f, DType::BF16, dqk, dv),
                        Catch::Contains(what) && Catch::Contains(rule));
    }
    CHECK_THROWS_WITH(split_desc(dqk, dv, 1, 1, 0), Catch::Contains(what) && Catch::Contains(rule));
    if (dqk == 128) {
      CHECK_THROWS_WITH(
          combine_desc(DType::BF16, dv),
          Catch::Contains("decode_combine does not support " + what) && Catch::Contains(rule));
    }
  }
}

TEST_CASE("head dims: the generated configs carry the tile dims and the real ones",
          "[head_dims][codegen]") {
  const Mods causal = standard_mods("causal");
  auto source_of = [&](const KernelDesc& d) {
    return Registry::global().find(d.family, d.variant)->generate(causal, d).source;
  };
  const std::string fwd = source_of(forward_desc(kSm80, DType::BF16, 80, 80));
  CHECK_THAT(fwd, Catch::Contains("kHeadDimQK = 128, kHeadDimV = 128") &&
                      Catch::Contains("kRealDimQK = 80, kRealDimV = 80") &&
                      Catch::Contains("forward/sm80_mma sm_80 bf16 d=80/80"));
  const std::string paged = source_of(forward_desc(kSm80, DType::BF16, 192, 128, 16));
  CHECK_THAT(paged, Catch::Contains("kHeadDimQK = 256, kHeadDimV = 128") &&
                        Catch::Contains("kRealDimQK = 192, kRealDimV = 128") &&
                        Catch::Contains("kPageSize = 16"));
  const std::string dkdv = source_of(backward_desc(Family::BackwardDkDv, DType::BF16, 160, 96));
  CHECK_THAT(dkdv, Catch::Contains("kHeadDimQK = 256, kHeadDimV = 128") &&
                       Catch::Contains("kRealDimQK = 160, kRealDimV = 96") &&
                       Catch::Contains("kDqAccumDim = 192"));
  // The row kernels take the real dims.
  const std::string pre =
      source_of(backward_desc(Family::BackwardPreprocess, DType::BF16, 160, 96));
  CHECK_THAT(pre, Catch::Contains("kHeadDimQK = 160, kHeadDimV = 96"));
  const std::string split = source_of(split_desc(96, 64, 4, 1, 16));
  CHECK_THAT(split, Catch::Contains("kHeadDimQK = 128, kHeadDimV = 64") &&
                        Catch::Contains("kRealDimQK = 96, kRealDimV = 64"));
  const std::string comb = source_of(combine_desc(DType::BF16, 80));
  CHECK_THAT(comb, Catch::Contains("kHeadDimV = 128, kRealDimV = 80"));
  // Equal dims keep today's config: tile = real.
  CHECK_THAT(source_of(forward_desc(kSm80, DType::BF16, 128, 128)),
             Catch::Contains("kHeadDimQK = 128, kHeadDimV = 128") &&
                 Catch::Contains("kRealDimQK = 128, kRealDimV = 128"));
}

TEST_CASE("head dims: the new configs compile through NVRTC within the register file",
          "[head_dims][nvrtc]") {
  struct Job {
    std::string what;
    KernelDesc desc;
    std::string mods;
    int max_spill;  // bytes of spill stores allowed
  };
  // The forward and the backward at 255 registers may spill a little, as their tile dims' own
  // defaults do (forward d = 112 in the 128 tile: 40 B, as d = 128 with a causal mask_mod: 32 B,
  // on the current NVRTC): the backward suite's bound of 64 bytes for both; decoding none.
  constexpr int kBound = 64;
  std::vector<Job> jobs;
  const cuda::Arch sm90a = cuda::Arch::parse("sm_90a");
  for (auto [dqk, dv] : std::vector<std::pair<int, int>>{
           {32, 32}, {48, 48}, {80, 80}, {112, 112}, {160, 160}, {192, 128}, {96, 64}}) {
    const std::string d = fmt::format("d={}/{}", dqk, dv);
    jobs.push_back({"forward " + d, forward_desc(kSm80, DType::BF16, dqk, dv), "causal", kBound});
    jobs.push_back(
        {"forward sm_90a " + d, forward_desc(sm90a, DType::F16, dqk, dv), "alibi", kBound});
    jobs.push_back({"prefill pages " + d, forward_desc(kSm80, DType::BF16, dqk, dv, 16),
                    "alibi_causal", kBound});
    jobs.push_back(
        {"dkdv " + d, backward_desc(Family::BackwardDkDv, DType::BF16, dqk, dv), "alibi", kBound});
    jobs.push_back(
        {"dq " + d, backward_desc(Family::BackwardDq, DType::BF16, dqk, dv), "alibi", kBound});
    jobs.push_back({"decode " + d, split_desc(dqk, dv, 4, 1, 0), "alibi_causal", 0});
    jobs.push_back({"decode pages " + d, split_desc(dqk, dv, 4, 2, 16), "causal", 0});
    jobs.push_back({"combine " + d, combine_desc(DType::BF16, dv, "warp_batched"), "noop", 0});
  }
  for (auto [dqk, dv] : std::vector<std::pair<int, int>>{{80, 80}, {192, 128}, {40, 200}}) {
    const std::string d = fmt::format("d={}/{}", dqk, dv);
    jobs.push_back(
        {"f32 forward " + d, forward_desc(kSm80, DType::F32, dqk, dv), "causal", kBound});
    jobs.push_back(
        {"ragged prefill " + d, forward_desc(kSm80, DType::BF16, dqk, dv, 0), "causal", kBound});
    jobs.push_back({"f32 dkdv " + d, backward_desc(Family::BackwardDkDv, DType::F32, dqk, dv),
                    "noop", kBound});
    jobs.push_back({"dkdv dq_atomic " + d,
                    backward_desc(Family::BackwardDkDv, DType::BF16, dqk, dv, true), "causal",
                    kBound});
    jobs.push_back({"preprocess " + d,
                    backward_desc(Family::BackwardPreprocess, DType::F16, dqk, dv), "noop", 0});
    jobs.push_back({"atomic_convert " + d,
                    backward_desc(Family::BackwardDq, DType::BF16, dqk, dv, true), "noop", 0});
    jobs.push_back(
        {"combine warp_per_row " + d, combine_desc(DType::F32, dv, "warp_per_row"), "noop", 0});
    jobs.push_back({"decode sm80_ef " + d, split_desc(dqk, dv, 2, 1, 0, "sm80_ef"), "noop", 0});
  }
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::mutex mu;
  std::vector<std::string> failures, usage(jobs.size());
  test::run_parallel(jobs.size(), [&](size_t i) {
    const Job& j = jobs[i];
    try {
      const BuiltKernel k = builder.build(standard_mods(j.mods), j.desc);
      const auto& u = k.compiled.kernel->usage;
      usage[i] = fmt::format("{} ({}): {} registers, {} spill bytes", j.what, j.desc.str(),
                             u.registers, u.spill_store_bytes);
      if (u.registers <= 0 || u.registers > 255 || u.spill_store_bytes > j.max_spill) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back(usage[i]);
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(j.what + " (" + j.desc.str() + "): " + e.what());
    }
  });
  for (const std::string& u : usage)
    UNSCOPED_INFO(u);
  for (const std::string& f : failures)
    FAIL_CHECK(f);
  CHECK(failures.empty());
}

namespace {

// Random f32 [B, H, S, D] values.
std::vector<float> random_values(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& e : x)
    e = n01(rng);
  return x;
}

TensorRef host(std::vector<float>& x, std::vector<int64_t> shape) {
  return TensorRef::contiguous(x.data(), DType::F32, std::move(shape));
}

}  // namespace

TEST_CASE(
    "head dims: the CPU forward and backward at d = 80 and 192 / 128 match the fp64 "
    "reference",
    "[head_dims][cpu]") {
  uint32_t seed = 28;
  for (auto [dqk, dv] : {std::pair{80, 80}, {192, 128}}) {
    for (const char* name : {"causal", "alibi"}) {
      const int B = 1, Hq = 4, Hkv = 2, Sq = 37, Skv = 53;
      INFO(name << " d=" << dqk << "/" << dv);
      std::mt19937 rng(seed++);
      const Mods mods = standard_mods(name);
      std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
      ir::EvalEnv env;
      env.buffers["slopes"] = ir::BufferView{slopes.data(), DType::F32, {Hq}, {}};
      const ModBindings bindings = test::host_bindings(mods, env);
      std::vector<float> q = random_values(rng, static_cast<size_t>(B * Hq * Sq * dqk));
      std::vector<float> k = random_values(rng, static_cast<size_t>(B * Hkv * Skv * dqk));
      std::vector<float> v = random_values(rng, static_cast<size_t>(B * Hkv * Skv * dv));
      std::vector<float> dout = random_values(rng, static_cast<size_t>(B * Hq * Sq * dv));
      const TensorRef tq = host(q, {B, Hq, Sq, dqk}), tk = host(k, {B, Hkv, Skv, dqk}),
                      tv = host(v, {B, Hkv, Skv, dv}), tdo = host(dout, {B, Hq, Sq, dv});
      // The default scale is 1 / sqrt(head_dim_qk).
      const float scale = 1.0f / std::sqrt(static_cast<float>(dqk));
      const test::ReferenceResult ref =
          test::reference_attention(mods, {B, Hq, Hkv, Sq, Skv, dqk, dv}, q, k, v, scale, env);
      const size_t rows = static_cast<size_t>(B * Hq * Sq);
      std::vector<float> out(rows * dv), lse(rows);
      std::vector<double> out64(rows * dv), lse64(rows);
      // fp32 with the default scale (1 / sqrt(80), not 1 / sqrt(128): 26 % apart); fp64 with the
      // reference's float scale, to compare at its precision.
      cpu::cpu_attention_forward(mods, bindings, tq, tk, tv, out.data(), lse.data());
      cpu::CpuForwardOptions opt;
      opt.scale = scale;
      cpu::cpu_attention_forward_f64(mods, bindings, tq, tk, tv, out64.data(), lse64.data(), opt);
      CHECK(test::relative_error(out, ref.out) <= 1e-5);
      // Both evaluate a score_mod in f32 (on the score rounded to float): where their sums of d
      // products round to neighbouring floats, the results differ by about an f32 ulp.
      const double tol64 = mods.score_mod.defined() ? 1e-5 : 1e-12;
      double err64 = 0;
      for (size_t i = 0; i < out64.size(); ++i)
        err64 = std::max(err64, std::abs(out64[i] - ref.out[i]));
      CHECK(err64 <= tol64);
      for (size_t i = 0; i < rows; ++i)
        CHECK(std::abs(lse64[i] - ref.lse[i]) <= tol64 * std::max(1.0, std::abs(ref.lse[i])));

      // The fp32 backward against the fp64 one, and the fp64 one against central differences of
      // the fp64 forward (loss = sum(out * dout)) at a few entries of q, k and v.
      cpu::cpu_attention_forward_f64(mods, bindings, tq, tk, tv, out64.data(), lse64.data());
      const cpu::CpuGradients<double> g64 = cpu::cpu_attention_backward_f64(
          mods, bindings, tq, tk, tv, out64.data(), lse64.data(), tdo, {});
      const cpu::CpuGradients<float> g32 =
          cpu::cpu_attention_backward(mods, bindings, tq, tk, tv, out.data(), lse.data(), tdo, {});
      REQUIRE(g64.dq.size() == q.size());
      REQUIRE(g64.dk.size() == k.size());
      REQUIRE(g64.dv.size() == v.size());
      const size_t out_elems = rows * static_cast<size_t>(dv);  // clang 14: no binding captures
      auto loss = [&] {
        std::vector<double> o(out_elems), l(rows);
        cpu::cpu_attention_forward_f64(mods, bindings, tq, tk, tv, o.data(), l.data());
        double s = 0;
        for (size_t i = 0; i < o.size(); ++i)
          s += o[i] * dout[i];
        return s;
      };
      for (auto [what, x, g, g32v] :
           {std::tuple{"dq", &q, &g64.dq, &g32.dq}, std::tuple{"dk", &k, &g64.dk, &g32.dk},
            std::tuple{"dv", &v, &g64.dv, &g32.dv}}) {
        INFO(what);
        double scale_g = 1.0;
        for (double e : *g)
          scale_g = std::max(scale_g, std::abs(e));
        for (size_t i = 0; i < g->size(); ++i)
          CHECK(std::abs(static_cast<double>((*g32v)[i]) - (*g)[i]) <= 1e-4 * scale_g);
        std::uniform_int_distribution<size_t> pick(0, x->size() - 1);
        for (int s = 0; s < 6; ++s) {
          const size_t i = pick(rng);
          const float x0 = (*x)[i];
          const float h = 4e-3f * std::max(1.0f, std::abs(x0));
          (*x)[i] = x0 + h;
          const double hi = (*x)[i], lp = loss();
          (*x)[i] = x0 - h;
          const double lo = (*x)[i], lm = loss();
          (*x)[i] = x0;
          INFO("entry " << i);
          CHECK(std::abs((lp - lm) / (hi - lo) - (*g)[i]) <= 2e-3 * scale_g);
        }
      }
    }
  }
}
