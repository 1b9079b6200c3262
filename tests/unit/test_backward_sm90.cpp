// backward_dkdv/sm90a_wgmma and backward_dq/sm90a_wgmma without a GPU: experimental selection
// (the sm80 backward stays the default until they are verified), what they serve and refuse
// (with reasons), their configs, and NVRTC compiles of every standard mod at head dims 64 and
// 128 with their register / spill / shared-memory budget.
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "kernels/Registry.h"
#include "kernels/backward/Backward.h"
#include "kernels/backward/Sm90Backward.h"
#include "support/Parallel.h"

#include <flexjit_abi.h>
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <mutex>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

KernelDesc bwd_problem(Family f, const char* arch, DType dtype, int dqk, int dv, int gqa = 1) {
  return backward_problem(f, cuda::Arch::parse(arch), dtype, dqk, dv, gqa, true);
}

KernelDesc sm90_desc(Family f, DType dtype, int dqk, int dv, const Params& overrides = {}) {
  return Registry::global().complete(bwd_problem(f, "sm_90a", dtype, dqk, dv), {}, overrides,
                                     "sm90a_wgmma");
}

}  // namespace

TEST_CASE("sm90a_wgmma backward: the sm_90a default, sm80_mma for what it cannot take",
          "[sm90][backward]") {
  const Registry& reg = Registry::global();
  for (Family f : {Family::BackwardDkDv, Family::BackwardDq}) {
    INFO(to_string(f));
    const Variant* v = reg.find(f, "sm90a_wgmma");
    REQUIRE(v != nullptr);
    CHECK_FALSE(v->experimental());  // verified on an H100 (docs/kernels/backward_sm90.md)
    const KernelDesc p = bwd_problem(f, "sm_90a", DType::BF16, 128, 128);
    if (!reg.excluded().empty()) continue;  // FLEXJIT_EXCLUDE_VARIANTS changes the defaults
    CHECK(reg.complete(p, {}, {}).variant == "sm90a_wgmma");
    // What it cannot take falls back to sm80_mma, with the reason.
    Selection fb;
    CHECK(reg.complete(bwd_problem(f, "sm_90a", DType::F32, 128, 128), {}, {}, {}, &fb).variant ==
          "sm80_mma");
    CHECK_THAT(fb.str(), Catch::Contains("f32 inputs run on the tf32 tensor cores"));
    CHECK(reg.complete(bwd_problem(f, "sm_90a", DType::BF16, 256, 256), {}, {}).variant ==
          "sm80_mma");
    // Head dims below the tiles run here (96 in 128, 48 in 64, 96 / 64); past 128 on sm80_mma,
    // whose reason names what this variant takes.
    for (auto [dqk, dv] : {std::pair{96, 96}, {48, 48}, {96, 64}, {128, 64}, {80, 112}}) {
      INFO("d=" << dqk << "/" << dv);
      CHECK(reg.complete(bwd_problem(f, "sm_90a", DType::BF16, dqk, dv), {}, {}).variant ==
            "sm90a_wgmma");
    }
    CHECK_THAT(
        v->unsupported(bwd_problem(f, "sm_90a", DType::BF16, 192, 128), {}).value(),
        Catch::Contains("head_dim_qk = 192") && Catch::Contains("multiples of 8 from 8 to 128"));
    CHECK(reg.complete(bwd_problem(f, "sm_90", DType::BF16, 128, 128), {}, {}).variant ==
          "sm80_mma");
    // A config parameter only sm80_mma has (num_warps) passes it over.
    CHECK(reg.complete(p, {}, {{"num_warps", 4}}).variant == "sm80_mma");
    if (f == Family::BackwardDkDv) {
      // Both dQ strategies are this variant's (its dq_atomic config).
      for (int a : {0, 1}) {
        const KernelDesc d = reg.complete(p, {}, {{"dq_atomic", a}});
        CHECK(d.variant == "sm90a_wgmma");
        CHECK(d.config.at("dq_atomic") == a);
      }
      // Deterministic buffer gradients are sm80_mma's.
      Selection det;
      const KernelDesc dp = backward_problem(f, cuda::Arch::parse("sm_90a"), DType::BF16, 128, 128,
                                             1, true, /*deterministic=*/true);
      CHECK(reg.complete(dp, {}, {}, {}, &det).variant == "sm80_mma");
      CHECK_THAT(det.str(), Catch::Contains("deterministic buffer gradients run on sm80_mma"));
    }
  }
}

