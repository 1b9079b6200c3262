// Small buffer gradients through a private shared-memory copy per dK/dV CTA (the problem flag
// bufgrad_smem; docs/backward.md "Small buffer gradients in shared memory") without a GPU: which
// calls ask for it, where the variants keep or drop it, the generated hooks, and NVRTC compiles
// of both dK/dV variants with it (the GPU numerics are tests/gpu/test_backward.cpp's
// "[bufgrad_smem]" case).
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "codegen/cuda/ModCodegen.h"
#include "jit/ResourceUsage.h"
#include "kernels/Registry.h"
#include "kernels/backward/Backward.h"
#include "support/Parallel.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

// The dK/dV description of a call whose buffers ask for a private copy of `floats` (0: none).
KernelDesc dkdv_desc(const std::string& arch, const std::string& variant, int64_t floats,
                     int dim = 128, const Params& overrides = {}) {
  KernelDesc p = backward_problem(Family::BackwardDkDv, cuda::Arch::parse(arch), DType::BF16, dim,
                                  dim, 1, true);
  if (floats > 0) p.flags.set(kBufGradSmemFlag, floats);
  return Registry::global().complete(p, {}, overrides, variant);
}

const char* kPerHeadTable = "buffer tab: f32[H, 8]\nscore_mod = score + tab[h, kv_idx % 8]";

}  // namespace

TEST_CASE("small buffer gradients: which calls ask for a private copy, and where it fits",
          "[backward][bufgrad_smem]") {
  // The request: the smallest power of two from 32 holding every float buffer, up to 4096
  // floats; none without a per-element site, for deterministic gradients or past 4096.
  CHECK(bufgrad_smem_request(8, true, false) == 32);
  CHECK(bufgrad_smem_request(16 * 32, true, false) == 512);
  CHECK(bufgrad_smem_request(513, true, false) == 1024);
  CHECK(bufgrad_smem_request(4096, true, false) == 4096);
  CHECK(bufgrad_smem_request(4097, true, false) == 0);
  CHECK(bufgrad_smem_request(512, false, false) == 0);
  CHECK(bufgrad_smem_request(512, true, true) == 0);
  CHECK(bufgrad_smem_request(0, true, false) == 0);
  // Per-element sites: T5's table, a relative bias, a per-head table; not ALiBi's slopes[h]
  // (summed per head already) nor a mod without float buffers.
  CHECK(cuda::has_element_grad_sites(standard_mods("t5_bucketed_bias")));
  CHECK(cuda::has_element_grad_sites(standard_mods("relative_bias_causal")));
  CHECK(cuda::has_element_grad_sites(parse_mods(kPerHeadTable)));
  CHECK_FALSE(cuda::has_element_grad_sites(standard_mods("alibi_causal")));
  CHECK_FALSE(cuda::has_element_grad_sites(standard_mods("document_causal")));

  // Kept where the default tiles leave room: T5 at H = 16 (512 floats) on both variants.
  for (const char* variant : {"sm80_mma", "sm90a_wgmma"}) {
    INFO(variant);
    const KernelDesc d = dkdv_desc("sm_90a", variant, 512);
    CHECK(bufgrad_smem_floats(d) == 512);
    CHECK_THAT(d.str(), Catch::Contains("bufgrad_smem=512 "));
    CHECK(KernelDesc::parse(d.str()) == d);
    CHECK(d.hash() != dkdv_desc("sm_90a", variant, 0).hash());
  }
  // sm90a_wgmma at d = 128: 198,696 bytes of dynamic shared memory and up to 27,840 of
  // diagonal tables leave no 16 KiB under 227 KiB: the flag is dropped (global atomics), and
  // the description is the one without it (same kernel, same cache entry).
  const KernelDesc full = dkdv_desc("sm_90a", "sm90a_wgmma", 4096);
  CHECK_FALSE(full.flags.has(kBufGradSmemFlag));
  CHECK(full == dkdv_desc("sm_90a", "sm90a_wgmma", 0));
  CHECK(bufgrad_smem_floats(dkdv_desc("sm_90a", "sm90a_wgmma", 4096, 64)) == 4096);
  CHECK(bufgrad_smem_floats(dkdv_desc("sm_90a", "sm80_mma", 4096)) == 4096);
  // sm_86's 99 KiB: the sm80 tiles' own shared memory decides.
  CHECK(bufgrad_smem_floats(dkdv_desc("sm_86", "sm80_mma", 512, 64)) == 512);

  // Malformed values and families are refused by name.
  const Variant& v80 = *Registry::global().find(Family::BackwardDkDv, "sm80_mma");
  const Variant& v90 = *Registry::global().find(Family::BackwardDkDv, "sm90a_wgmma");
  KernelDesc odd = dkdv_desc("sm_90a", "sm80_mma", 512);
  odd.flags.set(kBufGradSmemFlag, 100);
  CHECK_THROWS_WITH(v80.validate(odd), Catch::Contains("flag 'bufgrad_smem' = 100") &&
                                           Catch::Contains("a power of two from 32 to 4096"));
  KernelDesc big = dkdv_desc("sm_90a", "sm90a_wgmma", 512);
  big.flags.set(kBufGradSmemFlag, 8192);
  CHECK_THROWS_WITH(v90.validate(big), Catch::Contains("flag 'bufgrad_smem' = 8192"));
  KernelDesc det = dkdv_desc("sm_90a", "sm80_mma", 512);
  det.flags.set(kDeterministicFlag, 1);
  det.config.set("dq_atomic", 0);
  CHECK_THROWS_WITH(v80.validate(det), Catch::Contains("exclude each other"));
  KernelDesc dq =
      Registry::global().complete(backward_problem(Family::BackwardDq, cuda::Arch::parse("sm_90a"),
                                                   DType::BF16, 128, 128, 1, true),
                                  {}, {}, "sm80_mma");
  dq.flags.set(kBufGradSmemFlag, 512);
  CHECK_THROWS_WITH(Registry::global().find(Family::BackwardDq, "sm80_mma")->validate(dq),
                    Catch::Contains("only backward_dkdv takes it"));
}

