// Chunked prefill on a KV cache without a GPU: the forward's page_size / seq_lens flags
// (descriptions, round trips, validation of sm80_mma and sm90a_wgmma), sm90a_wgmma's selection
// on sm_90a (its configs and reasons), the kernel arguments of a paged launch, the dispatch
// between decode and the forward, emit through the API and the CLI, and NVRTC compiles of the
// paged forward ([nvrtc]: sm_80, sm_90a, standard mods, page sizes 1 / 16 / 32 / 64 / 256 and
// ragged contiguous K / V, head dims 64 / 128 / 256; sm_86's 99 KiB config for d=256; registers
// <= 255, no spills; sm90a_wgmma's every page size 1 .. 256, tiles of 64 / 128 / 176 / 192 keys
// and head dims 64 .. 256).
#include <flexjit/attention.h>
#include <flexjit/error.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "ir/Visitor.h"
#include "kernels/Registry.h"
#include "kernels/forward/Forward.h"
#include "kernels/forward/Sm80Mma.h"
#include "kernels/forward/Sm90Wgmma.h"
#include "runtime/Decode.h"
#include "runtime/ForwardPlan.h"
#include "support/CliPath.h"
#include "support/Parallel.h"

#include <flexjit_abi.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <mutex>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

KernelDesc paged_problem(const std::string& arch, DType dtype, int d, int gqa, int page_size,
                         bool kv_e4m3 = false) {
  KernelDesc p = forward_problem(cuda::Arch::parse(arch), dtype, d, d, gqa, /*divisible=*/false,
                                 /*full_blocks=*/true);
  set_kv_cache_flags(p, page_size);
  if (kv_e4m3) set_kv_e4m3_flag(p);
  return p;
}

TensorRef fake_cuda(DType dtype, std::vector<int64_t> shape, uintptr_t addr = 0x100000) {
  return TensorRef::contiguous(reinterpret_cast<void*>(addr), dtype, std::move(shape),
                               TensorRef::Device::CUDA, 0);
}

}  // namespace

TEST_CASE("paged prefill: forward descriptions carry page_size / seq_lens and round-trip",
          "[decode][prefill][desc]") {
  Selection sel;
  const KernelDesc d = Registry::global().complete(paged_problem("sm_80", DType::BF16, 128, 4, 16),
                                                   InputFacts{}, {}, {}, &sel);
  CHECK(d.str() ==
        "forward/sm80_mma sm_80 bf16 d=128/128 gqa=4 divisible=0 fast_math=1 full_blocks=1 "
        "page_size=16 seq_lens=1 | block_m=128 block_n=64 num_stages=2 num_warps=8");
  CHECK(KernelDesc::parse(d.str()) == d);
  CHECK(KernelDesc::from_json(d.to_json()) == d);
  CHECK(on_kv_cache(d));
  CHECK(kv_page_size(d) == 16);
  // Ragged contiguous K / V: seq_lens only.
  const KernelDesc r =
      Registry::global().complete(paged_problem("sm_80", DType::F16, 64, 1, 0), InputFacts{});
  CHECK_THAT(r.str(), Catch::Contains("seq_lens=1") && !Catch::Contains("page_size"));
  CHECK(KernelDesc::parse(r.str()) == r);
  CHECK(on_kv_cache(r));
  CHECK(kv_page_size(r) == 0);
  // A contiguous forward's description (and so its tuning key) is unchanged: no new flags.
  const KernelDesc c = Registry::global().complete(
      forward_problem(cuda::Arch::parse("sm_80"), DType::BF16, 128, 128, 1, false, true),
      InputFacts{});
  CHECK_THAT(c.str(), !Catch::Contains("page_size") && !Catch::Contains("seq_lens"));
  CHECK_FALSE(on_kv_cache(c));
  // specialize: lengths that divide the tiles still leave the bounds checks on a KV cache.
  InputFacts facts;
  facts.seqlen_q = 256;
  facts.seqlen_kv = 1024;
  CHECK(Registry::global()
            .complete(paged_problem("sm_80", DType::BF16, 128, 1, 64), facts)
            .flags.at("divisible") == 0);
  CHECK(Registry::global()
            .complete(
                forward_problem(cuda::Arch::parse("sm_80"), DType::BF16, 128, 128, 1, false, true),
                facts)
            .flags.at("divisible") == 1);
}

