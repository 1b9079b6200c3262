// KernelBuilder::build_in_background, the backward's early start (docs/caching.md "First call"):
// a kernel asked for while it compiles in the background is waited for, not compiled again, and
// is the same kernel; nothing is queued where each compile must be the caller's own; a failure
// is the later call's to report; a builder's destruction and process exit stop the background
// thread safely ([pipeline][background]). No GPU: NVRTC compiles sm_90a without one.
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "jit/Nvrtc.h"
#include "support/BuildRequests.h"
#include "support/CacheTest.h"
#include "support/KernelDescs.h"

#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

std::vector<OwnedBuildRequest> owned(const Mods& mods, const std::vector<KernelDesc>& descs) {
  std::vector<OwnedBuildRequest> out;
  for (const KernelDesc& d : descs)
    out.push_back({mods, d});
  return out;
}

}  // namespace

TEST_CASE(
    "a backward plan built in the background and asked for at once is compiled once, the "
    "same kernels",
    "[pipeline][background][nvrtc]") {
  test::TempDir dir;
  KernelBuilder builder(test::settings_in(dir.path()));
  builder.set_compile_threads(4);
  const Mods mods = standard_mods("causal");
  const std::vector<KernelDesc> descs = test::backward_plan_descs("sm_90a");
  REQUIRE(descs[1].variant == "sm90a_wgmma");

  const uint64_t compiles = jit::nvrtc_compile_count();
  CHECK(builder.build_in_background(owned(mods, descs)) == 3);
  // Queued or compiling already: asking again queues nothing.
  CHECK(builder.build_in_background(owned(mods, descs)) == 0);
  // The backward's own build while the background one runs: it waits for the compiles in flight
  // (or compiles one that has not started; then the background thread finds it built).
  const std::vector<BuiltKernel> got = builder.build_all(test::build_requests(mods, descs));
  builder.wait_background();
  CHECK(jit::nvrtc_compile_count() == compiles + 3);  // each kernel once
  CHECK(builder.memo_size() == 3);                    // one memo entry per kernel
  REQUIRE(got.size() == 3);
  const std::vector<BuiltKernel> again = builder.build_all(test::build_requests(mods, descs));
  for (size_t i = 0; i < 3; ++i) {
    INFO(descs[i].str());
    CHECK(got[i].desc == descs[i]);
    REQUIRE(got[i].compiled.kernel != nullptr);
    CHECK_FALSE(got[i].compiled.kernel->cubin.empty());
    CHECK(again[i].compiled.outcome == jit::CacheOutcome::MemoryHit);
    CHECK(again[i].compiled.kernel == got[i].compiled.kernel);  // the one kernel
  }
  // All built: nothing to queue, no compile.
  CHECK(builder.build_in_background(owned(mods, descs)) == 0);
  CHECK(jit::nvrtc_compile_count() == compiles + 3);
}

TEST_CASE("threads building the same new sm_90a kernel compile it once and share it",
          "[pipeline][background][concurrency][nvrtc]") {
  test::TempDir dir;
  KernelBuilder builder(test::settings_in(dir.path()));
  const Mods mods = standard_mods("causal");
  const KernelDesc preprocess = test::backward_plan_descs("sm_90a")[0];
  constexpr int kThreads = 4;
  std::vector<BuiltKernel> built(kThreads);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  const uint64_t compiles = jit::nvrtc_compile_count();
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (!go.load())
        std::this_thread::yield();
      built[i] = builder.build(mods, preprocess);
    });
  }
  while (ready.load() < kThreads)
    std::this_thread::yield();
  go.store(true);
  for (std::thread& t : threads)
    t.join();
  CHECK(jit::nvrtc_compile_count() == compiles + 1);
  for (const BuiltKernel& k : built)
    CHECK(k.compiled.kernel == built[0].compiled.kernel);
  CHECK(builder.memo_size() == 1);
}

TEST_CASE(
    "build_in_background queues nothing with one compile thread, with caching disabled, or "
    "once stopped",
    "[pipeline][background]") {
  const Mods mods = standard_mods("causal");
  const std::vector<KernelDesc> descs = test::backward_plan_descs("sm_90a");
  const uint64_t compiles = jit::nvrtc_compile_count();
  {
    test::TempDir dir;
    KernelBuilder one(test::settings_in(dir.path()));
    one.set_compile_threads(1);  // FLEXJIT_COMPILE_THREADS=1: one compile at a time
    CHECK(one.build_in_background(owned(mods, descs)) == 0);
  }
  {
    jit::CacheSettings off;
    off.enabled = false;  // FLEXJIT_DISABLE_CACHE=1: every compile is its caller's
    KernelBuilder uncached(off);
    uncached.set_compile_threads(4);
    CHECK(uncached.build_in_background(owned(mods, descs)) == 0);
  }
  {
    test::TempDir dir;
    KernelBuilder stopped(test::settings_in(dir.path()));
    stopped.set_compile_threads(4);
    stopped.stop_background();
    stopped.stop_background();  // idempotent
    CHECK(stopped.build_in_background(owned(mods, descs)) == 0);
    stopped.wait_background();  // nothing queued: returns at once
  }
  CHECK(jit::nvrtc_compile_count() == compiles);
}