TEST_CASE("small buffer gradients: the generated hooks add into the CTA's private copy",
          "[backward][bufgrad_smem][codegen]") {
  using cuda::GradAccumulation;
  using cuda::MathFunctions;
  const Mods t5 = standard_mods("t5_bucketed_bias");
  const std::string on = cuda::generate_mod_grad_functions(
      t5, MathFunctions::Exact, GradAccumulation::Atomic, cuda::BufferChecks::Off, 512);
  // The diagonal site's add goes to shared memory at the slice layout's row-major index.
  CHECK_THAT(on, Catch::Contains("static constexpr int kFjGradSmemFloats = 512;") &&
                     Catch::Contains("static __shared__ __align__(16) float fj_grad_smem[") &&
                     Catch::Contains("fj_grad_add_shared(fj_grad_smem + ((int)gp.gslice_bias + ") &&
                     Catch::Contains("if (v != 0.0f) fj_bufgrad_add_to(gp, e, v);"));
  const std::string off = cuda::generate_mod_grad_functions(t5);
  CHECK_THAT(off, Catch::Contains("static constexpr int kFjGradSmemFloats = 0;") &&
                      !Catch::Contains("fj_grad_smem") &&
                      Catch::Contains("atomicAdd(gp.grad_bias + ("));
  // A per-element site that is not diagonal: fj_bufgrad adds into the copy.
  const std::string table =
      cuda::generate_mod_grad_functions(parse_mods(kPerHeadTable), MathFunctions::Exact,
                                        GradAccumulation::Atomic, cuda::BufferChecks::Off, 32);
  CHECK_THAT(table, Catch::Contains("fj_grad_add_shared(fj_grad_smem + ((int)gp.gslice_tab + "));
  // ALiBi's per-head site keeps its one global atomic per warp and head: no copy at all.
  const std::string alibi =
      cuda::generate_mod_grad_functions(standard_mods("alibi_causal"), MathFunctions::Exact,
                                        GradAccumulation::Atomic, cuda::BufferChecks::Off, 32);
  CHECK_THAT(alibi, Catch::Contains("kFjGradSmemFloats = 0;") &&
                        Catch::Contains("fj_grad_add(gp.grad_slopes"));
  // Ordered (deterministic) hooks never take it.
  CHECK_THAT(cuda::generate_mod_grad_functions(t5, MathFunctions::Exact, GradAccumulation::Ordered,
                                               cuda::BufferChecks::Off, 512),
             Catch::Contains("kFjGradSmemFloats = 0;"));
}

