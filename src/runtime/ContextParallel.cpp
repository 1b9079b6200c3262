// flex_attention_cp (include/flexjit/context_parallel.h): one attention over a sequence sharded
// across the ranks of an NCCL communicator (docs/context_parallel.md).
//
// Every rank follows its cp::schedule_rank, the same schedule the CPU check runs
// (runtime/ContextParallelCpu.cpp). Two streams: the caller's (compute: the pair calls, merges,
// reorders) and the communicator's (the collectives), ordered by events:
//
//   all-gather  comm: ncclAllGather of K and V (rank-major) → event; compute: waits, reorders
//               the gathered shards into sequence order (cuMemcpy2DAsync, one per chunk), then
//               one flex_attention call per query chunk straight into out / lse.
//   ring        step t holds rank (r - t) mod N's shard: step 0 the caller's own k / v, later
//               steps one of two receive buffers. While compute runs step t's pair calls, comm
//               sends the shard in hand to r + 1 and receives step t + 1's from r - 1
//               (ncclGroupStart / ncclSend / ncclRecv / ncclGroupEnd); before receiving into a
//               buffer it waits for the compute event of the step that last read it. Each pair's
//               (out, lse) is merged into its query chunk's f32 running result by the cp_merge
//               kernel; a finalize writes the result into out / lse.
//
// Memory: the buffers NCCL writes into (the gathered K / V, the ring's two receive buffers) are
// the communicator's, allocated once with cuMemAlloc and reused by later calls (NCCL may write
// them from a peer GPU of the same process, which stream-ordered pool memory does not allow);
// every other buffer (the reordered K / V, the running results, a pair's partial result) is
// allocated and freed in stream order on the compute stream (cuMemAllocAsync / cuMemFreeAsync),
// after that stream waited for the comm stream's last event. Nothing synchronizes the host
// (except the one-time growth of the communicator's buffers).
#include <flexjit/backward.h>
#include <flexjit/context_parallel.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>

#include "binding/AttentionCall.h"
#include "cp/CallChecks.h"
#include "cp/GlobalPositions.h"
#include "cp/MergeKernel.h"
#include "cp/NcclLibrary.h"
#include "cp/PairPlan.h"
#include "cp/Schedule.h"
#include "cp/Sharding.h"
#include "device/CudaDriver.h"
#include "device/Device.h"
#include "ir/Visitor.h"
#include "plan/ContextImpl.h"
#include "plan/Plan.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
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
  char* nccl_scratch(size_t bytes) {
    if (bytes > scratch_bytes) {
      if (scratch != 0) {
        FJ_CU(cuCtxSynchronize, "freeing the context-parallel buffers");
        FJ_CU(cuMemFree, "the context-parallel buffers", scratch);
        scratch = 0, scratch_bytes = 0;
      }
      FJ_CU(cuMemAlloc, "the context-parallel buffers NCCL writes into", &scratch, bytes);
      scratch_bytes = bytes;
    }
    return reinterpret_cast<char*>(scratch);
  }
  // Block masks of the pairs, by mods, geometry, offsets and parameter values (masks that read
  // no buffer only: a buffer's contents may change between calls).
  std::map<std::string, std::shared_ptr<DeviceBlockMask>> masks;

  ~Impl() {
    const runtime::Driver& d = runtime::Driver::get();
    // The stream, event and buffers belong to the device's primary context, whichever thread
    // drops the last copy.
    if (d.available() && device >= 0 && (comm_stream != nullptr || scratch != 0)) {
      try {
        runtime::Device::get(device).make_current();
      } catch (const std::exception&) {
        return;  // the device is gone: nothing to release into
      }
    }
    if (comm_stream != nullptr && d.available()) d.cuStreamDestroy_(comm_stream);
    if (done != nullptr && d.available()) d.cuEventDestroy_(done);
    if (scratch != 0 && d.available()) {
      d.cuCtxSynchronize_();
      d.cuMemFree_(scratch);
    }
    if (owned && comm != nullptr && cp::Nccl::get().available()) {
      cp::Nccl::get().ncclCommDestroy_(comm);
    }
  }
};

struct NcclCommunicatorAccess {
  static NcclCommunicator::Impl& impl(const NcclCommunicator& c) { return *c.impl_; }
  static void set(NcclCommunicator& c, std::shared_ptr<NcclCommunicator::Impl> impl) {
    c.impl_ = std::move(impl);
  }
};

bool nccl_available(std::string* reason) {
  const cp::Nccl& n = cp::Nccl::get();
  if (!n.available() && reason != nullptr) *reason = n.unavailable_reason();
  return n.available();
}

namespace {

std::shared_ptr<NcclCommunicator::Impl> describe_comm(cp::NcclComm comm, bool owned) {
  auto impl = std::make_shared<NcclCommunicator::Impl>();
  impl->comm = comm;
  impl->owned = owned;
  FJ_NCCL(ncclCommCount, "the communicator's size", comm, &impl->size);
  FJ_NCCL(ncclCommUserRank, "the communicator's rank", comm, &impl->rank);
  FJ_NCCL(ncclCommCuDevice, "the communicator's device", comm, &impl->device);
  return impl;
}

}  // namespace

