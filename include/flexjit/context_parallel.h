// Context parallelism: one attention over a sequence split across several GPUs, on NCCL
// (docs/context_parallel.md).
//
// Each of the N ranks holds a shard of q, k and v: S / N positions of the sequence, cut as
// CpLayout says (zigzag by default: rank r holds chunks r and 2N - 1 - r of 2N, so a causal
// mask gives every rank the same work). flex_attention_cp computes the rank's rows of the
// attention over the whole sequence — out and lse of its own query positions — exchanging K / V
// with the other ranks over an NCCL communicator:
//
//   ncclComm_t comm = ...;                  // the caller's, or NcclCommunicator::create(...)
//   Context ctx({.device = local_rank});
//   NcclCommunicator cp = NcclCommunicator::wrap(comm);
//   auto [out, lse] = flex_attention_cp(ctx, cp, q_shard, k_shard, v_shard,
//                                       {.mods = standard_mods("causal"), .return_lse = true},
//                                       {.strategy = CpStrategy::Ring});
//
// The mods see global positions (q_idx and kv_idx of the whole sequence): every mask_mod and
// score_mod keeps its meaning, and buffers indexed by position (doc_id[S]) are bound whole on
// every rank. NCCL is loaded with dlopen at first use (libnccl.so.2; FLEXJIT_NCCL_LIBRARY names
// another file): flexjit never links it.
//
// flex_attention_cp_cpu runs the same partitioning on the CPU backend, every rank in turn in one
// process, with the same offsets, call order and lse merges: what `flexjit run --device cpu
// --cp-shards N --check` compares with the unsharded attention.
#pragma once

#include <flexjit/export.h>

#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/context.h>
#include <flexjit/cpu.h>
#include <flexjit/tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

struct ncclComm;  // nccl.h: typedef struct ncclComm* ncclComm_t

namespace flexjit {

// How K / V reach the queries (docs/context_parallel.md, "Strategies").
//   AllGather  every rank gathers the whole K / V (ncclAllGather), reorders it into sequence
//              order and runs one call per query chunk over the keys it needs (Llama 3's CP):
//              simple, any mask; memory O(S) for K / V.
//   Ring       K / V shards travel rank to rank (ncclSend / ncclRecv to r + 1, from r - 1), N
//              steps, the transfer of the next shard overlapped with the attention on the one
//              in hand; partial results merged by their lse. Memory O(S / N).
enum class CpStrategy { AllGather, Ring };
FLEXJIT_API std::string_view to_string(CpStrategy s);                         // "allgather", "ring"
FLEXJIT_API std::optional<CpStrategy> parse_cp_strategy(std::string_view s);  // those words

// How the sequence is cut (docs/context_parallel.md, "Sharding").
//   Zigzag      2N chunks of S / (2N); rank r holds chunks r and 2N - 1 - r, in that order.
//   Contiguous  N chunks of S / N; rank r holds chunk r (masks without a causal structure).
enum class CpLayout { Zigzag, Contiguous };
FLEXJIT_API std::string_view to_string(CpLayout l);                       // "zigzag", "contiguous"
FLEXJIT_API std::optional<CpLayout> parse_cp_layout(std::string_view s);  // those words

class CpTimeline;

struct ContextParallelOptions {
  CpStrategy strategy = CpStrategy::Ring;
  CpLayout layout = CpLayout::Zigzag;
  // GPU calls only: when set, the call records CUDA events around each of its steps into this
  // timeline (one per rank; docs/context_parallel.md, "Timeline"). Null (the default): nothing is
  // recorded and nothing is spent on it.
  CpTimeline* timeline = nullptr;
};

// ---- the timeline of GPU calls (opt-in: ContextParallelOptions::timeline) -------------------

// One step of a call as the GPU ran it: the time between two CUDA events recorded before and
// after it on its stream, in microseconds from the timeline's first event (one device's clock).
struct CpTimelineSpan {
  enum class Lane { Compute, Comm };  // the caller's stream, the communicator's (NCCL) stream
  Lane lane = Lane::Compute;
  // "step 1 attention q [3072, 4096) x kv [1024, 2048) (full)", "step 0 send / recv K / V",
  // "merge [1, 16, 4096, 128]", "all-gather K / V", "reduce-scatter dK / dV", ...
  std::string name;
  double start_us = 0, end_us = 0;
};

struct CpTimelineSummary {
  double wall_us = 0;     // first start to last end
  double compute_us = 0;  // time during which a compute span ran (the union of their intervals)
  double comm_us = 0;     // the same for the comm spans (transfers, including waits for a peer)
  // comm time during which no compute span ran: the communication not hidden behind compute
  double comm_exposed_us = 0;
  int64_t compute_spans = 0, comm_spans = 0;
};

// The summary of one rank's spans (any order).
FLEXJIT_API CpTimelineSummary summarize_cp_timeline(const std::vector<CpTimelineSpan>& spans);

// A Chrome trace (JSON of the Trace Event Format, opened by chrome://tracing and Perfetto) of the
// ranks' spans: ranks[i] is rank i's, shown as process "rank i" with two threads, "compute" and
// "comm". Each rank's times are on its own device's clock, from its first event.
FLEXJIT_API std::string cp_timeline_chrome_trace(
    const std::vector<std::vector<CpTimelineSpan>>& ranks);

// The events of one rank's context-parallel GPU calls (every call given this timeline, on one
// device): the pair attentions and backwards, merges, reorders on the compute stream, and each
// NCCL exchange on the comm stream. Recording adds two events per step and does not synchronize;
// spans() waits for the recorded work.
class FLEXJIT_API CpTimeline {
 public:
  CpTimeline();
  ~CpTimeline();
  CpTimeline(const CpTimeline&) = delete;
  CpTimeline& operator=(const CpTimeline&) = delete;

