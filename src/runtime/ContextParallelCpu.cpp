// flex_attention_cp_cpu (include/flexjit/context_parallel.h): the context-parallel partitioning
// on the CPU backend, rank after rank in one process. Each rank's calls, offsets and merges are
// the GPU path's (runtime/ContextParallel.cpp): both follow cp::schedule_rank. The collectives
// are simulated by copies in the same layouts: the all-gather's rank-major buffer reordered
// into sequence order, the ring's shard "in hand" at step t being rank (r - t) mod N's.
#include <flexjit/context_parallel.h>
#include <flexjit/cpu.h>
#include <flexjit/error.h>

#include "cp/CallChecks.h"
#include "cp/GlobalPositions.h"
#include "cp/LseMerge.h"
#include "cp/PairPlan.h"
#include "cp/Schedule.h"
#include "cp/Sharding.h"
#include "cpu/BackwardKernel.h"

#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <vector>

namespace flexjit {

namespace {

// A host tensor this file owns: contiguous bytes and their view.
struct HostTensor {
  std::vector<char> bytes;
  TensorRef ref;

  HostTensor() = default;
  // `ref` points into `bytes`: a move keeps the buffer, a copy would not.
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
  HostTensor(HostTensor&&) = default;
  HostTensor& operator=(HostTensor&&) = default;
  HostTensor(DType dtype, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    bytes.resize(static_cast<size_t>(n * dtype_size(dtype)));
    ref = TensorRef::contiguous(bytes.data(), dtype, std::move(shape));
  }
};

// Copies rows [src_row, src_row + rows) of dim 2 of `src` into rows [dst_row, ...) of `dst` (same
// dtype, same B, H and last dim; the last dim contiguous in both).
void copy_rows(const TensorRef& src, int64_t src_row, const TensorRef& dst, int64_t dst_row,
               int64_t rows) {
  const int64_t elt = dtype_size(src.dtype);
  const int64_t row_elems = src.ndim() == 4 ? src.shape[3] : 1;
  const auto* s = static_cast<const char*>(src.data);
  auto* d = static_cast<char*>(dst.data);
  for (int64_t b = 0; b < src.shape[0]; ++b) {
    for (int64_t h = 0; h < src.shape[1]; ++h) {
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t so = b * src.strides[0] + h * src.strides[1] + (src_row + i) * src.strides[2];
        const int64_t dof =
            b * dst.strides[0] + h * dst.strides[1] + (dst_row + i) * dst.strides[2];
        std::memcpy(d + dof * elt, s + so * elt, static_cast<size_t>(row_elems * elt));
      }
    }
  }
}

// Rank r's shard of a whole-sequence tensor [B, H, S, D] or [B, H, S]: its chunks' rows, in its
// order.
HostTensor shard_of(const TensorRef& t, const cp::Sharding& sh, int rank) {
  std::vector<int64_t> shape = t.shape;
  shape[2] = sh.local_length();
  HostTensor out(t.dtype, shape);
  int64_t row = 0;
  for (const cp::Chunk& c : sh.chunks_of(rank)) {
    copy_rows(t, c.start, out.ref, row, c.length);
    row += c.length;
  }
  return out;
}

// What ncclAllGather leaves on every rank, [N][B, H, S / N, D] rank-major, put into sequence
// order [B, H, S, D] chunk by chunk (the GPU path's reorder).
HostTensor gathered_in_sequence_order(const std::vector<HostTensor>& shards,
                                      const cp::Sharding& sh) {
  const TensorRef& s0 = shards[0].ref;
  // The all-gather's buffer: the shards one after the other.
  HostTensor gathered(s0.dtype, {sh.ranks(), s0.shape[0], s0.shape[1], s0.shape[2], s0.shape[3]});
  const size_t shard_bytes = shards[0].bytes.size();
  for (int r = 0; r < sh.ranks(); ++r) {
    std::memcpy(gathered.bytes.data() + r * shard_bytes,
                shards[static_cast<size_t>(r)].bytes.data(), shard_bytes);
  }
  HostTensor ordered(s0.dtype, {s0.shape[0], s0.shape[1], sh.seqlen(), s0.shape[3]});
  for (int64_t c = 0; c < sh.num_chunks(); ++c) {
    const int owner = sh.owner_of(c);
    TensorRef from =
        TensorRef::contiguous(gathered.bytes.data() + owner * shard_bytes, s0.dtype, s0.shape);
    copy_rows(from, sh.local_row_of(c), ordered.ref, sh.chunk(c).start, sh.chunk_length());
  }
  return ordered;
}

// Adds `src` ([B, H, rows, d] f32, contiguous) into rows [dst_row, dst_row + rows) of `dst` (f32,
// contiguous [B, H, S', d]).
void add_rows(const std::vector<float>& src, const TensorRef& dst, int64_t dst_row, int64_t rows) {
  const int64_t B = dst.shape[0], H = dst.shape[1], d = dst.shape[3];
  auto* out = static_cast<float*>(dst.data);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t e = 0; e < d; ++e)
        out[(bh * dst.shape[2] + dst_row + i) * d + e] +=
            src[static_cast<size_t>((bh * rows + i) * d + e)];
}