TEST_CASE("paged prefill: validation names the flag and the limits; sm90a_wgmma serves sm_90a",
          "[decode][prefill][errors]") {
  const ForwardSm80Mma v;
  KernelDesc d =
      Registry::global().complete(paged_problem("sm_80", DType::BF16, 128, 1, 16), InputFacts{});
  KernelDesc bad = d;
  bad.flags.set("page_size", 3);
  CHECK_THROWS_WITH(v.validate(bad), Catch::Contains("page_size = 3") &&
                                         Catch::Contains("power of two from 1 to 256"));
  bad.flags.set("page_size", 512);
  CHECK_THROWS_WITH(v.validate(bad), Catch::Contains("page_size = 512"));
  bad = d;
  bad.flags.set("seq_lens", 2);
  CHECK_THROWS_WITH(v.validate(bad), Catch::Contains("'seq_lens' = 0 or 1, not 2"));
  bad = d;
  bad.flags.set("divisible", 1);
  CHECK_THROWS_WITH(v.validate(bad), Catch::Contains("on a KV cache needs divisible = 0"));

  // sm_90a: the TMA kernel reads the cache, every page size (TMA boxes from a tile's keys up,
  // cp.async gathers below) and ragged contiguous K / V, one CTA per query tile; 192-row tiles at
  // d 128 as on contiguous K / V (three consumer warpgroups), 128 at d 64 and 256.
  InputFacts facts;
  facts.seqlen_q = 2048;
  facts.seqlen_kv = 8192;
  for (int dim : {64, 128, 256}) {
    for (int page : {0, 1, 2, 16, 64, 128, 256}) {
      Selection sel;
      const KernelDesc h = Registry::global().complete(
          paged_problem("sm_90a", DType::BF16, dim, 4, page), facts, {}, {}, &sel);
      INFO(h.str() << "\n" << sel.str());
      CHECK(h.family_variant() == "forward/sm90a_wgmma");
      CHECK(kv_page_size(h) == page);
      CHECK(h.flags.at("divisible") == 0);  // 2048 x 8192 divides the tiles; the lengths do not
      // d 64's contiguous default would be 192 persistent rows
      CHECK(h.config.at("block_m") == (dim == 128 ? 192 : 128));
      CHECK(h.config.get("persistent").value_or(0) == 0);  // d 64's default would be persistent
    }
  }
  // The fact that keeps 128 rows at d 128 on a cache: a mask_mod that loads a buffer at kv_idx
  // (ir::loads_at: document masks; offset_causal's q_pos[b] does not).
  CHECK(ir::loads_at(standard_mods("document_causal").mask_mod, ir::VarKind::KvIdx));
  CHECK_FALSE(ir::loads_at(
      parse_mods("buffer q_pos: i32[B]\nmask_mod = q_idx + q_pos[b] >= kv_idx", "o.fx").mask_mod,
      ir::VarKind::KvIdx));
  CHECK_FALSE(ir::loads_at(standard_mods("causal").mask_mod, ir::VarKind::KvIdx));
  CHECK_FALSE(ir::loads_at(Expr(), ir::VarKind::KvIdx));
  InputFacts doc = facts;
  doc.mask_mod = doc.mask_mod_loads_kv = true;
  CHECK(Registry::global()
            .complete(paged_problem("sm_90a", DType::BF16, 128, 4, 16), doc)
            .config.at("block_m") == 128);
  // Contiguous K / V: 192 rows, persistent CTAs claiming single query tiles.
  const KernelDesc contiguous = Registry::global().complete(
      forward_problem(cuda::Arch::parse("sm_90a"), DType::BF16, 128, 128, 4, false, true), doc);
  CHECK(contiguous.config.at("block_m") == 192);
  CHECK(contiguous.config.at("persistent") == 1);
  CHECK(contiguous.config.at("q_tiles") == 1);
  // d 64's default of persistent CTAs becomes one CTA per query tile.
  const KernelDesc f16 =
      Registry::global().complete(paged_problem("sm_90a", DType::F16, 64, 1, 16), facts);
  CHECK(f16.config.at("q_tiles") == 1);
  CHECK(f16.config.at("persistent") == 0);
  // f32 runs on sm80_mma's tf32 path; the selection says why sm90a_wgmma did not take it.
  Selection fsel;
  CHECK(Registry::global()
            .complete(paged_problem("sm_90a", DType::F32, 128, 1, 16), facts, {}, {}, &fsel)
            .family_variant() == "forward/sm80_mma");
  CHECK_THAT(fsel.str(), Catch::Contains("sm90a_wgmma") && Catch::Contains("tf32"));

  // sm90a_wgmma's own checks of a KV cache description.
  const ForwardSm90Wgmma w;
  const KernelDesc h =
      Registry::global().complete(paged_problem("sm_90a", DType::BF16, 128, 4, 16), facts);
  bad = h;
  bad.flags.set("page_size", 3);
  CHECK_THROWS_WITH(w.validate(bad),
                    Catch::Contains("sm90a_wgmma does not support page_size = 3") &&
                        Catch::Contains("power of two from 1 to 256"));
  bad.flags.set("page_size", 512);
  CHECK_THROWS_WITH(w.validate(bad), Catch::Contains("page_size = 512"));
  bad = h;
  bad.flags.set("seq_lens", 2);
  CHECK_THROWS_WITH(w.validate(bad), Catch::Contains("'seq_lens' = 0 or 1, not 2"));
  bad = h;
  bad.flags.set("divisible", 1);
  CHECK_THROWS_WITH(w.validate(bad), Catch::Contains("on a KV cache needs divisible = 0"));
  bad = h;
  bad.config.set("persistent", 1);
  bad.config.set("q_tiles", 2);
  CHECK_THROWS_WITH(w.validate(bad), Catch::Contains("one query tile per CTA (persistent = 0, "
                                                     "q_tiles = 1), not persistent = 1"));
  bad.config.set("persistent", 0);
  CHECK_THROWS_WITH(w.validate(bad), Catch::Contains("not persistent = 0, q_tiles = 2"));
  // An e4m3 cache takes 192-row tiles too (its loaders stage and convert in 32 registers).
  const KernelDesc e8 = Registry::global().complete(
      paged_problem("sm_90a", DType::BF16, 128, 1, 16, /*kv_e4m3=*/true), facts);
  CHECK(e8.config.at("block_m") == 192);
  CHECK_NOTHROW(w.validate(e8));
  KernelDesc rows192 =
      Registry::global().complete(paged_problem("sm_90a", DType::BF16, 64, 1, 1), facts);
  rows192.config.set("block_m", 192);
  CHECK_NOTHROW(w.validate(rows192));
  // Asked for by the caller, the same reasons.
  CHECK_THROWS_WITH(Registry::global().complete(paged_problem("sm_90a", DType::BF16, 128, 1, 16),
                                                facts, {{"persistent", 1}}, "sm90a_wgmma"),
                    Catch::Contains("persistent = 0, q_tiles = 1"));
  CHECK(Registry::global()
            .complete(paged_problem("sm_90a", DType::BF16, 64, 1, 0), facts, {{"block_m", 192}},
                      "sm90a_wgmma")
            .config.at("block_m") == 192);
  // The contiguous sm_90a forward is as it was: 192 persistent rows at d 64, no KV flags.
  const KernelDesc c = Registry::global().complete(
      forward_problem(cuda::Arch::parse("sm_90a"), DType::BF16, 64, 64, 1, false, true), facts);
  CHECK(c.family_variant() == "forward/sm90a_wgmma");
  CHECK(c.config.at("block_m") == 192);
  CHECK(c.config.at("persistent") == 1);
  CHECK_FALSE(on_kv_cache(c));
}

