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

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

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
  jit::KernelCompiler compiler_;
  const size_t max_memo_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_multimap<uint64_t, std::list<Entry>::iterator> memo_;
};

}  // namespace flexjit
