// What the GPU path of context parallelism shares between its files (docs/context_parallel.md):
//
//   ContextParallel.cpp           the communicator, the entry points and their checks, the
//                                 set-up every call makes (CallSetup) and a pair's calls (CpCall)
//   ContextParallelAllGather.cpp  the all-gather strategy, forward and backward
//   ContextParallelRing.cpp       the ring strategy, forward and backward
//   ContextParallelTimeline.cpp   CpTimeline: CUDA events around every step, when asked for
//
// Two streams: the caller's (compute: the pair calls, merges, reorders) and the communicator's
// (the collectives), ordered by events.
//
// Memory: the buffers NCCL writes into (the gathered K / V, the ring's receive buffers) are the
// communicator's, allocated once with cuMemAlloc and reused by later calls (NCCL may write them
// from a peer GPU of the same process, which stream-ordered pool memory does not allow); every
// other buffer (the reordered K / V, the running results, a pair's partial result) is allocated
// and freed in stream order on the compute stream (cuMemAllocAsync / cuMemFreeAsync), after that
// stream waited for the comm stream's last event. Nothing synchronizes the host (except the
// one-time growth of the communicator's buffers, and a recorded timeline when it is read).
#pragma once

#include <flexjit/backward.h>
#include <flexjit/context_parallel.h>
#include <flexjit/device_block_mask.h>

