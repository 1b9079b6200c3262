// KernelBuilder::build_all, how runtime::build_plan builds a plan's kernels: the new ones compiled
// concurrently (a cold backward costs its longest compile, not the sum of three), the same
// kernels as one at a time, memo hits without threads, a key compiled once, and errors reported
// by position after every other kernel was built ([pipeline][build_all]).
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "jit/Nvrtc.h"
#include "kernels/Registry.h"
#include "support/BuildRequests.h"
#include "support/CacheTest.h"
#include "support/KernelDescs.h"

#include <catch2/catch.hpp>

#include <thread>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

jit::CacheSettings no_cache() {
  jit::CacheSettings s;
  s.enabled = false;  // every kernel a real NVRTC compile
  return s;
}

}  // namespace

TEST_CASE(
    "build_all compiles a cold sm_90a backward plan concurrently, the same cubins as one "
    "at a time",
    "[pipeline][build_all][nvrtc]") {
  const Mods mods = standard_mods("causal");
  const std::vector<KernelDesc> descs = test::backward_plan_descs("sm_90a");
  REQUIRE(descs[1].variant == "sm90a_wgmma");
  REQUIRE(descs[2].variant == "atomic_convert");
  const std::vector<BuildRequest> requests = test::build_requests(mods, descs);

  KernelBuilder one_at_a_time(no_cache());
  one_at_a_time.set_compile_threads(1);
  const std::vector<BuiltKernel> a = one_at_a_time.build_all(requests);
  CHECK(one_at_a_time.totals().kernels == 3);
  CHECK(one_at_a_time.totals().concurrent_batches == 0);

  KernelBuilder concurrent(no_cache());
  concurrent.set_compile_threads(3);
  const std::vector<BuiltKernel> b = concurrent.build_all(requests);
  CHECK(concurrent.totals().kernels == 3);
  CHECK(concurrent.totals().concurrent_batches == 1);

  REQUIRE(a.size() == 3);
  REQUIRE(b.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    INFO(descs[i].str());
    CHECK(b[i].desc == descs[i]);  // in the order asked
    CHECK(a[i].compiled.outcome == jit::CacheOutcome::Compiled);
    CHECK(b[i].compiled.outcome == jit::CacheOutcome::Compiled);
    CHECK(a[i].compiled.kernel->key == b[i].compiled.kernel->key);
    CHECK(a[i].compiled.kernel->kernel_name == b[i].compiled.kernel->kernel_name);
    CHECK(a[i].compiled.kernel->cubin == b[i].compiled.kernel->cubin);
  }
  // The plan's second call: every kernel from the memo, no thread, no compile.
  const uint64_t compiles = jit::nvrtc_compile_count();
  const std::vector<BuiltKernel> again = concurrent.build_all(requests);
  CHECK(jit::nvrtc_compile_count() == compiles);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(again[i].compiled.outcome == jit::CacheOutcome::MemoryHit);
    CHECK(again[i].compiled.kernel == b[i].compiled.kernel);
  }
  CHECK(concurrent.totals().kernels == 3);
  CHECK(concurrent.totals().concurrent_batches == 1);
}

TEST_CASE("build_all: only memo misses are built, one key compiled once", "[pipeline][build_all]") {
  test::TempDir dir;
  KernelBuilder builder(test::settings_in(dir.path()));
  builder.set_compile_threads(4);
  const Mods causal = standard_mods("causal");
  const Mods window = standard_mods("sliding_window");
  const KernelDesc d64 = test::block_mask_desc("sm_80", 64);
  const KernelDesc d128 = test::block_mask_desc("sm_80", 128);

  // Warm one kernel; a batch with it and one new kernel builds one kernel, on this thread.
  builder.build(causal, d64);
  const std::vector<BuiltKernel> one = builder.build_all({{&causal, &d64}, {&window, &d64}});
  CHECK(one[0].compiled.outcome == jit::CacheOutcome::MemoryHit);
  CHECK(one[1].compiled.outcome == jit::CacheOutcome::Compiled);
  CHECK(builder.totals().kernels == 2);
  CHECK(builder.totals().concurrent_batches == 0);

  // The same new kernel asked twice in one batch: built by two threads, compiled once (the
  // compiler's single flight), one kernel for both.
  const uint64_t compiles = jit::nvrtc_compile_count();
  const std::vector<BuiltKernel> twice = builder.build_all({{&causal, &d128}, {&causal, &d128}});
  CHECK(jit::nvrtc_compile_count() == compiles + 1);
  CHECK(twice[0].compiled.kernel == twice[1].compiled.kernel);
  CHECK(builder.totals().concurrent_batches == 1);
  CHECK(builder.totals().wall_ms > 0);
}

TEST_CASE(
    "build_all: a failing kernel fails the batch after the others are built, the first "
    "failure by position",
    "[pipeline][build_all]") {
  KernelBuilder builder(no_cache());
  builder.set_compile_threads(3);
  const Mods causal = standard_mods("causal");
  const KernelDesc good = test::block_mask_desc("sm_80", 128);
  KernelDesc first_bad = good, second_bad = good;
  first_bad.variant = "no_such_variant";
  second_bad.variant = "nor_this_one";
  const std::vector<BuildRequest> requests = {
      {&causal, &good}, {&causal, &first_bad}, {&causal, &second_bad}};
  try {
    builder.build_all(requests);
    FAIL("build_all returned although two of its kernels cannot be built");
  } catch (const UnsupportedError& e) {
    // The first failure by position is request 1's, whichever thread finished first.
    CHECK_THAT(e.what(), Catch::Contains("no_such_variant"));
    CHECK_THAT(e.what(), !Catch::Contains("nor_this_one"));
  }
  // The good kernel was built and kept: the next call finds it in the memo.
  CHECK(builder.build(causal, good).compiled.outcome == jit::CacheOutcome::MemoryHit);
}

TEST_CASE("FLEXJIT_COMPILE_THREADS sets how many threads build_all uses", "[pipeline][build_all]") {
  const size_t hardware = std::max(1u, std::thread::hardware_concurrency());
  {
    test::ScopedEnv env("FLEXJIT_COMPILE_THREADS", nullptr);
    CHECK(KernelBuilder(no_cache()).compile_threads() == hardware);
  }
  {
    test::ScopedEnv env("FLEXJIT_COMPILE_THREADS", "1");
    KernelBuilder b(no_cache());
    CHECK(b.compile_threads() == 1);
    b.set_compile_threads(0);  // 0: the hardware's
    CHECK(b.compile_threads() == hardware);
  }
  {
    test::ScopedEnv env("FLEXJIT_COMPILE_THREADS", "0");
    CHECK(KernelBuilder(no_cache()).compile_threads() == hardware);
  }
  {
    test::ScopedEnv env("FLEXJIT_COMPILE_THREADS", "many");
    CHECK_THROWS_WITH(KernelBuilder(no_cache()),
                      Catch::Contains("FLEXJIT_COMPILE_THREADS") && Catch::Contains("many"));
  }
}