TEST_CASE("small buffer gradients: both dK/dV variants compile with the private copy",
          "[backward][bufgrad_smem][nvrtc]") {
  // T5 (the diagonal site on sm90a_wgmma), a relative bias and a per-head table, at the default
  // tiles of d = 128 and 64: the copy is the kernel's static shared memory beside the diagonal
  // tables, and it keeps the spills within the suite's bound.
  struct Job {
    std::string variant, label;
    Mods mods;
    int dim;
    int64_t floats;
  };
  std::vector<Job> jobs;
  for (const char* variant : {"sm80_mma", "sm90a_wgmma"}) {
    for (int dim : {128, 64}) {
      jobs.push_back({variant, "t5", standard_mods("t5_bucketed_bias"), dim, 512});
      jobs.push_back({variant, "relative_bias", standard_mods("relative_bias_causal"), dim, 1024});
      jobs.push_back({variant, "per-head table", parse_mods(kPerHeadTable), dim, 128});
    }
  }
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::mutex mu;
  std::vector<std::string> failures, resources;
  test::run_parallel(jobs.size(), [&](size_t i) {
    const Job& j = jobs[i];
    try {
      const KernelDesc with = dkdv_desc("sm_90a", j.variant, j.floats, j.dim);
      const KernelDesc without = dkdv_desc("sm_90a", j.variant, 0, j.dim);
      const BuiltKernel k = builder.build(j.mods, with);
      const BuiltKernel g = builder.build(j.mods, without);
      const jit::ResourceUsage& u = k.compiled.kernel->usage;
      const jit::ResourceUsage& ug = g.compiled.kernel->usage;
      std::lock_guard<std::mutex> lock(mu);
      resources.push_back(fmt::format("{} {} d={} bufgrad_smem={}: {} (global atomics: {})",
                                      j.variant, j.label, j.dim, bufgrad_smem_floats(with), u.str(),
                                      ug.str()));
      if (!with.flags.has(kBufGradSmemFlag)) {
        failures.push_back(fmt::format("{}: the flag was dropped", with.str()));
      }
      // The copy is static shared memory: exactly its 4 bytes per float more.
      if (u.static_shared_bytes != ug.static_shared_bytes + 4 * j.floats) {
        failures.push_back(fmt::format("{} {}: static smem {} against {} + {}", with.str(), j.label,
                                       u.static_shared_bytes, ug.static_shared_bytes,
                                       4 * j.floats));
      }
      // The suite's bound for the backward kernels (64 bytes of spill stores), or the global
      // kernel's spills where that is more: sm80_mma at d = 128 runs at 255 registers either
      // way, and the copy's addressing moves a few values (the relative bias: 24 -> 56 bytes;
      // T5 and the per-head table spill less than with the global atomics).
      if (u.spill_store_bytes > std::max(64, ug.spill_store_bytes)) {
        failures.push_back(fmt::format("{} {}: {} bytes of spill stores, global atomics {}",
                                       with.str(), j.label, u.spill_store_bytes,
                                       ug.spill_store_bytes));
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(fmt::format("{} {} d={}: {}", j.variant, j.label, j.dim, e.what()));
    }
  });
  std::sort(resources.begin(), resources.end());
  for (const std::string& r : resources)
    UNSCOPED_INFO(r);
  if (std::getenv("FLEXJIT_PRINT_RESOURCES") != nullptr) {
    for (const std::string& r : resources)
      std::printf("  %s\n", r.c_str());
  }
  for (const std::string& f : failures)
    FAIL_CHECK(f);
  CHECK(failures.empty());
}
