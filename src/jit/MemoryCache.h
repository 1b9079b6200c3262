// The in-process cache of compiled kernels: a bounded LRU map from cache key, thread-safe.
#pragma once

#include "jit/Nvrtc.h"

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace flexjit::jit {

class MemoryCache {
 public:
  explicit MemoryCache(size_t max_entries);
  // The entry for `key` (now the most recently used), or nullptr.
  std::shared_ptr<const CompiledKernel> get(const std::string& key);
  // Inserts or replaces; evicts the least recently used entries beyond max_entries. Kernels
  // still held by callers stay alive (shared_ptr).
  void put(const std::string& key, std::shared_ptr<const CompiledKernel> kernel);
  void clear();
  size_t size() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const CompiledKernel>>;
  size_t max_entries_;
  mutable std::mutex mutex_;
  std::list<Entry> lru_;  // front = most recently used
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

}  // namespace flexjit::jit
