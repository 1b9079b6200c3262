// flex_attention_cp (include/flexjit/context_parallel.h): one attention over a sequence sharded
// across the ranks of an NCCL communicator (docs/context_parallel.md).
//
// This file: the communicator, the entry points and their checks, and what every call sets up
// before its strategy runs (CallSetup: the streams, the wait for the communicator's previous
// call, the rank's schedule and its pairs' block masks) and a pair's calls (CpCall: attention,
// backward, merge). Every rank follows its cp::schedule_rank, the same schedule the CPU check
// runs (runtime/ContextParallelCpu.cpp). The strategies are in ContextParallelAllGather.cpp and
// ContextParallelRing.cpp; what they share, in ContextParallelGpu.h.
#include "runtime/ContextParallelGpu.h"

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
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace flexjit {

char* NcclCommunicator::Impl::nccl_scratch(size_t bytes) {
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

NcclCommunicator::Impl::~Impl() {
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

namespace cp_gpu {

StreamBuffer::StreamBuffer(size_t bytes, CUstream stream, const char* what) : stream_(stream) {
  if (bytes > 0) FJ_CU(cuMemAllocAsync, what, &ptr_, bytes, stream);
}
StreamBuffer::~StreamBuffer() {
  if (ptr_ != 0) runtime::Driver::get().cuMemFreeAsync_(ptr_, stream_);
}

Event::Event() {
  FJ_CU(cuEventCreate, "a context-parallel event", &e_, CU_EVENT_DISABLE_TIMING);
}
Event::~Event() {
  runtime::Driver::get().cuEventDestroy_(e_);
}
void Event::record(CUstream s) {
  FJ_CU(cuEventRecord, "a context-parallel event", e_, s);
}
void Event::wait_on(CUstream waiter) {
  FJ_CU(cuStreamWaitEvent, "a context-parallel event", waiter, e_, 0);
}

namespace {

bool reads_buffer(const Expr& e) {
  return ir::any_node(e, [](const Expr& n) { return n->op == ir::Op::Load; });
}

}  // namespace

std::shared_ptr<DeviceBlockMask> CpCall::mask_for(const cp::PairCall& call) {
  if (call.kind != cp::PairKind::Partial) return nullptr;
  const Mods& m = shifted;
  const int bm = ir::reads_var(m.mask_mod, ir::VarKind::B) ? static_cast<int>(s.batch) : 1;
  const int hm = ir::reads_var(m.mask_mod, ir::VarKind::H) ? static_cast<int>(s.heads_q) : 1;
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

namespace {

// "step 1 attention q [3072, 4096) x kv [1024, 2048) (full)": a pair's span in the timeline.
std::string pair_name(const char* what, const cp::PairCall& call, cp::Strategy strategy) {
  const std::string step =
      strategy == cp::Strategy::Ring ? fmt::format("step {} ", call.step) : std::string();
  return fmt::format("{}{} q [{}, {}) x kv [{}, {}) ({})", step, what, call.q.start, call.q.end(),
                     call.kv.start, call.kv.end(), to_string(call.kind));
}

cp::Strategy strategy_of(const cp::PairCall& call) {
  return call.kv_rank < 0 ? cp::Strategy::AllGather : cp::Strategy::Ring;
}

}  // namespace

AttentionOptions CpCall::pair_options(const cp::PairCall& call, const DeviceBlockMask* mask) const {
  AttentionOptions o = options;
  o.mods = cp::mods_for_pair(shifted, call.kind);
  o.bindings = cp::with_offsets(options.bindings, o.mods, call.q.start, call.kv.start);
  o.block_mask = mask;
  o.stream = compute;
  o.workspace = {};
  return o;
}

void CpCall::attend(const cp::PairCall& call, const DeviceBlockMask* mask, const TensorRef& q,
                    const TensorRef& k, const TensorRef& v, const TensorRef& out,
                    const TensorRef* lse) {
  const TimedSpan span(timeline, device, compute, CpTimelineSpan::Lane::Compute,
                       [&] { return pair_name("attention", call, strategy_of(call)); });
  flex_attention_into(ctx, q, k, v, out, lse, pair_options(call, mask));
}

void CpCall::attend_backward(const cp::PairCall& call, const DeviceBlockMask* mask,
                             const TensorRef& q, const TensorRef& k, const TensorRef& v,
                             const TensorRef& out, const TensorRef& lse, const TensorRef& dout,
                             const BackwardOutputs& grads) {
  const TimedSpan span(timeline, device, compute, CpTimelineSpan::Lane::Compute,
                       [&] { return pair_name("backward", call, strategy_of(call)); });
  flex_attention_backward_into(ctx, q, k, v, out, lse, dout, grads, pair_options(call, mask));
}

void CpCall::merge(const cp::MergeInputs& in, std::optional<DType> of) {
  const TimedSpan span(timeline, device, compute, CpTimelineSpan::Lane::Compute, [&] {
    const char* mode = in.mode == cp::MergeInputs::Mode::Merge      ? "merge"
                       : in.mode == cp::MergeInputs::Mode::Finalize ? "finalize"
                                                                    : "accumulate";
    return fmt::format("{} [{}, {}, {}, {}]", mode, in.batch, in.heads, in.seqlen, in.dv);
  });
  ContextImpl& impl = impl_of(ctx);
  runtime::Plan plan;
  plan.add(runtime::plan_step<cp::MergeVariant>(
      cp::merge_problem(cuda::Arch::parse(ctx.arch()), of.value_or(dtype), static_cast<int>(in.dv)),
      in, kernels::InputFacts{}, Mods{}));
  const runtime::BuiltPlan built = runtime::build_plan(impl.builder, plan);
  runtime::launch_plan(*impl.device, plan, built, compute, Workspace{});
}

void CpCall::accumulate(const TensorRef& part, float* acc, int64_t acc_seqlen, int64_t row0) {
  cp::MergeInputs m;
  m.mode = cp::MergeInputs::Mode::Accumulate;
  m.batch = part.shape[0], m.heads = part.shape[1], m.seqlen = part.shape[2];
  m.dv = part.shape[3];
  m.acc = acc;
  m.acc_seqlen = acc_seqlen, m.acc_row0 = row0;
  m.part = part;
  merge(m, part.dtype);
}

void CpCall::buffer_grad_views(BackwardOutputs& grads, const BackwardResult& g, float* parts,
                               const std::vector<int64_t>& numel) const {
  int64_t off = 0;
  for (size_t j = 0; j < g.buffer_grads.size(); ++j) {
    grads.buffer_grads.emplace_back(
        g.buffer_grads[j].first,
        scratch_view(parts + off, DType::F32, g.buffer_grads[j].second.ref().shape, device));
    off += numel[j];
  }
}

void CpCall::accumulate_buffer_grads(float* sums, float* parts, const std::vector<int64_t>& numel) {
  // Each buffer gradient as [1, 1, numel, 1]: rows of one element.
  int64_t off = 0;
  for (const int64_t x : numel) {
    accumulate(scratch_view(parts + off, DType::F32, {1, 1, x, 1}, device), sums + off, x, 0);
    off += x;
  }
}

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
  st->timeline = cpo.timeline;
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

void plan_calls(CallSetup& st, Context& ctx, const AttentionOptions& options,
                const ContextParallelOptions& cpo, DType dtype) {
  st.call.reset(new CpCall{ctx, *st.ci, options, *st.sh, st.shifted,
                           cp::known_params(options.mods, options.bindings), st.s, dtype,
                           st.compute, st.device, st.timeline});
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

void CpCall::convert(float* acc, const TensorRef& dst) {
  cp::MergeInputs m;
  m.mode = cp::MergeInputs::Mode::Finalize;
  m.batch = dst.shape[0], m.heads = dst.shape[1], m.seqlen = dst.shape[2], m.dv = dst.shape[3];
  m.acc = acc;
  m.out = dst;
  merge(m, dst.dtype);
}

void all_reduce_buffer_grads(const CallSetup& st, const BackwardResult& g, float* sums,
                             const std::vector<int64_t>& numel) {
  int64_t off = 0;
  for (size_t j = 0; j < g.buffer_grads.size(); ++j) {
    FJ_NCCL(ncclAllReduce, "the all-reduce of a buffer gradient", sums + off,
            g.buffer_grads[j].second.ref().data, static_cast<size_t>(numel[j]), cp::kNcclFloat32,
            cp::kNcclSum, st.ci->comm, st.comm_stream);
    off += numel[j];
  }
}

RecordDone::~RecordDone() {
  std::lock_guard<std::mutex> lock(ci.mu);
  if (runtime::Driver::get().cuEventRecord_(ci.done, compute) == CUDA_SUCCESS) {
    ci.done_recorded = true;
  }
}

}  // namespace cp_gpu

using cp_gpu::begin_call;
using cp_gpu::CallSetup;
using cp_gpu::plan_calls;

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
  if (cpo.strategy == CpStrategy::Ring) {
    cp_gpu::ring_forward(*st, q, k, v, out, lse);
  } else {
    cp_gpu::allgather_forward(*st, q, k, v, out, lse);
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
    cp_gpu::ring_backward(*st, q, k, v, out, lse, dout, g, buf_numel);
  } else {
    cp_gpu::allgather_backward(*st, q, k, v, out, lse, dout, g, buf_numel);
  }
  return g;
}

}  // namespace flexjit