// RuntimeError unless `t` is a contiguous CPU tensor of `dtype` and `shape`.
void check_host(const char* name, const TensorRef& t, DType dtype,
                const std::vector<int64_t>& shape) {
  if (t.device != TensorRef::Device::CPU || t.dtype != dtype || t.shape != shape ||
      !t.is_contiguous()) {
    throw RuntimeError(fmt::format(
        "flex_attention_cp_backward_cpu: {} is {}; expected a contiguous CPU tensor {}[{}]", name,
        t.str(), to_string(dtype), fmt::join(shape, ", ")));
  }
}

// The checks every CPU context-parallel call makes: options, shapes, devices, Sq == Skv.
QkvShape check_inputs(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                      const AttentionOptions& options) {
  cp::check_cp_options(options);
  const QkvShape s = validate_qkv(q, k, v);
  for (const TensorRef* t : {&q, &k, &v}) {
    if (t->device != TensorRef::Device::CPU) {
      throw RuntimeError(fmt::format(
          "flex_attention_cp_cpu takes CPU tensors; got {} (flex_attention_cp runs on GPUs)",
          t->str()));
    }
  }
  if (s.seqlen_q != s.seqlen_kv) {
    throw RuntimeError(fmt::format(
        "context parallelism shards one sequence of queries, keys and values: Sq ({}) must equal "
        "Skv ({})",
        s.seqlen_q, s.seqlen_kv));
  }
  return s;
}

}  // namespace