TEST_CASE("paged prefill: the launch passes FjKvCacheArgs and the pools' page strides",
          "[decode][prefill][plan]") {
  const int B = 2, Hq = 8, Hkv = 2, Sq = 300, ps = 16, max_pages = 64, pages = 100, D = 128;
  ForwardInputs in;
  in.q = fake_cuda(DType::BF16, {B, Hq, Sq, D});
  in.k = fake_cuda(DType::BF16, {pages, ps, Hkv, D});
  in.v = fake_cuda(DType::BF16, {pages, ps, Hkv, D}, 0x200000);
  in.out = in.q;
  in.shape = validate_qkv(in.q, fake_cuda(DType::BF16, {B, Hkv, ps * max_pages, D}),
                          fake_cuda(DType::BF16, {B, Hkv, ps * max_pages, D}));
  in.page_table = reinterpret_cast<const int*>(0x300000);
  in.page_table_stride_b = max_pages;
  in.page_size = ps;
  in.seq_lens = reinterpret_cast<const int*>(0x400000);
  const cuda::Arch arch = cuda::Arch::parse("sm_90a");
  AttentionOptions o;
  // sm_90a serves the cache on sm90a_wgmma (its launch encodes tensor maps through the driver:
  // the [gpu] tests run it); sm80_mma's launch is checked here.
  CHECK(Registry::global()
            .complete(runtime::forward_problem_of(arch, in, o), forward_facts(in))
            .family_variant() == "forward/sm90a_wgmma");
  const KernelDesc desc = Registry::global().complete(runtime::forward_problem_of(arch, in, o),
                                                      forward_facts(in), {}, "sm80_mma");
  CHECK(desc.family_variant() == "forward/sm80_mma");
  CHECK_THAT(desc.str(), Catch::Contains("page_size=16 seq_lens=1"));
  auto launches = ForwardSm80Mma().launches(desc, in, nullptr);
  REQUIRE(launches.size() == 1);
  Launch& l = launches[0];
  CHECK(l.grid.x == 3);  // ceil(300 / 128) query tiles
  CHECK(l.grid.y == Hq);
  CHECK(l.grid.z == B);
  REQUIRE(l.args.size() == 3);  // FjFwdArgs, FjModParams, FjKvCacheArgs
  FjFwdArgs a;
  std::memcpy(&a, l.args.pointers()[0], sizeof a);
  CHECK(a.k_stride_b == ps * Hkv * D);  // between pages
  CHECK(a.k_stride_s == Hkv * D);       // between slots
  CHECK(a.k_stride_h == D);
  CHECK(a.v_stride_b == ps * Hkv * D);
  CHECK(a.seqlen_kv == ps * max_pages);  // the capacity
  FjKvCacheArgs kc;
  std::memcpy(&kc, l.args.pointers()[2], sizeof kc);
  CHECK(kc.page_table == in.page_table);
  CHECK(kc.page_table_stride_b == max_pages);
  CHECK(kc.seq_lens == in.seq_lens);
  // The inputs and the description must agree.
  ForwardInputs contiguous = in;
  contiguous.page_table = nullptr;
  contiguous.seq_lens = nullptr;
  CHECK_THROWS_AS(ForwardSm80Mma().launches(desc, contiguous, nullptr), InternalError);
  // The forward serves the cache on sm_90a, either variant named.
  CHECK_FALSE(runtime::forward_unsupported(arch, in, o).has_value());
  o.variant = "sm90a_wgmma";
  CHECK_FALSE(runtime::forward_unsupported(arch, in, o).has_value());
  o.variant = "sm80_mma";
  CHECK_FALSE(runtime::forward_unsupported(arch, in, o).has_value());
}