NcclUniqueId NcclCommunicator::unique_id() {
  cp::Nccl::get().require();
  cp::NcclUniqueIdBytes id{};
  FJ_NCCL(ncclGetUniqueId, "a new communicator", &id);
  NcclUniqueId out;
  static_assert(sizeof(out.bytes) == sizeof(id.internal));
  std::memcpy(out.bytes, id.internal, sizeof(out.bytes));
  return out;
}

NcclCommunicator NcclCommunicator::wrap(ncclComm* comm) {
  cp::Nccl::get().require();
  if (comm == nullptr) throw RuntimeError("NcclCommunicator::wrap: the ncclComm_t is null");
  NcclCommunicator c;
  NcclCommunicatorAccess::set(c, describe_comm(comm, /*owned=*/false));
  return c;
}

NcclCommunicator NcclCommunicator::create(Context& ctx, const NcclUniqueId& id, int nranks,
                                          int rank) {
  cp::Nccl::get().require();
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    throw RuntimeError(fmt::format(
        "NcclCommunicator::create: rank {} of {} ranks; need 0 <= rank < nranks", rank, nranks));
  }
  impl_of(ctx).device->make_current();
  cp::NcclUniqueIdBytes raw{};
  std::memcpy(raw.internal, id.bytes, sizeof(raw.internal));
  cp::NcclComm comm = nullptr;
  FJ_NCCL(ncclCommInitRank, fmt::format("rank {} of {}", rank, nranks), &comm, nranks, raw, rank);
  NcclCommunicator c;
  NcclCommunicatorAccess::set(c, describe_comm(comm, /*owned=*/true));
  return c;
}

int NcclCommunicator::rank() const {
  return impl_ ? impl_->rank : 0;
}
int NcclCommunicator::size() const {
  return impl_ ? impl_->size : 0;
}
ncclComm* NcclCommunicator::get() const {
  return impl_ ? impl_->comm : nullptr;
}

namespace {

// Device memory allocated and freed in order on one stream.
class StreamBuffer {
 public:
  StreamBuffer(size_t bytes, CUstream stream, const char* what) : stream_(stream) {
    if (bytes > 0) FJ_CU(cuMemAllocAsync, what, &ptr_, bytes, stream);
  }
  ~StreamBuffer() {
    if (ptr_ != 0) runtime::Driver::get().cuMemFreeAsync_(ptr_, stream_);
  }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  void* get() const { return reinterpret_cast<void*>(ptr_); }
  char* bytes() const { return reinterpret_cast<char*>(ptr_); }

 private:
  CUdeviceptr ptr_ = 0;
  CUstream stream_;
};

class Event {
 public:
  Event() { FJ_CU(cuEventCreate, "a context-parallel event", &e_, CU_EVENT_DISABLE_TIMING); }
  ~Event() { runtime::Driver::get().cuEventDestroy_(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  // Records on `s`; `waiter` then waits for it.
  void record(CUstream s) { FJ_CU(cuEventRecord, "a context-parallel event", e_, s); }
  void wait_on(CUstream waiter) {
    FJ_CU(cuStreamWaitEvent, "a context-parallel event", waiter, e_, 0);
  }

 private:
  CUevent e_ = nullptr;
};

bool reads_var(const Expr& e, ir::VarKind v) {
  return ir::any_node(e, [v](const Expr& n) { return n->op == ir::Op::Var && n->var == v; });
}

bool reads_buffer(const Expr& e) {
  return ir::any_node(e, [](const Expr& n) { return n->op == ir::Op::Load; });
}

// A contiguous device tensor view of `bytes` scratch: [B, H, S, D] of `dtype`.
TensorRef scratch_view(void* data, DType dtype, std::vector<int64_t> shape, int device) {
  return TensorRef::contiguous(data, dtype, std::move(shape), TensorRef::Device::CUDA, device);
}

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

  // The block mask of a Partial pair (null for Full ones), built now or taken from the cache.
  std::shared_ptr<DeviceBlockMask> mask_for(const cp::PairCall& call) {
    if (call.kind != cp::PairKind::Partial) return nullptr;
    const Mods& m = shifted;
    const int bm = reads_var(m.mask_mod, ir::VarKind::B) ? static_cast<int>(s.batch) : 1;
    const int hm = reads_var(m.mask_mod, ir::VarKind::H) ? static_cast<int>(s.heads_q) : 1;
    const ModBindings b = cp::with_offsets(options.bindings, m, call.q.start, call.kv.start);
    const bool cacheable = !reads_buffer(m.mask_mod);
    std::string key;
    if (cacheable) {
      key = fmt::format("{:x} {} {} {} {} {} {}", mask_only(m).hash(), bm, hm, call.q.length,
                        call.kv.length, call.q.start, call.kv.start);
      for (const auto& [name, value] : b.params)
        key += fmt::format(" {}={}", name, value);
      std::lock_guard<std::mutex> lock(comm.mu);
      if (auto it = comm.masks.find(key); it != comm.masks.end()) return it->second;
    }
    auto mask = std::make_shared<DeviceBlockMask>(
        create_block_mask(ctx, m, bm, hm, static_cast<int>(call.q.length),
                          static_cast<int>(call.kv.length), kDefaultSparseBlockSize, b));
    built_masks = true;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(comm.mu);
      comm.masks.emplace(key, mask);
    }
    return mask;
  }
  bool built_masks = false;

