// The all-gather strategy of context parallelism (Llama 3's CP; docs/context_parallel.md,
// "Strategies"), forward and backward, on the set-up of ContextParallel.cpp:
//
//   forward   comm: ncclAllGather of K and V (rank-major) → event; compute: waits, reorders the
//             gathered shards into sequence order (cuMemcpy2DAsync, one per chunk), then one
//             flex_attention call per query chunk over the span of keys it needs, straight into
//             out / lse.
//   backward  K / V gathered as in the forward; one backward per query chunk over its span (dQ
//             written in place), the span's dK / dV added in f32 into the whole sequence's, put
//             back in rank-major order and summed with ncclReduceScatter (each rank keeps its own
//             chunks); the buffer gradients summed with ncclAllReduce.
#include "runtime/ContextParallelGpu.h"

#include <flexjit/backward.h>
#include <flexjit/context_parallel.h>
#include <flexjit/error.h>

#include "binding/AttentionCall.h"
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

// Rank-major chunks into sequence order (`to_sequence`) or back (the reduce-scatter's layout):
// per chunk one cuMemcpy2DAsync of B x H rows of (chunk x row_bytes) bytes on `stream`.
void reorder_chunks(const cp::Sharding& sh, const char* rank_major, char* sequence,
                    size_t shard_bytes, size_t row_bytes, int64_t rows, bool to_sequence,
                    CUstream stream) {
  const size_t local_pitch = static_cast<size_t>(sh.local_length()) * row_bytes;
  const size_t seq_pitch = static_cast<size_t>(sh.seqlen()) * row_bytes;
  for (int64_t c = 0; c < sh.num_chunks(); ++c) {
    const char* local = rank_major + sh.owner_of(c) * shard_bytes + sh.local_row_of(c) * row_bytes;
    const char* seq = sequence + sh.chunk(c).start * row_bytes;
    CUDA_MEMCPY2D m{};
    m.srcMemoryType = m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    m.srcDevice = reinterpret_cast<CUdeviceptr>(to_sequence ? local : seq);
    m.srcPitch = to_sequence ? local_pitch : seq_pitch;
    m.dstDevice = reinterpret_cast<CUdeviceptr>(to_sequence ? seq : local);
    m.dstPitch = to_sequence ? seq_pitch : local_pitch;
    m.WidthInBytes = static_cast<size_t>(sh.chunk_length()) * row_bytes;
    m.Height = static_cast<size_t>(rows);
    FJ_CU(cuMemcpy2DAsync, "the reorder of K / V chunks", &m, stream);
  }
}

// The all-gather of K and V into `gathered` (NCCL memory, rank-major: every rank's k, then
// every rank's v) and their reorder into `ordered` (sequence order: K [B, Hkv, S, D], then V),
// the compute stream waiting for the collective.
void gather_kv(CallSetup& st, const TensorRef& k, const TensorRef& v, char* gathered,
               char* ordered) {
  const int n = st.n;
  const size_t k_bytes = static_cast<size_t>(k.numel() * dtype_size(k.dtype));
  const size_t v_bytes = static_cast<size_t>(v.numel() * dtype_size(v.dtype));
  const std::string what = fmt::format("rank {} of {}", st.r, n);
  Event start, gathered_ev;
  start.record(st.compute);  // the buffers are allocated and k / v written
  start.wait_on(st.comm_stream);
  {
    const TimedSpan span = st.timed(Lane::Comm, [] { return std::string("all-gather K / V"); });
    FJ_NCCL(ncclGroupStart, what);
    FJ_NCCL(ncclAllGather, "the all-gather of K", k.data, gathered, k_bytes, cp::kNcclUint8,
            st.ci->comm, st.comm_stream);
    FJ_NCCL(ncclAllGather, "the all-gather of V", v.data, gathered + n * k_bytes, v_bytes,
            cp::kNcclUint8, st.ci->comm, st.comm_stream);
    FJ_NCCL(ncclGroupEnd, what);
  }
  gathered_ev.record(st.comm_stream);
  gathered_ev.wait_on(st.compute);
  const int64_t rows = st.s.batch * st.s.heads_kv;
  const TimedSpan span =
      st.timed(Lane::Compute, [] { return std::string("reorder K / V into sequence order"); });
  reorder_chunks(*st.sh, gathered, ordered, k_bytes,
                 static_cast<size_t>(st.s.head_dim_qk * dtype_size(k.dtype)), rows, true,
                 st.compute);
  reorder_chunks(*st.sh, gathered + n * k_bytes, ordered + n * k_bytes, v_bytes,
                 static_cast<size_t>(st.s.head_dim_v * dtype_size(v.dtype)), rows, true,
                 st.compute);
}

}  // namespace