  // Every span recorded so far, in the order of recording; blocks the host until the recorded
  // work is done (RuntimeError naming the CUDA error when it failed).
  const std::vector<CpTimelineSpan>& spans();
  // Forgets the spans (the next one starts a new clock).
  void clear();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  friend struct CpTimelineAccess;
};

// ---- on the CPU backend: the partitioning checked in one process ----------------------------

struct CpuContextParallelResult {
  CpuAttentionResult result;  // every rank's rows put back in sequence order: [B, Hq, S, Dv]
  int64_t calls = 0;          // attention calls made, over all ranks
  int64_t skipped_pairs = 0;  // (query chunk, key chunk) pairs the mask analysis proved empty
  std::string schedule;       // every rank's calls, one line each (cp/Schedule.h's describe)
};

// q [B, Hq, S, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv]: the whole sequence, CPU tensors as
// flex_attention_cpu takes them. Cuts them into `ranks` shards as `cp.layout` says and computes
// each rank's rows as flex_attention_cp would on its GPU: the same calls (cp.strategy), shard
// offsets and lse merges, each call on the CPU backend. RuntimeError when S is not a multiple of
// the chunk count (2N zigzag, N contiguous), when Sq != Skv, or for a KV cache or block mask;
// UnsupportedError for a sink_mod (not yet: docs/context_parallel.md).
FLEXJIT_API CpuContextParallelResult flex_attention_cp_cpu(const TensorRef& q, const TensorRef& k,
                                                           const TensorRef& v, int ranks,
                                                           const AttentionOptions& options = {},
                                                           const ContextParallelOptions& cp = {},
                                                           const CpuRunOptions& cpu = {});

// The gradients of the whole sequence, in sequence order, as the ranks' shards put together.
struct CpuContextParallelGradients {
  std::vector<float> dq;  // [B, Hq, S, D]
  std::vector<float> dk;  // [B, Hkv, S, D]
  std::vector<float> dv;  // [B, Hkv, S, Dv]
  // Per captured float buffer of the mods: summed over every call of every rank (the all-reduce
  // the ranks make), contiguous over the bound buffer's shape.
  std::map<std::string, std::vector<float>> buffer_grads;
  int64_t calls = 0;  // backward calls made, over all ranks
};

// The backward of flex_attention_cp_cpu, rank by rank as the GPUs would run it (the sharded
// backward on GPUs is not done yet: docs/context_parallel.md). q, k, v as for
// flex_attention_cp_cpu; out [B, Hq, S, Dv] and lse [B, Hq, S] the forward's (f32, sequence
// order, contiguous: CpuContextParallelResult::result); dout of out's shape (CPU tensor). Each
// pair of the rank's schedule runs the CPU backward on its query rows, its keys and the final
// out / lse rows (the softmax's normalization is the whole row's):
//   ring       dQ adds up on the rank; each K / V shard's dK / dV add up as they travel with it
//              (step t adds rank (owner + t) mod N's part), back at the owner after N steps;
//   allgather  dK / dV of the whole sequence on each rank, then summed over the ranks and each
//              rank's chunks kept (the reduce-scatter).
// Buffer gradients are summed over all calls. Errors as flex_attention_cp_cpu's.
FLEXJIT_API CpuContextParallelGradients flex_attention_cp_backward_cpu(
    const TensorRef& q, const TensorRef& k, const TensorRef& v, const TensorRef& out,
    const TensorRef& lse, const TensorRef& dout, int ranks, const AttentionOptions& options = {},
    const ContextParallelOptions& cp = {}, const CpuRunOptions& cpu = {});

// ---- on GPUs over NCCL ----------------------------------------------------------------------

// Whether libnccl.so.2 can be loaded (docs/context_parallel.md, "NCCL"); otherwise false with
// every place tried in *reason.
FLEXJIT_API bool nccl_available(std::string* reason = nullptr);

// ncclUniqueId: 128 opaque bytes that rank 0 makes and every rank passes to create().
struct NcclUniqueId {
  char bytes[128] = {};
};

// An NCCL communicator, one per rank, and what flexjit keeps with it (the block masks of the
// shard pairs, reused by every later call of the same shapes and mods).
class FLEXJIT_API NcclCommunicator {
 public:
  NcclCommunicator() = default;
  // ncclGetUniqueId: made on one rank, sent to the others by the caller's own means.
  static NcclUniqueId unique_id();
  // The caller's communicator, not destroyed by flexjit (the caller keeps it alive for as long
  // as this object or its copies are used).
  static NcclCommunicator wrap(ncclComm* comm);
  // A communicator of `nranks` ranks that flexjit creates (ncclCommInitRank, on ctx's device)
  // and destroys with the last copy. Every rank calls it with the same id. Blocks until all
  // ranks joined.
  static NcclCommunicator create(Context& ctx, const NcclUniqueId& id, int nranks, int rank);