  // One pair's attention on the compute stream, into out / lse.
  void attend(const cp::PairCall& call, const DeviceBlockMask* mask, const TensorRef& q,
              const TensorRef& k, const TensorRef& v, const TensorRef& out, const TensorRef* lse) {
    AttentionOptions o = options;
    o.mods = cp::mods_for_pair(shifted, call.kind);
    o.bindings = cp::with_offsets(options.bindings, o.mods, call.q.start, call.kv.start);
    o.block_mask = mask;
    o.stream = compute;
    o.workspace = {};
    flex_attention_into(ctx, q, k, v, out, lse, o);
  }

  // One pair's backward on the compute stream, into `grads`.
  void attend_backward(const cp::PairCall& call, const DeviceBlockMask* mask, const TensorRef& q,
                       const TensorRef& k, const TensorRef& v, const TensorRef& out,
                       const TensorRef& lse, const TensorRef& dout, const BackwardOutputs& grads) {
    AttentionOptions o = options;
    o.mods = cp::mods_for_pair(shifted, call.kind);
    o.bindings = cp::with_offsets(options.bindings, o.mods, call.q.start, call.kv.start);
    o.block_mask = mask;
    o.stream = compute;
    o.workspace = {};
    flex_attention_backward_into(ctx, q, k, v, out, lse, dout, grads, o);
  }

  // A cp_merge launch on the compute stream; `of` is the dtype of part / out (default q's).
  void merge(const cp::MergeInputs& in, std::optional<DType> of = std::nullopt) {
    ContextImpl& impl = impl_of(ctx);
    runtime::Plan plan;
    plan.add(runtime::plan_step<cp::MergeVariant>(
        cp::merge_problem(cuda::Arch::parse(ctx.arch()), of.value_or(dtype),
                          static_cast<int>(in.dv)),
        in, kernels::InputFacts{}, Mods{}));
    const runtime::BuiltPlan built = runtime::build_plan(impl.builder, plan);
    runtime::launch_plan(*impl.device, plan, built, compute, Workspace{});
  }
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
  std::unique_ptr<CpCall> call;
  cp::RankSchedule sched;
  std::vector<std::shared_ptr<DeviceBlockMask>> masks;
};

// Null for an empty batch (nothing to do).
std::unique_ptr<CallSetup> begin_call(Context& ctx, const NcclCommunicator& comm,
                                      const TensorRef& q, const TensorRef& k, const TensorRef& v,
                                      const AttentionOptions& options,
                                      const ContextParallelOptions& cpo) {
  cp::check_cp_options(options);
  if (!comm.defined()) {
    throw RuntimeError(
        "flex_attention_cp: the NcclCommunicator is empty (NcclCommunicator::wrap or create)");
  }
  auto st = std::make_unique<CallSetup>();
  NcclCommunicator::Impl& ci = NcclCommunicatorAccess::impl(comm);
  st->ci = &ci;
  ContextImpl& impl = impl_of(ctx);
  const int device = impl.device->index();
  st->device = device;
  if (ci.device != device) {
    throw RuntimeError(fmt::format(
        "flex_attention_cp: the communicator's rank {} is on cuda:{}, the context on cuda:{}",
        ci.rank, ci.device, device));
  }
  const QkvShape s = validate_qkv(q, k, v);
  st->s = s;
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    if (t->device != TensorRef::Device::CUDA || t->device_index != device) {
      throw RuntimeError(fmt::format("flex_attention_cp: {} is {}; expected a tensor on cuda:{}",
                                     name, t->str(), device));
    }
  }
  // k and v are sent and gathered whole: one contiguous block each.
  for (const auto& [t, name] : {std::pair{&k, "k"}, {&v, "v"}}) {
    if (!t->is_contiguous()) {
      throw RuntimeError(fmt::format(
          "flex_attention_cp: {} must be C-contiguous (its shard is sent whole over NCCL); got {}",
          name, t->str()));
    }
  }
  if (s.seqlen_q != s.seqlen_kv) {
    throw RuntimeError(fmt::format(
        "flex_attention_cp shards one sequence: the local q has {} positions, k and v {}; every "
        "rank holds S / N of each",
        s.seqlen_q, s.seqlen_kv));
  }
  st->n = ci.size, st->r = ci.rank;
  st->sh = std::make_unique<cp::Sharding>(cpo.layout, s.seqlen_q * st->n, st->n);
  st->shifted = cp::with_global_positions(options.mods);
  impl.device->make_current();
  st->compute = static_cast<CUstream>(options.stream);
  std::lock_guard<std::mutex> lock(ci.mu);
  if (ci.comm_stream == nullptr) {
    FJ_CU(cuStreamCreate, "the context-parallel communication stream", &ci.comm_stream,
          CU_STREAM_NON_BLOCKING);
  }
  st->comm_stream = ci.comm_stream;
  // One call of a communicator at a time on the device: the previous call's compute is done
  // with the NCCL buffers before this one's streams use them.
  if (ci.done == nullptr) {
    FJ_CU(cuEventCreate, "a context-parallel event", &ci.done, CU_EVENT_DISABLE_TIMING);
  }
  if (ci.done_recorded) {
    FJ_CU(cuStreamWaitEvent, "the previous context-parallel call", st->compute, ci.done, 0);
    FJ_CU(cuStreamWaitEvent, "the previous context-parallel call", st->comm_stream, ci.done, 0);
  }
  return st;
}

