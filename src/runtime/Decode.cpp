// flex_attention's decode path: validate (paged_kv.h's validate_kv_cache, the outputs, the
// bindings), plan split + combine on one workspace, build, launch. docs/kernels/decode.md.
#include "runtime/Decode.h"

#include <flexjit/device_block_mask.h>
#include <flexjit/device_tensor.h>
#include <flexjit/error.h>

#include "binding/AttentionCall.h"
#include "binding/KvCache.h"
#include "binding/ModArgs.h"
#include "device/CudaDriver.h"
#include "device/ModuleCache.h"
#include "kernels/MathMode.h"
#include "kernels/decode/DecodeCombine.h"
#include "kernels/decode/DecodeSplit.h"
#include "kernels/forward/Forward.h"
#include "plan/ContextImpl.h"
#include "runtime/BufferCheck.h"
#include "runtime/ForwardPlan.h"
#include "util/Log.h"

#include <fmt/format.h>

#include <climits>
#include <cstdint>

namespace flexjit::runtime {

namespace {

kernels::KernelDesc split_problem(const cuda::Arch& arch, const kernels::DecodeInputs& in,
                                  MathMode math) {
  const int64_t gqa = in.heads_q / in.heads_kv;
  const bool full_blocks = in.block_mask != nullptr &&
                           in.block_mask->full_kv_num_blocks.defined() &&
                           in.block_mask->full_kv_indices.defined();
  kernels::KernelDesc d = kernels::decode_split_problem(
      arch, in.q.dtype, static_cast<int>(in.head_dim_qk), static_cast<int>(in.head_dim_v),
      static_cast<int>(gqa), kernels::decode_rows(gqa, in.seqlen_q), in.page_size, full_blocks,
      in.kv_fp8);
  kernels::set_math_mode(d, math);
  return d;
}

// A step of variant family V with a complete description (the combine that the tuner runs after
// each split candidate, with that candidate's split count).
template <typename V>
PlanStep make_step(const kernels::KernelDesc& desc, const kernels::Selection& sel,
                   const kernels::DecodeInputs& in, const Mods& mods) {
  const V& variant = kernels::variant_as<V>(kernels::Registry::global(), desc);
  PlanStep step;
  step.desc = desc;
  step.selection = sel;
  step.mods = mods;
  step.workspace_bytes = variant.workspace_bytes(desc, in);
  step.launches = [&variant, desc, in](void* ws) { return variant.launches(desc, in, ws); };
  return step;
}

// One int32 of a device tensor (the stream has been synchronized).
int read_int(const TensorRef& t, int64_t offset, const char* what) {
  int v = 0;
  FJ_CU(cuMemcpyDtoH, what, &v,
        reinterpret_cast<CUdeviceptr>(static_cast<const int*>(t.data) + offset), sizeof(int));
  return v;
}

}  // namespace

std::optional<std::string> decode_unsupported(const cuda::Arch& arch,
                                              const kernels::DecodeInputs& in,
                                              const AttentionOptions& options, bool auto_dispatch) {
  if (auto_dispatch) {
    if (!options.variant.empty()) {
      return fmt::format("the call names the forward variant '{}'", options.variant);
    }
    if (options.config.block_m != 0) {
      return fmt::format("the call sets block_m = {}, a forward config", options.config.block_m);
    }
    if (in.seqlen_q > kDecodeMaxQueries) {
      return fmt::format("Sq = {} is more than the {} query tokens the decode plan is for",
                         in.seqlen_q, kDecodeMaxQueries);
    }
  }
  const int64_t gqa = in.heads_q / in.heads_kv;
  const int rows = kernels::decode_rows(gqa, in.seqlen_q);
  const int64_t grid_y = in.heads_kv * kernels::decode_row_groups(gqa, in.seqlen_q, rows);
  if (grid_y > kMaxGridDimYZ || in.batch > kMaxGridDimYZ) {
    return fmt::format(
        "the decode grid needs Hkv x row groups = {} and B = {} CTAs along y and z; at most {}",
        grid_y, in.batch, kMaxGridDimYZ);
  }
  if (in.block_mask != nullptr && in.block_mask->meta().heads > 1 && gqa > 1) {
    return fmt::format(
        "the block mask differs per head ({} heads) while the decode kernel runs the {} q heads "
        "of a GQA group together; build the mask with heads = 1 (or use Hq = Hkv)",
        in.block_mask->meta().heads, gqa);
  }
  try {
    // The whole description, config included: a caller's block_n / num_warps / num_stages that
    // the decode kernel cannot take is a reason too (the forward may take them).
    kernels::Registry::global().complete(
        split_problem(arch, in, options.math), kernels::decode_facts(in),
        kernels::config_overrides(options.config, kernels::Family::DecodeSplit),
        auto_dispatch ? std::string_view{} : options.variant);
  } catch (const UnsupportedError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

Plan plan_decode(const cuda::Arch& arch, kernels::DecodeInputs in, const Mods& mods,
                 const AttentionOptions& options, const tune::StepTuning& tuning) {
  const kernels::Registry& reg = kernels::Registry::global();
  const kernels::InputFacts facts = kernels::decode_facts(in);
  const kernels::KernelDesc combine_problem =
      kernels::decode_combine_problem(arch, in.q.dtype, static_cast<int>(in.head_dim_v));
  // The split's candidates are timed and checked with the untuned combine after each: their
  // partials differ in number (num_splits), only the combined out and LSE compare.
  kernels::Selection combine_sel;
  const kernels::KernelDesc combine_default =
      reg.complete(combine_problem, facts, {}, {}, &combine_sel);
  tune::StepTuning split_tuning = tuning;
  if (tuning.active()) {
    // The best split count follows the grid of one split (batch x kv heads x row groups).
    const int64_t gqa = in.heads_q / in.heads_kv;
    const int64_t ctas =
        in.batch * in.heads_kv *
        kernels::decode_row_groups(gqa, in.seqlen_q, kernels::decode_rows(gqa, in.seqlen_q));
    int64_t bucket = 1;
    while (bucket < ctas)
      bucket *= 2;
    split_tuning.bucket_extra = fmt::format("ctas{}", bucket);
    // The split step's slice is the first of the plan's workspace.
    if (options.workspace.data != nullptr) split_tuning.workspace_limit = options.workspace.bytes;
    split_tuning.after = [&](const kernels::KernelDesc& split) {
      kernels::DecodeInputs with = in;
      with.num_splits = kernels::resolve_num_splits(split, in);
      return std::vector<tune::CompanionStep>{tune::companion_of(
          make_step<kernels::DecodeCombineVariant>(combine_default, combine_sel, with, mods))};
    };
  }
  PlanStep split_step = plan_step<kernels::DecodeSplitVariant>(
      split_problem(arch, in, options.math), in, facts, mods,
      kernels::config_overrides(options.config, kernels::Family::DecodeSplit), options.variant,
      split_tuning);
  in.num_splits = kernels::resolve_num_splits(split_step.desc, in);
  FJ_LOG("kernels", "flex_attention: decode plan, {} split(s) of the KV range (Sq={}, Skv={}{})",
         in.num_splits, in.seqlen_q, in.seqlen_kv,
         in.page_table != nullptr ? fmt::format(", pages of {}", in.page_size) : "");
  tune::StepTuning combine_tuning = tuning;
  if (tuning.active()) combine_tuning.before = tune::companion_of(split_step);
  PlanStep combine_step = plan_step<kernels::DecodeCombineVariant>(combine_problem, in, facts, mods,
                                                                   {}, {}, combine_tuning);
  combine_step.workspace_of = 0;
  Plan plan;
  plan.add(std::move(split_step));
  plan.add(std::move(combine_step));
  return plan;
}

kernels::DecodeInputs decode_inputs(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                                    const TensorRef& out, const TensorRef* lse, const QkvShape& s,
                                    const AttentionOptions& options,
                                    std::vector<uint64_t> mod_params, int sm_count) {
  kernels::DecodeInputs in;
  in.q = q;
  in.k = k;
  in.v = v;
  in.out = out;
  if (lse != nullptr) in.lse = *lse;
  in.batch = s.batch;
  in.heads_q = s.heads_q;
  in.heads_kv = s.heads_kv;
  in.seqlen_q = s.seqlen_q;
  in.seqlen_kv = s.seqlen_kv;
  in.head_dim_qk = s.head_dim_qk;
  in.head_dim_v = s.head_dim_v;
  in.scale = options.scale;
  in.block_mask = options.block_mask;
  in.mod_params = std::move(mod_params);
  in.sm_count = sm_count;
  in.aligned16 = s.fast_path;
  in.alignment_blocker = s.fast_path_blocker;
  kernels::check_aligned16(in.out, "out", in.aligned16, in.alignment_blocker);
  return in;
}

void check_kv_cache_on_device(Context& ctx, const KvCache& cache, const KvCacheShape& shape,
                              DType dtype, void* stream) {
  ContextImpl& impl = impl_of(ctx);
  const cuda::Arch arch = cuda::Arch::parse(ctx.arch());
  kernels::Selection sel;
  const kernels::KernelDesc desc = kernels::Registry::global().complete(
      kernels::decode_combine_problem(arch, dtype, static_cast<int>(shape.qkv.head_dim_v)), {}, {},
      {}, &sel);
  const DeviceTensor result = DeviceTensor::empty(ctx, DType::I32, {2});
  FjDecodeCheckArgs a{};
  a.page_table = shape.paged ? static_cast<const int*>(cache.page_table.data) : nullptr;
  a.page_table_stride_b = shape.paged ? cache.page_table.strides[0] : 0;
  a.seq_lens = static_cast<const int*>(cache.seq_lens.data);
  a.result = static_cast<unsigned long long*>(result.ref().data);
  a.max_pages = shape.paged ? shape.max_pages : 0;
  a.page_size = shape.paged ? shape.page_size : 1;
  a.num_pages = shape.num_pages;
  a.capacity = shape.qkv.seqlen_kv;
  const auto batch = static_cast<unsigned>(shape.qkv.batch);
  PlanStep step;
  step.desc = desc;
  step.selection = sel;
  step.launches = [a, batch](void*) {
    std::vector<kernels::Launch> out(2);
    out[0].entry_point = kernels::DecodeCombineWarpPerRow::kCheckInit;
    out[0].grid = {1, 1, 1};
    out[0].block = {32, 1, 1};
    out[0].args.add(a);
    out[1].entry_point = kernels::DecodeCombineWarpPerRow::kCheckPages;
    out[1].grid = {batch, 1, 1};
    out[1].block = {128, 1, 1};
    out[1].args.add(a);
    return out;
  };
  Plan plan;
  plan.add(std::move(step));
  const BuiltPlan built = build_plan(impl.builder, plan);
  launch_plan(*impl.device, plan, built, static_cast<CuStream>(stream), {});
  FJ_CU(cuStreamSynchronize, "the KV cache check", static_cast<CUstream>(stream));
  unsigned long long key = 0;
  result.copy_to_host(&key);
  if (key == ~0ull) return;
  const auto row = static_cast<unsigned long long>(a.max_pages + 1);
  const auto b = static_cast<int64_t>(key / row);
  const auto slot = static_cast<int64_t>(key % row);
  const int len = read_int(cache.seq_lens, b * cache.seq_lens.strides[0], "seq_lens");
  if (slot == 0) throw RuntimeError(kv_cache_length_error(b, len, shape));
  const int entry = read_int(cache.page_table, b * a.page_table_stride_b + slot - 1, "page_table");
  throw RuntimeError(kv_cache_page_error(b, slot - 1, entry, len, shape));
}

KvCachePlanChoice choose_kv_cache_plan(int64_t seqlen_q,
                                       const std::optional<std::string>& decode_why,
                                       const std::optional<std::string>& forward_why) {
  KvCachePlanChoice c;
  if (seqlen_q <= kDecodeMaxQueries && !decode_why) return c;
  if (!forward_why) {
    c.forward = true;
    c.why = seqlen_q > kDecodeMaxQueries
                ? fmt::format(
                      "chunked prefill: Sq = {} is more than the {} query tokens of the "
                      "decode plan",
                      seqlen_q, kDecodeMaxQueries)
                : fmt::format("the decode plan cannot serve it: {}", *decode_why);
    return c;
  }
  if (!decode_why) {
    c.why = fmt::format("the forward cannot serve it: {}", *forward_why);
    return c;
  }
  throw UnsupportedError(fmt::format(
      "flex_attention on a KV cache: the decode plan cannot serve it: {}; nor can the forward: {}",
      *decode_why, *forward_why));
}

namespace {

// A call on a KV cache, validated, with the plan it takes: the forward on the cache (chunked
// prefill: more than kDecodeMaxQueries query tokens) or the decode plan; when the preferred one
// cannot serve the call, the other one if it can (an UnsupportedError with both reasons if
// neither can).
struct KvCacheCall {
  KvCacheShape shape;
  Mods mods;
  BoundModArgs bound;
  kernels::DecodeInputs inputs;
  kernels::ForwardInputs forward;
  bool use_forward = false;
  std::string why;  // the choice, for FLEXJIT_LOG=kernels
};

// The forward inputs of a KV cache call: k and v as they are (pools, or [B, Hkv, Skv, D]); the
// forward's launch reads pool strides as decode_split's does.
kernels::ForwardInputs forward_inputs(const kernels::DecodeInputs& d, const KvCacheShape& shape) {
  kernels::ForwardInputs f;
  f.q = d.q;
  f.k = d.k;
  f.v = d.v;
  f.out = d.out;
  f.lse = d.lse;
  f.shape = shape.qkv;
  f.scale = d.scale;
  f.block_mask = d.block_mask;
  f.mod_params = d.mod_params;
  f.page_table = d.page_table;
  f.page_table_stride_b = d.page_table_stride_b;
  f.page_size = d.page_size;
  f.seq_lens = d.seq_lens;
  if (d.kv_fp8) {
    f.k_scale = d.k_scale;
    f.v_scale = d.v_scale;
  }
  f.sm_count = d.sm_count;
  return f;
}

KvCacheCall validate_kv_cache_call(Context& ctx, const TensorRef& q, const TensorRef& k,
                                   const TensorRef& v, const TensorRef& out, const TensorRef* lse,
                                   const AttentionOptions& options, void* check_record = nullptr) {
  const KvCache& cache = *options.kv_cache;
  KvCacheCall call;
  call.shape = validate_kv_cache(q, k, v, cache);
  check_no_descales_on_kv_cache(options.descale);
  const QkvShape& s = call.shape.qkv;
  ContextImpl& impl = impl_of(ctx);
  const int device_index = impl.device->index();
  check_on_device(q, device_index);
  check_attention_outputs(q, s, out, lse);
  check_launch_limits(s);
  if (options.block_mask != nullptr) check_block_mask(*options.block_mask, s);
  call.mods = effective_mods(options);
  // The lengths live on the device: kv_idx's range is not the host's to check.
  CallExtents extents = CallExtents::of(s);
  extents.seqlen_kv = -1;
  call.bound = bind_mod_args(call.mods, options.bindings, TensorRef::Device::CUDA, device_index,
                             nullptr, &extents);
  call.inputs =
      decode_inputs(q, k, v, out, lse, s, options,
                    pack_mod_params(call.mods, call.bound, check_record), impl.device->sm_count());
  call.inputs.seq_lens = static_cast<const int*>(cache.seq_lens.data);
  if (call.shape.paged) {
    call.inputs.page_table = static_cast<const int*>(cache.page_table.data);
    call.inputs.page_table_stride_b = cache.page_table.strides[0];
    call.inputs.page_size = static_cast<int>(call.shape.page_size);
  }
  if (call.shape.fp8) {
    call.inputs.kv_fp8 = true;
    call.inputs.k_scale = static_cast<const float*>(cache.k_scale.data);
    call.inputs.v_scale = static_cast<const float*>(cache.v_scale.data);
  }
  call.forward = forward_inputs(call.inputs, call.shape);
  // The mods' facts (192-row tiles on a cache read them) and the stream (a block mask's union
  // schedule is kept with the mask only outside a graph capture), as a call without a cache.
  set_mod_facts(call.forward, call.mods);
  call.forward.stream = static_cast<CuStream>(options.stream);
  const cuda::Arch arch = cuda::Arch::parse(ctx.arch());
  // An e4m3 cache: the forward reads it on sm_90a (forward/sm90a_wgmma, flag kv_e4m3); elsewhere
  // the registry's reasons say so, and the decode kernels, which take any Sq, run the call
  // (docs/kernels/decode.md, "FP8 KV caches").
  const std::optional<std::string> forward_why = forward_unsupported(arch, call.forward, options);
  const KvCachePlanChoice choice = choose_kv_cache_plan(
      s.seqlen_q, decode_unsupported(arch, call.inputs, options, false), forward_why);
  call.use_forward = choice.forward;
  call.why = choice.why;
  return call;
}

Plan plan_kv_cache(Context& ctx, const KvCacheCall& call, const AttentionOptions& options,
                   const tune::StepTuning& tuning) {
  const cuda::Arch arch = cuda::Arch::parse(ctx.arch());
  const QkvShape& s = call.shape.qkv;
  if (call.use_forward) {
    FJ_LOG("kernels", "flex_attention: forward plan on the KV cache (Sq={}, capacity {}{}): {}",
           s.seqlen_q, s.seqlen_kv,
           call.shape.paged ? fmt::format(", pages of {}", call.shape.page_size) : "", call.why);
    return plan_forward(arch, call.forward, call.mods, options, tuning);
  }
  if (!call.why.empty()) {
    FJ_LOG("kernels", "flex_attention: decode plan on the KV cache for Sq={}: {}", s.seqlen_q,
           call.why);
  }
  return plan_decode(arch, call.inputs, call.mods, options, tuning);
}

}  // namespace

void flex_attention_kv_cache_into(Context& ctx, const TensorRef& q, const TensorRef& k,
                                  const TensorRef& v, const TensorRef& out, const TensorRef* lse,
                                  const AttentionOptions& options) {
  const DeviceBufferCheck check(ctx, options.check_buffers, effective_mods(options),
                                options.stream);
  const KvCacheCall call = validate_kv_cache_call(ctx, q, k, v, out, lse, options, check.record());
  ContextImpl& impl = impl_of(ctx);
  impl.device->make_current();
  const QkvShape& s = call.shape.qkv;
  if (s.batch == 0 || s.heads_q == 0 || s.seqlen_q == 0) return;
  if (options.kv_cache->check_pages) {
    check_kv_cache_on_device(ctx, *options.kv_cache, call.shape, q.dtype, options.stream);
  }
  if (s.seqlen_kv == 0) {
    if (options.mods.sink_mod.defined()) {
      throw UnsupportedError(
          "decoding with a sink_mod needs a KV capacity of at least one key on the GPU (with none "
          "every row's lse is its sink); the CPU backend runs it");
    }
    write_empty_attention(out, lse, static_cast<CUstream>(options.stream));
    return;
  }
  // A checked call searches no tuning (its kernels are not timed): stored configs or defaults.
  tune::StepTuning tuning = tune::step_tuning(ctx, options.autotune, options.stream);
  if (check.on()) tuning = tune::lookup_only(tuning);
  Plan plan = plan_kv_cache(ctx, call, options, tuning);
  check.arm(plan);
  const BuiltPlan built = build_plan(impl.builder, plan);
  launch_plan(*impl.device, plan, built, static_cast<CuStream>(options.stream), options.workspace);
  check.verify(call.mods, call.bound);
}

std::string describe_kv_cache_plan(Context& ctx, const TensorRef& q, const TensorRef& k,
                                   const TensorRef& v, const AttentionOptions& options) {
  const KvCacheShape shape = validate_kv_cache(q, k, v, *options.kv_cache);
  const QkvShape& s = shape.qkv;
  TensorRef out = TensorRef::contiguous(
      q.data, q.dtype, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v}, q.device, q.device_index);
  const KvCacheCall call = validate_kv_cache_call(ctx, q, k, v, out, nullptr, options);
  if (s.batch == 0 || s.heads_q == 0 || s.seqlen_q == 0 || s.seqlen_kv == 0) return "(no kernel)";
  return plan_kv_cache(ctx, call, options,
                       tune::lookup_only(tune::step_tuning(ctx, options.autotune, options.stream)))
      .str();
}

size_t flex_attention_kv_cache_workspace_bytes(Context& ctx, const TensorRef& q, const TensorRef& k,
                                               const TensorRef& v,
                                               const AttentionOptions& options) {
  const KvCacheShape shape = validate_kv_cache(q, k, v, *options.kv_cache);
  const QkvShape& s = shape.qkv;
  TensorRef out = TensorRef::contiguous(
      q.data, q.dtype, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v}, q.device, q.device_index);
  const KvCacheCall call = validate_kv_cache_call(ctx, q, k, v, out, nullptr, options);
  if (s.batch == 0 || s.heads_q == 0 || s.seqlen_q == 0 || s.seqlen_kv == 0) return 0;
  return plan_kv_cache(ctx, call, options,
                       tune::lookup_only(tune::step_tuning(ctx, options.autotune, options.stream)))
      .workspace_bytes;
}

}  // namespace flexjit::runtime
