// A kernel is compiled once: by one thread of a process (single flight), and by one process of
// those sharing a cache directory (a per-key file lock) ([cache][concurrency]).
#include "jit/KernelCompiler.h"
#include "support/CacheTest.h"

#include <flexjit/error.h>

#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>
#include <vector>

using namespace flexjit;
using namespace flexjit::jit;
using namespace flexjit::test;
namespace fs = std::filesystem;

namespace {

// Runs `fn(i)` on n threads released together.
template <typename F>
void on_threads(int n, F fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (!go.load())
        std::this_thread::yield();
      fn(i);
    });
  }
  while (ready.load() < n)
    std::this_thread::yield();
  go.store(true);
  for (auto& t : threads)
    t.join();
}

}  // namespace

TEST_CASE("threads asking for the same new kernel compile it once", "[cache][concurrency]") {
  TempDir dir;
  KernelCompiler compiler(settings_in(dir.path()));
  constexpr int kThreads = 8;
  std::vector<CompileResult> results(kThreads);
  on_threads(kThreads, [&](int i) { results[i] = compiler.compile(small_request(21)); });
  std::map<CacheOutcome, int> outcomes;
  for (const auto& r : results) {
    ++outcomes[r.outcome];
    CHECK(r.kernel == results[0].kernel);  // the one kernel, shared
  }
  CHECK(outcomes[CacheOutcome::Compiled] == 1);
  CHECK(outcomes[CacheOutcome::MemoryHit] == kThreads - 1);
  CHECK(files_with_suffix(dir.path(), ".fjc").size() == 1);
  CHECK(files_with_suffix(dir.path(), ".lock").empty());
}

TEST_CASE("threads waiting for a compile that fails get its error", "[cache][concurrency]") {
  TempDir dir;
  KernelCompiler compiler(settings_in(dir.path()));
  CompileRequest bad{"extern \"C\" __global__ void f() { nope; }", "f", "sm_80", {}, "bad"};
  constexpr int kThreads = 6;
  std::atomic<int> jit_errors{0};
  on_threads(kThreads, [&](int) {
    try {
      compiler.compile(bad);
    } catch (const JitError& e) {
      if (std::string(e.what()).find("nope") != std::string::npos) jit_errors.fetch_add(1);
    }
  });
  CHECK(jit_errors.load() == kThreads);
  CHECK(files_with_suffix(dir.path(), ".fjc").empty());
  // A failure is not remembered: the next call compiles (and fails) again.
  CHECK_THROWS_AS(compiler.compile(bad), JitError);
}

TEST_CASE("processes asking for the same new kernel compile it once; the others hit the disk",
          "[cache][concurrency]") {
  TempDir dir;
  constexpr int kProcesses = 4;
  int go[2];
  REQUIRE(::pipe(go) == 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < kProcesses; ++i) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(go[1]);
      char c;
      int status = 90;
      if (::read(go[0], &c, 1) == 0) {  // released together when the parent closes the pipe
        try {
          KernelCompiler compiler(settings_in(dir.path()));
          status = 10 + static_cast<int>(compiler.compile(small_request(22)).outcome);
        } catch (...) {
          status = 91;
        }
      }
      ::_exit(status);
    }
    pids.push_back(pid);
  }
  ::close(go[0]);
  ::close(go[1]);
  std::map<int, int> outcomes;
  for (pid_t pid : pids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    ++outcomes[WEXITSTATUS(status)];
  }
  CHECK(outcomes[10 + static_cast<int>(CacheOutcome::Compiled)] == 1);
  CHECK(outcomes[10 + static_cast<int>(CacheOutcome::DiskHit)] == kProcesses - 1);
  CHECK(files_with_suffix(dir.path(), ".fjc").size() == 1);
  CHECK(files_with_suffix(dir.path(), ".lock").empty());
}

TEST_CASE("a compile waits for another process's lock only as long as lock_wait",
          "[cache][concurrency]") {
  TempDir dir;
  const CompileRequest req = small_request(23);
  DiskCache disk(dir.path(), 1 << 30);
  // A lock held and never released (a stuck process): flock locks of separate opens conflict
  // even within one process.
  KeyLock stuck = disk.lock(cache_key(req), std::chrono::milliseconds(0));
  REQUIRE(stuck.held());
  CHECK_FALSE(disk.lock(cache_key(req), std::chrono::milliseconds(50)).held());

  CacheSettings s = settings_in(dir.path());
  s.lock_wait = std::chrono::milliseconds(300);
  KernelCompiler compiler(s);
  auto t0 = std::chrono::steady_clock::now();
  CompileResult r = compiler.compile(req);
  double waited =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CHECK(r.outcome == CacheOutcome::Compiled);
  CHECK(waited >= 300);
  CHECK(files_with_suffix(dir.path(), ".fjc").size() == 1);

  // Released (its holder died or finished): the lock file goes, the next lock is immediate.
  stuck.release();
  CHECK(files_with_suffix(dir.path(), ".lock").empty());
  KeyLock again = disk.lock(cache_key(req), std::chrono::milliseconds(0));
  CHECK(again.held());
}
