// Chunked prefill on an e4m3 KV cache without a GPU (issue 31; docs/kernels/forward_sm90.md
// "e4m3 KV caches"): the forward problem's kv_e4m3 flag (descriptions, round trips), the
// selection of forward/sm90a_wgmma on sm_90a and its configs (the staging tile's shared memory),
// the refusals of every other combination by name, the dispatch of a KV cache call (decode for
// short queries, the forward for a prefill chunk on sm_90a, decode elsewhere), and NVRTC compiles
// of the e4m3 cache kernels for sm_90a ([nvrtc]: bf16 and f16 q, head dims 64, 96, 128, 256 and
// 192 / 128, pages of 1, 16, 128, 256 keys and ragged contiguous K / V, KV tiles of 64 / 128 /
// 192 keys, mods that read buffers; no spills).
#include <flexjit/attention.h>
#include <flexjit/error.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "kernels/Registry.h"
#include "kernels/forward/Forward.h"
#include "kernels/forward/Sm80Mma.h"
#include "kernels/forward/Sm90Wgmma.h"
#include "runtime/Decode.h"
#include "runtime/ForwardPlan.h"
#include "support/Parallel.h"

#include <flexjit_abi.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <mutex>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

KernelDesc fp8_cache_problem(const std::string& arch, DType q_dtype, int dqk, int dv, int gqa,
                             int page_size) {
  KernelDesc p = forward_problem(cuda::Arch::parse(arch), q_dtype, dqk, dv, gqa,
                                 /*divisible=*/false, /*full_blocks=*/true);
  set_kv_cache_flags(p, page_size);
  set_kv_e4m3_flag(p);
  return p;
}

TensorRef fake_cuda(DType dtype, std::vector<int64_t> shape, uintptr_t addr = 0x100000) {
  return TensorRef::contiguous(reinterpret_cast<void*>(addr), dtype, std::move(shape),
                               TensorRef::Device::CUDA, 0);
}

// A chunked prefill's forward inputs on an e4m3 cache: q [2, 8, Sq, D] bf16, pools of 16-key
// pages (or contiguous [2, 2, 1024, D] with lengths), k_scale / v_scale set.
ForwardInputs fp8_cache_inputs(int sq, int d, int page_size, DType q_dtype = DType::BF16) {
  const int B = 2, Hq = 8, Hkv = 2, cap = 1024;
  ForwardInputs in;
  in.q = fake_cuda(q_dtype, {B, Hq, sq, d});
  in.out = in.q;
  // The shape as validate_kv_cache reports it: the logical [B, Hkv, capacity, D] K / V.
  in.shape = validate_qkv(in.q, fake_cuda(q_dtype, {B, Hkv, cap, d}, 0x200000),
                          fake_cuda(q_dtype, {B, Hkv, cap, d}, 0x300000));
  const TensorRef logical_k = fake_cuda(DType::E4M3, {B, Hkv, cap, d}, 0x200000);
  const TensorRef logical_v = fake_cuda(DType::E4M3, {B, Hkv, cap, d}, 0x300000);
  if (page_size > 0) {
    const int pages = B * cap / page_size;
    in.k = fake_cuda(DType::E4M3, {pages, page_size, Hkv, d}, 0x200000);
    in.v = fake_cuda(DType::E4M3, {pages, page_size, Hkv, d}, 0x300000);
    in.page_table = reinterpret_cast<const int*>(0x400000);
    in.page_table_stride_b = cap / page_size;
    in.page_size = page_size;
  } else {
    in.k = logical_k;
    in.v = logical_v;
  }
  in.seq_lens = reinterpret_cast<const int*>(0x500000);
  in.k_scale = reinterpret_cast<const float*>(0x600000);
  in.v_scale = reinterpret_cast<const float*>(0x700000);
  return in;
}

}  // namespace

