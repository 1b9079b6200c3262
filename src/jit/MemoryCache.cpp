#include "jit/MemoryCache.h"

namespace flexjit::jit {

MemoryCache::MemoryCache(size_t max_entries) : max_entries_(max_entries) {}

std::shared_ptr<const CompiledKernel> MemoryCache::get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void MemoryCache::put(const std::string& key, std::shared_ptr<const CompiledKernel> kernel) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (max_entries_ == 0) return;
  auto it = index_.find(key);
  if (it != index_.end()) {
    it->second->second = std::move(kernel);
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.emplace_front(key, std::move(kernel));
  index_[key] = lru_.begin();
  while (lru_.size() > max_entries_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

void MemoryCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  lru_.clear();
  index_.clear();
}

size_t MemoryCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lru_.size();
}

}  // namespace flexjit::jit