// Plans the rank's calls and builds their block masks (create_block_mask runs on the legacy
// default stream: the compute stream waits for them once).
void plan_calls(CallSetup& st, Context& ctx, const AttentionOptions& options,
                const ContextParallelOptions& cpo, DType dtype) {
  st.call.reset(new CpCall{ctx, *st.ci, options, *st.sh, st.shifted,
                           cp::known_params(options.mods, options.bindings), st.s, dtype,
                           st.compute, st.device});
  st.sched = cp::schedule_rank(*st.sh, cpo.strategy, st.r, st.shifted, st.call->params, st.s.batch,
                               st.s.heads_q);
  for (const cp::PairCall& c : st.sched.calls)
    st.masks.push_back(st.call->mask_for(c));
  if (st.call->built_masks) {
    Event built;
    built.record(nullptr);
    built.wait_on(st.compute);
  }
}

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
  FJ_NCCL(ncclGroupStart, what);
  FJ_NCCL(ncclAllGather, "the all-gather of K", k.data, gathered, k_bytes, cp::kNcclUint8,
          st.ci->comm, st.comm_stream);
  FJ_NCCL(ncclAllGather, "the all-gather of V", v.data, gathered + n * k_bytes, v_bytes,
          cp::kNcclUint8, st.ci->comm, st.comm_stream);
  FJ_NCCL(ncclGroupEnd, what);
  gathered_ev.record(st.comm_stream);
  gathered_ev.wait_on(st.compute);
  const int64_t rows = st.s.batch * st.s.heads_kv;
  reorder_chunks(*st.sh, gathered, ordered, k_bytes,
                 static_cast<size_t>(st.s.head_dim_qk * dtype_size(k.dtype)), rows, true,
                 st.compute);
  reorder_chunks(*st.sh, gathered + n * k_bytes, ordered + n * k_bytes, v_bytes,
                 static_cast<size_t>(st.s.head_dim_v * dtype_size(v.dtype)), rows, true,
                 st.compute);
}

// Records the communicator's `done` event on the compute stream when the call's enqueueing ends
// (normally or by an exception), after everything that touches its NCCL buffers.
struct RecordDone {
  NcclCommunicator::Impl& ci;
  CUstream compute;
  ~RecordDone() {
    std::lock_guard<std::mutex> lock(ci.mu);
    if (runtime::Driver::get().cuEventRecord_(ci.done, compute) == CUDA_SUCCESS) {
      ci.done_recorded = true;
    }
  }
};

}  // namespace