TEST_CASE("fp8 prefill: the kv_e4m3 flag, sm90a_wgmma's selection and configs",
          "[prefill][fp8][desc]") {
  InputFacts facts;
  facts.seqlen_q = 2048;
  facts.seqlen_kv = 8192;
  Selection sel;
  const KernelDesc d = Registry::global().complete(
      fp8_cache_problem("sm_90a", DType::BF16, 128, 128, 4, 16), facts, {}, {}, &sel);
  INFO(d.str() << "\n" << sel.str());
  CHECK(d.family_variant() == "forward/sm90a_wgmma");
  CHECK_THAT(d.str(), Catch::Contains("bf16 d=128/128") &&
                          Catch::Contains("kv_e4m3=1 page_size=16 seq_lens=1"));
  CHECK(KernelDesc::parse(d.str()) == d);
  CHECK(KernelDesc::from_json(d.to_json()) == d);
  CHECK(on_kv_e4m3(d));
  CHECK(on_kv_cache(d));
  // 192-row tiles, one per CTA, as on a bf16 cache; the staging tile (32 KB at d 128) leaves room
  // for two stages of 128 keys.
  CHECK(d.config.at("block_m") == 192);
  CHECK(d.config.at("block_n") == 128);
  CHECK(d.config.at("num_stages") == 2);
  CHECK(d.config.at("q_tiles") == 1);
  CHECK(d.config.at("persistent") == 0);
  const ForwardSm90Wgmma w;
  CHECK(w.smem_bytes(d) ==
        static_cast<unsigned>(fj_forward_sm90_smem_bytes(192, 128, 128, 128, 2, 2) +
                              fj_forward_sm90_kv_fp8_staging_bytes(128, 128, 128)));
  // A bf16 cache of the same shape keeps its description (no kv_e4m3) and takes 192-row tiles in
  // 2 stages, as contiguous K / V do.
  KernelDesc plain =
      forward_problem(cuda::Arch::parse("sm_90a"), DType::BF16, 128, 128, 4, false, true);
  set_kv_cache_flags(plain, 16);
  const KernelDesc p = Registry::global().complete(plain, facts);
  CHECK_THAT(p.str(), !Catch::Contains("kv_e4m3"));
  CHECK_FALSE(on_kv_e4m3(p));
  CHECK(p.config.at("block_m") == 192);
  CHECK(p.config.at("num_stages") == 2);
  // Every head dim's default fits: d 64 (four stages), 96 (tile 128, 192 rows), 256 (64-key
  // tiles), and 192 / 128, whose 128-key tiles do not fit two stages beside the staging tile: 64
  // keys.
  for (auto [dqk, dv, bn, bm] : {std::tuple{64, 64, 128, 128},
                                 {96, 96, 128, 192},
                                 {256, 256, 64, 128},
                                 {192, 128, 64, 128},
                                 {128, 64, 128, 128}}) {
    for (DType q : {DType::BF16, DType::F16}) {
      for (int page : {0, 1, 16, 256}) {
        const KernelDesc e = Registry::global().complete(
            fp8_cache_problem("sm_90a", q, dqk, dv, 8, page), facts, {}, "sm90a_wgmma");
        INFO(e.str());
        CHECK(e.config.at("block_n") == bn);
        CHECK(e.config.at("block_m") == bm);
        CHECK(w.smem_bytes(e) <= 232448u);
      }
    }
  }
  // block_n 64 and 192 are taken when asked for.
  CHECK(Registry::global()
            .complete(fp8_cache_problem("sm_90a", DType::F16, 64, 64, 1, 16), facts,
                      {{"block_n", 192}}, "sm90a_wgmma")
            .config.at("block_n") == 192);
}

