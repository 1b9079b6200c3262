// The ring strategy of context parallelism (docs/context_parallel.md, "Strategies"), forward and
// backward, on the set-up of ContextParallel.cpp:
//
//   forward   step t holds rank (r - t) mod N's shard: step 0 the caller's own k / v, later steps
//             one of two receive buffers. While compute runs step t's pair calls, comm sends the
//             shard in hand to r + 1 and receives step t + 1's from r - 1 (ncclGroupStart /
//             ncclSend / ncclRecv / ncclGroupEnd); before receiving into a buffer it waits for
//             the compute event of the step that last read it. Each pair's (out, lse) is merged
//             into its query chunk's f32 running result by the cp_merge kernel; a finalize writes
//             the result into out / lse.
//   backward  the same K / V ring; each step's pairs add their dQ into the rank's f32 dQ and
//             their dK / dV into f32 sums that travel with the shard, back to its owner after
//             the last step; the buffer gradients summed with ncclAllReduce.
#include "runtime/ContextParallelGpu.h"

#include <flexjit/backward.h>
#include <flexjit/context_parallel.h>
#include <flexjit/error.h>

#include "cp/CallChecks.h"
#include "cp/MergeKernel.h"
#include "cp/NcclLibrary.h"
#include "cp/Schedule.h"
#include "cp/Sharding.h"
#include "device/CudaDriver.h"

#include <fmt/format.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace flexjit::cp_gpu {

namespace {

using Lane = CpTimelineSpan::Lane;

// One hop of the ring on the comm stream: sends the K / V shard in hand to rank r + 1 and
// receives the next one from rank r - 1, in one NCCL group; a "step t send / recv K / V" span of
// the timeline.
void exchange_kv(const CallSetup& st, int t, const char* send_k, const char* send_v, char* recv_k,
                 char* recv_v, size_t k_bytes, size_t v_bytes, const std::string& what) {
  const int next = (st.r + 1) % st.n, prev = (st.r - 1 + st.n) % st.n;
  const cp::NcclComm comm = st.ci->comm;
  const CUstream stream = st.comm_stream;
  const TimedSpan span =
      st.timed(Lane::Comm, [t] { return fmt::format("step {} send / recv K / V", t); });
  FJ_NCCL(ncclGroupStart, what);
  FJ_NCCL(ncclSend, what, send_k, k_bytes, cp::kNcclUint8, next, comm, stream);
  FJ_NCCL(ncclSend, what, send_v, v_bytes, cp::kNcclUint8, next, comm, stream);
  FJ_NCCL(ncclRecv, what, recv_k, k_bytes, cp::kNcclUint8, prev, comm, stream);
  FJ_NCCL(ncclRecv, what, recv_v, v_bytes, cp::kNcclUint8, prev, comm, stream);
  FJ_NCCL(ncclGroupEnd, what);
}

}  // namespace

