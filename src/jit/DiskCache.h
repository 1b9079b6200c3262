// The on-disk cache of compiled kernels: one self-validating file per entry in one private
// directory, shared safely by any number of processes. docs/caching.md describes the format and
// the trust rules.
#pragma once

#include "jit/Nvrtc.h"

#include <chrono>
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

// A cross-process lock on one cache key: flock(2) on "<dir>/.<key>.lock", held while a process
// checks the disk again, compiles and stores, so that processes sharing a directory compile a
// key once. The kernel releases it if the holder dies. Releasing removes the lock file.
class KeyLock {
 public:
  KeyLock() = default;
  KeyLock(KeyLock&& o) noexcept;
  KeyLock& operator=(KeyLock&& o) noexcept;
  KeyLock(const KeyLock&) = delete;
  KeyLock& operator=(const KeyLock&) = delete;
  ~KeyLock();
  bool held() const { return fd_ >= 0; }
  void release();

 private:
  friend class DiskCache;
  int fd_ = -1;
  std::filesystem::path path_;
};

class DiskCache {
 public:
  // No entry larger than this is read (or written): a huge or sparse file is refused by its size.
  static constexpr uint64_t kMaxEntryBytes = 256ull << 20;

  // Creates `dir` (mode 0700) if needed and checks that it can be trusted
  // (files::check_private_dir). Throws CacheError (with the path, the OS error and the
  // FLEXJIT_CACHE_DIR / FLEXJIT_DISABLE_CACHE way out) when it cannot be created or is not a
  // directory. An untrusted directory does not throw: trusted() is false, problem() says why, and
  // the cache then loads and stores nothing.
  DiskCache(std::filesystem::path dir, uint64_t max_bytes);

  bool trusted() const { return trusted_; }
  bool read_only() const { return read_only_; }  // trusted, but entries cannot be written here
  const std::string& problem() const { return problem_; }  // why untrusted or read-only

  // The entry for `key`, or nullptr on a miss. An entry is used only if it is a regular file
  // owned by the user, not writable by others, at most kMaxEntryBytes, and its header, key echo
  // and checksum verify against `key`. A malformed or mismatched file is a miss and is removed;
  // a symlink, FIFO, foreign-owned or loosely permitted one is a miss with a warning (once per
  // path) and is left for store() to replace. A hit refreshes the file's last-use time.
  std::shared_ptr<const CompiledKernel> load(const std::string& key);
  // The same, looking only at the file for `arch` (no directory scan: what compiles use).
  std::shared_ptr<const CompiledKernel> load(const std::string& key, const std::string& arch);

  // Writes the entry atomically (temp file, mode 0600, + rename), then evicts least recently used
  // entries while the directory holds more than max_bytes. Throws CacheError if the write fails
  // or the directory is untrusted or read-only.
  void store(const CompiledKernel& kernel);

  // Takes the lock for `key`, waiting at most `wait`. Returns an unheld lock when the directory
  // is untrusted or read-only, the lock file cannot be made, or the wait ran out: the caller then
  // goes on without it (at worst the key is compiled twice; entries are never partial).
  KeyLock lock(const std::string& key, std::chrono::milliseconds wait);

  // These throw CacheError when the directory is untrusted (and clear/prune when it is
  // read-only).
  std::vector<DiskEntryInfo> list() const;  // valid entries, in no particular order
  DiskStats stats() const;
  // Removes every entry (whatever its file type: symlinks and FIFOs too), temp and lock file,
  // and nothing else in the directory; returns the number of entries removed.
  uint64_t clear();
  // Removes entries that are not regular files, then least recently used entries until at most
  // max_bytes remain, and temp and lock files older than an hour; returns bytes freed.
  uint64_t prune(uint64_t max_bytes);

  const std::filesystem::path& dir() const { return dir_; }
  // The entry's file name: "<key>.sm90a.nvrtc13.0.v1.fjc".
  static std::string file_name(const std::string& key, const std::string& arch);

 private:
  void require_usable(bool writing) const;

  std::filesystem::path dir_;
  uint64_t max_bytes_;
  bool trusted_ = true;
  bool read_only_ = false;
  std::string problem_;
};

// The metadata stored with each entry and written to dumps: arch, kernel name, label, usage,
// log, compile_ms, NVRTC version.
std::string kernel_metadata_json(const CompiledKernel& kernel);

}  // namespace flexjit::jit