TEST_CASE("fp8 prefill: every unsupported combination names the value and what is supported",
          "[prefill][fp8][errors]") {
  InputFacts facts;
  facts.seqlen_q = 2048;
  facts.seqlen_kv = 8192;
  const ForwardSm90Wgmma w;
  const KernelDesc d =
      Registry::global().complete(fp8_cache_problem("sm_90a", DType::BF16, 128, 128, 4, 16), facts);
  KernelDesc bad = d;
  bad.flags.set("kv_e4m3", 2);
  CHECK_THROWS_WITH(w.validate(bad), Catch::Contains("'kv_e4m3' = 0 or 1, not 2"));
  bad = d;
  bad.config.set("block_n", 176);
  CHECK_THROWS_WITH(w.validate(bad), Catch::Contains("e4m3 KV cache does not support block_n = "
                                                     "176; supported: 64, 128, 192"));
  CHECK_THROWS_WITH(
      Registry::global().complete(fp8_cache_problem("sm_90a", DType::BF16, 128, 128, 4, 16), facts,
                                  {{"block_n", 176}, {"num_stages", 2}}, "sm90a_wgmma"),
      Catch::Contains("block_n = 176"));
  // Head dims: multiples of 16 (16-byte units of e4m3).
  CHECK_THROWS_WITH(
      Registry::global().complete(fp8_cache_problem("sm_90a", DType::BF16, 72, 72, 1, 16), facts,
                                  {}, "sm90a_wgmma"),
      Catch::Contains("e4m3 KV cache does not support head_dim_qk = 72") &&
          Catch::Contains("multiples of 16"));
  // The flag without a cache.
  KernelDesc contiguous =
      forward_problem(cuda::Arch::parse("sm_90a"), DType::BF16, 128, 128, 1, false, true);
  set_kv_e4m3_flag(contiguous);
  CHECK_THROWS_WITH(Registry::global().complete(contiguous, facts, {}, "sm90a_wgmma"),
                    Catch::Contains("only on a KV cache"));
  // f32 q: refused (sm90a_wgmma takes bf16 / f16; sm80_mma reads no e4m3 cache).
  CHECK_THROWS_WITH(
      Registry::global().complete(fp8_cache_problem("sm_90a", DType::F32, 128, 128, 1, 16), facts),
      Catch::Contains("does not read e4m3 KV caches"));
  // sm80_mma reads no e4m3 cache, on any GPU: sm_80, sm_89 and sm_90 (not 90a) have no forward.
  for (const char* arch : {"sm_80", "sm_89", "sm_90"}) {
    INFO(arch);
    CHECK_THROWS_WITH(
        Registry::global().complete(fp8_cache_problem(arch, DType::BF16, 128, 128, 1, 16), facts),
        Catch::Contains("forward/sm80_mma does not read e4m3 KV caches") &&
            Catch::Contains("forward/sm90a_wgmma reads them on sm_90a"));
  }
  CHECK_THROWS_WITH(
      Registry::global().complete(fp8_cache_problem("sm_90a", DType::BF16, 128, 128, 1, 16), facts,
                                  {}, "sm80_mma"),
      Catch::Contains("forward/sm80_mma does not read e4m3 KV caches"));
}

