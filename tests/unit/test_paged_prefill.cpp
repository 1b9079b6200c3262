// Chunked prefill on a KV cache without a GPU: forward/sm80_mma's page_size / seq_lens flags
// (descriptions, round trips, validation), the sm90a_wgmma fallback and its reason, the kernel
// arguments of a paged launch, the dispatch between decode and the forward, emit through the
// API and the CLI, and NVRTC compiles of the paged forward ([nvrtc]: sm_80, sm_90a, standard
// mods, page sizes 1 / 16 / 32 / 64 / 256 and ragged contiguous K / V, head dims 64 / 128 / 256;
// sm_86's 99 KiB config for d=256; registers <= 255, no spills).
#include <flexjit/attention.h>
#include <flexjit/error.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "kernels/Registry.h"
#include "kernels/forward/Forward.h"
#include "kernels/forward/Sm80Mma.h"
#include "runtime/Decode.h"
#include "runtime/ForwardPlan.h"
#include "support/CliPath.h"
#include "support/Parallel.h"

#include <flexjit_abi.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstring>
#include <mutex>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

KernelDesc paged_problem(const std::string& arch, DType dtype, int d, int gqa, int page_size) {
  KernelDesc p = forward_problem(cuda::Arch::parse(arch), dtype, d, d, gqa, /*divisible=*/false,
                                 /*full_blocks=*/true);
  set_kv_cache_flags(p, page_size);
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

TEST_CASE("paged prefill: validation names the flag and the limits; sm90a_wgmma passes over it",
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

  // sm_90a: the TMA kernel cannot follow a page table; the selection takes sm80_mma and says why.
  Selection sel;
  const KernelDesc h = Registry::global().complete(paged_problem("sm_90a", DType::BF16, 128, 4, 16),
                                                   InputFacts{}, {}, {}, &sel);
  CHECK(h.family_variant() == "forward/sm80_mma");
  CHECK_THAT(sel.str(), Catch::Contains("sm90a_wgmma") &&
                            Catch::Contains("cannot follow a page table or per-sequence KV "
                                            "lengths (pages of 16)"));
  Selection rsel;
  Registry::global().complete(paged_problem("sm_90a", DType::BF16, 128, 1, 0), InputFacts{}, {}, {},
                              &rsel);
  CHECK_THAT(rsel.str(), Catch::Contains("(ragged lengths)"));
  // Named, it refuses with the same reason.
  CHECK_THROWS_WITH(Registry::global().complete(paged_problem("sm_90a", DType::BF16, 128, 1, 16),
                                                InputFacts{}, {}, "sm90a_wgmma"),
                    Catch::Contains("TMA tensor maps cannot follow a page table"));
  // The contiguous sm_90a forward still takes sm90a_wgmma.
  CHECK(Registry::global()
            .complete(
                forward_problem(cuda::Arch::parse("sm_90a"), DType::BF16, 128, 128, 1, false, true),
                InputFacts{})
            .family_variant() == "forward/sm90a_wgmma");
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
  const KernelDesc desc =
      Registry::global().complete(runtime::forward_problem_of(arch, in, o), forward_facts(in));
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
  // The forward serves the cache on sm_90a; naming the TMA variant is a reason.
  CHECK_FALSE(runtime::forward_unsupported(arch, in, o).has_value());
  o.variant = "sm90a_wgmma";
  CHECK_THAT(*runtime::forward_unsupported(arch, in, o),
             Catch::Contains("cannot follow a page table"));
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
  CHECK_THAT(src.description, Catch::StartsWith("forward/sm80_mma sm_90a bf16 d=128/128 gqa=4") &&
                                  Catch::Contains("page_size=64 seq_lens=1"));
  CHECK_THAT(src.source, Catch::Contains("#define FJ_FWD_KV_CACHE 1") &&
                             Catch::Contains("static constexpr int kPageSize = 64;") &&
                             Catch::Contains("const FjKvCacheArgs kv_cache"));
  q.page_size = 0;
  const KernelSource contiguous = emit_kernel(standard_mods("alibi_causal"), q);
  CHECK_THAT(contiguous.source, !Catch::Contains("#define FJ_FWD_KV_CACHE"));

  std::string out;
  REQUIRE(test::run_cli("emit --kernel forward --mods causal --page-size 16 --head-dim 64 --arch "
                        "sm_90a",
                        &out) == 0);
  CHECK_THAT(out, Catch::Contains("forward/sm80_mma sm_90a bf16 d=64/64") &&
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