CpuContextParallelResult flex_attention_cp_cpu(const TensorRef& q, const TensorRef& k,
                                               const TensorRef& v, int ranks,
                                               const AttentionOptions& options,
                                               const ContextParallelOptions& cp,
                                               const CpuRunOptions& cpu) {
  const QkvShape s = check_inputs(q, k, v, options);
  const cp::Sharding sh(cp.layout, s.seqlen_q, ranks);
  const Mods shifted = cp::with_global_positions(options.mods);
  const auto params = cp::known_params(options.mods, options.bindings);
  const int64_t len = sh.chunk_length();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  std::vector<HostTensor> qs, ks, vs;
  for (int r = 0; r < ranks; ++r) {
    qs.push_back(shard_of(q, sh, r));
    ks.push_back(shard_of(k, sh, r));
    vs.push_back(shard_of(v, sh, r));
  }
  HostTensor k_all, v_all;
  if (cp.strategy == CpStrategy::AllGather) {
    k_all = gathered_in_sequence_order(ks, sh);
    v_all = gathered_in_sequence_order(vs, sh);
  }

  // One pair's call: the shifted mods (without the mask_mod on a full pair) at the pair's offsets.
  auto run_pair = [&](const cp::PairCall& call, const TensorRef& qv, const TensorRef& kv,
                      const TensorRef& vv) {
    AttentionOptions o = options;
    o.mods = cp::mods_for_pair(shifted, call.kind);
    o.bindings = cp::with_offsets(options.bindings, o.mods, call.q.start, call.kv.start);
    o.return_lse = true;
    return flex_attention_cpu(qv, kv, vv, o, cpu);
  };

  CpuContextParallelResult result;
  CpuAttentionResult& all = result.result;
  all.shape = {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v};
  all.out.assign(static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q * s.head_dim_v), 0.0f);
  all.lse.assign(static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q), kNegInf);
  const TensorRef all_out = TensorRef::contiguous(all.out.data(), DType::F32, all.shape);
  const TensorRef all_lse =
      TensorRef::contiguous(all.lse.data(), DType::F32, {s.batch, s.heads_q, s.seqlen_q});

  for (int r = 0; r < ranks; ++r) {
    const cp::RankSchedule sched =
        cp::schedule_rank(sh, cp.strategy, r, shifted, params, s.batch, s.heads_q);
    result.calls += static_cast<int64_t>(sched.calls.size());
    result.skipped_pairs += sched.skipped_pairs;
    result.schedule += cp::describe(sched);
    // The running result of each query chunk: out 0, lse -inf until a call adds keys.
    std::vector<std::vector<float>> acc(sched.q_chunks.size()), acc_lse(sched.q_chunks.size());
    for (size_t i = 0; i < sched.q_chunks.size(); ++i) {
      acc[i].assign(static_cast<size_t>(s.batch * s.heads_q * len * s.head_dim_v), 0.0f);
      acc_lse[i].assign(static_cast<size_t>(s.batch * s.heads_q * len), kNegInf);
    }
    for (const cp::PairCall& call : sched.calls) {
      const TensorRef qv = cp::rows_of(qs[static_cast<size_t>(r)].ref, call.q_local_row, len);
      const bool gathered = call.kv_rank < 0;
      const TensorRef& kt = gathered ? k_all.ref : ks[static_cast<size_t>(call.kv_rank)].ref;
      const TensorRef& vt = gathered ? v_all.ref : vs[static_cast<size_t>(call.kv_rank)].ref;
      const CpuAttentionResult part =
          run_pair(call, qv, cp::rows_of(kt, call.kv_local_row, call.kv.length),
                   cp::rows_of(vt, call.kv_local_row, call.kv.length));
      const size_t i = static_cast<size_t>(call.q_chunk);
      cp::merge_partial(acc[i].data(), acc_lse[i].data(), part.out.data(), part.lse.data(),
                        s.batch * s.heads_q * len, s.head_dim_v);
    }
    // The rank's rows back into sequence order.
    for (size_t i = 0; i < sched.q_chunks.size(); ++i) {
      const TensorRef a =
          TensorRef::contiguous(acc[i].data(), DType::F32, {s.batch, s.heads_q, len, s.head_dim_v});
      const TensorRef al =
          TensorRef::contiguous(acc_lse[i].data(), DType::F32, {s.batch, s.heads_q, len});
      copy_rows(a, 0, all_out, sched.q_chunks[i].start, len);
      copy_rows(al, 0, all_lse, sched.q_chunks[i].start, len);
    }
  }
  return result;
}