TEST_CASE("fp8 prefill: a prefill chunk on an e4m3 cache takes the forward on sm_90a",
          "[prefill][fp8][plan]") {
  const cuda::Arch sm90a = cuda::Arch::parse("sm_90a");
  AttentionOptions o;
  for (int page : {0, 1, 16, 128}) {
    const ForwardInputs in = fp8_cache_inputs(2048, 128, page);
    INFO("page " << page);
    const KernelDesc problem = runtime::forward_problem_of(sm90a, in, o);
    CHECK(on_kv_e4m3(problem));
    CHECK(kv_page_size(problem) == page);
    CHECK(Registry::global().complete(problem, forward_facts(in)).family_variant() ==
          "forward/sm90a_wgmma");
    const std::optional<std::string> forward_why = runtime::forward_unsupported(sm90a, in, o);
    CHECK_FALSE(forward_why.has_value());
    // choose_kv_cache_plan (src/runtime/Decode.cpp): more than 16 query tokens take the forward,
    // a few decode; both kernels serve an e4m3 cache on sm_90a.
    const std::optional<std::string> decode_ok;
    CHECK(runtime::choose_kv_cache_plan(2048, decode_ok, forward_why).forward);
    CHECK(runtime::choose_kv_cache_plan(17, decode_ok, forward_why).forward);
    CHECK_FALSE(runtime::choose_kv_cache_plan(16, decode_ok, forward_why).forward);
    CHECK_FALSE(runtime::choose_kv_cache_plan(1, decode_ok, forward_why).forward);
  }
  // The scales make the problem an e4m3 one; without them the bf16 cache's problem.
  ForwardInputs plain = fp8_cache_inputs(2048, 128, 16);
  plain.k_scale = plain.v_scale = nullptr;
  CHECK_FALSE(on_kv_e4m3(runtime::forward_problem_of(sm90a, plain, o)));
  // f16 q, head dim 96.
  CHECK_FALSE(runtime::forward_unsupported(sm90a, fp8_cache_inputs(300, 96, 16, DType::F16), o)
                  .has_value());

  // Elsewhere (and with sm80_mma named) the forward cannot: a chunk runs on decode, and the
  // reason goes into FLEXJIT_LOG=kernels.
  const ForwardInputs in = fp8_cache_inputs(2048, 128, 16);
  for (const char* arch : {"sm_80", "sm_89", "sm_90"}) {
    const std::optional<std::string> why =
        runtime::forward_unsupported(cuda::Arch::parse(arch), in, o);
    REQUIRE(why.has_value());
    CHECK_THAT(*why, Catch::Contains("does not read e4m3 KV caches"));
    const runtime::KvCachePlanChoice c = runtime::choose_kv_cache_plan(2048, std::nullopt, why);
    CHECK_FALSE(c.forward);
    CHECK_THAT(c.why,
               Catch::Contains("the forward cannot serve it") && Catch::Contains("e4m3 KV caches"));
  }
  AttentionOptions named;
  named.variant = "sm80_mma";
  const std::optional<std::string> why = runtime::forward_unsupported(sm90a, in, named);
  REQUIRE(why.has_value());
  CHECK_THAT(*why, Catch::Contains("forward/sm80_mma does not read e4m3 KV caches"));
  // Neither kernel: both reasons.
  CHECK_THROWS_WITH(runtime::choose_kv_cache_plan(2048, std::string("decode says no"), why),
                    Catch::Contains("decode says no") &&
                        Catch::Contains("forward/sm80_mma does not read e4m3 KV caches"));
}