TEST_CASE("sm90a_wgmma backward serves sm_90a bf16 / f16 d 64 / 128 and says why not the rest",
          "[sm90][backward]") {
  const BackwardDkDvSm90Wgmma dkdv;
  const BackwardDqSm90Wgmma dq;
  auto p = [](Family f, const char* arch, DType dt, int dqk = 128, int dv = 128) {
    return bwd_problem(f, arch, dt, dqk, dv);
  };
  for (const Variant* v : {static_cast<const Variant*>(&dkdv), static_cast<const Variant*>(&dq)}) {
    const Family f = v->family();
    INFO(to_string(f));
    CHECK_FALSE(v->unsupported(p(f, "sm_90a", DType::BF16), {}).has_value());
    CHECK_FALSE(v->unsupported(p(f, "sm_90a", DType::F16, 64, 64), {}).has_value());
    CHECK_FALSE(v->unsupported(p(f, "sm_90a", DType::BF16, 128, 64), {}).has_value());
    CHECK(v->unsupported(p(f, "sm_90", DType::BF16), {}).value() ==
          "wgmma and setmaxnreg need sm_90a, not sm_90");
    CHECK_THAT(v->unsupported(p(f, "sm_90a", DType::F32), {}).value(),
               Catch::Contains("f32 inputs run on the tf32 tensor cores of sm80_mma"));
    CHECK(v->unsupported(p(f, "sm_90a", DType::BF16, 256, 256), {}).value() ==
          fmt::format("{}/sm90a_wgmma does not support head_dim_qk = 256; supported: multiples "
                      "of 8 from 8 to 128 (computed in tiles of 64, 128)",
                      to_string(f)));
    CHECK_THAT(v->unsupported(p(f, "sm_90a", DType::BF16, 64, 100), {}).value(),
               Catch::Contains("head_dim_v = 100"));
    CHECK_FALSE(v->unsupported(p(f, "sm_90a", DType::BF16, 96, 72), {}).has_value());
    KernelDesc det = p(f, "sm_90a", DType::BF16);
    det.flags.set(kDeterministicFlag, 1);
    CHECK_THAT(v->unsupported(det, {}).value(),
               Catch::Contains("deterministic buffer gradients run on sm80_mma"));
    InputFacts tma;
    tma.tma_blocker = "dout's head stride is 0 bytes; ...";
    CHECK(v->unsupported(p(f, "sm_90a", DType::BF16), tma).value() == tma.tma_blocker);
    InputFacts unaligned;
    unaligned.aligned16 = false;
    unaligned.alignment_blocker = "dq's data pointer is not 16-byte aligned";
    CHECK_THAT(v->unsupported(p(f, "sm_90a", DType::BF16), unaligned).value(),
               Catch::Contains("TMA needs 16-byte aligned") && Catch::Contains("dq's data"));
  }
  // Block masks: dK/dV's kv tile is its two 64-row consumers (128 keys), its q tile shrinks to
  // 64; dQ the other way round.
  InputFacts mask64;
  mask64.mask_q_block = mask64.mask_kv_block = 64;
  CHECK_THAT(dkdv.unsupported(p(Family::BackwardDkDv, "sm_90a", DType::BF16), mask64).value(),
             Catch::Contains("kv block size 64 is not a multiple of 128"));
  CHECK_THAT(dq.unsupported(p(Family::BackwardDq, "sm_90a", DType::BF16), mask64).value(),
             Catch::Contains("q block size 64 is not a multiple of 128"));
  InputFacts mask_128x64, mask_64x128;
  mask_128x64.mask_q_block = 128, mask_128x64.mask_kv_block = 64;
  mask_64x128.mask_q_block = 64, mask_64x128.mask_kv_block = 128;
  CHECK_FALSE(dq.unsupported(p(Family::BackwardDq, "sm_90a", DType::BF16), mask_128x64));
  CHECK(dq.resolve_config(p(Family::BackwardDq, "sm_90a", DType::BF16, 64, 64), {}, mask_128x64)
            .at("block_n") == 64);
  CHECK_FALSE(dkdv.unsupported(p(Family::BackwardDkDv, "sm_90a", DType::BF16), mask_64x128));
  CHECK_THROWS_WITH(dkdv.resolve_config(p(Family::BackwardDkDv, "sm_90a", DType::BF16),
                                        {{"block_m", 128}}, mask_64x128),
                    Catch::Contains("not multiples") && Catch::Contains("128x128 tiles"));
}