void flex_attention_cp_into(Context& ctx, const NcclCommunicator& comm, const TensorRef& q,
                            const TensorRef& k, const TensorRef& v, const TensorRef& out,
                            const TensorRef* lse, const AttentionOptions& options,
                            const ContextParallelOptions& cpo) {
  runtime::check_attention_outputs(q, validate_qkv(q, k, v), out, lse);
  if (!out.is_contiguous()) {
    throw RuntimeError(
        fmt::format("flex_attention_cp: out must be C-contiguous; got {}", out.str()));
  }
  const std::unique_ptr<CallSetup> st = begin_call(ctx, comm, q, k, v, options, cpo);
  if (st->s.batch == 0 || st->s.heads_q == 0) return;
  plan_calls(*st, ctx, options, cpo, q.dtype);
  NcclCommunicator::Impl& ci = *st->ci;
  const cp::Sharding& sh = *st->sh;
  const QkvShape& s = st->s;
  const int n = st->n, r = st->r, device = st->device;
  const CUstream compute = st->compute, comm_stream = st->comm_stream;
  CpCall& call_state = *st->call;
  const cp::RankSchedule& sched = st->sched;
  const std::vector<std::shared_ptr<DeviceBlockMask>>& masks = st->masks;

  const int64_t len = sh.chunk_length();
  const int64_t elt = dtype_size(q.dtype);
  const size_t k_bytes = static_cast<size_t>(k.numel() * elt);
  const size_t v_bytes = static_cast<size_t>(v.numel() * dtype_size(v.dtype));
  const TensorRef q_ref = q;
  const std::string peer_what = fmt::format("rank {} of {}", r, n);

  if (cpo.strategy == CpStrategy::AllGather) {
    char* gathered;
    {
      std::lock_guard<std::mutex> lock(ci.mu);
      gathered = ci.nccl_scratch(n * (k_bytes + v_bytes));
    }
    StreamBuffer ordered(n * (k_bytes + v_bytes), compute, "K / V in sequence order");
    const RecordDone record_done{ci, compute};
    gather_kv(*st, k, v, gathered, ordered.bytes());
    const TensorRef k_all = scratch_view(ordered.get(), k.dtype,
                                         {s.batch, s.heads_kv, sh.seqlen(), s.head_dim_qk}, device);
    const TensorRef v_all = scratch_view(ordered.bytes() + n * k_bytes, v.dtype,
                                         {s.batch, s.heads_kv, sh.seqlen(), s.head_dim_v}, device);
    std::vector<bool> written(sched.q_chunks.size(), false);
    for (size_t i = 0; i < sched.calls.size(); ++i) {
      const cp::PairCall& c = sched.calls[i];
      const TensorRef lse_rows = lse ? cp::rows_of(*lse, c.q_local_row, len) : TensorRef{};
      call_state.attend(c, masks[i].get(), cp::rows_of(q_ref, c.q_local_row, len),
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
      runtime::write_empty_attention(cp::rows_of(out, row, len), lse ? &lse_rows : nullptr,
                                     compute);
    }
    return;  // the buffers are freed on the compute stream, after its last read
  }

  // Ring.
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
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
      const std::string what =
          fmt::format("the ring's K / V exchange of step {} ({})", t, peer_what);
      FJ_NCCL(ncclGroupStart, what);
      FJ_NCCL(ncclSend, what, shard_k(t), k_bytes, cp::kNcclUint8, next, ci.comm, comm_stream);
      FJ_NCCL(ncclSend, what, shard_v(t), v_bytes, cp::kNcclUint8, next, ci.comm, comm_stream);
      FJ_NCCL(ncclRecv, what, shard_k(t + 1), k_bytes, cp::kNcclUint8, prev, ci.comm, comm_stream);
      FJ_NCCL(ncclRecv, what, shard_v(t + 1), v_bytes, cp::kNcclUint8, prev, ci.comm, comm_stream);
      FJ_NCCL(ncclGroupEnd, what);
      ready[static_cast<size_t>(t + 1)]->record(comm_stream);
    }
    if (t >= 1) ready[static_cast<size_t>(t)]->wait_on(compute);
    const TensorRef k_shard = scratch_view(
        shard_k(t), k.dtype, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_qk}, device);
    const TensorRef v_shard =
        scratch_view(shard_v(t), v.dtype, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_v}, device);
    for (; next_call < sched.calls.size() && sched.calls[next_call].step == t; ++next_call) {
      const cp::PairCall& c = sched.calls[next_call];
      call_state.attend(c, masks[next_call].get(), cp::rows_of(q_ref, c.q_local_row, len),
                        cp::rows_of(k_shard, c.kv_local_row, c.kv.length),
                        cp::rows_of(v_shard, c.kv_local_row, c.kv.length), part_out, &part_lse);
      cp::MergeInputs m;
      m.batch = s.batch, m.heads = s.heads_q, m.seqlen = len, m.dv = s.head_dim_v;
      m.acc = reinterpret_cast<float*>(acc.bytes() + static_cast<size_t>(c.q_chunk) * acc_bytes);
      m.acc_lse = reinterpret_cast<float*>(acc.bytes() + chunks * acc_bytes +
                                           static_cast<size_t>(c.q_chunk) * lse_bytes);
      m.part = part_out;
      m.part_lse = part_lse;
      call_state.merge(m);
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
    call_state.merge(m);
  }
}

AttentionResult flex_attention_cp(Context& ctx, const NcclCommunicator& comm, const TensorRef& q,
                                  const TensorRef& k, const TensorRef& v,
                                  const AttentionOptions& options,
                                  const ContextParallelOptions& cp) {
  const QkvShape s = validate_qkv(q, k, v);
  AttentionResult r;
  r.out = DeviceTensor::empty(ctx, q.dtype, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v});
  if (options.return_lse) {
    r.lse = DeviceTensor::empty(ctx, DType::F32, {s.batch, s.heads_q, s.seqlen_q});
  }
  flex_attention_cp_into(ctx, comm, q, k, v, r.out, options.return_lse ? &r.lse.ref() : nullptr,
                         options, cp);
  return r;
}

