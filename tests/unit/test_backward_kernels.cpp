// The backward kernel families without a GPU: the generated gradient hooks, the variants'
// descriptions, validation messages and config spaces, and NVRTC compiles of the three kernels
// for every arch, dtype and head dim.
#include <flexjit/error.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "codegen/cuda/ModCodegen.h"
#include "kernels/Registry.h"
#include "kernels/backward/Backward.h"
#include "kernels/backward/Sm80Backward.h"
#include "passes/TypeCheck.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <mutex>
#include <thread>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

KernelDesc bwd_desc(Family f, const std::string& arch, DType dtype, int dqk, int dv, int gqa = 1) {
  return Registry::global().complete(
      backward_problem(f, cuda::Arch::parse(arch), dtype, dqk, dv, gqa, true), {}, {});
}

}  // namespace

TEST_CASE("gradient hooks: FjGradParams, fj_dscore and fj_bufgrad from the autodiff pass",
          "[backward][codegen]") {
  const Mods alibi = standard_mods("alibi");
  const std::string src = cuda::generate_mod_grad_functions(alibi);
  CHECK_THAT(src, Catch::Contains("float* grad_slopes;") &&
                      Catch::Contains("fj_i64 gstride_slopes[1];") &&
                      Catch::Contains("fj_i64 gextent_slopes[1];") &&
                      Catch::Contains("static constexpr bool kFjHasBufferGrads = true;") &&
                      Catch::Contains("kFjUniformGradSites = 1") && Catch::Contains("acc[0] += ") &&
                      Catch::Contains("fj_grad_add(gp.grad_slopes") &&
                      Catch::Contains("fj_clamp_index(h, gp.gextent_slopes[0])"));
  // relative_bias reads bias[q_idx - kv_idx + offset]: one address per element.
  const std::string rsrc = cuda::generate_mod_grad_functions(standard_mods("relative_bias"));
  CHECK_THAT(rsrc, Catch::Contains("kFjUniformGradSites = 0") &&
                       Catch::Contains("__all_sync(0xffffffffu, ds == 0.0f)") &&
                       Catch::Contains("fj_grad_add(gp.grad_bias"));
  const cuda::GradParamLayout layout = cuda::grad_param_layout(alibi);
  REQUIRE(layout.entries.size() == 1);
  CHECK(layout.entries[0].offset == 0);
  CHECK(layout.size == 24);  // pointer, one stride, one extent

  // A mask-only mod set: no float buffer, no gradient, d score_mod / d score = 1.
  const Mods doc = standard_mods("document_causal");
  const std::string dsrc = cuda::generate_mod_grad_functions(doc);
  CHECK_THAT(dsrc, Catch::Contains("int unused_;") &&
                       Catch::Contains("kFjHasBufferGrads = false") &&
                       Catch::Contains("return 1.0f;") && !Catch::Contains("fj_grad_add("));
  CHECK(cuda::grad_param_layout(doc).entries.empty());
  CHECK(cuda::grad_param_layout(doc).size == 8);

  // softcap: d/dscore of cap * tanh(score / cap) is 1 - tanh^2, no buffer.
  const std::string ssrc = cuda::generate_mod_grad_functions(standard_mods("softcap"));
  CHECK_THAT(ssrc, Catch::Contains("fj_tanh") && Catch::Contains("kFjHasBufferGrads = false"));
}