// dQ added by the dK/dV kernel goes into an f32 accumulator whose rows are the qk tile wide (the
// sm_90a kernel's 64-row blocks); the workspace holds it and the preprocess / convert modules say
// it.
TEST_CASE("sm90a_wgmma backward: the dQ accumulator's rows are the qk tile wide",
          "[sm90][backward]") {
  CHECK(dq_accum_dim(64) == 64);
  CHECK(dq_accum_dim(40) == 64);
  CHECK(dq_accum_dim(96) == 128);
  CHECK(dq_accum_dim(128) == 128);
  CHECK(dq_accum_dim(200) == 256);
  QkvShape s;
  s.batch = 2, s.heads_q = s.heads_kv = 3, s.seqlen_q = 300, s.seqlen_kv = 100;
  s.head_dim_qk = 96, s.head_dim_v = 64;
  const size_t rows = 2 * 3 * 384;  // Sq rounded up to 128
  CHECK(backward_scratch_bytes(s, false) == 4 * rows * 2);
  CHECK(backward_scratch_bytes(s, true) == 4 * rows * (2 + 128));
  const Registry& reg = Registry::global();
  const KernelDesc pre =
      reg.complete(bwd_problem(Family::BackwardPreprocess, "sm_90a", DType::BF16, 96, 64), {}, {});
  const KernelDesc convert =
      reg.complete(bwd_problem(Family::BackwardDq, "sm_90a", DType::BF16, 96, 64), {},
                   {{"dq_layout", 1}}, "atomic_convert");
  for (const KernelDesc& d : {pre, convert}) {
    INFO(d.str());
    const std::string src = reg.get(d.family, d.variant).generate(standard_mods("noop"), d).source;
    CHECK_THAT(src, Catch::Contains("kDqAccumDim = 128") &&
                        Catch::Contains("kHeadDimQK = 96, kHeadDimV = 64"));
  }
}

