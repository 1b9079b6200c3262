// Where and how much flexjit caches compiled kernels; read from the environment.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace flexjit::jit {

struct CacheSettings {
  bool enabled = true;                   // false: neither the memory nor the disk cache is used
  std::filesystem::path dir;             // the disk cache directory
  uint64_t max_disk_bytes = 2ull << 30;  // the disk cache is pruned (LRU) to this size
  size_t max_memory_entries = 512;       // in-process LRU capacity
  std::filesystem::path dump_dir;        // empty = no dumps; else source, log and usage per compile
  // How long a compile waits for another process compiling the same key (then compiles anyway).
  std::chrono::milliseconds lock_wait{std::chrono::minutes(2)};

  // FLEXJIT_CACHE_DIR, else $XDG_CACHE_HOME/flexjit (if absolute), else ~/.cache/flexjit, else
  // (HOME unset) a per-user $TMPDIR/flexjit-cache-<uid>, checked like any other;
  // FLEXJIT_DISABLE_CACHE=1 turns both caches off; FLEXJIT_DUMP_DIR sets dump_dir.
  static CacheSettings from_env();
};

}  // namespace flexjit::jit
