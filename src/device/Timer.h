// Device timing with CUDA events: warm-up, then repeats each bracketed by an event pair and
// preceded by an L2 flush, reported as the median. The method of triton.testing.do_bench (which
// the anchors use), so flexjit and the anchors are timed alike.
//
// cuda.h-free: the CLI and tests use it.
#pragma once

#include "device/Device.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

struct CUevent_st;

namespace flexjit::runtime {

// A CUDA event (default flags: timing enabled) in the device's primary context.
class Event {
 public:
  explicit Event(Device& device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept : event_(o.event_) { o.event_ = nullptr; }
  Event& operator=(Event&& o) = delete;

  void record(CuStream stream = nullptr);
  // Blocks the host until the recorded work completed; a kernel fault surfaces here.
  void synchronize();
  // Milliseconds between `start` and this event, both recorded and completed.
  float elapsed_ms_since(const Event& start) const;

 private:
  CUevent_st* event_ = nullptr;
};

struct TimingOptions {
  double warmup_ms = 25;   // warm-up runs until this much device time passed (at least 1 run)
  double repeat_ms = 100;  // the repeat count is repeat_ms / (estimated time), clamped to:
  int min_repeats = 10;
  int max_repeats = 1000;
  int fixed_repeats = 0;  // > 0: exactly this many repeats and a single warm-up run
  bool flush_l2 = true;   // write a buffer of 2 x L2 before each repeat
  // Enqueued before every run (warm-up and repeats), ahead of the flush and outside the timed
  // region: restores what a run consumes (the tuner zeroes outputs that kernels add into).
  std::function<void()> before_each;
};

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int repeats = 0;
  std::vector<double> samples_ms;  // per repeat, in run order
};

// Times work enqueued on one stream. Holds the L2-flush buffer (allocated on first use).
class DeviceTimer {
 public:
  explicit DeviceTimer(Device& device, CuStream stream = nullptr);

  // `fn` enqueues the work to time on the timer's stream (it may be called a few hundred
  // times). Exceptions from fn or the driver propagate.
  Timing time(const std::function<void()>& fn, const TimingOptions& options = {});

  // Enqueues a write of 2 x L2 bytes on the stream, evicting what earlier runs left in L2.
  void flush_l2();
  // The device's L2 size in bytes (CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE).
  size_t l2_bytes() const { return l2_bytes_; }

 private:
  Device& device_;
  CuStream stream_;
  size_t l2_bytes_ = 0;
  DeviceBuffer flush_buffer_;
  uint8_t flush_value_ = 0;
};

// The median of `v` (the mean of the two middle elements for an even count); 0 when empty.
double median(std::vector<double> v);

}  // namespace flexjit::runtime