TEST_CASE("sm90a_wgmma backward configs: defaults, the space, and precise refusals",
          "[sm90][backward]") {
  for (Family f : {Family::BackwardDkDv, Family::BackwardDq}) {
    const Variant& v = Registry::global().get(f, "sm90a_wgmma");
    for (DType dt : {DType::BF16, DType::F16}) {
      for (auto [dqk, dv] : {std::pair{64, 64}, {128, 128}, {128, 64}, {64, 128}}) {
        INFO(to_string(f) << " " << to_string(dt) << " d=" << dqk << "/" << dv);
        const KernelDesc d = sm90_desc(f, dt, dqk, dv);
        CHECK(d.variant == "sm90a_wgmma");
        CHECK(KernelDesc::parse(d.str()) == d);
        const std::vector<Params> space = v.config_space(d);
        CHECK(std::find(space.begin(), space.end(), d.config) != space.end());
        for (const Params& c : space) {
          KernelDesc e = d;
          e.config = c;
          CHECK(v.smem_bytes(e) <= 232448u);  // sm_90's 227 KiB per block
        }
      }
    }
  }
  CHECK(sm90_desc(Family::BackwardDkDv, DType::BF16, 128, 128).config.str() ==
        "block_m=64 block_n=128 dq_atomic=1 num_stages=2");
  // dQ inside the dK/dV kernel takes 64-query steps: a caller's block_m = 128 alone gets the
  // second pass, with dq_atomic = 1 a precise refusal.
  CHECK(sm90_desc(Family::BackwardDkDv, DType::BF16, 64, 64, {{"block_m", 128}}).config.str() ==
        "block_m=128 block_n=128 dq_atomic=0 num_stages=2");
  CHECK_THROWS_WITH(
      sm90_desc(Family::BackwardDkDv, DType::BF16, 64, 64, {{"block_m", 128}, {"dq_atomic", 1}}),
      Catch::Contains("dq_atomic = 1 takes block_m = 64"));
  CHECK_THROWS_WITH(sm90_desc(Family::BackwardDkDv, DType::BF16, 64, 64, {{"dq_atomic", 2}}),
                    Catch::Contains("dq_atomic must be 0 or 1, not 2"));
  // dQ at d = 128: 64 keys for lengths that leave a ragged tile (or are not known), 128 where
  // both divide 128 (1.13-1.19x on masked cases: docs/kernels/backward_sm90.md "Design notes"); a
  // caller's block_n stays.
  CHECK(sm90_desc(Family::BackwardDq, DType::BF16, 128, 128).config.str() ==
        "block_m=128 block_n=64 num_stages=2");
  {
    const Variant& dq = Registry::global().get(Family::BackwardDq, "sm90a_wgmma");
    const KernelDesc p = bwd_problem(Family::BackwardDq, "sm_90a", DType::BF16, 128, 128);
    InputFacts even, ragged;
    even.seqlen_q = 4096, even.seqlen_kv = 1024;
    ragged.seqlen_q = 4096, ragged.seqlen_kv = 1000;
    CHECK(dq.resolve_config(p, {}, even).str() == "block_m=128 block_n=128 num_stages=2");
    CHECK(dq.resolve_config(p, {}, ragged).str() == "block_m=128 block_n=64 num_stages=2");
    CHECK(dq.resolve_config(p, {{"block_n", 64}}, even).str() ==
          "block_m=128 block_n=64 num_stages=2");
  }
  CHECK(sm90_desc(Family::BackwardDq, DType::BF16, 64, 64).config.str() ==
        "block_m=128 block_n=128 num_stages=2");
  // dK + dV (64 + 64) and S^T + dP^T (64 + 64 with 128-row q tiles) do not fit at d = 128.
  CHECK_THROWS_WITH(
      sm90_desc(Family::BackwardDkDv, DType::BF16, 128, 128, {{"block_m", 128}}),
      Catch::Contains("256 accumulator registers") && Catch::Contains("use block_m = 64"));
  CHECK_NOTHROW(sm90_desc(Family::BackwardDkDv, DType::BF16, 64, 64, {{"block_m", 128}}));
  CHECK_THROWS_WITH(sm90_desc(Family::BackwardDkDv, DType::BF16, 128, 128, {{"block_n", 64}}),
                    Catch::Contains("block_n = 64") && Catch::Contains("supported: 128"));
  CHECK_THROWS_WITH(sm90_desc(Family::BackwardDq, DType::BF16, 128, 128, {{"num_warps", 8}}),
                    Catch::Contains("num_warps"));
  // The layout formulas: slack, tiles, each stage's lse2 and delta (64 floats each), the
  // mbarriers.
  CHECK(fj_bwd_dkdv_sm90_smem_bytes(64, 128, 128, 128, 2, 2, 0) ==
        1024 + 2 * (128 + 2 * 64) * 256 + 2 * 2 * 4 * 64 + 8 * 5);
  // dq_atomic: two 128 x 64 dS^T tiles and 64 x 128 f32 dQ rows.
  CHECK(fj_bwd_dkdv_sm90_smem_bytes(64, 128, 128, 128, 2, 2, 1) ==
        1024 + 2 * (128 + 2 * 64) * 256 + 2 * 2 * 128 * 64 + 4 * 64 * 128 + 2 * 2 * 4 * 64 + 8 * 5);
  CHECK(fj_bwd_dq_sm90_smem_bytes(128, 64, 128, 128, 2, 2) ==
        1024 + 2 * (128 + 2 * 64) * 256 + 8 * 5);
}