namespace {

// The ring's backward (docs/context_parallel.md, "The backward"): step t holds rank (r - t) mod
// N's K / V shard and that shard's dK / dV so far (f32, travelling with it). Each step's pairs
// add their dQ into the rank's f32 dQ and their dK / dV into the travelling sums; then the sums
// go on to rank r + 1 (after the last step: back to their owner). The K / V of step t + 1 are
// received while step t computes, as in the forward.
void ring_backward(Context& ctx, CallSetup& st, const TensorRef& q, const TensorRef& k,
                   const TensorRef& v, const TensorRef& out, const TensorRef& lse,
                   const TensorRef& dout, BackwardResult& g,
                   const std::vector<int64_t>& buf_numel) {
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
      const std::string what = fmt::format("the ring backward's K / V of step {} ({})", t, peer);
      FJ_NCCL(ncclGroupStart, what);
      FJ_NCCL(ncclSend, what, shard_k(t), k_bytes, cp::kNcclUint8, next, ci.comm, comm_stream);
      FJ_NCCL(ncclSend, what, shard_v(t), v_bytes, cp::kNcclUint8, next, ci.comm, comm_stream);
      FJ_NCCL(ncclRecv, what, shard_k(t + 1), k_bytes, cp::kNcclUint8, prev, ci.comm, comm_stream);
      FJ_NCCL(ncclRecv, what, shard_v(t + 1), v_bytes, cp::kNcclUint8, prev, ci.comm, comm_stream);
      FJ_NCCL(ncclGroupEnd, what);
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
      int64_t off = 0;
      for (size_t j = 0; j < g.buffer_grads.size(); ++j) {
        grads.buffer_grads.emplace_back(g.buffer_grads[j].first,
                                        scratch_view(part_bufs + off, DType::F32,
                                                     g.buffer_grads[j].second.ref().shape, device));
        off += buf_numel[j];
      }
      st.call->attend_backward(
          c, st.masks[next_call].get(), cp::rows_of(q, c.q_local_row, len),
          cp::rows_of(k_shard, c.kv_local_row, len), cp::rows_of(v_shard, c.kv_local_row, len),
          cp::rows_of(out, c.q_local_row, len), cp::rows_of(lse, c.q_local_row, len),
          cp::rows_of(dout, c.q_local_row, len), grads);
      // dQ into the rank's rows, dK / dV into the travelling sums (f32).
      for (const auto& [part, acc, heads, seqlen, row0, d, dt] :
           {std::tuple{&grads.dq, reinterpret_cast<float*>(dq_acc.get()), s.heads_q, L,
                       c.q_local_row, s.head_dim_qk, q.dtype},
            std::tuple{&grads.dk, dk_sum, s.heads_kv, L, c.kv_local_row, s.head_dim_qk, k.dtype},
            std::tuple{&grads.dv, dv_sum, s.heads_kv, L, c.kv_local_row, s.head_dim_v, v.dtype}}) {
        cp::MergeInputs m;
        m.mode = cp::MergeInputs::Mode::Accumulate;
        m.batch = s.batch, m.heads = heads, m.seqlen = len, m.dv = d;
        m.acc = acc;
        m.acc_seqlen = seqlen, m.acc_row0 = row0;
        m.part = *part;
        st.call->merge(m, dt);
      }
      off = 0;
      for (size_t j = 0; j < g.buffer_grads.size(); ++j) {
        cp::MergeInputs m;
        m.mode = cp::MergeInputs::Mode::Accumulate;
        m.batch = 1, m.heads = 1, m.seqlen = buf_numel[j], m.dv = 1;
        m.acc = buf_sums + off;
        m.acc_seqlen = buf_numel[j], m.acc_row0 = 0;
        m.part = scratch_view(part_bufs + off, DType::F32, {1, 1, buf_numel[j], 1}, device);
        st.call->merge(m, DType::F32);
        off += buf_numel[j];
      }
    }
    step_done[ti]->record(compute);
    // The sums travel on: to rank r + 1, and rank r - 1's come in (after the last step, each
    // shard's sums reach their owner).
    step_done[ti]->wait_on(comm_stream);
    const std::string what = fmt::format("the ring backward's dK / dV of step {} ({})", t, peer);
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
    FJ_NCCL(ncclGroupStart, what);
    int64_t off = 0;
    for (size_t j = 0; j < g.buffer_grads.size(); ++j) {
      FJ_NCCL(ncclAllReduce, "the all-reduce of a buffer gradient", buf_sums + off,
              g.buffer_grads[j].second.ref().data, static_cast<size_t>(buf_numel[j]),
              cp::kNcclFloat32, cp::kNcclSum, ci.comm, comm_stream);
      off += buf_numel[j];
    }
    FJ_NCCL(ncclGroupEnd, what);
  }
  sums_out.record(comm_stream);
  sums_out.wait_on(compute);
  acc_ready[static_cast<size_t>(n)]->wait_on(compute);  // the own shard's sums are back
  char* const own = acc_of(n);
  for (const auto& [acc, dst, heads, d, dt] :
       {std::tuple{reinterpret_cast<float*>(dq_acc.get()), &g.dq, s.heads_q, s.head_dim_qk,
                   q.dtype},
        std::tuple{reinterpret_cast<float*>(own), &g.dk, s.heads_kv, s.head_dim_qk, k.dtype},
        std::tuple{reinterpret_cast<float*>(own + dk32), &g.dv, s.heads_kv, s.head_dim_v,
                   v.dtype}}) {
    cp::MergeInputs m;
    m.mode = cp::MergeInputs::Mode::Finalize;
    m.batch = s.batch, m.heads = heads, m.seqlen = L, m.dv = d;
    m.acc = acc;
    m.out = dst->ref();
    st.call->merge(m, dt);
  }
}

}  // namespace