void ring_forward(CallSetup& st, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                  const TensorRef& out, const TensorRef* lse) {
  NcclCommunicator::Impl& ci = *st.ci;
  const cp::Sharding& sh = *st.sh;
  const QkvShape& s = st.s;
  const int n = st.n, r = st.r, device = st.device;
  const CUstream compute = st.compute, comm_stream = st.comm_stream;
  const cp::RankSchedule& sched = st.sched;
  const int64_t len = sh.chunk_length();
  const int64_t elt = dtype_size(q.dtype);
  const size_t k_bytes = static_cast<size_t>(k.numel() * elt);
  const size_t v_bytes = static_cast<size_t>(v.numel() * dtype_size(v.dtype));
  const std::string peer_what = fmt::format("rank {} of {}", r, n);
  const int64_t rows = s.batch * s.heads_q * len;
  const size_t acc_bytes = static_cast<size_t>(rows * s.head_dim_v) * sizeof(float);
  const size_t lse_bytes = static_cast<size_t>(rows) * sizeof(float);
  const size_t chunks = sched.q_chunks.size();
  StreamBuffer acc(chunks * (acc_bytes + lse_bytes), compute, "the ring's running results");
  StreamBuffer part(static_cast<size_t>(rows * s.head_dim_v * elt) + lse_bytes, compute,
                    "a pair's partial result");
  char* recv0;
  {
    std::lock_guard<std::mutex> lock(ci.mu);
    recv0 = ci.nccl_scratch((n > 2 ? 2 : 1) * (k_bytes + v_bytes));
  }
  char* const recv1 = recv0 + k_bytes + v_bytes;  // used from N = 3 on
  const RecordDone record_done{ci, compute};
  FJ_CU(cuMemsetD32Async, "the ring's running results", reinterpret_cast<CUdeviceptr>(acc.get()),
        0u, chunks * acc_bytes / sizeof(float), compute);
  FJ_CU(cuMemsetD32Async, "the ring's running lse",
        reinterpret_cast<CUdeviceptr>(acc.bytes() + chunks * acc_bytes), 0xff800000u,
        chunks * lse_bytes / sizeof(float), compute);
  const TensorRef part_out =
      scratch_view(part.get(), q.dtype, {s.batch, s.heads_q, len, s.head_dim_v}, device);
  const TensorRef part_lse = scratch_view(part.bytes() + rows * s.head_dim_v * elt, DType::F32,
                                          {s.batch, s.heads_q, len}, device);
  // The shard in hand at step t: the caller's at 0, then the receive buffers in turn.
  auto shard_k = [&](int t) -> char* {
    if (t == 0) return static_cast<char*>(k.data);
    return t % 2 == 1 ? recv0 : recv1;
  };
  auto shard_v = [&](int t) -> char* {
    if (t == 0) return static_cast<char*>(v.data);
    return (t % 2 == 1 ? recv0 : recv1) + k_bytes;
  };
  std::vector<std::unique_ptr<Event>> ready(static_cast<size_t>(n)), used(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) {
    ready[static_cast<size_t>(t)] = std::make_unique<Event>();
    used[static_cast<size_t>(t)] = std::make_unique<Event>();
  }
  Event start;
  start.record(compute);  // buffers allocated, k / v written
  start.wait_on(comm_stream);
  size_t next_call = 0;
  for (int t = 0; t < n; ++t) {
    if (t + 1 < n) {
      // Receive step t + 1's shard into the buffer step t - 1 read: wait until it did.
      if (t >= 1) used[static_cast<size_t>(t - 1)]->wait_on(comm_stream);
      exchange_kv(st, t, shard_k(t), shard_v(t), shard_k(t + 1), shard_v(t + 1), k_bytes, v_bytes,
                  fmt::format("the ring's K / V exchange of step {} ({})", t, peer_what));
      ready[static_cast<size_t>(t + 1)]->record(comm_stream);
    }
    if (t >= 1) ready[static_cast<size_t>(t)]->wait_on(compute);
    const TensorRef k_shard = scratch_view(
        shard_k(t), k.dtype, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_qk}, device);
    const TensorRef v_shard =
        scratch_view(shard_v(t), v.dtype, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_v}, device);
    for (; next_call < sched.calls.size() && sched.calls[next_call].step == t; ++next_call) {
      const cp::PairCall& c = sched.calls[next_call];
      st.call->attend(c, st.masks[next_call].get(), cp::rows_of(q, c.q_local_row, len),
                      cp::rows_of(k_shard, c.kv_local_row, c.kv.length),
                      cp::rows_of(v_shard, c.kv_local_row, c.kv.length), part_out, &part_lse);
      cp::MergeInputs m;
      m.batch = s.batch, m.heads = s.heads_q, m.seqlen = len, m.dv = s.head_dim_v;
      m.acc = reinterpret_cast<float*>(acc.bytes() + static_cast<size_t>(c.q_chunk) * acc_bytes);
      m.acc_lse = reinterpret_cast<float*>(acc.bytes() + chunks * acc_bytes +
                                           static_cast<size_t>(c.q_chunk) * lse_bytes);
      m.part = part_out;
      m.part_lse = part_lse;
      st.call->merge(m);
    }
    used[static_cast<size_t>(t)]->record(compute);
  }
  // The last exchange is done before the receive buffers are freed (stream order on compute).
  if (n > 1) ready[static_cast<size_t>(n - 1)]->wait_on(compute);
  for (size_t i = 0; i < chunks; ++i) {
    const int64_t row = static_cast<int64_t>(i) * len;
    const TensorRef lse_rows = lse ? cp::rows_of(*lse, row, len) : TensorRef{};
    cp::MergeInputs m;
    m.mode = cp::MergeInputs::Mode::Finalize;
    m.batch = s.batch, m.heads = s.heads_q, m.seqlen = len, m.dv = s.head_dim_v;
    m.acc = reinterpret_cast<float*>(acc.bytes() + i * acc_bytes);
    m.acc_lse = reinterpret_cast<float*>(acc.bytes() + chunks * acc_bytes + i * lse_bytes);
    m.out = cp::rows_of(out, row, len);
    m.out_lse = lse ? &lse_rows : nullptr;
    st.call->merge(m);
  }
}

