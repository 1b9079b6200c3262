// flex_attention_backward on the GPU, as a plan of three kernels (plan/Plan.h): validate the
// call, plan backward_preprocess -> backward_dkdv -> backward_dq (the registry's variants for
// this arch; the last two read the preprocess's workspace slice), build, then zero the buffer
// gradients and launch on the caller's stream. See docs/backward.md.
#include <flexjit/backward.h>
#include <flexjit/error.h>

#include "binding/AttentionCall.h"
#include "binding/ModArgs.h"
#include "codegen/cuda/ModCodegen.h"
#include "kernels/Family.h"
#include "kernels/MathMode.h"
#include "kernels/backward/Backward.h"
#include "kernels/forward/Forward.h"
#include "plan/ContextImpl.h"
#include "plan/Plan.h"
#include "runtime/BackwardPlan.h"
#include "runtime/BufferCheck.h"
#include "tune/StepTuner.h"

#include <fmt/format.h>

#include <climits>
#include <optional>
#include <set>

namespace flexjit {

namespace {

struct ValidatedBackward {
  Mods mods;
  runtime::BoundModArgs bound;
  kernels::BackwardInputs inputs;
  bool empty = false;                   // a zero length or count: gradients are zeros, no kernel
  std::vector<TensorRef> buffer_grads;  // per float buffer, in grad_param_layout order
};

bool is_float(DType d) {
  return d == DType::F32 || d == DType::F16 || d == DType::BF16;
}

// The backward differentiates contiguous K / V; on a KV cache (pools, ragged lengths) it would
// read pools as [B, Hkv, Skv, D] or every key past a sequence's length.
void reject_kv_cache(const AttentionOptions& options) {
  if (options.kv_cache != nullptr) {
    throw UnsupportedError(
        "flex_attention_backward does not take a KV cache (options.kv_cache): its gradients are "
        "for contiguous K / V [B, Hkv, Skv, D] of one length; call it without kv_cache");
  }
}

ValidatedBackward validate_backward(Context& ctx, const TensorRef& q, const TensorRef& k,
                                    const TensorRef& v, const TensorRef& out, const TensorRef& lse,
                                    const TensorRef& dout, const BackwardOutputs& grads,
                                    const AttentionOptions& options,
                                    const BackwardOptions& backward, const QkvShape& s,
                                    void* check_record = nullptr) {
  const int device_index = impl_of(ctx).device->index();
  runtime::check_on_device(q, device_index);
  if (backward.deterministic && backward.dq_mode == BackwardOptions::DqMode::Atomic) {
    throw RuntimeError(
        "BackwardOptions: deterministic = true and dq_mode = Atomic exclude each other: dQ added "
        "with fp32 atomics is not deterministic; use dq_mode = SecondPass or Auto (the second "
        "pass computes dQ without atomics)");
  }
  const std::vector<int64_t> o_shape = {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v};
  const std::vector<int64_t> rows = {s.batch, s.heads_q, s.seqlen_q};
  runtime::check_attention_outputs(q, s, out, &lse);
  runtime::check_tensor("dout", dout, o_shape, "[B, Hq, Sq, Dv]", q.dtype, q);
  if (backward.dlse != nullptr) {
    runtime::check_tensor("dlse", *backward.dlse, rows, "[B, Hq, Sq]", DType::F32, q);
  }
  runtime::check_tensor("dq", grads.dq, q.shape, "the shape of q", q.dtype, q);
  runtime::check_tensor("dk", grads.dk, k.shape, "the shape of k", k.dtype, q);
  runtime::check_tensor("dv", grads.dv, v.shape, "the shape of v", v.dtype, q);
  runtime::check_launch_limits(s);
  if (options.block_mask != nullptr) {
    runtime::check_block_mask(*options.block_mask, s);
    if (!options.block_mask->q_num_blocks.defined() || !options.block_mask->q_indices.defined()) {
      throw RuntimeError(
          "the block mask has no q_num_blocks / q_indices on the device; the backward's dK/dV "
          "kernel walks them (create_block_mask builds them)");
    }
  }
  ValidatedBackward call;
  call.mods = runtime::effective_mods(options);
  const runtime::CallExtents extents = runtime::CallExtents::of(s);
  call.bound = runtime::bind_mod_args(call.mods, options.bindings, TensorRef::Device::CUDA,
                                      device_index, nullptr, &extents);
  const runtime::BoundModArgs& bound = call.bound;
  call.inputs.mod_params = runtime::pack_mod_params(call.mods, bound, check_record);

  // The buffer gradients: one per float buffer, f32 of the bound buffer's shape.
  std::set<std::string> float_names;
  for (const Buffer& b : call.mods.buffers) {
    if (is_float(b.dtype())) float_names.insert(b.name());
  }
  for (const auto& [name, t] : grads.buffer_grads) {
    if (float_names.count(name) == 0) {
      bool declared = false;
      for (const Buffer& b : call.mods.buffers)
        declared = declared || b.name() == name;
      throw RuntimeError(
          declared ? fmt::format("a gradient is given for buffer '{}', an integer or bool buffer; "
                                 "only float buffers have gradients",
                                 name)
                   : fmt::format("a gradient is given for buffer '{}', which the mods '{}' do "
                                 "not declare",
                                 name, call.mods.name));
    }
  }
  const cuda::GradParamLayout layout = cuda::grad_param_layout(call.mods);
  std::vector<uint64_t> packed(static_cast<size_t>(layout.size) / 8, 0);
  auto put = [&](int offset, int64_t value) { packed[static_cast<size_t>(offset) / 8] = value; };
  // Deterministic mode's partial slices hold every float buffer, one after another.
  std::vector<std::vector<int64_t>> slice_shapes;
  for (const cuda::GradParamLayout::Entry& e : layout.entries) {
    const Buffer& buf = call.mods.buffers[static_cast<size_t>(e.buffer_index)];
    const TensorRef& bound_t = *bound.buffers[static_cast<size_t>(e.buffer_index)];
    const TensorRef* given = nullptr;
    for (const auto& [name, t] : grads.buffer_grads) {
      if (name == buf.name()) {
        if (given != nullptr) {
          throw RuntimeError(fmt::format("two gradients are given for buffer '{}'", name));
        }
        given = &t;
      }
    }
    if (given == nullptr) {
      throw RuntimeError(fmt::format(
          "no gradient tensor is given for float buffer '{}' (f32, shape of the bound buffer)",
          buf.name()));
    }
    const std::string what = fmt::format("gradient of buffer '{}'", buf.name());
    runtime::check_tensor(what.c_str(), *given, bound_t.shape, "the bound buffer's shape",
                          DType::F32, q);
    call.buffer_grads.push_back(*given);
    call.inputs.buffer_grads.push_back(*given);
    packed[static_cast<size_t>(e.offset) / 8] = reinterpret_cast<uint64_t>(given->data);
    for (int d = 0; d < e.rank; ++d) {
      put(e.offset + 8 * (1 + d), given->strides[static_cast<size_t>(d)]);
      put(e.offset + 8 * (1 + e.rank + d), bound_t.shape[static_cast<size_t>(d)]);
    }
    int64_t slice_offset = 0;
    for (const std::vector<int64_t>& shape : slice_shapes) {
      int64_t count = 1;
      for (int64_t x : shape)
        count *= x;
      slice_offset += count;
    }
    put(e.slice_offset(), slice_offset);
    slice_shapes.push_back(bound_t.shape);
  }
  call.inputs.deterministic = backward.deterministic;
  call.inputs.sink_grads = cuda::has_sink_grads(call.mods);
  if (layout.partials_offset >= 0) {
    call.inputs.bufgrad_slice_elems = kernels::backward_bufgrad_slice_elems(slice_shapes);
    call.inputs.grad_partials_offset = layout.partials_offset;
    put(layout.partials_offset + 8, call.inputs.bufgrad_slice_elems);
  }
  call.inputs.grad_params = std::move(packed);
  call.inputs.q = q;
  call.inputs.k = k;
  call.inputs.v = v;
  call.inputs.out = out;
  call.inputs.lse = lse;
  call.inputs.dout = dout;
  if (backward.dlse != nullptr) call.inputs.dlse = *backward.dlse;
  call.inputs.dq = grads.dq;
  call.inputs.dk = grads.dk;
  call.inputs.dv = grads.dv;
  call.inputs.shape = s;
  call.inputs.scale = options.scale;
  call.inputs.block_mask = options.block_mask;
  call.empty = s.batch == 0 || s.heads_q == 0 || s.seqlen_q == 0 || s.seqlen_kv == 0;
  return call;
}

// preprocess -> dK/dV -> dQ; the last two read the preprocess's slice of the workspace. The dK/dV
// kernel's config decides how dQ is made: a second pass (backward_dq's auto-selected variant) or
// added by the dK/dV kernel into an accumulator in that slice (then backward_dq/atomic_convert,
// in the accumulator layout of the dK/dV variant, writes dq). With
// `tuning` active, the dK/dV and dQ steps are tuned (docs/tuning.md) on the preprocess's
// workspace, the dQ strategy (dq_atomic) fixed as BackwardOptions::dq_mode or the defaults set it:
// the tiles of each kernel are searched, not the choice between the two plans.
runtime::Plan plan_backward(Context& ctx, ValidatedBackward& call, const AttentionOptions& options,
                            const BackwardOptions& backward, const tune::StepTuning& tuning) {
  const QkvShape& s = call.inputs.shape;
  const bool full_blocks = options.block_mask != nullptr &&
                           options.block_mask->full_kv_num_blocks.defined() &&
                           options.block_mask->full_kv_indices.defined() &&
                           options.block_mask->full_q_num_blocks.defined() &&
                           options.block_mask->full_q_indices.defined();
  const cuda::Arch arch = cuda::Arch::parse(ctx.arch());
  const int64_t bufgrad_smem = kernels::bufgrad_smem_request(
      call.inputs.bufgrad_slice_elems, cuda::has_element_grad_sites(call.mods),
      backward.deterministic);
  auto problem = [&](kernels::Family f) {
    kernels::KernelDesc d = kernels::backward_problem(
        f, arch, call.inputs.q.dtype, static_cast<int>(s.head_dim_qk),
        static_cast<int>(s.head_dim_v), static_cast<int>(s.heads_q / s.heads_kv), full_blocks,
        backward.deterministic);
    // The forward's math mode: the backward recomputes its probabilities against its lse.
    if (f != kernels::Family::BackwardPreprocess) kernels::set_math_mode(d, options.math);
    // Small buffer gradients: a private copy per CTA in shared memory (the variant drops the
    // flag where its config leaves no room).
    if (f == kernels::Family::BackwardDkDv && bufgrad_smem > 0) {
      d.flags.set(kernels::kBufGradSmemFlag, bufgrad_smem);
    }
    return d;
  };
  const kernels::InputFacts facts = kernels::backward_facts(call.inputs);
  // A named variant (options.variant) and the block config apply to the dK/dV and dQ kernels.
  const kernels::Params dq_overrides =
      kernels::config_overrides(options.config, kernels::Family::BackwardDq);
  // dq_atomic is a config of the dK/dV variants that can add dQ themselves (sm80_mma by atomics,
  // sm90a_wgmma by bulk reductions, its default); the key goes into the overrides only where it
  // decides something: a caller's key refuses every variant without it, and the registry would
  // pick the next one (the tuned plan once ran sm80_mma's dK/dV on sm_90a that way: docs/tuning.md,
  // "The backward's dQ strategy").
  kernels::Params dkdv_overrides =
      kernels::config_overrides(options.config, kernels::Family::BackwardDkDv);
  // Atomic: only a variant with dq_atomic = 1 can do it. Deterministic: dQ by the second pass
  // (validate_backward refused dq_mode = Atomic); the registry picks a dK/dV variant that
  // implements the ordered buffer gradients: the problem carries the flag, and a variant without
  // it refuses the problem (sm90a_wgmma says so).
  if (backward.dq_mode == BackwardOptions::DqMode::Atomic) dkdv_overrides.set("dq_atomic", 1);
  if (backward.deterministic) dkdv_overrides.set("dq_atomic", 0);
  const std::string& dkdv_variant = options.variant;
  const kernels::Registry& reg = kernels::Registry::global();
  kernels::KernelDesc dkdv_desc =
      reg.complete(problem(kernels::Family::BackwardDkDv), facts, dkdv_overrides, dkdv_variant);
  // SecondPass: the chosen variant's own choice, unless it would add dQ by atomics.
  if (backward.dq_mode == BackwardOptions::DqMode::SecondPass &&
      dkdv_desc.config.get("dq_atomic").value_or(0) != 0) {
    dkdv_overrides.set("dq_atomic", 0);
    dkdv_desc =
        reg.complete(problem(kernels::Family::BackwardDkDv), facts, dkdv_overrides, dkdv_variant);
  }
  call.inputs.dq_atomic = dkdv_desc.config.get("dq_atomic").value_or(0) == 1;

  runtime::Plan plan;
  plan.add(runtime::plan_step<kernels::BackwardPreprocessVariant>(
      problem(kernels::Family::BackwardPreprocess), call.inputs, facts, call.mods));
  // The tuned steps run on the preprocess's workspace, made again before every candidate run.
  tune::StepTuning on_preprocess = tuning;
  if (tuning.active()) {
    on_preprocess.before = tune::companion_of(plan.steps[0]);
    // The plan's dQ strategy holds for every candidate (the workspace was sized for it), where
    // the variant has the choice.
    if (dkdv_desc.config.has("dq_atomic")) {
      dkdv_overrides.set("dq_atomic", call.inputs.dq_atomic ? 1 : 0);
    }
  }
  runtime::PlanStep dkdv = runtime::plan_step<kernels::BackwardDkDvVariant>(
      problem(kernels::Family::BackwardDkDv), call.inputs, facts, call.mods, dkdv_overrides,
      dkdv_variant, on_preprocess);
  dkdv.workspace_of = 0;
  plan.add(std::move(dkdv));
  // A dK/dV kernel that adds dQ changes the dQ step into the convert of its accumulator (the
  // family record says how: kernels::FamilyInfo::changes_later; manifests warm the same).
  const std::optional<kernels::StepChange> dq_change =
      kernels::Families::global().get(kernels::Family::BackwardDkDv).changes_later(dkdv_desc);
  FJ_ASSERT(dq_change.has_value() == call.inputs.dq_atomic &&
                (!dq_change || dq_change->family == kernels::Family::BackwardDq),
            "the dK/dV step's change of the dQ step disagrees with its dq_atomic");
  runtime::PlanStep dq = dq_change ? runtime::plan_step<kernels::BackwardDqVariant>(
                                         problem(kernels::Family::BackwardDq), call.inputs, facts,
                                         call.mods, dq_change->overrides, dq_change->variant)
                                   : runtime::plan_step<kernels::BackwardDqVariant>(
                                         problem(kernels::Family::BackwardDq), call.inputs, facts,
                                         call.mods, dq_overrides, options.variant, on_preprocess);
  dq.workspace_of = 0;
  plan.add(std::move(dq));
  return plan;
}

}  // namespace

void flex_attention_backward_into(Context& ctx, const TensorRef& q, const TensorRef& k,
                                  const TensorRef& v, const TensorRef& out, const TensorRef& lse,
                                  const TensorRef& dout, const BackwardOutputs& grads,
                                  const AttentionOptions& options,
                                  const BackwardOptions& backward) {
  reject_kv_cache(options);
  const QkvShape s = validate_qkv(q, k, v);
  if (q.device == TensorRef::Device::CPU) {
    throw RuntimeError(
        "flex_attention_backward takes CUDA tensors; q, k and v are on the CPU (the CPU backend's "
        "backward is `flexjit run --device cpu --dout ...`)");
  }
  const runtime::DeviceBufferCheck check(ctx, options.check_buffers,
                                         runtime::effective_mods(options), options.stream);
  ValidatedBackward call =
      validate_backward(ctx, q, k, v, out, lse, dout, grads, options, backward, s, check.record());
  ContextImpl& impl = impl_of(ctx);
  impl.device->make_current();
  const auto stream = static_cast<runtime::CuStream>(options.stream);
  if (call.empty) {  // softmax over nothing, or nothing to differentiate: zero gradients
    for (const TensorRef& g : call.buffer_grads)
      runtime::zero_fill(g, stream);
    runtime::zero_fill(grads.dq, stream);
    runtime::zero_fill(grads.dk, stream);
    runtime::zero_fill(grads.dv, stream);
    return;
  }
  // A checked call searches no tuning (its kernels are not timed): stored configs or defaults.
  tune::StepTuning tuning = tune::step_tuning(ctx, options.autotune, stream);
  if (check.on()) tuning = tune::lookup_only(tuning);
  runtime::Plan plan = plan_backward(ctx, call, options, backward, tuning);
  check.arm(plan);
  const runtime::BuiltPlan built = runtime::build_plan(impl.builder, plan);
  // Atomics add into the buffer gradients (the deterministic reduction overwrites them): they
  // start at zero (after planning, whose tuning runs candidates on these tensors).
  for (const TensorRef& g : call.buffer_grads)
    runtime::zero_fill(g, stream);
  runtime::launch_plan(*impl.device, plan, built, stream, options.workspace);
  check.verify(call.mods, call.bound);
}

BackwardResult flex_attention_backward(Context& ctx, const TensorRef& q, const TensorRef& k,
                                       const TensorRef& v, const TensorRef& out,
                                       const TensorRef& lse, const TensorRef& dout,
                                       const AttentionOptions& options,
                                       const BackwardOptions& backward) {
  reject_kv_cache(options);
  validate_qkv(q, k, v);
  BackwardResult r;
  r.dq = DeviceTensor::empty(ctx, q.dtype, q.shape);
  r.dk = DeviceTensor::empty(ctx, k.dtype, k.shape);
  r.dv = DeviceTensor::empty(ctx, v.dtype, v.shape);
  BackwardOutputs outs{r.dq.ref(), r.dk.ref(), r.dv.ref(), {}};
  // One f32 gradient per float buffer, of the bound buffer's shape.
  const Mods mods = runtime::effective_mods(options);
  for (const Buffer& b : mods.buffers) {
    if (!is_float(b.dtype())) continue;
    for (const auto& [name, t] : options.bindings.buffers) {
      if (name != b.name()) continue;
      r.buffer_grads.emplace_back(name, DeviceTensor::empty(ctx, DType::F32, t.shape));
      outs.buffer_grads.emplace_back(name, r.buffer_grads.back().second.ref());
      break;
    }
  }
  flex_attention_backward_into(ctx, q, k, v, out, lse, dout, outs, options, backward);
  return r;
}

namespace {

// The plan of the backward of q, k, v with stand-ins for its other tensors in the inputs' layouts
// (the plan does not depend on their data); tuned configs looked up, never searched. Empty (no
// steps) when the backward launches no kernel.
runtime::Plan stand_in_backward_plan(Context& ctx, const TensorRef& q, const TensorRef& k,
                                     const TensorRef& v, const AttentionOptions& options,
                                     const BackwardOptions& backward) {
  const QkvShape s = validate_qkv(q, k, v);
  if (s.batch == 0 || s.heads_q == 0 || s.seqlen_q == 0 || s.seqlen_kv == 0) return {};
  const TensorRef out = TensorRef::contiguous(
      q.data, q.dtype, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v}, q.device, q.device_index);
  const TensorRef lse = TensorRef::contiguous(q.data, DType::F32, {s.batch, s.heads_q, s.seqlen_q},
                                              q.device, q.device_index);
  BackwardOutputs grads{q, k, v, {}};
  const Mods mods = runtime::effective_mods(options);
  for (const Buffer& b : mods.buffers) {
    if (!is_float(b.dtype())) continue;
    for (const auto& [name, t] : options.bindings.buffers) {
      if (name == b.name()) {
        grads.buffer_grads.emplace_back(
            name, TensorRef::contiguous(q.data, DType::F32, t.shape, q.device, q.device_index));
      }
    }
  }
  ValidatedBackward call =
      validate_backward(ctx, q, k, v, out, lse, out, grads, options, backward, s);
  return plan_backward(ctx, call, options, backward,
                       tune::lookup_only(tune::step_tuning(ctx, options.autotune, options.stream)));
}

}  // namespace

