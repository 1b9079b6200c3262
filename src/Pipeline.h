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
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
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
};

// One kernel of KernelBuilder::build_all (pointers: the caller keeps them alive for the call).
struct BuildRequest {
  const Mods* mods = nullptr;
  const kernels::KernelDesc* desc = nullptr;
};

// What a KernelBuilder built since it was made: the kernels that missed its memo (codegen, then
// the compiler's caches or NVRTC). `flexjit bench --first-call` reads it around a call.
struct BuildTotals {
  uint64_t kernels = 0;             // memo misses built, whatever the compiler's outcome
  uint64_t concurrent_batches = 0;  // build_all calls that built two or more kernels at once
  double wall_ms = 0;               // host wall time of those builds (a batch counted once)
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
  // Builds the kernel of a complete description (variant and config set).
  BuiltKernel build(const Mods& mods, const kernels::KernelDesc& desc);
  // Builds several independent kernels (a plan's steps), returned in the order asked, each the
  // kernel build() would return. Memo hits cost no thread; two or more misses are built
  // concurrently on up to compile_threads() threads, the calling thread among them, so a cold
  // plan costs about its longest compile rather than the sum (NVRTC is thread-safe, and the
  // compiler compiles a key once). When builds fail, the others still finish (and are cached);
  // then the first failing request's error (by position) is rethrown.
  std::vector<BuiltKernel> build_all(const std::vector<BuildRequest>& requests);
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
  // Codegen and compile (through the compiler's caches) of a memo miss, then into the memo.
  BuiltKernel build_miss(const Mods& mods, const kernels::KernelDesc& desc);
  static uint64_t memo_key(const Mods& mods, const kernels::KernelDesc& desc);

  jit::KernelCompiler compiler_;
  const size_t max_memo_;
  std::atomic<size_t> compile_threads_{0};  // 0: the hardware's
  mutable std::mutex mu_;
  BuildTotals totals_;    // under mu_
  std::list<Entry> lru_;  // most recently used first
  std::unordered_multimap<uint64_t, std::list<Entry>::iterator> memo_;
};

}  // namespace flexjit
