// The process-wide ORC JIT (LLVM's LLJIT) that runs flexjit's CPU code, and its memory cache.
//
// Each compiled module gets its own JITDylib, so every module may define the same fixed symbol
// names (fj_score, fj_mask_tile, ...). Modules are optimised with LLVM's O2 pipeline for the
// host CPU (JITTargetMachineBuilder::detectHost, so AVX2 / AVX-512 where present) and compiled
// eagerly; every function they define is resolved once, and CpuModule::lookup is then a map
// lookup, safe from any thread. libm functions are resolved from the current process.
//
// The cache key is (kernel kind, Mods): the structural hash picks a bucket and flexjit::equal
// decides, so two mod sets that hash alike never share code. Parameter values and buffer
// contents are not part of the key: they are arguments of the generated functions. Entries live
// as long as the process (compiled mods are a few KiB each).
//
// FLEXJIT_DUMP_LLVM=1 prints each optimised module to stderr before it is compiled.
//
// This header exposes no LLVM types beyond forward declarations: only src/codegen/llvm/*.cpp
// include LLVM headers.
#pragma once

#include <flexjit/mods.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace flexjit::llvmjit {

// One compiled module: its functions by name.
class CpuModule {
 public:
  // The address of the function `name` defined by the module, or nullptr.
  void* lookup(std::string_view name) const;
  // Milliseconds spent generating, optimising and compiling this module.
  double compile_ms() const { return compile_ms_; }

 private:
  friend class OrcJit;
  std::unordered_map<std::string, void*> symbols_;
  double compile_ms_ = 0.0;
};

// Builds the LLVM module for a cache miss; runs in the calling thread under the JIT's lock.
using ModuleBuilder = std::function<std::unique_ptr<llvm::Module>(llvm::LLVMContext&)>;

class OrcJit {
 public:
  // The process-wide JIT, created on first use. Throws JitError if LLVM cannot target the host.
  static OrcJit& instance();

  // The module compiled for (kind, mods), building it with `build` on a miss. Throws JitError
  // if the generated module fails verification or does not compile (a flexjit bug).
  std::shared_ptr<const CpuModule> get(std::string_view kind, const Mods& mods,
                                       const ModuleBuilder& build);

  struct Stats {
    int64_t hits = 0;
    int64_t misses = 0;       // = modules compiled
    double compile_ms = 0.0;  // total over all misses
  };
  Stats stats() const;

  // The host CPU name and features the JIT targets ("skylake-avx512", "+avx2,...").
  std::string host_cpu() const;

  OrcJit(const OrcJit&) = delete;
  OrcJit& operator=(const OrcJit&) = delete;
  ~OrcJit();

 private:
  OrcJit();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flexjit::llvmjit