void allgather_forward(CallSetup& st, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                       const TensorRef& out, const TensorRef* lse) {
  NcclCommunicator::Impl& ci = *st.ci;
  const cp::Sharding& sh = *st.sh;
  const QkvShape& s = st.s;
  const int n = st.n, device = st.device;
  const CUstream compute = st.compute;
  const int64_t len = sh.chunk_length();
  const size_t k_bytes = static_cast<size_t>(k.numel() * dtype_size(k.dtype));
  const size_t v_bytes = static_cast<size_t>(v.numel() * dtype_size(v.dtype));
  char* gathered;
  {
    std::lock_guard<std::mutex> lock(ci.mu);
    gathered = ci.nccl_scratch(n * (k_bytes + v_bytes));
  }
  StreamBuffer ordered(n * (k_bytes + v_bytes), compute, "K / V in sequence order");
  const RecordDone record_done{ci, compute};
  gather_kv(st, k, v, gathered, ordered.bytes());
  const TensorRef k_all = scratch_view(ordered.get(), k.dtype,
                                       {s.batch, s.heads_kv, sh.seqlen(), s.head_dim_qk}, device);
  const TensorRef v_all = scratch_view(ordered.bytes() + n * k_bytes, v.dtype,
                                       {s.batch, s.heads_kv, sh.seqlen(), s.head_dim_v}, device);
  std::vector<bool> written(st.sched.q_chunks.size(), false);
  for (size_t i = 0; i < st.sched.calls.size(); ++i) {
    const cp::PairCall& c = st.sched.calls[i];
    const TensorRef lse_rows = lse ? cp::rows_of(*lse, c.q_local_row, len) : TensorRef{};
    st.call->attend(c, st.masks[i].get(), cp::rows_of(q, c.q_local_row, len),
                    cp::rows_of(k_all, c.kv.start, c.kv.length),
                    cp::rows_of(v_all, c.kv.start, c.kv.length),
                    cp::rows_of(out, c.q_local_row, len), lse ? &lse_rows : nullptr);
    written[static_cast<size_t>(c.q_chunk)] = true;
  }
  // A query chunk every key chunk of which is masked: out 0, lse -inf.
  for (size_t i = 0; i < written.size(); ++i) {
    if (written[i]) continue;
    const int64_t row = static_cast<int64_t>(i) * len;
    const TensorRef lse_rows = lse ? cp::rows_of(*lse, row, len) : TensorRef{};
    runtime::write_empty_attention(cp::rows_of(out, row, len), lse ? &lse_rows : nullptr, compute);
  }
  // `ordered` is freed on the compute stream, after its last read.
}

