// The compiler pipeline, one named stage per line (Pipeline.cpp reads top to bottom):
//
//   typecheck -> simplify -> cse -> codegen (the variant's CUDA source) -> compile (NVRTC +
//   caches)
//
// What to build is a complete kernels::KernelDesc (family, variant, arch, problem, config: see
// kernels/Registry.h for how one is selected). Each stage logs under FLEXJIT_LOG=pipeline (or
// all). A stage knows nothing of later stages.
#pragma once

#include <flexjit/mods.h>

#include "codegen/cuda/SourceAssembly.h"
#include "jit/KernelCompiler.h"
#include "kernels/KernelDesc.h"
#include "kernels/Variant.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace flexjit {

// The mods after the front-end passes: type-checked, simplified, common sub-expressions shared.
Mods lower_mods(const Mods& mods);

// The variant of `desc` in kernels::Registry::global(); UnsupportedError naming the family's
// variants when there is none of that name.
const kernels::Variant& variant_of(const kernels::KernelDesc& desc);

// Mods -> CUDA source of the kernel `desc` describes (no compilation): the variant's kernel
// mods, lowered, then its generate().
cuda::GeneratedSource emit_source(const Mods& mods, const kernels::KernelDesc& desc);

struct BuiltKernel {
  kernels::KernelDesc desc;
  std::shared_ptr<const cuda::GeneratedSource> source;
  jit::CompileResult compiled;
  // The kernels of the variant's companions(desc, mods), in that order (Launch::companion).
  std::vector<BuiltKernel> companions;
};

// One kernel of KernelBuilder::build_all (pointers: the caller keeps them alive for the call).
struct BuildRequest {
  const Mods* mods = nullptr;
  const kernels::KernelDesc* desc = nullptr;
};

// One kernel of KernelBuilder::build_in_background, owned: the caller returns before it is built.
struct OwnedBuildRequest {
  Mods mods;
  kernels::KernelDesc desc;
};

// What a KernelBuilder built since it was made: the kernels that missed its memo (codegen, then
// the compiler's caches or NVRTC). `flexjit bench --first-call` reads it around a call.
struct BuildTotals {
  uint64_t kernels = 0;             // memo misses built, whatever the compiler's outcome
  uint64_t concurrent_batches = 0;  // build_all calls that built two or more kernels at once
  double wall_ms = 0;               // host wall time of those builds (a batch counted once)
  // Built by build_in_background (not in the three above): memo misses it built or failed.
  uint64_t background_kernels = 0;
};

// Builds kernels through three levels of caching: a memo keyed by the mods' structure and the
// description (no codegen, no hashing of source: the hot path of a repeated call; bounded, least
// recently used entries evicted), then the compiler's memory LRU and disk cache keyed by the
// SHA-256 of the source, then NVRTC. Thread-safe.
class KernelBuilder {
 public:
  static constexpr size_t kDefaultMemoEntries = 512;