TEST_CASE("a kernel that fails in the background is reported by the call that needs it",
          "[pipeline][background]") {
  test::TempDir dir;
  KernelBuilder builder(test::settings_in(dir.path()));
  builder.set_compile_threads(2);
  const Mods mods = standard_mods("causal");
  KernelDesc bad = test::block_mask_desc("sm_80", 128);
  bad.variant = "no_such_variant";
  CHECK(builder.build_in_background(owned(mods, {bad})) == 1);
  builder.wait_background();
  CHECK(builder.totals().background_kernels == 1);
  CHECK(builder.totals().kernels == 0);  // the foreground built nothing
  CHECK(builder.memo_size() == 0);       // a failure is not remembered
  CHECK_THROWS_WITH(builder.build(mods, bad), Catch::Contains("no_such_variant"));
}

TEST_CASE(
    "a builder destroyed with background builds queued waits for the compile in flight and "
    "drops the rest",
    "[pipeline][background][nvrtc]") {
  const Mods mods = standard_mods("causal");
  std::vector<KernelDesc> descs = test::backward_plan_descs("sm_90a");
  std::swap(descs[1], descs[2]);  // the dK/dV kernel, the longest compile, last
  const uint64_t compiles = jit::nvrtc_compile_count();
  {
    test::TempDir dir;
    KernelBuilder builder(test::settings_in(dir.path()));
    builder.set_compile_threads(2);  // one background thread: one kernel at a time
    CHECK(builder.build_in_background(owned(mods, descs)) == 3);
  }  // ~KernelBuilder: no crash, no hang
  CHECK(jit::nvrtc_compile_count() - compiles <= 1);
}

// The child of the test below, in a fresh process (exec'd: a forked copy of a process that has
// used the CUDA driver, as the [gpu] tests' has, may not even exit cleanly): queues the backward's
// kernels on a builder that is never destroyed (FLEXJIT_TEST_BACKGROUND_EXIT=leaked, as the
// Python module's contexts are) or a static one (=static), then exits while they compile.
TEST_CASE("(child) exit while kernels compile in the background", "[.background_exit_child]") {
  const char* mode = std::getenv("FLEXJIT_TEST_BACKGROUND_EXIT");
  const char* dir = std::getenv("FLEXJIT_TEST_BACKGROUND_DIR");
  if (mode == nullptr || dir == nullptr) return;  // run by hand: nothing to do
  int status = 90;
  try {
    const Mods mods = standard_mods("causal");
    const std::vector<KernelDesc> descs = test::backward_plan_descs("sm_90a");
    KernelBuilder* builder = nullptr;
    if (std::string(mode) == "leaked") {
      builder = new KernelBuilder(test::settings_in(dir));
    } else {
      static KernelBuilder in_static(test::settings_in(dir));
      builder = &in_static;
    }
    builder->set_compile_threads(4);
    status = builder->build_in_background(owned(mods, descs)) == 3 ? 0 : 91;
  } catch (...) {
    status = 92;
  }
  std::fflush(nullptr);
  std::exit(status);  // atexit handlers and static destructors while the compiles run
}

TEST_CASE("a process exiting while kernels compile in the background exits cleanly",
          "[pipeline][background][nvrtc]") {
  // The Python module's contexts are never destroyed: their builders' background threads are
  // stopped by the atexit handler before static destruction. And a builder that is itself a
  // static, destroyed at exit. Each in a child process (this executable, the hidden case above)
  // that exits right after queuing.
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  for (const char* mode : {"leaked", "static"}) {
    INFO("a builder " << (std::string(mode) == "leaked" ? "never destroyed" : "in a static"));
    test::TempDir dir;
    std::fflush(nullptr);  // nothing buffered twice
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::setenv("FLEXJIT_TEST_BACKGROUND_EXIT", mode, 1);
      ::setenv("FLEXJIT_TEST_BACKGROUND_DIR", dir.path().c_str(), 1);
      ::execl(self.c_str(), self.c_str(), "[background_exit_child]", "--out", "/dev/null",
              static_cast<char*>(nullptr));
      ::_exit(93);  // exec failed
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK((WIFEXITED(status) ? WEXITSTATUS(status) : -1) == 0);
  }
}
