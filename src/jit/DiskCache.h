// The on-disk cache of compiled kernels: one self-validating file per entry in one directory,
// shared safely by any number of processes. docs/caching.md describes the format.
#pragma once

#include "jit/Nvrtc.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace flexjit::jit {

struct DiskEntryInfo {
  std::string key;
  std::string arch;
  std::string kernel_name;
  std::string label;
  uint64_t size_bytes = 0;
  std::filesystem::file_time_type last_used;  // the file's mtime, refreshed on every hit
};

struct DiskStats {
  uint64_t entries = 0;
  uint64_t bytes = 0;
  uint64_t max_bytes = 0;
  std::filesystem::path dir;
};

class DiskCache {
 public:
  // Creates `dir` if needed. Throws CacheError (with the path, the OS error and the
  // FLEXJIT_CACHE_DIR / FLEXJIT_DISABLE_CACHE way out) when it cannot be created or written.
  DiskCache(std::filesystem::path dir, uint64_t max_bytes);

  // The entry for `key`, or nullptr on a miss. A malformed, truncated or mismatched file is a
  // miss and is removed. A hit refreshes the file's last-use time.
  std::shared_ptr<const CompiledKernel> load(const std::string& key);
  // The same, looking only at the file for `arch` (no directory scan: what compiles use).
  std::shared_ptr<const CompiledKernel> load(const std::string& key, const std::string& arch);

  // Writes the entry atomically (temp file + rename), then evicts least recently used entries
  // while the directory holds more than max_bytes. Throws CacheError if the write fails.
  void store(const CompiledKernel& kernel);

  std::vector<DiskEntryInfo> list() const;  // valid entries, in no particular order
  DiskStats stats() const;
  void clear();  // removes every entry and stale temp file (nothing else in the directory)
  // Removes least recently used entries until at most max_bytes remain; returns bytes freed.
  uint64_t prune(uint64_t max_bytes);

  const std::filesystem::path& dir() const { return dir_; }
  // The entry's file name: "<key>.sm90a.nvrtc13.0.v1.fjc".
  static std::string file_name(const std::string& key, const std::string& arch);

 private:
  std::filesystem::path dir_;
  uint64_t max_bytes_;
};

// The metadata stored with each entry and written to dumps: arch, kernel name, label, usage,
// log, compile_ms, NVRTC version.
std::string kernel_metadata_json(const CompiledKernel& kernel);

}  // namespace flexjit::jit
