// flex_attention on the GPU, as a plan (plan/Plan.h): validate the call, plan its kernel
// (the forward family's variant chosen by the registry), build it through the context's
// KernelBuilder, launch it on the caller's stream. See docs/attention.md.
#include <flexjit/attention.h>
#include <flexjit/block_mask.h>
#include <flexjit/cpu.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>
#include <flexjit/paged_kv.h>

#include "binding/AttentionCall.h"
#include "binding/ModArgs.h"
#include "device/CudaDriver.h"
#include "ir/Visitor.h"
#include "kernels/MathMode.h"
#include "kernels/forward/Forward.h"
#include "passes/RuntimeDivision.h"
#include "plan/ContextImpl.h"
#include "plan/Plan.h"
#include "runtime/BufferCheck.h"
#include "runtime/Decode.h"
#include "runtime/ForwardPlan.h"
#include "tune/StepTuner.h"
#include "util/Log.h"

#include <flexjit_abi.h>
#include <fmt/format.h>

#include <climits>
#include <cmath>
#include <cstdint>

namespace flexjit {

namespace {

// A validated call: what planning needs, and whether there is anything to launch. With
// `check_record` (runtime::DeviceBufferCheck) the mod params carry the buffer checks.
struct ValidatedCall {
  Mods mods;
  runtime::BoundModArgs bound;
  kernels::ForwardInputs inputs;
  bool empty_q = false;   // nothing to write
  bool empty_kv = false;  // out = 0, lse = -inf without a kernel
};

ValidatedCall validate_call(Context& ctx, const TensorRef& q, const TensorRef& k,
                            const TensorRef& v, const TensorRef& out, const TensorRef* lse,
                            const AttentionOptions& options, const QkvShape& s,
                            void* check_record = nullptr) {
  const int device_index = impl_of(ctx).device->index();
  runtime::check_on_device(q, device_index);
  runtime::check_attention_outputs(q, s, out, lse);
  runtime::check_launch_limits(s);
  if (options.block_mask != nullptr) runtime::check_block_mask(*options.block_mask, s);
  ValidatedCall call;
  call.mods = runtime::effective_mods(options);
  // Bindings are checked even when nothing runs, so a mistake shows on the first call.
  const runtime::CallExtents extents = runtime::CallExtents::of(s);
  call.bound = runtime::bind_mod_args(call.mods, options.bindings, TensorRef::Device::CUDA,
                                      device_index, nullptr, &extents);
  call.inputs.mod_params = runtime::pack_mod_params(call.mods, call.bound, check_record);
  call.inputs.q = q;
  call.inputs.k = k;
  call.inputs.v = v;
  call.inputs.out = out;
  if (lse != nullptr) call.inputs.lse = *lse;
  call.inputs.shape = s;
  call.inputs.scale = options.scale;
  call.inputs.block_mask = options.block_mask;
  call.inputs.sm_count = impl_of(ctx).device->sm_count();
  runtime::set_mod_facts(call.inputs, call.mods);
  call.inputs.stream = static_cast<runtime::CuStream>(options.stream);
  call.inputs.descale = runtime::check_descales(options.descale, q, s);
  call.empty_q = s.batch == 0 || s.heads_q == 0 || s.seqlen_q == 0;
  call.empty_kv = s.seqlen_kv == 0;
  return call;
}

}  // namespace

namespace runtime {

void set_mod_facts(kernels::ForwardInputs& in, const Mods& mods) {
  in.mask_mod = mods.mask_mod.defined();
  in.mask_mod_divides = passes::divides_by_runtime_value(mods.mask_mod);
  in.score_mod_reads_kv = ir::reads_var(mods.score_mod, ir::VarKind::KvIdx);
  in.mask_mod_loads_kv = ir::loads_at(mods.mask_mod, ir::VarKind::KvIdx);
}

}  // namespace runtime

namespace {

// Short queries take the split-KV decode plan when it supports the call (runtime/Decode.h),
// the forward otherwise; the choice and its reason are logged under FLEXJIT_LOG=kernels.
runtime::Plan plan_attention(Context& ctx, const ValidatedCall& call,
                             const AttentionOptions& options, const tune::StepTuning& tuning) {
  const QkvShape& s = call.inputs.shape;
  // e4m3 q, k, v run in the forward alone (forward/sm90a_wgmma) at every query length.
  if (s.seqlen_q <= runtime::kDecodeMaxQueries && call.inputs.q.dtype != DType::E4M3) {
    const kernels::ForwardInputs& f = call.inputs;
    const kernels::DecodeInputs in =
        runtime::decode_inputs(f.q, f.k, f.v, f.out, f.lse ? &*f.lse : nullptr, s, options,
                               f.mod_params, impl_of(ctx).device->sm_count());
    const cuda::Arch arch = cuda::Arch::parse(ctx.arch());
    const auto why_not = runtime::decode_unsupported(arch, in, options, /*auto_dispatch=*/true);
    if (!why_not) return runtime::plan_decode(arch, in, call.mods, options, tuning);
    FJ_LOG("kernels", "flex_attention: forward plan for Sq={}: the decode plan cannot serve it: {}",
           s.seqlen_q, *why_not);
  }
  return runtime::plan_forward(cuda::Arch::parse(ctx.arch()), call.inputs, call.mods, options,
                               tuning);
}

// The tuning of a call that plans without launching: a stored winner is looked up (so the plan
// matches what the call itself runs after a search), nothing is searched.
tune::StepTuning lookup_only(Context& ctx, const AttentionOptions& options) {
  tune::StepTuning t = tune::step_tuning(ctx, options.autotune, options.stream);
  if (t.mode == tune::Mode::Search) t.mode = tune::Mode::Cached;
  return t;
}

}  // namespace

kernels::KernelDesc runtime::forward_problem_of(const cuda::Arch& arch,
                                                const kernels::ForwardInputs& in,
                                                const AttentionOptions& options) {
  const QkvShape& s = in.shape;
  const bool full_blocks = in.block_mask != nullptr &&
                           in.block_mask->full_kv_num_blocks.defined() &&
                           in.block_mask->full_kv_indices.defined();
  kernels::KernelDesc problem = kernels::forward_problem(
      arch, in.q.dtype, static_cast<int>(s.head_dim_qk), static_cast<int>(s.head_dim_v),
      static_cast<int>(s.heads_q / s.heads_kv), /*divisible=*/false, full_blocks);
  kernels::set_math_mode(problem, options.math);
  if (in.seq_lens != nullptr || in.page_table != nullptr) {
    kernels::set_kv_cache_flags(problem, in.page_table != nullptr ? in.page_size : 0);
    if (in.k_scale != nullptr) kernels::set_kv_e4m3_flag(problem);
  }
  return problem;
}

runtime::Plan runtime::plan_forward(const cuda::Arch& arch, const kernels::ForwardInputs& in,
                                    const Mods& mods, const AttentionOptions& options,
                                    const tune::StepTuning& tuning) {
  runtime::Plan plan;
  plan.add(runtime::plan_step<kernels::ForwardVariant>(
      forward_problem_of(arch, in, options), in, kernels::forward_facts(in), mods,
      kernels::config_overrides(options.config, kernels::Family::Forward), options.variant,
      tuning));
  return plan;
}

std::optional<std::string> runtime::forward_unsupported(const cuda::Arch& arch,
                                                        const kernels::ForwardInputs& in,
                                                        const AttentionOptions& options) {
  try {
    kernels::Registry::global().complete(
        forward_problem_of(arch, in, options), kernels::forward_facts(in),
        kernels::config_overrides(options.config, kernels::Family::Forward), options.variant);
  } catch (const UnsupportedError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

void flex_attention_into(Context& ctx, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                         const TensorRef& out, const TensorRef* lse,
                         const AttentionOptions& options) {
  if (q.device == TensorRef::Device::CPU) {  // host tensors: the CPU backend (cpu.h)
    flex_attention_cpu_into(q, k, v, out, lse, options);
    return;
  }
  if (options.kv_cache != nullptr) {
    runtime::flex_attention_kv_cache_into(ctx, q, k, v, out, lse, options);
    return;
  }
  const QkvShape s = validate_forward_qkv(q, k, v);
  const runtime::DeviceBufferCheck check(ctx, options.check_buffers,
                                         runtime::effective_mods(options), options.stream);
  const ValidatedCall call = validate_call(ctx, q, k, v, out, lse, options, s, check.record());
  ContextImpl& impl = impl_of(ctx);
  impl.device->make_current();
  if (call.empty_q) return;  // nothing to write
  if (call.empty_kv) {
    if (call.mods.sink_mod.defined()) {
      // Every row is then its sink alone (out 0, lse = sink), which no memset writes.
      throw UnsupportedError(
          "flex_attention with a sink_mod needs Skv >= 1 on the GPU (with Skv = 0 every row's lse "
          "is its sink); the CPU backend runs it");
    }
    runtime::write_empty_attention(out, lse, static_cast<CUstream>(options.stream));
    return;
  }
  runtime::Plan plan =
      plan_attention(ctx, call, options,
                     check.on() ? lookup_only(ctx, options)
                                : tune::step_tuning(ctx, options.autotune, options.stream));
  check.arm(plan);
  const runtime::BuiltPlan built = runtime::build_plan(impl.builder, plan);
  runtime::launch_plan(*impl.device, plan, built, static_cast<runtime::CuStream>(options.stream),
                       options.workspace);
  check.verify(call.mods, call.bound);
}

size_t flex_attention_workspace_bytes(Context& ctx, const TensorRef& q, const TensorRef& k,
                                      const TensorRef& v, const AttentionOptions& options) {
  if (q.device == TensorRef::Device::CPU) {  // the CPU backend takes no workspace
    if (options.kv_cache != nullptr) {
      validate_kv_cache(q, k, v, *options.kv_cache);
    } else {
      validate_forward_qkv(q, k, v);
    }
    return 0;
  }
  if (options.kv_cache != nullptr) {
    return runtime::flex_attention_kv_cache_workspace_bytes(ctx, q, k, v, options);
  }
  const QkvShape s = validate_forward_qkv(q, k, v);
  // A stand-in output with q's layout: the plan does not depend on out's data.
  TensorRef out = TensorRef::contiguous(q.data, attention_out_dtype(q.dtype),
                                        {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v}, q.device,
                                        q.device_index);
  const ValidatedCall call = validate_call(ctx, q, k, v, out, nullptr, options, s);
  if (call.empty_q || call.empty_kv) return 0;
  return plan_attention(ctx, call, options, lookup_only(ctx, options)).workspace_bytes;
}

std::string runtime::describe_forward_plan(Context& ctx, const TensorRef& q, const TensorRef& k,
                                           const TensorRef& v, const AttentionOptions& options) {
  if (options.kv_cache != nullptr) return runtime::describe_kv_cache_plan(ctx, q, k, v, options);
  const QkvShape s = validate_forward_qkv(q, k, v);
  TensorRef out = TensorRef::contiguous(q.data, attention_out_dtype(q.dtype),
                                        {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v}, q.device,
                                        q.device_index);
  const ValidatedCall call = validate_call(ctx, q, k, v, out, nullptr, options, s);
  if (call.empty_q || call.empty_kv) return "(no kernel)";
  return plan_attention(ctx, call, options, lookup_only(ctx, options)).str();
}

AttentionResult flex_attention(Context& ctx, const TensorRef& q, const TensorRef& k,
                               const TensorRef& v, const AttentionOptions& options) {
  const QkvShape s = options.kv_cache != nullptr ? validate_kv_cache(q, k, v, *options.kv_cache).qkv
                                                 : validate_forward_qkv(q, k, v);
  AttentionResult r;
  r.out = DeviceTensor::empty(ctx, attention_out_dtype(q.dtype),
                              {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v});
  if (options.return_lse) {
    r.lse = DeviceTensor::empty(ctx, DType::F32, {s.batch, s.heads_q, s.seqlen_q});
  }
  flex_attention_into(ctx, q, k, v, r.out, options.return_lse ? &r.lse.ref() : nullptr, options);
  return r;
}

}  // namespace flexjit