#include "cp/MergeKernel.h"
#include "cp/NcclLibrary.h"
#include "cp/PairPlan.h"
#include "cp/Schedule.h"
#include "cp/Sharding.h"
#include "device/CudaDriver.h"

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace flexjit {

struct NcclCommunicator::Impl {
  cp::NcclComm comm = nullptr;
  bool owned = false;
  int rank = 0, size = 0, device = -1;

  std::mutex mu;
  CUstream comm_stream = nullptr;  // created on first use, on `device`
  // The buffers NCCL writes into (the all-gather's, the ring's receive buffers), kept between
  // calls: allocated with cuMemAlloc, not from the stream-ordered pool, because NCCL may access
  // them directly from a peer GPU of the same process (P2P), which pool memory does not allow
  // without cuMemPoolSetAccess.
  CUdeviceptr scratch = 0;
  size_t scratch_bytes = 0;
  // Recorded on the compute stream at the end of every call: the next call's streams wait for
  // it before touching `scratch` again.
  CUevent done = nullptr;
  bool done_recorded = false;

  // `bytes` of scratch (the device current); a larger need frees the old buffer after the
  // device is idle and allocates anew.
  char* nccl_scratch(size_t bytes);
  // Block masks of the pairs, by mods, geometry, offsets and parameter values (masks that read
  // no buffer only: a buffer's contents may change between calls).
  std::map<std::string, std::shared_ptr<DeviceBlockMask>> masks;

  ~Impl();
};

struct NcclCommunicatorAccess {
  static NcclCommunicator::Impl& impl(const NcclCommunicator& c) { return *c.impl_; }
  static void set(NcclCommunicator& c, std::shared_ptr<NcclCommunicator::Impl> impl) {
    c.impl_ = std::move(impl);
  }
};

// The recorder behind a CpTimeline (ContextParallelTimeline.cpp): two timing events per span,
// read when the caller asks for the spans.
struct CpTimeline::Impl {
  // Records a span's start on `stream` (on `device`, current): returns the span's number for
  // end(), which records its end. RuntimeError when the timeline recorded on another device
  // before.
  size_t begin(int device, CUstream stream, CpTimelineSpan::Lane lane, std::string name);
  void end(size_t span, CUstream stream);

  struct Pending;
  std::vector<std::unique_ptr<Pending>> pending;  // recorded, not read yet
  std::vector<CpTimelineSpan> spans;              // read, in microseconds from `base`
  std::unique_ptr<Pending> base;                  // the timeline's first event
  int device = -1;
  ~Impl();
};

struct CpTimelineAccess {
  static CpTimeline::Impl& impl(CpTimeline& t) { return *t.impl_; }
};

namespace cp_gpu {

// Device memory allocated and freed in order on one stream.
class StreamBuffer {
 public:
  StreamBuffer(size_t bytes, CUstream stream, const char* what);
  ~StreamBuffer();
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  void* get() const { return reinterpret_cast<void*>(ptr_); }
  char* bytes() const { return reinterpret_cast<char*>(ptr_); }

 private:
  CUdeviceptr ptr_ = 0;
  CUstream stream_;
};

// An event that orders the two streams (no timing).
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  // Records on `s`; `waiter` then waits for it.
  void record(CUstream s);
  void wait_on(CUstream waiter);

 private:
  CUevent e_ = nullptr;
};

// A span of the call's timeline on one stream, from construction to destruction: nothing at all
// when the call records no timeline (the name is only made when it does).
class TimedSpan {
 public:
  template <class MakeName>
  TimedSpan(CpTimeline* timeline, int device, CUstream stream, CpTimelineSpan::Lane lane,
            MakeName&& make_name)
      : timeline_(timeline), stream_(stream) {
    if (timeline_ != nullptr) {
      span_ = CpTimelineAccess::impl(*timeline_).begin(device, stream, lane, make_name());
    }
  }
  ~TimedSpan() {
    if (timeline_ == nullptr) return;
    try {
      CpTimelineAccess::impl(*timeline_).end(span_, stream_);
    } catch (const std::exception&) {
      // The span stays open (spans() leaves it out); the call's own error, if any, is thrown.
    }
  }
  TimedSpan(const TimedSpan&) = delete;
  TimedSpan& operator=(const TimedSpan&) = delete;

 private:
  CpTimeline* timeline_;
  CUstream stream_;
  size_t span_ = 0;
};

// A contiguous device tensor view of scratch memory: [B, H, S, D] of `dtype`.
inline TensorRef scratch_view(void* data, DType dtype, std::vector<int64_t> shape, int device) {
  return TensorRef::contiguous(data, dtype, std::move(shape), TensorRef::Device::CUDA, device);
}

// What one call's pairs share: the options, the sharding, the shifted mods, the streams.
struct CpCall {
  Context& ctx;
  NcclCommunicator::Impl& comm;
  const AttentionOptions& options;
  const cp::Sharding& sh;
  const Mods& shifted;
  std::unordered_map<std::string, double> params;
  QkvShape s;  // of the local shards
  DType dtype = DType::BF16;
  CUstream compute = nullptr;
  int device = 0;
  CpTimeline* timeline = nullptr;
  bool built_masks = false;  // mask_for built a block mask (on the legacy default stream)

  // The block mask of a Partial pair (null for Full ones), built now or taken from the cache.
  std::shared_ptr<DeviceBlockMask> mask_for(const cp::PairCall& call);
  // One pair's attention on the compute stream, into out / lse.
  void attend(const cp::PairCall& call, const DeviceBlockMask* mask, const TensorRef& q,
              const TensorRef& k, const TensorRef& v, const TensorRef& out, const TensorRef* lse);
  // One pair's backward on the compute stream, into `grads`.
  void attend_backward(const cp::PairCall& call, const DeviceBlockMask* mask, const TensorRef& q,
                       const TensorRef& k, const TensorRef& v, const TensorRef& out,
                       const TensorRef& lse, const TensorRef& dout, const BackwardOutputs& grads);
  // A cp_merge launch on the compute stream; `of` is the dtype of part / out (default q's).
  void merge(const cp::MergeInputs& in, std::optional<DType> of = std::nullopt);
  // Rows [row0, row0 + S) of acc [B, H, acc_seqlen, D] (f32) += part [B, H, S, D] (a cp_merge
  // accumulate, in part's dtype).
  void accumulate(const TensorRef& part, float* acc, int64_t acc_seqlen, int64_t row0);

  // The backward's captured-buffer gradients: per buffer of g.buffer_grads, `numel` f32
  // elements, the buffers one after the other in `parts` (a pair's) and `sums` (the rank's).
  // buffer_grad_views adds the views of `parts` that a pair's backward writes into to `grads`;
  // accumulate_buffer_grads adds `parts` into `sums`.
  void buffer_grad_views(BackwardOutputs& grads, const BackwardResult& g, float* parts,
                         const std::vector<int64_t>& numel) const;
  void accumulate_buffer_grads(float* sums, float* parts, const std::vector<int64_t>& numel);
  // dst [B, H, S, D] (its dtype) = acc (f32, the same shape): a gradient's sum converted.
  void convert(float* acc, const TensorRef& dst);

 private:
  // The options of one pair's call: the pair's mods and offsets, its block mask, the stream.
  AttentionOptions pair_options(const cp::PairCall& call, const DeviceBlockMask* mask) const;
};

// What a context-parallel call sets up before its first launch: the checks, the streams, the
// wait for the communicator's previous call, the rank's schedule and its pairs' block masks.
struct CallSetup {
  NcclCommunicator::Impl* ci = nullptr;
  QkvShape s;
  int n = 0, r = 0, device = 0;
  std::unique_ptr<cp::Sharding> sh;
  Mods shifted;
  CUstream compute = nullptr, comm_stream = nullptr;
  CpTimeline* timeline = nullptr;
  std::unique_ptr<CpCall> call;
  cp::RankSchedule sched;
  std::vector<std::shared_ptr<DeviceBlockMask>> masks;

  // A span of the timeline on the compute or the comm stream (see TimedSpan).
  template <class MakeName>
  TimedSpan timed(CpTimelineSpan::Lane lane, MakeName&& make_name) const {
    return TimedSpan(timeline, device,
                     lane == CpTimelineSpan::Lane::Compute ? compute : comm_stream, lane,
                     std::forward<MakeName>(make_name));
  }
};

// Checks the call and sets up its streams.
std::unique_ptr<CallSetup> begin_call(Context& ctx, const NcclCommunicator& comm,
                                      const TensorRef& q, const TensorRef& k, const TensorRef& v,
                                      const AttentionOptions& options,
                                      const ContextParallelOptions& cpo);

// Plans the rank's calls and builds their block masks (create_block_mask runs on the legacy
// default stream: the compute stream waits for them once).
void plan_calls(CallSetup& st, Context& ctx, const AttentionOptions& options,
                const ContextParallelOptions& cpo, DType dtype);

// Enqueues (inside the caller's NCCL group, on the comm stream) the ncclAllReduce of each
// captured buffer's gradient sum (`sums`, laid out as CpCall::buffer_grad_views says) into
// g.buffer_grads.
void all_reduce_buffer_grads(const CallSetup& st, const BackwardResult& g, float* sums,
                             const std::vector<int64_t>& numel);

// Records the communicator's `done` event on the compute stream when the call's enqueueing ends
// (normally or by an exception), after everything that touches its NCCL buffers.
struct RecordDone {
  NcclCommunicator::Impl& ci;
  CUstream compute;
  ~RecordDone();
};

// The strategies (docs/context_parallel.md, "Strategies", "The backward"): the rank's out / lse
// (forward) or gradients (backward) from its shards, after plan_calls.
void allgather_forward(CallSetup& st, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                       const TensorRef& out, const TensorRef* lse);
void ring_forward(CallSetup& st, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                  const TensorRef& out, const TensorRef* lse);
// g holds the rank's dq, dk, dv and the buffer gradients (allocated, of their shapes);
// buf_numel the element count of each buffer gradient, in g.buffer_grads' order.
void allgather_backward(CallSetup& st, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                        const TensorRef& out, const TensorRef& lse, const TensorRef& dout,
                        BackwardResult& g, const std::vector<int64_t>& buf_numel);
void ring_backward(CallSetup& st, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                   const TensorRef& out, const TensorRef& lse, const TensorRef& dout,
                   BackwardResult& g, const std::vector<int64_t>& buf_numel);

}  // namespace cp_gpu
}  // namespace flexjit