TEST_CASE("sm90a_wgmma backward compiles for every standard mod at d 64 / 128 without spills",
          "[sm90][backward][nvrtc]") {
  struct Job {
    Family family;
    std::string mods;
    DType dtype;
    int dqk, dv;
    Params overrides;
  };
  std::vector<Job> jobs;
  for (Family f : {Family::BackwardDkDv, Family::BackwardDq}) {
    for (const std::string& m : standard_mod_names())
      jobs.push_back({f, m, DType::BF16, 128, 128, {}});
    for (const char* m : {"alibi_causal", "softcap", "relative_bias_causal", "document_causal"})
      jobs.push_back({f, m, DType::F16, 64, 64, {}});
    jobs.push_back({f, "alibi_causal", DType::BF16, 128, 64, {}});
    jobs.push_back({f, "softcap_causal", DType::BF16, 64, 128, {}});
    // Head dims below their tiles (issue 28): the defaults of d 96, 80, 96 / 64.
    for (auto [dqk, dv] : {std::pair{96, 96}, {80, 80}, {96, 64}}) {
      for (const char* m : {"noop", "causal", "alibi_causal"})
        jobs.push_back({f, m, DType::BF16, dqk, dv, {}});
    }
    jobs.push_back({f, "document_causal", DType::F16, 40, 40, {}});
  }
  jobs.push_back({Family::BackwardDkDv, "causal", DType::BF16, 64, 64, {{"block_m", 128}}});
  jobs.push_back({Family::BackwardDq, "causal", DType::BF16, 128, 128, {{"block_n", 128}}});
  jobs.push_back({Family::BackwardDkDv, "noop", DType::BF16, 128, 128, {{"num_stages", 3}}});
  // The dK/dV kernel without dQ (the second pass's plan); the defaults above add it.
  for (const char* m : {"noop", "relative_bias_causal", "document_causal"})
    jobs.push_back({Family::BackwardDkDv, m, DType::BF16, 128, 128, {{"dq_atomic", 0}}});
  jobs.push_back({Family::BackwardDkDv, "alibi_causal", DType::F16, 64, 64, {{"dq_atomic", 0}}});

  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::mutex mu;
  std::vector<std::string> failures, report;
  test::run_parallel(jobs.size(), [&](size_t i) {
    const Job& j = jobs[i];
    try {
      const KernelDesc d = sm90_desc(j.family, j.dtype, j.dqk, j.dv, j.overrides);
      const auto t0 = std::chrono::steady_clock::now();
      const BuiltKernel k = builder.build(standard_mods(j.mods), d);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const auto& u = k.compiled.kernel->usage;
      std::lock_guard<std::mutex> lock(mu);
      report.push_back(
          fmt::format("{} {}: {} registers (launch bound), {} / {} B spill "
                      "stores / loads, {} B smem, compiled in {:.2f} s",
                      d.str(), j.mods, u.registers, u.spill_store_bytes, u.spill_load_bytes,
                      Registry::global().get(j.family, "sm90a_wgmma").smem_bytes(d), secs));
      // Known (docs/kernels/backward_sm90.md "Resources and compile time"): dQ at d = 64 with its
      // 128-key tiles spills 16 bytes for relative_bias_causal (the bias loads of 64 scores in
      // flight beside S, dP and dQ); dK/dV with dQ added (dq_atomic) at d = 128 spills 16 bytes for
      // alibi without a mask (two 64-bit values stored before the S^T / dP^T GEMMs and loaded in
      // the element step: its slope gradient's per-head sums and the element step pass 240
      // registers). Every other case: none.
      const bool known = (j.family == Family::BackwardDq && j.dqk == 64 &&
                          j.mods.rfind("relative_bias", 0) == 0) ||
                         (j.family == Family::BackwardDkDv && j.dqk > 64 && j.mods == "alibi" &&
                          d.config.get("dq_atomic").value_or(0) == 1);
      const int64_t allowed = known ? 32 : 0;
      if (u.spill_store_bytes > allowed || u.spill_load_bytes > allowed) {
        failures.push_back(fmt::format("{} {}: {} / {} bytes of spill stores / loads", d.str(),
                                       j.mods, u.spill_store_bytes, u.spill_load_bytes));
      }
      // Short of registers, ptxas may serialize the wgmma instead of spilling (each product
      // waited for before the next issues): the dK/dV kernel without `divisible` did for noop,
      // alibi and sinks at d 128 until 2026-11-28.
      if (!u.wgmma_serialized.empty()) {
        failures.push_back(
            fmt::format("{} {}: wgmma serialized ({})", d.str(), j.mods, u.wgmma_serialized));
      }
      for (const char* needle :
           {"wgmma.mma_async", "cp.async.bulk.tensor.4d", "setmaxnreg.inc", "mbarrier.try_wait"}) {
        if (k.source->source.find(needle) == std::string::npos)
          failures.push_back(fmt::format("{} {}: source lacks {}", d.str(), j.mods, needle));
      }
      // dQ inside the dK/dV kernel: the generated MN-major wrapper only there.
      const bool adds_dq = d.config.get("dq_atomic").value_or(0) == 1;
      if ((k.source->source.find("FJ_DEVICE void fj_wgmma_tt(") != std::string::npos) != adds_dq) {
        failures.push_back(fmt::format("{} {}: {} fj_wgmma_tt", d.str(), j.mods,
                                       adds_dq ? "source lacks" : "source has"));
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(fmt::format("{} {}: {}", to_string(j.family), j.mods, e.what()));
    }
  });
  std::sort(report.begin(), report.end());
  WARN(fmt::format("{}", fmt::join(report, "\n")));
  CHECK(failures.empty());
  for (const std::string& f : failures)
    FAIL_CHECK(f);
}

TEST_CASE("the dQ convert of the sm_90a dK/dV kernel's accumulator compiles at every tile dim",
          "[sm90][backward][nvrtc]") {
  // backward_dq/atomic_convert with dq_layout 1 (the accumulator in wgmma fragment order): the
  // rows go through shared memory (64 rows of the tile dim in dq's dtype, 16 bytes of padding
  // each) and out in 16-byte stores.
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  for (DType dt : {DType::BF16, DType::F16}) {
    for (auto [d, tile] : {std::pair{128, 128}, {64, 64}, {96, 128}, {40, 64}}) {
      const KernelDesc desc =
          Registry::global().complete(bwd_problem(Family::BackwardDq, "sm_90a", dt, d, d), {},
                                      {{"dq_layout", 1}}, "atomic_convert");
      INFO(desc.str());
      const BuiltKernel k = builder.build(standard_mods("noop"), desc);
      const auto& u = k.compiled.kernel->usage;
      CHECK(u.spill_store_bytes == 0);
      CHECK(u.spill_load_bytes == 0);
      CHECK(u.static_shared_bytes == 64 * (tile * 2 + 16));
    }
  }
}
