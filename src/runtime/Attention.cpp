// flex_attention on the GPU, as a plan (runtime/Plan.h): validate the call, plan its kernel
// (the forward family's variant chosen by the registry), build it through the context's
// KernelBuilder, launch it on the caller's stream. See docs/attention.md.
#include <flexjit/attention.h>
#include <flexjit/block_mask.h>
#include <flexjit/cpu.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>

#include "kernels/forward/Forward.h"
#include "runtime/ContextImpl.h"
#include "runtime/CudaDriver.h"
#include "runtime/ForwardPlan.h"
#include "runtime/ModArgs.h"
#include "runtime/Plan.h"
#include "util/Log.h"

#include <flexjit_abi.h>
#include <fmt/format.h>

#include <climits>
#include <cmath>
#include <cstdint>

namespace flexjit {

namespace {

constexpr int64_t kMaxGridYZ = 65535;  // gridDim.y / gridDim.z limit (heads, batch)

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

// out [B, Hq, Sq, Dv] (dtype of q) and lse [B, Hq, Sq] f32 on the context's device.
void validate_outputs(const TensorRef& q, const QkvShape& s, const TensorRef& out,
                      const TensorRef* lse) {
  const std::vector<int64_t> out_shape = {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v};
  if (out.shape != out_shape) {
    throw RuntimeError(fmt::format("out has shape {}; expected [B, Hq, Sq, Dv] = {}",
                                   shape_str(out.shape), shape_str(out_shape)));
  }
  if (out.strides.size() != out.shape.size()) {
    throw RuntimeError(fmt::format("out has {} strides for 4 dims", out.strides.size()));
  }
  if (out.dtype != q.dtype) {
    throw RuntimeError(fmt::format("out has dtype {}; expected the dtype of q, {}",
                                   to_string(out.dtype), to_string(q.dtype)));
  }
  if (out.device != q.device || out.device_index != q.device_index) {
    throw RuntimeError(fmt::format("out is on {} but q is on {}",
                                   to_string(out.device, out.device_index),
                                   to_string(q.device, q.device_index)));
  }
  if (!out.is_last_dim_contiguous()) {
    throw RuntimeError(
        fmt::format("last dim of out is not contiguous (stride {})", out.strides[3]));
  }
  for (int d = 0; d < 4; ++d) {
    if (out.strides[d] < 0) {
      throw RuntimeError(
          fmt::format("out has a negative stride in dim {} ({})", d, out.strides[d]));
    }
  }
  if (out.data == nullptr && out.numel() > 0) throw RuntimeError("out has a null data pointer");
  if (lse == nullptr) return;
  const std::vector<int64_t> lse_shape = {s.batch, s.heads_q, s.seqlen_q};
  if (lse->shape != lse_shape) {
    throw RuntimeError(fmt::format("lse has shape {}; expected [B, Hq, Sq] = {}",
                                   shape_str(lse->shape), shape_str(lse_shape)));
  }
  if (lse->strides.size() != 3) {
    throw RuntimeError(fmt::format("lse has {} strides for 3 dims", lse->strides.size()));
  }
  if (lse->dtype != DType::F32) {
    throw RuntimeError(fmt::format("lse has dtype {}; expected f32", to_string(lse->dtype)));
  }
  if (lse->device != q.device || lse->device_index != q.device_index) {
    throw RuntimeError(fmt::format("lse is on {} but q is on {}",
                                   to_string(lse->device, lse->device_index),
                                   to_string(q.device, q.device_index)));
  }
  if (!lse->is_last_dim_contiguous()) {
    throw RuntimeError(
        fmt::format("last dim of lse is not contiguous (stride {})", lse->strides[2]));
  }
  if (lse->strides[0] < 0 || lse->strides[1] < 0) {
    throw RuntimeError("lse has a negative stride");
  }
  if (lse->data == nullptr && lse->numel() > 0) throw RuntimeError("lse has a null data pointer");
}

CUstream as_stream(void* s) {
  return static_cast<CUstream>(s);
}

// Zero-length KV: softmax over nothing. out = 0 and lse = -inf (DESIGN.md "Semantics at the
// edges"), written with memsets on the stream; no kernel.
void write_empty_kv_result(const TensorRef& out, const TensorRef* lse, void* stream) {
  const CUstream st = as_stream(stream);
  const int64_t B = out.shape[0], H = out.shape[1], S = out.shape[2], D = out.shape[3];
  const int es = dtype_size(out.dtype);
  if (out.numel() > 0) {
    if (out.is_contiguous()) {
      FJ_CU(cuMemsetD8Async, "out", reinterpret_cast<CUdeviceptr>(out.data), 0,
            static_cast<size_t>(out.numel()) * es, st);
    } else {
      // One 2D memset per (b, h): S rows of D elements, pitch = the row stride.
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < H; ++h) {
          auto* base =
              static_cast<char*>(out.data) + (b * out.strides[0] + h * out.strides[1]) * es;
          const size_t pitch = S > 1 ? static_cast<size_t>(out.strides[2]) * es : D * es;
          FJ_CU(cuMemsetD2D8Async, "out", reinterpret_cast<CUdeviceptr>(base), pitch, 0,
                static_cast<size_t>(D) * es, static_cast<size_t>(S), st);
        }
      }
    }
  }
  if (lse == nullptr || lse->numel() == 0) return;
  constexpr unsigned kNegInfBits = 0xff800000u;
  if (lse->is_contiguous()) {
    FJ_CU(cuMemsetD32Async, "lse", reinterpret_cast<CUdeviceptr>(lse->data), kNegInfBits,
          static_cast<size_t>(lse->numel()), st);
    return;
  }
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      auto* base = static_cast<float*>(lse->data) + b * lse->strides[0] + h * lse->strides[1];
      FJ_CU(cuMemsetD32Async, "lse", reinterpret_cast<CUdeviceptr>(base), kNegInfBits,
            static_cast<size_t>(S), st);
    }
  }
}