TEST_CASE("backward variants: registration, descriptions and validation", "[backward][kernels]") {
  const Registry& reg = Registry::global();
  REQUIRE(reg.find(Family::BackwardPreprocess, "sm80") != nullptr);
  REQUIRE(reg.find(Family::BackwardDkDv, "sm80_mma") != nullptr);
  REQUIRE(reg.find(Family::BackwardDq, "sm80_mma") != nullptr);

  const KernelDesc d = bwd_desc(Family::BackwardDkDv, "sm_90a", DType::BF16, 128, 128, 4);
  CHECK(d.str() ==
        "backward_dkdv/sm80_mma sm_90a bf16 d=128/128 gqa=4 divisible=0 fast_math=1 full_blocks=1 "
        "| block_m=64 block_n=64 dq_atomic=0 num_stages=2 num_warps=4");
  // dq_atomic = 1 where the default tiles do not split the dQ products: 64 x 64 on 4 warps.
  const KernelDesc a64 =
      reg.complete(backward_problem(Family::BackwardDkDv, cuda::Arch::parse("sm_90a"), DType::BF16,
                                    64, 64, 1, true),
                   {}, {{"dq_atomic", 1}});
  CHECK(a64.config.str() == "block_m=64 block_n=64 dq_atomic=1 num_stages=2 num_warps=4");
  CHECK(reg.find(Family::BackwardDq, "atomic_convert") != nullptr);
  CHECK_FALSE(reg.find(Family::BackwardDq, "atomic_convert")->auto_select());
  CHECK(KernelDesc::parse(d.str()) == d);
  CHECK(KernelDesc::from_json(d.to_json()) == d);
  const KernelDesc p = bwd_desc(Family::BackwardPreprocess, "sm_80", DType::F16, 64, 128);
  CHECK(p.str() == "backward_preprocess/sm80 sm_80 f16 d=64/128 gqa=1 | num_warps=4");

  // Shared memory beyond sm_86's 99 KiB: a precise message.
  CHECK_THROWS_WITH(bwd_desc(Family::BackwardDq, "sm_86", DType::F32, 256, 256),
                    Catch::Contains("131072 bytes of shared memory") &&
                        Catch::Contains("the 101376 bytes a block may use on sm_86"));
  KernelDesc bad = d;
  bad.config.set("num_warps", 2);
  CHECK_THROWS_WITH(reg.find(Family::BackwardDkDv, "sm80_mma")->validate(bad),
                    Catch::Contains("num_warps = 2 must be block_n / 16 = 4 or twice that"));
  KernelDesc dq = bwd_desc(Family::BackwardDq, "sm_80", DType::BF16, 64, 64);
  dq.config.set("block_m", 128);
  CHECK_THROWS_WITH(reg.find(Family::BackwardDq, "sm80_mma")->validate(dq),
                    Catch::Contains("block_m = 128 must be 16 * num_warps = 64"));
  KernelDesc d96 = backward_problem(Family::BackwardDq, cuda::Arch::parse("sm_80"), DType::BF16, 96,
                                    96, 1, false);
  CHECK_THROWS_WITH(reg.complete(d96, {}, {}), Catch::Contains("head_dim_qk = 96"));

  // Every config of the space validates; the defaults are in it.
  for (Family f : {Family::BackwardDkDv, Family::BackwardDq}) {
    for (int dim : {64, 128, 256}) {
      const KernelDesc def = bwd_desc(f, "sm_90a", DType::BF16, dim, dim);
      const auto space = reg.find(f, "sm80_mma")->config_space(def);
      CHECK(std::find(space.begin(), space.end(), def.config) != space.end());
    }
  }
}

TEST_CASE("the backward kernels compile for every arch, dtype and head dim", "[backward][nvrtc]") {
  struct Job {
    Family family;
    std::string arch, mods;
    DType dtype;
    int dqk, dv;
    bool dq_atomic = false;
  };
  std::vector<Job> jobs;
  const Family families[] = {Family::BackwardPreprocess, Family::BackwardDkDv, Family::BackwardDq};
  for (Family f : families) {
    for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"})
      jobs.push_back({f, arch, "alibi_causal", DType::BF16, 128, 128});
    for (DType dt : {DType::F16, DType::F32}) {
      for (auto [dqk, dv] : {std::pair{64, 64}, std::pair{128, 64}, std::pair{256, 256}})
        jobs.push_back({f, "sm_80", "relative_bias_causal", dt, dqk, dv});
    }
  }
  for (const char* mods :
       {"noop", "softcap_causal", "t5_bucketed_bias", "document_causal", "sliding_window"}) {
    jobs.push_back({Family::BackwardDkDv, "sm_90a", mods, DType::BF16, 64, 64});
    jobs.push_back({Family::BackwardDq, "sm_90a", mods, DType::BF16, 256, 128});
  }
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::vector<std::string> failures;
  auto worker = [&] {
    for (size_t i; (i = next++) < jobs.size();) {
      const Job& j = jobs[i];
      try {
        KernelDesc d = bwd_desc(j.family, j.arch, j.dtype, j.dqk, j.dv);
        if (j.dq_atomic) {
          const KernelDesc p =
              backward_problem(j.family, cuda::Arch::parse(j.arch), j.dtype, j.dqk, j.dv, 1, true);
          d = j.family == Family::BackwardDkDv
                  ? Registry::global().complete(p, {}, {{"dq_atomic", 1}})
                  : Registry::global().complete(p, {}, {}, "atomic_convert");
        }
        const BuiltKernel k = builder.build(standard_mods(j.mods), d);
        if (k.compiled.kernel->usage.spill_store_bytes > 64) {
          std::lock_guard<std::mutex> lock(mu);
          failures.push_back(fmt::format("{} {}: {} bytes of spill stores", d.str(), j.mods,
                                         k.compiled.kernel->usage.spill_store_bytes));
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back(std::string(to_string(j.family)) + " " + j.arch + " " + j.mods + ": " +
                           e.what());
      }
    }
  };
  std::vector<std::thread> pool;
  const unsigned n = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  for (unsigned t = 0; t < n; ++t)
    pool.emplace_back(worker);
  for (auto& t : pool)
    t.join();
  for (const std::string& f : failures)
    FAIL_CHECK(f);
  CHECK(failures.empty());
}
