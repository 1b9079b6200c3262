// The JIT front door: compile a request to cubin through the memory cache, the disk cache and
// NVRTC, in that order.
#pragma once

#include "jit/CacheKey.h"
#include "jit/CacheSettings.h"
#include "jit/DiskCache.h"
#include "jit/MemoryCache.h"
#include "jit/Nvrtc.h"
#include "jit/ResourceUsage.h"

#include <memory>

namespace flexjit::jit {

enum class CacheOutcome { Compiled, MemoryHit, DiskHit };
const char* to_string(CacheOutcome o);  // "compiled", "memory hit", "disk hit"

struct CompileResult {
  std::shared_ptr<const CompiledKernel> kernel;
  CacheOutcome outcome = CacheOutcome::Compiled;
  double elapsed_ms = 0;  // of this compile() call, hits included
};

class KernelCompiler {
 public:
  // Opens (creates) the disk cache unless settings disable caching; throws CacheError when the
  // directory cannot be created or written.
  explicit KernelCompiler(CacheSettings s = CacheSettings::from_env());

  // Throws JitError when NVRTC rejects the source. A new entry that cannot be written to disk,
  // or a dump that cannot be written, is a warning on stderr, not an error: the kernel is good.
  // With s.dump_dir set, every real compile (failed ones too) writes <label>-<key12>.cu, .log
  // and .json there. Thread-safe; two threads asking for the same new
  // key at once may both compile it (the results are identical).
  CompileResult compile(const CompileRequest& req);

  DiskCache* disk();  // nullptr when caching is disabled
  void clear_memory();
  const CacheSettings& settings() const;

 private:
  void dump(const CompileRequest& req, const std::string& key, const CompiledKernel* kernel,
            const std::string& error) const;

  CacheSettings settings_;
  MemoryCache memory_;
  std::unique_ptr<DiskCache> disk_;
};

}  // namespace flexjit::jit
