// runtime::DeviceTimer: CUDA-event timings of real device work, and the median it reports.
#include "device/Device.h"
#include "device/Timer.h"

#include <catch2/catch.hpp>

#include <algorithm>

using namespace flexjit::runtime;

TEST_CASE("timer: median of odd and even counts", "[timer]") {
  CHECK(median({}) == 0.0);
  CHECK(median({3.0}) == 3.0);
  CHECK(median({5.0, 1.0, 3.0}) == 3.0);
  CHECK(median({4.0, 1.0, 3.0, 2.0}) == 2.5);
}

TEST_CASE("timer: CUDA events time the L2 flush at a plausible bandwidth", "[gpu][small][timer]") {
  std::string reason;
  if (!cuda_available(&reason)) {
    WARN("skipped: no GPU (" << reason << ")");
    return;
  }
  Device& dev = Device::get(0);
  DeviceTimer timer(dev);
  INFO(dev.str() << ", L2 " << timer.l2_bytes() << " bytes");
  CHECK(timer.l2_bytes() >= (size_t{1} << 20));
  const double bytes = static_cast<double>(std::max<size_t>(2 * timer.l2_bytes(), 64u << 20));

  // The timed work is the flush itself: a memset of `bytes`. Events that did not bracket it
  // would give ~0 ms (an impossible bandwidth); events bracketing idle time would give a tiny one.
  TimingOptions o;
  o.flush_l2 = false;
  o.fixed_repeats = 7;
  Timing t = timer.time([&] { timer.flush_l2(); }, o);
  CHECK(t.repeats == 7);
  REQUIRE(t.samples_ms.size() == 7);
  CHECK(t.min_ms <= t.median_ms);
  CHECK(t.median_ms <= t.max_ms);
  const double tb_per_s = bytes / (t.median_ms * 1e-3) / 1e12;
  INFO("memset bandwidth " << tb_per_s << " TB/s");
  CHECK(tb_per_s > 0.05);
  CHECK(tb_per_s < 20.0);

  // Time-based repeat count: the repeat budget over the warm-up estimate, within the clamps.
  TimingOptions timed;
  timed.warmup_ms = 2;
  timed.repeat_ms = 5;
  timed.min_repeats = 3;
  timed.max_repeats = 40;
  t = timer.time([&] { timer.flush_l2(); }, timed);
  CHECK(t.repeats >= 3);
  CHECK(t.repeats <= 40);
  CHECK(t.samples_ms.size() == static_cast<size_t>(t.repeats));
}
