#include "device/MaskScheduleCache.h"

#include <flexjit/error.h>

#include "device/CudaDriver.h"

#include <fmt/format.h>

namespace flexjit::runtime {

namespace {

// Whether `stream` is capturing a graph (a failed query counts as capturing: nothing that must
// stay out of a capture runs on its word).
bool capturing(CuStream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return Driver::get().cuStreamIsCapturing_(stream, &status) != CUDA_SUCCESS ||
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace

MaskScheduleCache::~MaskScheduleCache() {
  for (auto& [key, e] : entries_)
    destroy_event(e);
}

void MaskScheduleCache::destroy_event(Entry& e) {
  if (e.event != nullptr) Driver::get().cuEventDestroy_(e.event);
  e.event = nullptr;
}

int64_t MaskScheduleCache::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

void* MaskScheduleCache::ready(const UnionScheduleKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  return it != entries_.end() && it->second.ready ? it->second.buffer.data() : nullptr;
}

void* MaskScheduleCache::claim(const UnionScheduleKey& key, size_t bytes, CuStream stream) {
  if (capturing(stream)) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  if (key.generation != generation_ || entries_.count(key) != 0 || entries_.size() >= kMaxEntries) {
    return nullptr;
  }
  Entry e;
  try {
    e.buffer = DeviceBuffer(*device_, bytes);
  } catch (const RuntimeError&) {
    return nullptr;  // the call builds into its workspace
  }
  return entries_.emplace(key, std::move(e)).first->second.buffer.data();
}

void MaskScheduleCache::built(const UnionScheduleKey& key, CuStream stream) {
  const Driver& drv = Driver::get();
  const bool captured = capturing(stream);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  FJ_ASSERT(it != entries_.end(), "a union schedule built without its claim");
  Entry& e = it->second;
  if (captured) {
    e.captured = true;  // only the graph's replays build it
    return;
  }
  CUevent event = nullptr;
  FJ_CU(cuEventCreate, "a block mask's union schedule", &event, CU_EVENT_DISABLE_TIMING);
  e.event = event;
  if (CUresult r = drv.cuEventRecord_(event, stream); r != CUDA_SUCCESS) {
    destroy_event(e);
    check(r, "cuEventRecord", "a block mask's union schedule");
  }
  e.stream = stream;
  e.ready = true;
}

void MaskScheduleCache::wait_for(const UnionScheduleKey& key, CuStream stream) {
  CUevent event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    FJ_ASSERT(it != entries_.end() && it->second.ready, "waiting for a union schedule not built");
    if (it->second.stream == stream) return;  // stream order suffices
    event = it->second.event;
  }
  const Driver& drv = Driver::get();
  const CUresult q = drv.cuEventQuery_(event);
  if (q == CUDA_SUCCESS) return;
  if (q != CUDA_ERROR_NOT_READY) check(q, "cuEventQuery", "a block mask's union schedule");
  if (capturing(stream)) {
    FJ_CU(cuEventSynchronize, "a block mask's union schedule", event);
  } else {
    FJ_CU(cuStreamWaitEvent, "a block mask's union schedule", stream, event, 0);
  }
}

size_t MaskScheduleCache::ready_entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [key, e] : entries_)
    n += e.ready ? 1 : 0;
  return n;
}

void MaskScheduleCache::arrays_changed() {
  std::lock_guard<std::mutex> lock(mu_);
  ++generation_;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.captured) {
      ++it;
      continue;
    }
    destroy_event(it->second);
    it = entries_.erase(it);
  }
}

}  // namespace flexjit::runtime