BackwardResult flex_attention_cp_backward(Context& ctx, const NcclCommunicator& comm,
                                          const TensorRef& q, const TensorRef& k,
                                          const TensorRef& v, const TensorRef& out,
                                          const TensorRef& lse, const TensorRef& dout,
                                          const AttentionOptions& options,
                                          const ContextParallelOptions& cpo) {
  const QkvShape s0 = validate_qkv(q, k, v);
  runtime::check_attention_outputs(q, s0, out, &lse);
  if (dout.shape != out.shape || dout.dtype != q.dtype || !dout.is_last_dim_contiguous()) {
    throw RuntimeError(fmt::format(
        "flex_attention_cp_backward: dout is {}; expected out's shape and q's dtype ({}), the "
        "last dim contiguous",
        dout.str(), to_string(q.dtype)));
  }
  const std::unique_ptr<CallSetup> st = begin_call(ctx, comm, q, k, v, options, cpo);
  const QkvShape& s = st->s;
  BackwardResult g;
  g.dq = DeviceTensor::empty(ctx, q.dtype, q.shape);
  g.dk = DeviceTensor::empty(ctx, k.dtype, k.shape);
  g.dv = DeviceTensor::empty(ctx, v.dtype, v.shape);
  // The float buffers' gradients, of their bound shapes (declaration order).
  std::vector<int64_t> buf_numel;
  for (const Buffer& b : options.mods.buffers) {
    if (b.dtype() != DType::F32 && b.dtype() != DType::F16 && b.dtype() != DType::BF16) continue;
    const TensorRef* bound = nullptr;
    for (const auto& [name, t] : options.bindings.buffers)
      if (name == b.name()) bound = &t;
    if (bound == nullptr) {
      throw RuntimeError(fmt::format(
          "flex_attention_cp_backward: the mods' buffer '{}' is not bound (bindings.buffers)",
          b.name()));
    }
    g.buffer_grads.emplace_back(b.name(), DeviceTensor::empty(ctx, DType::F32, bound->shape));
    buf_numel.push_back(bound->numel());
  }
  if (s.batch == 0 || s.heads_q == 0 || s.seqlen_q == 0) return g;
  plan_calls(*st, ctx, options, cpo, q.dtype);
  if (cpo.strategy == CpStrategy::Ring) {
    ring_backward(ctx, *st, q, k, v, out, lse, dout, g, buf_numel);
    return g;
  }
  NcclCommunicator::Impl& ci = *st->ci;
  const cp::Sharding& sh = *st->sh;
  const int n = st->n, device = st->device;
  const CUstream compute = st->compute, comm_stream = st->comm_stream;
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
  gather_kv(*st, k, v, nccl, ordered.bytes());
  const TensorRef k_all =
      scratch_view(ordered.get(), k.dtype, {s.batch, s.heads_kv, S, s.head_dim_qk}, device);
  const TensorRef v_all = scratch_view(ordered.bytes() + n * k_bytes, v.dtype,
                                       {s.batch, s.heads_kv, S, s.head_dim_v}, device);
  float* const dk_seq = reinterpret_cast<float*>(seq_grads.get());
  float* const dv_seq = reinterpret_cast<float*>(seq_grads.bytes() + n * dk32);
  char* const part_dk = parts.bytes();
  char* const part_dv = part_dk + n * k_bytes;
  float* const part_bufs = reinterpret_cast<float*>(part_dv + n * v_bytes);

  std::vector<bool> written(st->sched.q_chunks.size(), false);
  for (size_t i = 0; i < st->sched.calls.size(); ++i) {
    const cp::PairCall& c = st->sched.calls[i];
    const int64_t span = c.kv.length;
    BackwardOutputs grads;
    grads.dq = cp::rows_of(g.dq, c.q_local_row, len);
    grads.dk = scratch_view(part_dk, k.dtype, {s.batch, s.heads_kv, span, s.head_dim_qk}, device);
    grads.dv = scratch_view(part_dv, v.dtype, {s.batch, s.heads_kv, span, s.head_dim_v}, device);
    int64_t off = 0;
    for (size_t j = 0; j < g.buffer_grads.size(); ++j) {
      grads.buffer_grads.emplace_back(
          g.buffer_grads[j].first,
          scratch_view(part_bufs + off, DType::F32, g.buffer_grads[j].second.ref().shape, device));
      off += buf_numel[j];
    }
    st->call->attend_backward(
        c, st->masks[i].get(), cp::rows_of(q, c.q_local_row, len),
        cp::rows_of(k_all, c.kv.start, span), cp::rows_of(v_all, c.kv.start, span),
        cp::rows_of(out, c.q_local_row, len), cp::rows_of(lse, c.q_local_row, len),
        cp::rows_of(dout, c.q_local_row, len), grads);
    written[static_cast<size_t>(c.q_chunk)] = true;
    // The span's dK / dV into the whole sequence's, in f32.
    for (const auto& [part, acc, d, dt] : {std::tuple{&grads.dk, dk_seq, s.head_dim_qk, k.dtype},
                                           std::tuple{&grads.dv, dv_seq, s.head_dim_v, v.dtype}}) {
      cp::MergeInputs m;
      m.mode = cp::MergeInputs::Mode::Accumulate;
      m.batch = s.batch, m.heads = s.heads_kv, m.seqlen = span, m.dv = d;
      m.acc = acc;
      m.acc_seqlen = S, m.acc_row0 = c.kv.start;
      m.part = *part;
      st->call->merge(m, dt);
    }
    // Each buffer gradient as [1, 1, numel, 1] rows of one element.
    off = 0;
    for (size_t j = 0; j < g.buffer_grads.size(); ++j) {
      cp::MergeInputs m;
      m.mode = cp::MergeInputs::Mode::Accumulate;
      m.batch = 1, m.heads = 1, m.seqlen = buf_numel[j], m.dv = 1;
      m.acc = buf_sums + off;
      m.acc_seqlen = buf_numel[j], m.acc_row0 = 0;
      m.part = scratch_view(part_bufs + off, DType::F32, {1, 1, buf_numel[j], 1}, device);
      st->call->merge(m, DType::F32);
      off += buf_numel[j];
    }
  }
  // A query chunk whose every key chunk is masked: dQ 0.
  for (size_t i = 0; i < written.size(); ++i) {
    if (!written[i]) {
      runtime::zero_fill(cp::rows_of(g.dq, static_cast<int64_t>(i) * len, len), compute);
    }
  }
  // dK / dV back into rank-major order and summed over the ranks (each keeps its own chunks);
  // the buffer gradients summed over the ranks.
  const int64_t rows = s.batch * s.heads_kv;
  reorder_chunks(sh, rm_dk, reinterpret_cast<char*>(dk_seq), dk32,
                 static_cast<size_t>(s.head_dim_qk) * sizeof(float), rows, false, compute);
  reorder_chunks(sh, rm_dv, reinterpret_cast<char*>(dv_seq), dv32,
                 static_cast<size_t>(s.head_dim_v) * sizeof(float), rows, false, compute);
  Event reduced_in, reduced;
  reduced_in.record(compute);
  reduced_in.wait_on(comm_stream);
  const std::string what = fmt::format("the backward's reductions (rank {} of {})", st->r, n);
  FJ_NCCL(ncclGroupStart, what);
  FJ_NCCL(ncclReduceScatter, "the reduce-scatter of dK", rm_dk, local_dk, dk32 / sizeof(float),
          cp::kNcclFloat32, cp::kNcclSum, ci.comm, comm_stream);
  FJ_NCCL(ncclReduceScatter, "the reduce-scatter of dV", rm_dv, local_dv, dv32 / sizeof(float),
          cp::kNcclFloat32, cp::kNcclSum, ci.comm, comm_stream);
  int64_t off = 0;
  for (size_t j = 0; j < g.buffer_grads.size(); ++j) {
    FJ_NCCL(ncclAllReduce, "the all-reduce of a buffer gradient", buf_sums + off,
            g.buffer_grads[j].second.ref().data, static_cast<size_t>(buf_numel[j]),
            cp::kNcclFloat32, cp::kNcclSum, ci.comm, comm_stream);
    off += buf_numel[j];
  }
  FJ_NCCL(ncclGroupEnd, what);
  reduced.record(comm_stream);
  reduced.wait_on(compute);
  for (const auto& [acc, dst, d, dt] : {std::tuple{local_dk, &g.dk, s.head_dim_qk, k.dtype},
                                        std::tuple{local_dv, &g.dv, s.head_dim_v, v.dtype}}) {
    cp::MergeInputs m;
    m.mode = cp::MergeInputs::Mode::Finalize;
    m.batch = s.batch, m.heads = s.heads_kv, m.seqlen = s.seqlen_kv, m.dv = d;
    m.acc = reinterpret_cast<float*>(acc);
    m.out = dst->ref();
    st->call->merge(m, dt);
  }
  return g;
}

}  // namespace flexjit