TEST_CASE("paged prefill: a KV cache call takes decode for short queries, the forward for long",
          "[decode][prefill][plan]") {
  using runtime::choose_kv_cache_plan;
  const std::optional<std::string> ok;
  // Short queries: decode; the forward when decode cannot serve the call (f32, ...).
  CHECK_FALSE(choose_kv_cache_plan(16, ok, ok).forward);
  CHECK(choose_kv_cache_plan(16, ok, ok).why.empty());
  const auto f32 = choose_kv_cache_plan(1, std::string("bf16 or f16 inputs, not f32"), ok);
  CHECK(f32.forward);
  CHECK_THAT(f32.why, Catch::Contains("the decode plan cannot serve it: bf16 or f16"));
  // Long queries: the forward (chunked prefill); decode when the forward cannot.
  const auto prefill = choose_kv_cache_plan(17, ok, ok);
  CHECK(prefill.forward);
  CHECK_THAT(prefill.why, Catch::Contains("chunked prefill: Sq = 17 is more than the 16"));
  const auto back = choose_kv_cache_plan(2048, ok, std::string("no aligned rows"));
  CHECK_FALSE(back.forward);
  CHECK_THAT(back.why, Catch::Contains("the forward cannot serve it: no aligned rows"));
  // Neither: both reasons, before any launch.
  CHECK_THROWS_AS(choose_kv_cache_plan(300, std::string("a"), std::string("b")), UnsupportedError);
  CHECK_THROWS_WITH(
      choose_kv_cache_plan(4, std::string("grid too large"), std::string("head dim 96")),
      Catch::Contains("the decode plan cannot serve it: grid too large; nor can "
                      "the forward: head dim 96"));
}