void check_block_mask(const DeviceBlockMask& dbm, const QkvShape& s) {
  const BlockMask& m = dbm.meta();
  if (m.seqlen_q != s.seqlen_q || m.seqlen_kv != s.seqlen_kv) {
    throw RuntimeError(
        fmt::format("the block mask was built for Sq={}, Skv={} but the inputs have Sq={}, Skv={}",
                    m.seqlen_q, m.seqlen_kv, s.seqlen_q, s.seqlen_kv));
  }
  if (m.batch != 1 && m.batch != s.batch) {
    throw RuntimeError(
        fmt::format("the block mask has batch {}; expected 1 or B={}", m.batch, s.batch));
  }
  if (m.heads != 1 && m.heads != s.heads_q) {
    throw RuntimeError(
        fmt::format("the block mask has {} heads; expected 1 or Hq={}", m.heads, s.heads_q));
  }
  if (!dbm.kv_num_blocks.defined() || !dbm.kv_indices.defined()) {
    throw RuntimeError("the block mask has no kv_num_blocks / kv_indices on the device");
  }
}

// The mods the kernel applies: options.mods, with the block mask's mask_mod when options.mods
// has none (partial tiles must apply the predicate the mask was built from).
Mods effective_mods(const AttentionOptions& o) {
  if (o.mods.mask_mod.defined() || o.block_mask == nullptr) return o.mods;
  const Mods& from_mask = o.block_mask->meta().mods;
  if (!from_mask.mask_mod.defined()) return o.mods;
  // Only the mask_mod (and what it captures): a score_mod the mask was built alongside is not
  // the caller's to apply.
  const Expr mask = from_mask.mask_mod;
  Mods m = Mods::from_mask([&](Expr, Expr, Expr, Expr) { return mask; });
  m.name = from_mask.name;
  if (!o.mods.score_mod.defined() && o.mods.buffers.empty() && o.mods.params.empty()) return m;
  return combine(o.mods, m);
}

// A validated call: what planning needs, and whether there is anything to launch.
struct ValidatedCall {
  Mods mods;
  kernels::ForwardInputs inputs;
  bool empty_q = false;   // nothing to write
  bool empty_kv = false;  // out = 0, lse = -inf without a kernel
};

ValidatedCall validate_call(Context& ctx, const TensorRef& q, const TensorRef& k,
                            const TensorRef& v, const TensorRef& out, const TensorRef* lse,
                            const AttentionOptions& options, const QkvShape& s) {
  const int device_index = impl_of(ctx).device->index();
  if (q.device != TensorRef::Device::CUDA || q.device_index != device_index) {
    throw RuntimeError(fmt::format("q, k and v are on {}; the context's device is {}",
                                   to_string(q.device, q.device_index),
                                   to_string(TensorRef::Device::CUDA, device_index)));
  }
  validate_outputs(q, s, out, lse);
  if (s.seqlen_q > INT_MAX || s.seqlen_kv > INT_MAX) {
    throw RuntimeError(fmt::format("sequence lengths must be below 2^31 (Sq={}, Skv={})",
                                   s.seqlen_q, s.seqlen_kv));
  }
  if (s.heads_q > kMaxGridYZ || s.batch > kMaxGridYZ) {
    throw RuntimeError(fmt::format("at most {} heads and {} batches per call (Hq={}, B={})",
                                   kMaxGridYZ, kMaxGridYZ, s.heads_q, s.batch));
  }
  if (options.block_mask != nullptr) check_block_mask(*options.block_mask, s);
  ValidatedCall call;
  call.mods = effective_mods(options);
  // Bindings are checked even when nothing runs, so a mistake shows on the first call.
  call.inputs.mod_params = runtime::pack_mod_params(call.mods, options.bindings, device_index);
  call.inputs.q = q;
  call.inputs.k = k;
  call.inputs.v = v;
  call.inputs.out = out;
  if (lse != nullptr) call.inputs.lse = *lse;
  call.inputs.shape = s;
  call.inputs.scale = options.scale;
  call.inputs.block_mask = options.block_mask;
  call.empty_q = s.batch == 0 || s.heads_q == 0 || s.seqlen_q == 0;
  call.empty_kv = s.seqlen_kv == 0;
  return call;
}

