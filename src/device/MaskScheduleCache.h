// Schedules derived from a DeviceBlockMask's arrays and kept with the mask (shared by its
// copies). forward/sm90a_wgmma's union schedule of 192-row tiles (docs/kernels/forward_sm90.md)
// is built by a kernel at the first call that needs it and read by every later call, so a mask
// that serves every layer of a model costs that kernel once, not once per layer.
//
// An entry is keyed by everything that shaped it: the arrays' device addresses, the mask's
// generation (DeviceBlockMask::arrays_changed() starts a new one) and the schedule's own shape.
// Its life:
//   claim()     the first call allocates the entry's buffer and launches the builder into it
//               (not while its stream captures a graph: that call builds into its workspace);
//   built()     once that launch is enqueued: an event recorded on its stream, the entry ready.
//               A builder that a capture begun in between took into its graph leaves the entry
//               claimed for good: the graph's replays build it (so it lives as long as the
//               mask), nothing else reads it;
//   ready()     later calls read the buffer, and wait_for() makes a call's stream wait for the
//               builder where it ran on another stream and has not finished.
// A claimed entry that is not ready yet is never handed out: a concurrent call builds its own
// copy in its workspace, as every call did before the cache.
#pragma once

#include "device/Device.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

struct CUevent_st;

namespace flexjit {
class DeviceBlockMask;
}

namespace flexjit::runtime {

struct UnionScheduleKey {
  // kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices (null where absent or not
  // read).
  std::array<const void*, 4> arrays{};
  int64_t generation = 0;
  int block_m = 0, block_n = 0;
  int64_t seqlen_q = 0, max_tiles = 0;

  bool operator<(const UnionScheduleKey& o) const {
    return std::tie(arrays, generation, block_m, block_n, seqlen_q, max_tiles) <
           std::tie(o.arrays, o.generation, o.block_m, o.block_n, o.seqlen_q, o.max_tiles);
  }
};

class MaskScheduleCache {
 public:
  // Entries past this many are not kept (calls build into their workspace instead): a mask
  // whose fields are reassigned again and again does not grow without bound.
  static constexpr size_t kMaxEntries = 16;

  explicit MaskScheduleCache(Device& device) : device_(&device) {}
  ~MaskScheduleCache();
  MaskScheduleCache(const MaskScheduleCache&) = delete;
  MaskScheduleCache& operator=(const MaskScheduleCache&) = delete;

  int64_t generation() const;
  // The buffer of key's ready entry; null when there is none.
  void* ready(const UnionScheduleKey& key);
  // A new entry for key with a buffer of `bytes` to build into; null when key already has one
  // (ready or being built), the cache is full, `stream` is capturing a graph (no allocation
  // there: it would break the capture) or the allocation fails.
  void* claim(const UnionScheduleKey& key, size_t bytes, CuStream stream);
  // key's builder was enqueued on `stream` (see the header comment).
  void built(const UnionScheduleKey& key, CuStream stream);
  // Makes `stream` wait for key's builder when that ran on another stream and has not finished
  // (a capturing stream cannot wait on an event recorded outside its graph: the host waits).
  void wait_for(const UnionScheduleKey& key, CuStream stream);
  // Entries ready to be read (tests).
  size_t ready_entries() const;
  // Frees every entry but those a captured graph builds, and starts a new generation.
  void arrays_changed();

 private:
  struct Entry {
    DeviceBuffer buffer;
    ::CUevent_st* event = nullptr;  // recorded after the builder; null until built()
    CuStream stream = nullptr;
    bool ready = false;
    bool captured = false;
  };
  void destroy_event(Entry& e);

  Device* device_;
  mutable std::mutex mu_;
  int64_t generation_ = 0;
  std::map<UnionScheduleKey, Entry> entries_;
};

// The cache of a mask made by DeviceBlockMask::upload or create_block_mask; null for a
// default-constructed one (its calls build into their workspace).
MaskScheduleCache* schedule_cache_of(const DeviceBlockMask& mask);

}  // namespace flexjit::runtime