TEST_CASE("paged prefill: emit through the public API and the CLI", "[decode][prefill][api]") {
  KernelQuery q;
  q.family = "forward";
  q.arch = "sm_90a";
  q.gqa_ratio = 4;
  q.page_size = 64;
  const KernelSource src = emit_kernel(standard_mods("alibi_causal"), q);
  CHECK(src.kernel_name == "flexjit_forward");
  CHECK_THAT(src.description,
             Catch::StartsWith("forward/sm90a_wgmma sm_90a bf16 d=128/128 gqa=4") &&
                 Catch::Contains("page_size=64 seq_lens=1"));
  CHECK_THAT(src.source, Catch::Contains("#define FJ_FWD_KV_CACHE 1") &&
                             Catch::Contains("static constexpr int kPageSize = 64;") &&
                             Catch::Contains("const FjKvCacheArgs kv_cache"));
  q.page_size = 0;
  const KernelSource contiguous = emit_kernel(standard_mods("alibi_causal"), q);
  CHECK_THAT(contiguous.source, !Catch::Contains("#define FJ_FWD_KV_CACHE"));
  q.page_size = 16;
  q.arch = "sm_80";
  CHECK_THAT(emit_kernel(standard_mods("alibi_causal"), q).description,
             Catch::StartsWith("forward/sm80_mma sm_80"));

  std::string out;
  REQUIRE(test::run_cli("emit --kernel forward --mods causal --page-size 16 --head-dim 64 --arch "
                        "sm_90a",
                        &out) == 0);
  CHECK_THAT(out, Catch::Contains("forward/sm90a_wgmma sm_90a bf16 d=64/64") &&
                      Catch::Contains("page_size=16 seq_lens=1"));
  REQUIRE(test::run_cli("emit --kernel forward --page-size 3 --arch sm_80", &out) == 1);
  CHECK_THAT(out, Catch::Contains("page_size = 3"));
  REQUIRE(test::run_cli("emit --kernel forward --page-size 16 --divisible --arch sm_80", &out) ==
          1);
  CHECK_THAT(out, Catch::Contains("divisible = 0"));
}