// One forward step: the registry's variant for this arch and these inputs (or the one named in
// options.variant), its config resolved from options.config.
runtime::Plan plan_forward(Context& ctx, const ValidatedCall& call, const AttentionOptions& options,
                           const tune::StepTuning& tuning) {
  const QkvShape& s = call.inputs.shape;
  const bool full_blocks = options.block_mask != nullptr &&
                           options.block_mask->full_kv_num_blocks.defined() &&
                           options.block_mask->full_kv_indices.defined();
  const kernels::KernelDesc problem = kernels::forward_problem(
      cuda::Arch::parse(ctx.arch()), call.inputs.q.dtype, static_cast<int>(s.head_dim_qk),
      static_cast<int>(s.head_dim_v), static_cast<int>(s.heads_q / s.heads_kv),
      /*divisible=*/false, full_blocks);
  runtime::Plan plan;
  plan.add(runtime::plan_step<kernels::ForwardVariant>(
      problem, call.inputs, kernels::forward_facts(call.inputs), call.mods,
      kernels::config_overrides(options.config), options.variant, tuning));
  return plan;
}

// The tuning of a call that plans without launching: a stored winner is looked up (so the plan
// matches what the call itself runs after a search), nothing is searched.
tune::StepTuning lookup_only(Context& ctx, const AttentionOptions& options) {
  tune::StepTuning t = tune::step_tuning(ctx, options.autotune, options.stream);
  if (t.mode == tune::Mode::Search) t.mode = tune::Mode::Cached;
  return t;
}

}  // namespace

void flex_attention_into(Context& ctx, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                         const TensorRef& out, const TensorRef* lse,
                         const AttentionOptions& options) {
  const QkvShape s = validate_qkv(q, k, v);
  if (q.device == TensorRef::Device::CPU) {  // host tensors: the CPU backend (cpu.h)
    flex_attention_cpu_into(q, k, v, out, lse, options);
    return;
  }
  const ValidatedCall call = validate_call(ctx, q, k, v, out, lse, options, s);
  ContextImpl& impl = impl_of(ctx);
  impl.device->make_current();
  if (call.empty_q) return;  // nothing to write
  if (call.empty_kv) {
    write_empty_kv_result(out, lse, options.stream);
    return;
  }
  const runtime::Plan plan =
      plan_forward(ctx, call, options, tune::step_tuning(ctx, options.autotune, options.stream));
  const runtime::BuiltPlan built = runtime::build_plan(impl.builder, plan);
  runtime::launch_plan(*impl.device, plan, built, static_cast<runtime::CuStream>(options.stream),
                       options.workspace);
}

size_t flex_attention_workspace_bytes(Context& ctx, const TensorRef& q, const TensorRef& k,
                                      const TensorRef& v, const AttentionOptions& options) {
  const QkvShape s = validate_qkv(q, k, v);
  if (q.device == TensorRef::Device::CPU) return 0;
  // A stand-in output with q's layout: the plan does not depend on out's data.
  TensorRef out = TensorRef::contiguous(
      q.data, q.dtype, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v}, q.device, q.device_index);
  const ValidatedCall call = validate_call(ctx, q, k, v, out, nullptr, options, s);
  if (call.empty_q || call.empty_kv) return 0;
  return plan_forward(ctx, call, options, lookup_only(ctx, options)).workspace_bytes;
}

std::string runtime::describe_forward_plan(Context& ctx, const TensorRef& q, const TensorRef& k,
                                           const TensorRef& v, const AttentionOptions& options) {
  const QkvShape s = validate_qkv(q, k, v);
  TensorRef out = TensorRef::contiguous(
      q.data, q.dtype, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v}, q.device, q.device_index);
  const ValidatedCall call = validate_call(ctx, q, k, v, out, nullptr, options, s);
  if (call.empty_q || call.empty_kv) return "(no kernel)";
  return plan_forward(ctx, call, options, lookup_only(ctx, options)).str();
}

AttentionResult flex_attention(Context& ctx, const TensorRef& q, const TensorRef& k,
                               const TensorRef& v, const AttentionOptions& options) {
  const QkvShape s = validate_qkv(q, k, v);
  AttentionResult r;
  r.out = DeviceTensor::empty(ctx, q.dtype, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v});
  if (options.return_lse) {
    r.lse = DeviceTensor::empty(ctx, DType::F32, {s.batch, s.heads_q, s.seqlen_q});
  }
  flex_attention_into(ctx, q, k, v, r.out, options.return_lse ? &r.lse.ref() : nullptr, options);
  return r;
}

}  // namespace flexjit