// The ring's backward (docs/context_parallel.md, "The backward"): step t holds rank (r - t) mod
// N's K / V shard and that shard's dK / dV so far (f32, travelling with it). Each step's pairs
// add their dQ into the rank's f32 dQ and their dK / dV into the travelling sums; then the sums
// go on to rank r + 1 (after the last step: back to their owner). The K / V of step t + 1 are
// received while step t computes, as in the forward.
void ring_backward(CallSetup& st, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                   const TensorRef& out, const TensorRef& lse, const TensorRef& dout,
                   BackwardResult& g, const std::vector<int64_t>& buf_numel) {
  NcclCommunicator::Impl& ci = *st.ci;
  const QkvShape& s = st.s;
  const int n = st.n, r = st.r, device = st.device;
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  const CUstream compute = st.compute, comm_stream = st.comm_stream;
  const int64_t len = st.sh->chunk_length(), L = st.sh->local_length();
  const size_t k_bytes = static_cast<size_t>(k.numel() * dtype_size(k.dtype));
  const size_t v_bytes = static_cast<size_t>(v.numel() * dtype_size(v.dtype));
  const size_t kv_bytes = k_bytes + v_bytes;
  const size_t dk32 = static_cast<size_t>(k.numel()) * sizeof(float);
  const size_t dv32 = static_cast<size_t>(v.numel()) * sizeof(float);
  const size_t acc_bytes = dk32 + dv32;
  int64_t buf_total = 0;
  for (int64_t x : buf_numel)
    buf_total += x;
  // NCCL buffers: two K / V receive buffers | two travelling dK / dV sums | buffer sums.
  auto up = [](size_t x) { return (x + 255) / 256 * 256; };
  const size_t at_acc = 2 * up(kv_bytes);
  const size_t at_bufs = at_acc + 2 * up(acc_bytes);
  char* nccl;
  {
    std::lock_guard<std::mutex> lock(ci.mu);
    nccl = ci.nccl_scratch(at_bufs + up(static_cast<size_t>(buf_total) * sizeof(float)));
  }
  char* const kv_buf[2] = {nccl, nccl + up(kv_bytes)};
  char* const acc_buf[2] = {nccl + at_acc, nccl + at_acc + up(acc_bytes)};
  float* const buf_sums = reinterpret_cast<float*>(nccl + at_bufs);
  // Compute-only: the rank's dQ (f32) and one pair's partial gradients.
  const size_t dq32 = static_cast<size_t>(q.numel()) * sizeof(float);
  StreamBuffer dq_acc(dq32, compute, "the ring backward's dQ");
  const size_t part_dq_bytes = static_cast<size_t>(s.batch * s.heads_q * len * s.head_dim_qk) *
                               static_cast<size_t>(dtype_size(q.dtype));
  const size_t part_dk_bytes = static_cast<size_t>(s.batch * s.heads_kv * len * s.head_dim_qk) *
                               static_cast<size_t>(dtype_size(k.dtype));
  const size_t part_dv_bytes = static_cast<size_t>(s.batch * s.heads_kv * len * s.head_dim_v) *
                               static_cast<size_t>(dtype_size(v.dtype));
  StreamBuffer parts(up(part_dq_bytes) + up(part_dk_bytes) + up(part_dv_bytes) +
                         static_cast<size_t>(buf_total) * sizeof(float),
                     compute, "a pair's partial gradients");
  const RecordDone record_done{ci, compute};
  FJ_CU(cuMemsetD32Async, "the ring backward's dQ", reinterpret_cast<CUdeviceptr>(dq_acc.get()), 0u,
        dq32 / sizeof(float), compute);
  FJ_CU(cuMemsetD32Async, "the travelling dK / dV", reinterpret_cast<CUdeviceptr>(acc_buf[0]), 0u,
        acc_bytes / sizeof(float), compute);
  if (buf_total > 0) {
    FJ_CU(cuMemsetD32Async, "the buffer gradients' sums", reinterpret_cast<CUdeviceptr>(buf_sums),
          0u, static_cast<size_t>(buf_total), compute);
  }
  char* const part_dq = parts.bytes();
  char* const part_dk = part_dq + up(part_dq_bytes);
  char* const part_dv = part_dk + up(part_dk_bytes);
  float* const part_bufs = reinterpret_cast<float*>(part_dv + up(part_dv_bytes));
  // The K / V in hand at step t (the caller's at 0), and the dK / dV sums travelling with them.
  auto shard_kv = [&](int t) -> char* { return kv_buf[(t + 1) % 2]; };  // t >= 1
  auto shard_k = [&](int t) { return t == 0 ? static_cast<char*>(k.data) : shard_kv(t); };
  auto shard_v = [&](int t) { return t == 0 ? static_cast<char*>(v.data) : shard_kv(t) + k_bytes; };
  auto acc_of = [&](int t) { return acc_buf[t % 2]; };

  std::vector<std::unique_ptr<Event>> kv_ready, acc_ready, step_done;
  for (int t = 0; t <= n; ++t) {
    kv_ready.push_back(std::make_unique<Event>());
    acc_ready.push_back(std::make_unique<Event>());
    step_done.push_back(std::make_unique<Event>());
  }
  Event start;
  start.record(compute);  // buffers allocated and zeroed, k / v written
  start.wait_on(comm_stream);
  const std::string peer = fmt::format("rank {} of {}", r, n);
  size_t next_call = 0;
  for (int t = 0; t < n; ++t) {
    const auto ti = static_cast<size_t>(t);
    if (t + 1 < n) {
      // K / V of step t + 1, into the buffer step t - 1 read (wait until it did).
      if (t >= 1) step_done[ti - 1]->wait_on(comm_stream);
      exchange_kv(st, t, shard_k(t), shard_v(t), shard_k(t + 1), shard_v(t + 1), k_bytes, v_bytes,
                  fmt::format("the ring backward's K / V of step {} ({})", t, peer));
      kv_ready[ti + 1]->record(comm_stream);
    }
    if (t >= 1) {
      kv_ready[ti]->wait_on(compute);
      acc_ready[ti]->wait_on(compute);
    }
    const TensorRef k_shard =
        scratch_view(shard_k(t), k.dtype, {s.batch, s.heads_kv, L, s.head_dim_qk}, device);
    const TensorRef v_shard =
        scratch_view(shard_v(t), v.dtype, {s.batch, s.heads_kv, L, s.head_dim_v}, device);
    float* const dk_sum = reinterpret_cast<float*>(acc_of(t));
    float* const dv_sum = reinterpret_cast<float*>(acc_of(t) + dk32);
    for (; next_call < st.sched.calls.size() && st.sched.calls[next_call].step == t; ++next_call) {
      const cp::PairCall& c = st.sched.calls[next_call];
      BackwardOutputs grads;
      grads.dq = scratch_view(part_dq, q.dtype, {s.batch, s.heads_q, len, s.head_dim_qk}, device);
      grads.dk = scratch_view(part_dk, k.dtype, {s.batch, s.heads_kv, len, s.head_dim_qk}, device);
      grads.dv = scratch_view(part_dv, v.dtype, {s.batch, s.heads_kv, len, s.head_dim_v}, device);
      st.call->buffer_grad_views(grads, g, part_bufs, buf_numel);
      st.call->attend_backward(
          c, st.masks[next_call].get(), cp::rows_of(q, c.q_local_row, len),
          cp::rows_of(k_shard, c.kv_local_row, len), cp::rows_of(v_shard, c.kv_local_row, len),
          cp::rows_of(out, c.q_local_row, len), cp::rows_of(lse, c.q_local_row, len),
          cp::rows_of(dout, c.q_local_row, len), grads);
      // dQ into the rank's rows, dK / dV into the travelling sums (f32).
      st.call->accumulate(grads.dq, reinterpret_cast<float*>(dq_acc.get()), L, c.q_local_row);
      st.call->accumulate(grads.dk, dk_sum, L, c.kv_local_row);
      st.call->accumulate(grads.dv, dv_sum, L, c.kv_local_row);
      st.call->accumulate_buffer_grads(buf_sums, part_bufs, buf_numel);
    }
    step_done[ti]->record(compute);
    // The sums travel on: to rank r + 1, and rank r - 1's come in (after the last step, each
    // shard's sums reach their owner).
    step_done[ti]->wait_on(comm_stream);
    const std::string what = fmt::format("the ring backward's dK / dV of step {} ({})", t, peer);
    const TimedSpan span =
        st.timed(Lane::Comm, [t] { return fmt::format("step {} send / recv dK / dV sums", t); });
    FJ_NCCL(ncclGroupStart, what);
    FJ_NCCL(ncclSend, what, acc_of(t), acc_bytes / sizeof(float), cp::kNcclFloat32, next, ci.comm,
            comm_stream);
    FJ_NCCL(ncclRecv, what, acc_of(t + 1), acc_bytes / sizeof(float), cp::kNcclFloat32, prev,
            ci.comm, comm_stream);
    FJ_NCCL(ncclGroupEnd, what);
    acc_ready[ti + 1]->record(comm_stream);
  }
  // The buffer gradients summed over the ranks.
  Event sums_in, sums_out;
  sums_in.record(compute);
  sums_in.wait_on(comm_stream);
  if (!g.buffer_grads.empty()) {
    const std::string what = fmt::format("the backward's buffer gradients ({})", peer);
    const TimedSpan span =
        st.timed(Lane::Comm, [] { return std::string("all-reduce buffer gradients"); });
    FJ_NCCL(ncclGroupStart, what);
    all_reduce_buffer_grads(st, g, buf_sums, buf_numel);
    FJ_NCCL(ncclGroupEnd, what);
  }
  sums_out.record(comm_stream);
  sums_out.wait_on(compute);
  acc_ready[static_cast<size_t>(n)]->wait_on(compute);  // the own shard's sums are back
  char* const own = acc_of(n);
  st.call->convert(reinterpret_cast<float*>(dq_acc.get()), g.dq.ref());
  st.call->convert(reinterpret_cast<float*>(own), g.dk.ref());
  st.call->convert(reinterpret_cast<float*>(own + dk32), g.dv.ref());
}

}  // namespace flexjit::cp_gpu