TEST_CASE("paged prefill: the paged forward compiles for sm_80 and sm_90a without spills",
          "[decode][prefill][nvrtc]") {
  struct Job {
    std::string mods, arch;
    DType dtype;
    int d, gqa, page;
  };
  std::vector<Job> jobs;
  for (const std::string arch : {"sm_80", "sm_90a"}) {
    for (int page : {1, 16, 64, 256}) {
      jobs.push_back({"causal", arch, DType::BF16, 128, 4, page});
      jobs.push_back({"alibi_causal", arch, DType::F16, 64, 1, page});  // a buffer
    }
    jobs.push_back({"softcap", arch, DType::BF16, 128, 3, 0});  // ragged contiguous, a param
    jobs.push_back({"noop", arch, DType::BF16, 64, 1, 16});
    jobs.push_back({"document_causal", arch, DType::BF16, 128, 1, 1});
    jobs.push_back({"sliding_window", arch, DType::F16, 128, 8, 32});
    jobs.push_back({"relative_bias", arch, DType::BF16, 64, 2, 256});
    jobs.push_back({"causal", arch, DType::F32, 128, 1, 16});  // tf32
    jobs.push_back({"alibi", arch, DType::F32, 64, 2, 1});
    jobs.push_back({"relative_bias", arch, DType::BF16, 256, 1, 16});
    jobs.push_back({"t5_bucketed_bias", arch, DType::BF16, 128, 2, 64});
  }
  // sm_86 (99 KiB per block): d=256 takes 64x32 with 2 stages.
  jobs.push_back({"relative_bias", "sm_86", DType::BF16, 256, 1, 16});
  jobs.push_back({"causal", "sm_86", DType::F16, 256, 2, 1});
  jobs.push_back({"causal", "sm_86", DType::BF16, 128, 4, 16});
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::string> names(jobs.size());
  std::vector<int> registers(jobs.size(), -1), spills(jobs.size(), -1), stack(jobs.size(), -1);
  test::run_parallel(jobs.size(), [&](size_t i) {
    const Job& j = jobs[i];
    try {
      const KernelDesc d = Registry::global().complete(
          paged_problem(j.arch, j.dtype, j.d, j.gqa, j.page), InputFacts{});
      BuiltKernel k = builder.build(standard_mods(j.mods), d);
      registers[i] = k.compiled.kernel->usage.registers;
      spills[i] = k.compiled.kernel->usage.spill_store_bytes;
      stack[i] = k.compiled.kernel->usage.stack_frame_bytes;
      names[i] = d.str();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(j.mods + " " + j.arch + ": " + e.what());
    }
  });
  for (const auto& f : failures)
    FAIL_CHECK(f);
  for (size_t i = 0; i < jobs.size(); ++i) {
    INFO(jobs[i].mods << " " << names[i] << ": " << registers[i] << " registers, " << spills[i]
                      << " spill bytes");
    CHECK(registers[i] > 0);
    CHECK(registers[i] <= 255);
    CHECK(spills[i] == 0);
    CHECK(stack[i] == 0);  // the KV cache's copy of the arguments stays in registers
    std::printf("  %-16s %s: %d registers, %d spill bytes\n", jobs[i].mods.c_str(),
                names[i].c_str(), registers[i], spills[i]);
  }
}

