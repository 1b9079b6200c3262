// CpTimeline (include/flexjit/context_parallel.h): the recording side. A call given a timeline
// (ContextParallelOptions::timeline) brackets each step with two timing events on the step's
// stream (cp_gpu::TimedSpan); spans() waits for them and reads their times from the timeline's
// first event. What the spans say is computed in cp/Timeline.cpp.
#include "runtime/ContextParallelGpu.h"

#include <flexjit/context_parallel.h>
#include <flexjit/error.h>

#include "device/Device.h"
#include "device/Timer.h"

#include <fmt/format.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace flexjit {

struct CpTimeline::Impl::Pending {
  CpTimelineSpan span;
  runtime::Event start, end;
  bool ended = false;  // end recorded (a span left open by an error is not reported)
  explicit Pending(runtime::Device& d) : start(d), end(d) {}
};

size_t CpTimeline::Impl::begin(int dev, CUstream stream, CpTimelineSpan::Lane lane,
                               std::string name) {
  if (device >= 0 && device != dev) {
    throw RuntimeError(fmt::format(
        "CpTimeline: this timeline recorded calls on cuda:{}, and now a call on cuda:{}; give "
        "each rank (device) a timeline of its own",
        device, dev));
  }
  device = dev;
  runtime::Device& d = runtime::Device::get(dev);
  if (!base) {
    base = std::make_unique<Pending>(d);
    base->start.record(stream);
  }
  auto p = std::make_unique<Pending>(d);
  p->span.lane = lane;
  p->span.name = std::move(name);
  p->start.record(stream);
  pending.push_back(std::move(p));
  return pending.size() - 1;
}

void CpTimeline::Impl::end(size_t span, CUstream stream) {
  pending[span]->end.record(stream);
  pending[span]->ended = true;
}

CpTimeline::Impl::~Impl() = default;

CpTimeline::CpTimeline() : impl_(std::make_unique<Impl>()) {}
CpTimeline::~CpTimeline() = default;

const std::vector<CpTimelineSpan>& CpTimeline::spans() {
  Impl& t = *impl_;
  if (t.pending.empty()) return t.spans;
  runtime::Device::get(t.device).make_current();
  t.base->start.synchronize();
  for (const std::unique_ptr<Impl::Pending>& p : t.pending) {
    if (!p->ended) continue;
    p->start.synchronize();
    p->end.synchronize();
    CpTimelineSpan s = p->span;
    s.start_us = 1e3 * static_cast<double>(p->start.elapsed_ms_since(t.base->start));
    s.end_us = 1e3 * static_cast<double>(p->end.elapsed_ms_since(t.base->start));
    t.spans.push_back(std::move(s));
  }
  t.pending.clear();
  return t.spans;
}

void CpTimeline::clear() {
  impl_ = std::make_unique<Impl>();
}

}  // namespace flexjit