CpuContextParallelGradients flex_attention_cp_backward_cpu(
    const TensorRef& q, const TensorRef& k, const TensorRef& v, const TensorRef& out,
    const TensorRef& lse, const TensorRef& dout, int ranks, const AttentionOptions& options,
    const ContextParallelOptions& cp, const CpuRunOptions& cpu) {
  const QkvShape s = check_inputs(q, k, v, options);
  check_host("out", out, DType::F32, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v});
  check_host("lse", lse, DType::F32, {s.batch, s.heads_q, s.seqlen_q});
  if (dout.device != TensorRef::Device::CPU || dout.shape != out.shape) {
    throw RuntimeError(fmt::format(
        "flex_attention_cp_backward_cpu: dout is {}; expected a CPU tensor of out's shape [{}]",
        dout.str(), fmt::join(out.shape, ", ")));
  }
  const cp::Sharding sh(cp.layout, s.seqlen_q, ranks);
  const Mods shifted = cp::with_global_positions(options.mods);
  const auto params = cp::known_params(options.mods, options.bindings);
  const int64_t len = sh.chunk_length(), L = sh.local_length();

  // What each rank holds: its shards of q, k, v, dout, and of the forward's out and lse.
  std::vector<HostTensor> qs, ks, vs, outs, lses, douts;
  std::vector<cp::RankSchedule> scheds;
  for (int r = 0; r < ranks; ++r) {
    qs.push_back(shard_of(q, sh, r));
    ks.push_back(shard_of(k, sh, r));
    vs.push_back(shard_of(v, sh, r));
    outs.push_back(shard_of(out, sh, r));
    lses.push_back(shard_of(lse, sh, r));
    douts.push_back(shard_of(dout, sh, r));
    scheds.push_back(cp::schedule_rank(sh, cp.strategy, r, shifted, params, s.batch, s.heads_q));
  }
  HostTensor k_all, v_all;
  if (cp.strategy == CpStrategy::AllGather) {
    k_all = gathered_in_sequence_order(ks, sh);
    v_all = gathered_in_sequence_order(vs, sh);
  }

  CpuContextParallelGradients g;
  // dQ per rank (its shard's rows); dK / dV per K / V shard (ring: they travel with it) or per
  // rank over the whole sequence (all-gather: reduce-scattered at the end).
  std::vector<HostTensor> dqs, dks, dvs;
  const int64_t kv_rows = cp.strategy == CpStrategy::Ring ? L : sh.seqlen();
  for (int r = 0; r < ranks; ++r) {
    dqs.emplace_back(DType::F32, std::vector<int64_t>{s.batch, s.heads_q, L, s.head_dim_qk});
    dks.emplace_back(DType::F32, std::vector<int64_t>{s.batch, s.heads_kv, kv_rows, s.head_dim_qk});
    dvs.emplace_back(DType::F32, std::vector<int64_t>{s.batch, s.heads_kv, kv_rows, s.head_dim_v});
  }

  auto run_call = [&](int r, const cp::PairCall& call) {
    const bool gathered = call.kv_rank < 0;
    const TensorRef& kt = gathered ? k_all.ref : ks[static_cast<size_t>(call.kv_rank)].ref;
    const TensorRef& vt = gathered ? v_all.ref : vs[static_cast<size_t>(call.kv_rank)].ref;
    // The forward's out and lse of the query rows, contiguous as the CPU backward takes them.
    const auto ri = static_cast<size_t>(r);
    HostTensor o_rows(DType::F32, {s.batch, s.heads_q, len, s.head_dim_v});
    HostTensor l_rows(DType::F32, {s.batch, s.heads_q, len});
    copy_rows(outs[ri].ref, call.q_local_row, o_rows.ref, 0, len);
    copy_rows(lses[ri].ref, call.q_local_row, l_rows.ref, 0, len);
    const Mods mods = cp::mods_for_pair(shifted, call.kind);
    cpu::CpuBackwardOptions bo;
    bo.scale = options.scale;
    bo.num_threads = cpu.num_threads;
    const cpu::CpuGradients<float> part = cpu::cpu_attention_backward(
        mods, cp::with_offsets(options.bindings, mods, call.q.start, call.kv.start),
        cp::rows_of(qs[ri].ref, call.q_local_row, len),
        cp::rows_of(kt, call.kv_local_row, call.kv.length),
        cp::rows_of(vt, call.kv_local_row, call.kv.length),
        reinterpret_cast<const float*>(o_rows.bytes.data()),
        reinterpret_cast<const float*>(l_rows.bytes.data()),
        cp::rows_of(douts[ri].ref, call.q_local_row, len), bo);
    ++g.calls;
    add_rows(part.dq, dqs[ri].ref, call.q_local_row, len);
    // Ring: into the travelling gradients of the shard's owner; all-gather: this rank's own.
    const size_t into = gathered ? ri : static_cast<size_t>(call.kv_rank);
    add_rows(part.dk, dks[into].ref, call.kv_local_row, call.kv.length);
    add_rows(part.dv, dvs[into].ref, call.kv_local_row, call.kv.length);
    for (const auto& [name, grad] : part.buffers) {
      std::vector<float>& sum = g.buffer_grads[name];
      if (sum.empty()) sum.assign(grad.size(), 0.0f);
      for (size_t i = 0; i < grad.size(); ++i)
        sum[i] += grad[i];
    }
  };
  if (cp.strategy == CpStrategy::Ring) {
    // Step-major: shard s's gradients collect rank s's part at step 0, rank s + 1's at step 1, ...
    for (int t = 0; t < ranks; ++t)
      for (int r = 0; r < ranks; ++r)
        for (const cp::PairCall& call : scheds[static_cast<size_t>(r)].calls)
          if (call.step == t) run_call(r, call);
  } else {
    for (int r = 0; r < ranks; ++r)
      for (const cp::PairCall& call : scheds[static_cast<size_t>(r)].calls)
        run_call(r, call);
    // The reduce-scatter: the ranks' whole-sequence dK / dV summed in rank order into rank 0's.
    for (int r = 1; r < ranks; ++r) {
      for (auto* x : {&dks, &dvs}) {
        float* acc = reinterpret_cast<float*>((*x)[0].bytes.data());
        const float* add =
            reinterpret_cast<const float*>((*x)[static_cast<size_t>(r)].bytes.data());
        for (size_t i = 0; i < (*x)[0].bytes.size() / sizeof(float); ++i)
          acc[i] += add[i];
      }
    }
  }

  // Every rank's rows back into sequence order.
  g.dq.assign(static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q * s.head_dim_qk), 0.0f);
  g.dk.assign(static_cast<size_t>(s.batch * s.heads_kv * s.seqlen_kv * s.head_dim_qk), 0.0f);
  g.dv.assign(static_cast<size_t>(s.batch * s.heads_kv * s.seqlen_kv * s.head_dim_v), 0.0f);
  const TensorRef dq_all = TensorRef::contiguous(g.dq.data(), DType::F32,
                                                 {s.batch, s.heads_q, s.seqlen_q, s.head_dim_qk});
  const TensorRef dk_all = TensorRef::contiguous(g.dk.data(), DType::F32,
                                                 {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_qk});
  const TensorRef dv_all = TensorRef::contiguous(g.dv.data(), DType::F32,
                                                 {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_v});
  for (int r = 0; r < ranks; ++r) {
    const auto ri = static_cast<size_t>(r);
    int64_t row = 0;
    for (const cp::Chunk& c : sh.chunks_of(r)) {
      copy_rows(dqs[ri].ref, row, dq_all, c.start, len);
      if (cp.strategy == CpStrategy::Ring) {
        copy_rows(dks[ri].ref, row, dk_all, c.start, len);
        copy_rows(dvs[ri].ref, row, dv_all, c.start, len);
      }
      row += len;
    }
  }
  if (cp.strategy == CpStrategy::AllGather) {
    std::memcpy(g.dk.data(), dks[0].bytes.data(), g.dk.size() * sizeof(float));
    std::memcpy(g.dv.data(), dvs[0].bytes.data(), g.dv.size() * sizeof(float));
  }
  return g;
}

}  // namespace flexjit