size_t flex_attention_backward_workspace_bytes(Context& ctx, const TensorRef& q, const TensorRef& k,
                                               const TensorRef& v, const AttentionOptions& options,
                                               const BackwardOptions& backward) {
  reject_kv_cache(options);
  const QkvShape s = validate_qkv(q, k, v);
  if (q.device == TensorRef::Device::CPU) return 0;
  if (s.batch == 0 || s.heads_q == 0 || s.seqlen_q == 0 || s.seqlen_kv == 0) return 0;
  return stand_in_backward_plan(ctx, q, k, v, options, backward).workspace_bytes;
}

size_t flex_attention_backward_prepare(Context& ctx, const TensorRef& q, const TensorRef& k,
                                       const TensorRef& v, const AttentionOptions& options,
                                       const BackwardOptions& backward) {
  reject_kv_cache(options);
  validate_qkv(q, k, v);
  if (q.device == TensorRef::Device::CPU) return 0;
  ContextImpl& impl = impl_of(ctx);
  KernelBuilder& builder = impl.builder;
  if (!builder.background_enabled()) return 0;  // nothing could be queued: skip the planning
  runtime::Plan plan = stand_in_backward_plan(ctx, q, k, v, options, backward);
  // A checked call runs its kernels with the buffer checks.
  if (runtime::DeviceBufferCheck::wanted(options.check_buffers, runtime::effective_mods(options)))
    runtime::DeviceBufferCheck::arm_steps(plan);
  std::vector<OwnedBuildRequest> requests;
  requests.reserve(plan.steps.size());
  for (runtime::PlanStep& step : plan.steps)
    requests.push_back({std::move(step.mods), std::move(step.desc)});
  return builder.build_in_background(std::move(requests));
}

std::string runtime::describe_backward_plan(Context& ctx, const TensorRef& q, const TensorRef& k,
                                            const TensorRef& v, const AttentionOptions& options,
                                            const BackwardOptions& backward) {
  const runtime::Plan plan = stand_in_backward_plan(ctx, q, k, v, options, backward);
  return plan.steps.empty() ? "(no kernel)" : plan.str();
}

}  // namespace flexjit
