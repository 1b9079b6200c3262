#include "device/Timer.h"

#include "device/CudaDriver.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace flexjit::runtime {

Event::Event(Device& device) {
  device.make_current();
  CUevent e = nullptr;
  FJ_CU(cuEventCreate, "a timing event", &e, CU_EVENT_DEFAULT);
  event_ = e;
}

Event::~Event() {
  // Destroying an event whose record is pending is allowed (the driver defers the release).
  if (event_ != nullptr) Driver::get().cuEventDestroy_(event_);
}

void Event::record(CuStream stream) {
  FJ_CU(cuEventRecord, "a timing event", event_, stream);
}

void Event::synchronize() {
  FJ_CU(cuEventSynchronize, "a timing event", event_);
}

float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  FJ_CU(cuEventElapsedTime, "a timing event pair", &ms, start.event_, event_);
  return ms;
}

DeviceTimer::DeviceTimer(Device& device, CuStream stream) : device_(device), stream_(stream) {
  device.make_current();
  CUdevice dev = 0;
  const std::string what = fmt::format("device {}", device.index());
  FJ_CU(cuDeviceGet, what, &dev, device.index());
  int l2 = 0;
  FJ_CU(cuDeviceGetAttribute, what, &l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev);
  l2_bytes_ = static_cast<size_t>(std::max(l2, 0));
}

void DeviceTimer::flush_l2() {
  // Twice the L2 (at least 64 MiB): with any replacement policy, nothing of the previous run
  // survives a write of this much other data.
  const size_t bytes = std::max<size_t>(2 * l2_bytes_, size_t{64} << 20);
  if (flush_buffer_.size() < bytes) flush_buffer_ = DeviceBuffer(device_, bytes);
  device_.make_current();
  // The value changes per flush so that no layer can elide a write of identical bytes.
  ++flush_value_;
  FJ_CU(cuMemsetD8Async, "the L2 flush buffer",
        static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(flush_buffer_.data())), flush_value_,
        bytes, stream_);
}

Timing DeviceTimer::time(const std::function<void()>& fn, const TimingOptions& o) {
  device_.make_current();
  Event start(device_), stop(device_);

  // Warm-up: module load, first-touch and clocks out of the numbers. The warm-up runs also
  // estimate the time of one run (with a flush, like the repeats).
  int repeats = o.fixed_repeats;
  if (repeats <= 0) {
    double estimate_ms = 0;
    int runs = 0;
    double spent_ms = 0;
    while (runs < 1 || spent_ms < o.warmup_ms) {
      if (o.before_each) o.before_each();
      if (o.flush_l2) flush_l2();
      start.record(stream_);
      fn();
      stop.record(stream_);
      stop.synchronize();
      const double ms = stop.elapsed_ms_since(start);
      spent_ms += ms;
      ++runs;
      estimate_ms = ms;
      if (runs >= 10000) break;  // a run measured as 0 ms must not loop forever
    }
    repeats =
        estimate_ms > 0 ? static_cast<int>(std::lround(o.repeat_ms / estimate_ms)) : o.max_repeats;
    repeats = std::clamp(repeats, std::max(1, o.min_repeats), std::max(1, o.max_repeats));
  } else {
    if (o.before_each) o.before_each();
    fn();
    device_.synchronize();
  }

  std::vector<Event> starts, stops;
  starts.reserve(repeats);
  stops.reserve(repeats);
  for (int i = 0; i < repeats; ++i) {
    starts.emplace_back(device_);
    stops.emplace_back(device_);
  }
  for (int i = 0; i < repeats; ++i) {
    if (o.before_each) o.before_each();
    if (o.flush_l2) flush_l2();
    starts[i].record(stream_);
    fn();
    stops[i].record(stream_);
  }
  stops.back().synchronize();

  Timing t;
  t.repeats = repeats;
  for (int i = 0; i < repeats; ++i)
    t.samples_ms.push_back(stops[i].elapsed_ms_since(starts[i]));
  t.median_ms = median(t.samples_ms);
  t.min_ms = *std::min_element(t.samples_ms.begin(), t.samples_ms.end());
  t.max_ms = *std::max_element(t.samples_ms.begin(), t.samples_ms.end());
  return t;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace flexjit::runtime