// forward/sm90a_wgmma on a KV cache (docs/kernels/forward_sm90.md "KV caches"): every page size
// from 1 to 256 and ragged contiguous K / V, the default tiles of head dims 64, 128, 256 (64-key
// tiles) and 192 / 128, and the other KV tiles (64, 176, 192 keys: pages of 8 keys or more that
// divide a tile take a TMA box each, others are gathered), with standard mods and the chunk's
// offset as a buffer.
// The producer warpgroup's loaders run at 40 registers and the consumers at 232: no spills.
TEST_CASE("paged prefill: forward/sm90a_wgmma compiles every page size and tile without spills",
          "[decode][prefill][sm90][nvrtc]") {
  struct Job {
    std::string mods;
    DType dtype;
    int dqk, dv, page;
    Params overrides;
  };
  std::vector<Job> jobs;
  for (int page : {0, 1, 2, 4, 8, 16, 32, 64, 128, 256})
    jobs.push_back({"offset_causal", DType::BF16, 128, 128, page, {}});
  for (int page : {0, 1, 16, 128}) {
    jobs.push_back({"offset_causal", DType::F16, 64, 64, page, {}});
    jobs.push_back({"causal", DType::BF16, 256, 256, page, {}});
    jobs.push_back({"offset_causal", DType::BF16, 192, 128, page, {}});
  }
  for (const char* m : {"noop", "alibi_causal", "softcap_causal", "document_causal",
                        "relative_bias_causal", "sliding_window", "prefix_lm"})
    jobs.push_back({m, DType::BF16, 128, 128, 16, {}});
  // 192-row tiles (the defaults at d 128 above) over the other paths: 1-key pages (gathers
  // only), ragged contiguous K / V, d 96 (tile 128), f16, 64-key tiles, a cut tile at every
  // length (pages of 32 keys under 128-key tiles are boxes per page).
  for (int page : {1, 0, 32})
    jobs.push_back({"alibi_causal", DType::F16, 128, 128, page, {}});
  jobs.push_back({"offset_causal", DType::BF16, 96, 96, 16, {}});
  jobs.push_back({"causal", DType::BF16, 128, 128, 16, {{"block_m", 192}, {"block_n", 64}}});
  jobs.push_back({"noop", DType::BF16, 64, 64, 16, {{"block_m", 192}}});
  jobs.push_back({"document_causal", DType::BF16, 64, 64, 0, {}});
  jobs.push_back({"relative_bias_causal", DType::F16, 64, 64, 256, {}});
  jobs.push_back({"causal", DType::BF16, 128, 128, 64, {{"block_n", 64}}});
  jobs.push_back({"causal", DType::BF16, 128, 128, 32, {{"block_n", 64}}});
  jobs.push_back({"noop", DType::BF16, 128, 128, 256, {{"block_n", 176}, {"num_stages", 2}}});
  jobs.push_back({"causal", DType::BF16, 64, 64, 16, {{"block_n", 192}}});
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
      KernelDesc p = forward_problem(cuda::Arch::parse("sm_90a"), j.dtype, j.dqk, j.dv, 4,
                                     /*divisible=*/false, /*full_blocks=*/true);
      set_kv_cache_flags(p, j.page);
      const Mods mods = j.mods == "offset_causal" ? offset_causal : standard_mods(j.mods);
      // The facts the runtime takes from the mods (runtime/Attention.cpp): a document mask keeps
      // 128-row tiles on a cache, the others take 192 at d 128.
      InputFacts job_facts = facts;
      job_facts.mask_mod = mods.mask_mod.defined();
      job_facts.mask_mod_loads_kv = ir::loads_at(mods.mask_mod, ir::VarKind::KvIdx);
      job_facts.score_mod_reads_kv = ir::reads_var(mods.score_mod, ir::VarKind::KvIdx);
      const KernelDesc d = Registry::global().complete(p, job_facts, j.overrides, "sm90a_wgmma");
      const BuiltKernel k = builder.build(mods, d);
      const auto& u = k.compiled.kernel->usage;
      const std::string& src = k.source->source;
      std::lock_guard<std::mutex> lock(mu);
      report.push_back(fmt::format("{} {}: {} registers (launch bound), {} B spills", d.str(),
                                   j.mods, u.registers, u.spill_store_bytes));
      if (u.spill_store_bytes > 0 || u.spill_load_bytes > 0) {
        failures.push_back(fmt::format("{} {}: {} / {} bytes of spill stores / loads", d.str(),
                                       j.mods, u.spill_store_bytes, u.spill_load_bytes));
      }
      // The gathers (pages the tile does not divide, the tile a length cuts) and the TMA boxes
      // (tiles inside a page or a contiguous sequence) are both in every kernel; the four
      // parameters of a KV cache launch.
      for (const char* needle :
           {"#define FJ_FWD_KV_CACHE 1", "cp.async.mbarrier.arrive.noinc", "cp.async.cg.shared",
            "cp.async.bulk.tensor.4d", "wgmma.mma_async", "const FjKvCacheArgs kv_cache"}) {
        if (src.find(needle) == std::string::npos)
          failures.push_back(fmt::format("{} {}: source lacks {}", d.str(), j.mods, needle));
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(
          fmt::format("{} d={}/{} page {}: {}", j.mods, j.dqk, j.dv, j.page, e.what()));
    }
  });
  std::sort(report.begin(), report.end());
  WARN(fmt::format("{}", fmt::join(report, "\n")));
  CHECK(failures.empty());
  for (const std::string& f : failures)
    FAIL_CHECK(f);
}