// The e4m3 cache kernels for sm_90a (FJ_FWD_KV_FP8): every loader copies and converts, so the
// producer's 40 registers carry the copies' addresses and the conversion (no spills), and the
// consumers' mainloop is the bf16 / f16 one.
TEST_CASE("fp8 prefill: the e4m3 cache forward compiles for sm_90a without spills",
          "[prefill][fp8][sm90][nvrtc]") {
  struct Job {
    std::string mods;
    DType dtype;
    int dqk, dv, gqa, page;
    Params overrides;
  };
  std::vector<Job> jobs;
  for (DType q : {DType::BF16, DType::F16}) {
    for (int page : {0, 1, 16, 128}) {
      jobs.push_back({"offset_causal", q, 128, 128, 4, page, {}});
      jobs.push_back({"offset_causal", q, 64, 64, 8, page, {}});
      jobs.push_back({"offset_causal", q, 96, 96, 1, page, {}});  // tile 128, 32 zero columns
    }
  }
  jobs.push_back({"causal", DType::BF16, 256, 256, 4, 16, {}});
  jobs.push_back({"causal", DType::BF16, 192, 128, 4, 256, {}});
  for (const char* m : {"noop", "alibi_causal", "document_causal", "softcap_causal",
                        "relative_bias_causal", "sliding_window"})
    jobs.push_back({m, DType::BF16, 128, 128, 4, 16, {}});
  jobs.push_back({"alibi_causal", DType::F16, 64, 64, 4, 1, {}});
  jobs.push_back({"causal", DType::BF16, 128, 128, 4, 64, {{"block_n", 64}}});
  jobs.push_back({"causal", DType::F16, 64, 64, 1, 16, {{"block_n", 192}}});
  jobs.push_back({"noop", DType::BF16, 128, 128, 1, 0, {{"num_stages", 2}}});
  const Mods offset_causal =
      parse_mods("buffer q_pos: i32[B]\nmask_mod = q_idx + q_pos[b] >= kv_idx", "offset_causal.fx");
  InputFacts facts;
  facts.seqlen_q = 2048;
  facts.seqlen_kv = 8192;
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::mutex mu;
  std::vector<std::string> failures, report;
  test::run_parallel(jobs.size(), [&](size_t i) {
    const Job& j = jobs[i];
    try {
      const KernelDesc d = Registry::global().complete(
          fp8_cache_problem("sm_90a", j.dtype, j.dqk, j.dv, j.gqa, j.page), facts, j.overrides,
          "sm90a_wgmma");
      const Mods mods = j.mods == "offset_causal" ? offset_causal : standard_mods(j.mods);
      const BuiltKernel k = builder.build(mods, d);
      const auto& u = k.compiled.kernel->usage;
      const std::string& src = k.source->source;
      std::lock_guard<std::mutex> lock(mu);
      report.push_back(fmt::format("{} {}: {} registers (launch bound), {} B spills", d.str(),
                                   j.mods, u.registers, u.spill_store_bytes));
      if (u.spill_store_bytes > 0 || u.spill_load_bytes > 0 || u.stack_frame_bytes > 0) {
        failures.push_back(fmt::format("{} {}: {} / {} bytes of spill stores / loads, {} B stack",
                                       d.str(), j.mods, u.spill_store_bytes, u.spill_load_bytes,
                                       u.stack_frame_bytes));
      }
      // The e4m3 path: its define and parameter, the copies, the conversion and the wgmma of
      // the bf16 / f16 mainloop; no TMA box of K / V (the maps are not read).
      for (const char* needle :
           {"#define FJ_FWD_KV_FP8 1", "#define FJ_FWD_KV_CACHE 1", "const FjFwdKvFp8Args kv_fp8",
            "cp.async.cg.shared", "cvt.rn.f16x2.e4m3x2", "wgmma.mma_async"}) {
        if (src.find(needle) == std::string::npos)
          failures.push_back(fmt::format("{} {}: source lacks {}", d.str(), j.mods, needle));
      }
      const std::string wgmma_type = j.dtype == DType::BF16 ? ".bf16.bf16" : ".f16.f16";
      if (src.find(wgmma_type) == std::string::npos)
        failures.push_back(fmt::format("{} {}: no {} wgmma", d.str(), j.mods, wgmma_type));
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(fmt::format("{} {} d={}/{} page {}: {}", j.mods, to_string(j.dtype), j.dqk,
                                     j.dv, j.page, e.what()));
    }
  });
  std::sort(report.begin(), report.end());
  WARN(fmt::format("{}", fmt::join(report, "\n")));
  CHECK(failures.empty());
  for (const std::string& f : failures)
    FAIL_CHECK(f);

  // A bf16 cache's kernel has no e4m3 path in its source.
  KernelDesc plain =
      forward_problem(cuda::Arch::parse("sm_90a"), DType::BF16, 128, 128, 4, false, true);
  set_kv_cache_flags(plain, 16);
  const cuda::GeneratedSource g = ForwardSm90Wgmma().generate(
      offset_causal, Registry::global().complete(plain, facts, {}, "sm90a_wgmma"));
  CHECK(g.source.find("#define FJ_FWD_KV_FP8") == std::string::npos);
}