  bool defined() const { return impl_ != nullptr; }
  int rank() const;
  int size() const;
  ncclComm* get() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  friend struct NcclCommunicatorAccess;
};

// The rank's out [B, Hq, S / N, Dv] (dtype of q) and, with options.return_lse, lse [B, Hq, S / N]
// f32: its rows of the attention over the whole sequence. q [B, Hq, S / N, D], k [B, Hkv, S / N,
// D] and v [B, Hkv, S / N, Dv] are this rank's shards (cp.layout), C-contiguous, on ctx's
// device; every rank calls with the same shapes, options and cp. options as flex_attention takes
// them (mods, bindings, scale, stream, variant, config, math), except: no block_mask (the pairs
// get their own), no kv_cache, no sink_mod (not yet). Enqueued on options.stream; the
// collectives run on a second stream that waits for and is waited on by it through events, so
// the call is asynchronous like flex_attention. RuntimeError for invalid inputs or an NCCL
// failure (naming the call and NCCL's message); UnsupportedError for what is not supported.
FLEXJIT_API AttentionResult flex_attention_cp(Context& ctx, const NcclCommunicator& comm,
                                              const TensorRef& q, const TensorRef& k,
                                              const TensorRef& v,
                                              const AttentionOptions& options = {},
                                              const ContextParallelOptions& cp = {});

// The same into caller-owned tensors: out [B, Hq, S / N, Dv] (dtype of q, C-contiguous) and lse
// [B, Hq, S / N] f32 (may be null).
FLEXJIT_API void flex_attention_cp_into(Context& ctx, const NcclCommunicator& comm,
                                        const TensorRef& q, const TensorRef& k, const TensorRef& v,
                                        const TensorRef& out, const TensorRef* lse,
                                        const AttentionOptions& options = {},
                                        const ContextParallelOptions& cp = {});

// The backward of flex_attention_cp on the rank's shards: dq [B, Hq, S / N, D], dk and dv of
// k's and v's shard shapes (dtypes of q, k, v) and, per captured float buffer, its f32 gradient
// summed over every rank (ncclAllReduce). out and lse [B, Hq, S / N] are the forward's (with
// return_lse), dout of out's shape; options and cp as the forward's. Each pair's backward runs
// on the final out / lse rows (docs/context_parallel.md, "The backward"):
//   AllGather  K / V gathered as in the forward, one backward per query chunk over the keys it
//              read (dQ written in place), dK / dV added up in f32 over the whole sequence, then
//              ncclReduceScatter (f32) so that each rank keeps its own chunks' sums;
//   Ring       dQ added up in f32 on the rank; each shard's dK / dV sums (f32) travel with its
//              K / V and come back to the owner after the last step.
// No BackwardOptions yet (dlse, deterministic, dq_mode: the defaults). Asynchronous on
// options.stream.
FLEXJIT_API BackwardResult flex_attention_cp_backward(Context& ctx, const NcclCommunicator& comm,
                                                      const TensorRef& q, const TensorRef& k,
                                                      const TensorRef& v, const TensorRef& out,
                                                      const TensorRef& lse, const TensorRef& dout,
                                                      const AttentionOptions& options = {},
                                                      const ContextParallelOptions& cp = {});

}  // namespace flexjit