void allgather_backward(CallSetup& st, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                        const TensorRef& out, const TensorRef& lse, const TensorRef& dout,
                        BackwardResult& g, const std::vector<int64_t>& buf_numel) {
  const QkvShape& s = st.s;
  NcclCommunicator::Impl& ci = *st.ci;
  const cp::Sharding& sh = *st.sh;
  const int n = st.n, device = st.device;
  const CUstream compute = st.compute, comm_stream = st.comm_stream;
  const int64_t len = sh.chunk_length(), S = sh.seqlen();

  const size_t k_bytes = static_cast<size_t>(k.numel() * dtype_size(k.dtype));
  const size_t v_bytes = static_cast<size_t>(v.numel() * dtype_size(v.dtype));
  const size_t dk32 = static_cast<size_t>(k.numel()) * sizeof(float);  // the local shard's
  const size_t dv32 = static_cast<size_t>(v.numel()) * sizeof(float);
  int64_t buf_total = 0;
  for (int64_t x : buf_numel)
    buf_total += x;
  // The NCCL buffers: gathered K / V | dK, dV rank-major (f32) | the local dK, dV (f32) | the
  // buffer gradients' sums (f32), each 256-byte aligned.
  auto up = [](size_t x) { return (x + 255) / 256 * 256; };
  const size_t at_rm = up(n * (k_bytes + v_bytes));
  const size_t at_local = at_rm + up(n * dk32) + up(n * dv32);
  const size_t at_bufs = at_local + up(dk32) + up(dv32);
  const size_t total = at_bufs + up(static_cast<size_t>(buf_total) * sizeof(float));
  char* nccl;
  {
    std::lock_guard<std::mutex> lock(ci.mu);
    nccl = ci.nccl_scratch(total);
  }
  char* const rm_dk = nccl + at_rm;
  char* const rm_dv = rm_dk + up(n * dk32);
  char* const local_dk = nccl + at_local;
  char* const local_dv = local_dk + up(dk32);
  float* const buf_sums = reinterpret_cast<float*>(nccl + at_bufs);

  StreamBuffer ordered(n * (k_bytes + v_bytes), compute, "K / V in sequence order");
  StreamBuffer seq_grads(n * (dk32 + dv32), compute, "dK / dV over the whole sequence");
  StreamBuffer parts(n * (k_bytes + v_bytes) + static_cast<size_t>(buf_total) * sizeof(float),
                     compute, "a query chunk's dK / dV and buffer gradients");
  const RecordDone record_done{ci, compute};
  FJ_CU(cuMemsetD32Async, "dK / dV over the whole sequence",
        reinterpret_cast<CUdeviceptr>(seq_grads.get()), 0u, n * (dk32 + dv32) / sizeof(float),
        compute);
  if (buf_total > 0) {
    FJ_CU(cuMemsetD32Async, "the buffer gradients' sums", reinterpret_cast<CUdeviceptr>(buf_sums),
          0u, static_cast<size_t>(buf_total), compute);
  }
  gather_kv(st, k, v, nccl, ordered.bytes());
  const TensorRef k_all =
      scratch_view(ordered.get(), k.dtype, {s.batch, s.heads_kv, S, s.head_dim_qk}, device);
  const TensorRef v_all = scratch_view(ordered.bytes() + n * k_bytes, v.dtype,
                                       {s.batch, s.heads_kv, S, s.head_dim_v}, device);
  float* const dk_seq = reinterpret_cast<float*>(seq_grads.get());
  float* const dv_seq = reinterpret_cast<float*>(seq_grads.bytes() + n * dk32);
  char* const part_dk = parts.bytes();
  char* const part_dv = part_dk + n * k_bytes;
  float* const part_bufs = reinterpret_cast<float*>(part_dv + n * v_bytes);

  std::vector<bool> written(st.sched.q_chunks.size(), false);
  for (size_t i = 0; i < st.sched.calls.size(); ++i) {
    const cp::PairCall& c = st.sched.calls[i];
    const int64_t span = c.kv.length;
    BackwardOutputs grads;
    grads.dq = cp::rows_of(g.dq, c.q_local_row, len);
    grads.dk = scratch_view(part_dk, k.dtype, {s.batch, s.heads_kv, span, s.head_dim_qk}, device);
    grads.dv = scratch_view(part_dv, v.dtype, {s.batch, s.heads_kv, span, s.head_dim_v}, device);
    st.call->buffer_grad_views(grads, g, part_bufs, buf_numel);
    st.call->attend_backward(
        c, st.masks[i].get(), cp::rows_of(q, c.q_local_row, len),
        cp::rows_of(k_all, c.kv.start, span), cp::rows_of(v_all, c.kv.start, span),
        cp::rows_of(out, c.q_local_row, len), cp::rows_of(lse, c.q_local_row, len),
        cp::rows_of(dout, c.q_local_row, len), grads);
    written[static_cast<size_t>(c.q_chunk)] = true;
    // The span's dK / dV into the whole sequence's, in f32.
    st.call->accumulate(grads.dk, dk_seq, S, c.kv.start);
    st.call->accumulate(grads.dv, dv_seq, S, c.kv.start);
    st.call->accumulate_buffer_grads(buf_sums, part_bufs, buf_numel);
  }
  // A query chunk whose every key chunk is masked: dQ 0.
  for (size_t i = 0; i < written.size(); ++i) {
    if (!written[i]) {
      runtime::zero_fill(cp::rows_of(g.dq, static_cast<int64_t>(i) * len, len), compute);
    }
  }
  // dK / dV back into rank-major order and summed over the ranks (each keeps its own chunks);
  // the buffer gradients summed over the ranks.
  {
    const TimedSpan span = st.timed(
        Lane::Compute, [] { return std::string("reorder dK / dV into rank-major order"); });
    const int64_t rows = s.batch * s.heads_kv;
    reorder_chunks(sh, rm_dk, reinterpret_cast<char*>(dk_seq), dk32,
                   static_cast<size_t>(s.head_dim_qk) * sizeof(float), rows, false, compute);
    reorder_chunks(sh, rm_dv, reinterpret_cast<char*>(dv_seq), dv32,
                   static_cast<size_t>(s.head_dim_v) * sizeof(float), rows, false, compute);
  }
  Event reduced_in, reduced;
  reduced_in.record(compute);
  reduced_in.wait_on(comm_stream);
  {
    const std::string what = fmt::format("the backward's reductions (rank {} of {})", st.r, n);
    const TimedSpan span = st.timed(Lane::Comm, [&] {
      return std::string(g.buffer_grads.empty()
                             ? "reduce-scatter dK / dV"
                             : "reduce-scatter dK / dV, all-reduce buffer gradients");
    });
    FJ_NCCL(ncclGroupStart, what);
    FJ_NCCL(ncclReduceScatter, "the reduce-scatter of dK", rm_dk, local_dk, dk32 / sizeof(float),
            cp::kNcclFloat32, cp::kNcclSum, ci.comm, comm_stream);
    FJ_NCCL(ncclReduceScatter, "the reduce-scatter of dV", rm_dv, local_dv, dv32 / sizeof(float),
            cp::kNcclFloat32, cp::kNcclSum, ci.comm, comm_stream);
    all_reduce_buffer_grads(st, g, buf_sums, buf_numel);
    FJ_NCCL(ncclGroupEnd, what);
  }
  reduced.record(comm_stream);
  reduced.wait_on(compute);
  st.call->convert(reinterpret_cast<float*>(local_dk), g.dk.ref());
  st.call->convert(reinterpret_cast<float*>(local_dv), g.dv.ref());
}

}  // namespace flexjit::cp_gpu
