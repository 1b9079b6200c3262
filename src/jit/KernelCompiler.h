// The JIT front door: compile a request to cubin through the memory cache, the disk cache and
// NVRTC, in that order.
#pragma once

#include "jit/CacheKey.h"
#include "jit/CacheSettings.h"
#include "jit/DiskCache.h"
#include "jit/MemoryCache.h"
#include "jit/Nvrtc.h"
#include "jit/ResourceUsage.h"

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

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
  // Opens (creates, mode 0700) the disk cache unless settings disable caching; throws CacheError
  // when the directory cannot be created. A directory that cannot be trusted (another owner,
  // writable by others) is one warning on stderr, then no disk cache; a read-only one is used
  // read-only.
  explicit KernelCompiler(CacheSettings s = CacheSettings::from_env());

  // Throws JitError when NVRTC rejects the source. A new entry that cannot be written to disk,
  // or a dump that cannot be written, is a warning on stderr, not an error: the kernel is good.
  // With s.dump_dir set, every real compile (failed ones too) writes <label>-<key12>.cu, .log
  // and .json there (a private directory, like the cache's). Thread-safe, and a key is compiled
  // once: threads asking for a key that another thread is compiling wait for it and get its
  // kernel (outcome MemoryHit) or its error; processes sharing the disk cache take a per-key
  // lock around "check the disk again, compile, store" (waiting at most s.lock_wait), so the
  // second process gets a DiskHit.
  CompileResult compile(const CompileRequest& req);

  DiskCache* disk();  // nullptr when caching is disabled or the directory is not trusted
  // Why the disk cache is not used although caching is enabled (empty if it is used or disabled).
  const std::string& disk_problem() const { return disk_problem_; }
  void clear_memory();
  const CacheSettings& settings() const;

 private:
  using SharedKernel = std::shared_future<std::shared_ptr<const CompiledKernel>>;

  // The memory-miss path of one key, run by one thread at a time per key.
  CompileResult compile_once(const CompileRequest& req, const std::string& key,
                             std::chrono::steady_clock::time_point start);
  std::shared_ptr<CompiledKernel> run_nvrtc(const CompileRequest& req, const std::string& key);
  void store(const CompiledKernel& k);
  void dump(const CompileRequest& req, const std::string& key, const CompiledKernel* kernel,
            const std::string& error) const;

  CacheSettings settings_;
  MemoryCache memory_;
  std::unique_ptr<DiskCache> disk_;
  std::string disk_problem_;
  std::mutex inflight_mutex_;
  std::unordered_map<std::string, SharedKernel> inflight_;  // keys being compiled now
};

}  // namespace flexjit::jit