  explicit KernelBuilder(jit::CacheSettings settings = jit::CacheSettings::from_env(),
                         size_t max_memo_entries = kDefaultMemoEntries);
  // Stops the background builds (stop_background) before anything they use goes.
  ~KernelBuilder();
  KernelBuilder(const KernelBuilder&) = delete;
  KernelBuilder& operator=(const KernelBuilder&) = delete;
  // Builds the kernel of a complete description (variant and config set).
  BuiltKernel build(const Mods& mods, const kernels::KernelDesc& desc);
  // Builds several independent kernels (a plan's steps), returned in the order asked, each the
  // kernel build() would return. Memo hits cost no thread; two or more misses are built
  // concurrently on up to compile_threads() threads, the calling thread among them, so a cold
  // plan costs about its longest compile rather than the sum (NVRTC is thread-safe, and the
  // compiler compiles a key once). When builds fail, the others still finish (and are cached);
  // then the first failing request's error (by position) is rethrown.
  std::vector<BuiltKernel> build_all(const std::vector<BuildRequest>& requests);
  // Queues the kernels of `requests` that are neither in the memo nor queued already for a
  // build_all on the builder's background thread, and returns at once: how many it queued (the
  // backward's early start, docs/caching.md "First call"). A later build() / build_all() of one
  // of them finds it in the memo, or waits for its compile in flight (the compiler's single
  // flight) and gets the same kernel: nothing is compiled twice, no result changes. A queued
  // batch builds on up to compile_threads() - 1 threads, leaving one to the caller's own
  // compiles. Queues nothing (returns 0) when compile_threads() is 1, when the compiler's caches
  // are disabled (every compile is then its caller's own) and after stop_background(). A kernel
  // that fails to build is dropped (logged under FLEXJIT_LOG=pipeline): the call that needs it
  // builds it again and reports the error.
  size_t build_in_background(std::vector<OwnedBuildRequest> requests);
  // Whether build_in_background would queue anything now (caches enabled, two or more compile
  // threads, not stopped): a caller may skip preparing its requests when not.
  bool background_enabled() const;
  // Blocks until every kernel queued so far is built (or failed).
  void wait_background();
  // Drops the queued kernels and waits for the ones being compiled (at most one compile's time);
  // later build_in_background calls queue nothing. Idempotent, thread-safe.
  void stop_background();
  // stop_background() of every builder alive: at process exit, before the statics the compiles
  // use are destroyed (an atexit handler registered before the first background thread starts,
  // and the Python module's atexit handler).
  static void stop_all_background();
  // The threads build_all may use: FLEXJIT_COMPILE_THREADS when set and not 0 (1: one kernel at
  // a time), else std::thread::hardware_concurrency().
  size_t compile_threads() const;
  void set_compile_threads(size_t threads);  // 0: the hardware's
  BuildTotals totals() const;
  // Compiles any generated source through the compiler's caches; no structural memo.
  jit::CompileResult compile(const cuda::GeneratedSource& source, const std::string& arch,
                             const std::string& label);
  jit::KernelCompiler& compiler() { return compiler_; }
  size_t memo_size() const;

 private:
  struct Entry {
    uint64_t key;
    Mods mods;
    BuiltKernel kernel;
  };
  // The memo's kernel for (mods, desc), outcome MemoryHit, elapsed since t0; nullopt on a miss.
  std::optional<BuiltKernel> memo_get(const Mods& mods, const kernels::KernelDesc& desc,
                                      std::chrono::steady_clock::time_point t0);
  // Codegen and compile (through the compiler's caches) of a memo miss, then into the memo. The
  // variant's companions are built too (memo first, no mods), on a thread of their own beside
  // the kernel's compile when compile_threads() allows.
  BuiltKernel build_miss(const Mods& mods, const kernels::KernelDesc& desc);
  // The companions of `desc` built: memo hits, else build_miss (counted in totals_.kernels).
  std::vector<BuiltKernel> build_companions(const std::vector<kernels::KernelDesc>& descs);
  static uint64_t memo_key(const Mods& mods, const kernels::KernelDesc& desc);
  // Builds requests[i] for every i of `which` on up to `threads` threads (the calling one among
  // them), into out[i] or errors[i]; stops taking new ones once `stop` is set (when given).
  // Returns how many threads built.
  size_t build_each(const std::vector<BuildRequest>& requests, const std::vector<size_t>& which,
                    size_t threads, std::vector<BuiltKernel>& out,
                    std::vector<std::exception_ptr>& errors, const std::atomic<bool>* stop);
  // The background thread's loop: one queued batch at a time until stopped.
  void background_loop();
  // stop_background's work, without the live list's lock (the destructor takes the builder off
  // the list first; stop_all_background holds the lock).
  void halt_background();

  jit::KernelCompiler compiler_;
  const size_t max_memo_;
  std::atomic<size_t> compile_threads_{0};  // 0: the hardware's
  mutable std::mutex mu_;
  BuildTotals totals_;    // under mu_
  std::list<Entry> lru_;  // most recently used first
  std::unordered_multimap<uint64_t, std::list<Entry>::iterator> memo_;

  // build_in_background's state, under bg_mu_. A key is in bg_keys_ from its queuing until its
  // batch is done (a hash collision only skips an early build, never changes a kernel).
  std::mutex bg_mu_;
  std::condition_variable bg_cv_;    // a batch queued, or the thread asked to stop
  std::condition_variable bg_idle_;  // a batch done
  std::deque<std::vector<OwnedBuildRequest>> bg_queue_;
  std::unordered_set<uint64_t> bg_keys_;
  bool bg_busy_ = false;  // the thread is building a batch
  std::atomic<bool> bg_stop_{false};
  std::thread bg_thread_;
  int bg_pid_ = 0;         // the process that started bg_thread_ (a forked child has no thread)
  std::mutex bg_join_mu_;  // one joiner at a time
};

}  // namespace flexjit
