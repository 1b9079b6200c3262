// The compiler pipeline, one named stage per line (Pipeline.cpp reads top to bottom):
//
//   typecheck -> simplify -> cse -> codegen (CUDA source) -> compile (NVRTC + caches)
//
// Each stage logs under FLEXJIT_LOG=pipeline (or all). A stage knows nothing of later stages.
#pragma once

#include <flexjit/mods.h>

#include "codegen/cuda/ForwardSource.h"
#include "codegen/cuda/ForwardSpec.h"
#include "jit/KernelCompiler.h"

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace flexjit {

// The mods after the front-end passes: type-checked, simplified, common sub-expressions shared.
Mods lower_mods(const Mods& mods);

// Mods -> CUDA source of the forward kernel (no compilation).
cuda::GeneratedSource emit_forward(const Mods& mods, const cuda::ForwardSpec& spec);

struct BuiltKernel {
  std::shared_ptr<const cuda::GeneratedSource> source;
  jit::CompileResult compiled;
};

// Builds kernels through three levels of caching: a memo keyed by the mods' structure and the
// spec (no codegen, no hashing of source: the hot path of a repeated call), then the
// compiler's memory LRU and disk cache keyed by the SHA-256 of the source, then NVRTC.
// Thread-safe.
class KernelBuilder {
 public:
  explicit KernelBuilder(jit::CacheSettings settings = jit::CacheSettings::from_env());
  BuiltKernel build_forward(const Mods& mods, const cuda::ForwardSpec& spec);
  // Compiles any generated source (block-mask, reference kernels) through the compiler's
  // caches; no structural memo.
  jit::CompileResult compile(const cuda::GeneratedSource& source, const std::string& arch,
                             const std::string& label);
  jit::KernelCompiler& compiler() { return compiler_; }

 private:
  struct Entry {
    Mods mods;
    cuda::ForwardSpec spec;
    BuiltKernel kernel;
  };
  jit::KernelCompiler compiler_;
  std::mutex mu_;
  std::unordered_map<uint64_t, std::vector<Entry>> memo_;
};

}  // namespace flexjit
