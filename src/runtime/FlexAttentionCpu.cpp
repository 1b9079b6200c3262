// flex_attention_cpu, the public CPU API (include/flexjit/cpu.h): checks the call, gathers a KV
// cache (cpu/KvCacheGather.h), builds a CPU block mask for a mask_mod (cpu/JitBlockMask.h) and
// runs the forward kernel (cpu/ForwardKernel.h), in fp32 or the fp64 reference mode.
#include <flexjit/cpu.h>
#include <flexjit/error.h>
#include <flexjit/paged_kv.h>

#include "binding/AttentionCall.h"
#include "binding/ModArgs.h"
#include "cpu/BufferIndexCheck.h"
#include "cpu/ForwardKernel.h"
#include "cpu/JitBlockMask.h"
#include "cpu/KvCacheGather.h"
#include "ir/Evaluate.h"

#include <fmt/format.h>

#include <algorithm>

namespace flexjit {

namespace {

void check_output(const char* what, const TensorRef& t, const std::vector<int64_t>& shape) {
  if (t.device != TensorRef::Device::CPU || t.dtype != DType::F32 || t.shape != shape ||
      !t.is_contiguous() || (t.numel() > 0 && t.data == nullptr)) {
    throw RuntimeError(fmt::format("{} is {}; the CPU backend writes f32[{}] contiguous on cpu",
                                   what, t.str(), fmt::join(shape, ", ")));
  }
}

// An e4m3 tensor [B, H, S, D] (host) dequantized to f32 (contiguous in `buf`): element times its
// head's descale factor (f[h * stride]; null: 1).
TensorRef dequantize(const TensorRef& t, const float* f, int stride, std::vector<float>& buf) {
  buf.resize(static_cast<size_t>(t.numel()));
  const auto* bytes = static_cast<const uint8_t*>(t.data);
  size_t i = 0;
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t h = 0; h < t.shape[1]; ++h) {
      const float scale = f == nullptr ? 1.0f : f[h * stride];
      for (int64_t s = 0; s < t.shape[2]; ++s)
        for (int64_t d = 0; d < t.shape[3]; ++d)
          buf[i++] = ir::e4m3_bits_to_float(bytes[b * t.strides[0] + h * t.strides[1] +
                                                  s * t.strides[2] + d * t.strides[3]]) *
                     scale;
    }
  return TensorRef::contiguous(buf.data(), DType::F32, t.shape);
}

}  // namespace

void flex_attention_cpu_into(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                             const TensorRef& out, const TensorRef* lse,
                             const AttentionOptions& options, const CpuRunOptions& cpu) {
  if (options.kv_cache != nullptr) {  // gathered to contiguous K / V, the lengths as a mask
    const KvCacheShape shape = validate_kv_cache(q, k, v, *options.kv_cache);
    runtime::check_no_descales_on_kv_cache(options.descale);
    for (auto [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
      if (t->device != TensorRef::Device::CPU) {
        throw RuntimeError(
            fmt::format("flex_attention_cpu: {} is on {}; the CPU backend needs CPU tensors", name,
                        to_string(t->device, t->device_index)));
      }
    }
    const QkvShape& s = shape.qkv;
    check_output("out", out, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v});
    const cpu::GatheredKv g = cpu::gather_kv_cache(q, k, v, *options.kv_cache, shape);
    AttentionOptions gathered = cpu::with_length_mask(options, g);
    if (options.check_buffers) {  // kv_idx below each sequence's length, not the longest one's
      options.mods.check();
      const runtime::CallExtents extents{s.batch, s.heads_q, s.heads_kv, s.seqlen_q, g.max_len};
      cpu::check_buffer_indices(
          options.mods,
          runtime::bind_mod_args(options.mods, options.bindings, TensorRef::Device::CPU), extents,
          &g.lengths);
      gathered.check_buffers = false;
    }
    flex_attention_cpu_into(g.q, g.k, g.v, out, lse, gathered, cpu);
    return;
  }
  if (q.dtype == DType::E4M3) {
    // e4m3: the dequantized values (stored value times descale) in f32, then the f32 path.
    const QkvShape s = validate_forward_qkv(q, k, v);
    if (q.device != TensorRef::Device::CPU) {
      throw RuntimeError(
          fmt::format("flex_attention_cpu: q, k and v are on {}; the CPU backend needs CPU tensors",
                      to_string(q.device, q.device_index)));
    }
    const runtime::Fp8Descales d = runtime::check_descales(options.descale, q, s);
    std::vector<float> qf, kf, vf;
    AttentionOptions plain = options;
    plain.descale = {};
    flex_attention_cpu_into(dequantize(q, d.q, d.q_stride, qf), dequantize(k, d.k, d.k_stride, kf),
                            dequantize(v, d.v, d.v_stride, vf), out, lse, plain, cpu);
    return;
  }
  const QkvShape s = cpu::check_cpu_qkv("flex_attention_cpu", q, k, v);
  runtime::check_descales(options.descale, q, s);  // none for f32 / f16 / bf16
  check_output("out", out, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v});
  if (lse != nullptr) check_output("lse", *lse, {s.batch, s.heads_q, s.seqlen_q});
  const Mods& mods = options.mods;
  mods.check();
  if (options.check_buffers) {
    const runtime::CallExtents extents = runtime::CallExtents::of(s);
    cpu::check_buffer_indices(mods,
                              runtime::bind_mod_args(mods, options.bindings, TensorRef::Device::CPU,
                                                     0, nullptr, &extents),
                              extents);
  }

  cpu::CpuForwardOptions fo;
  if (options.scale) fo.scale = *options.scale;
  fo.num_threads = cpu.num_threads;
  BlockMask mask;
  if (mods.mask_mod.defined() && s.seqlen_q > 0 && s.seqlen_kv > 0) {
    mask = cpu::cpu_create_block_mask(mods, options.bindings, s.batch, s.heads_q, s.seqlen_q,
                                      s.seqlen_kv, {128, 128, cpu.num_threads});
    fo.block_mask = &mask;
  }
  const int64_t rows = s.batch * s.heads_q * s.seqlen_q;
  std::vector<float> lse_scratch;
  float* lse_ptr = nullptr;
  if (lse != nullptr) {
    lse_ptr = static_cast<float*>(lse->data);
  } else {
    lse_scratch.resize(static_cast<size_t>(rows));
    lse_ptr = lse_scratch.data();
  }
  float* out_ptr = static_cast<float*>(out.data);
  if (!cpu.reference_f64) {
    cpu::cpu_attention_forward(mods, options.bindings, q, k, v, out_ptr, lse_ptr, fo);
    return;
  }
  std::vector<double> out64(static_cast<size_t>(rows * s.head_dim_v)),
      lse64(static_cast<size_t>(rows));
  cpu::cpu_attention_forward_f64(mods, options.bindings, q, k, v, out64.data(), lse64.data(), fo);
  std::transform(out64.begin(), out64.end(), out_ptr, [](double x) { return float(x); });
  std::transform(lse64.begin(), lse64.end(), lse_ptr, [](double x) { return float(x); });
}

CpuAttentionResult flex_attention_cpu(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                                      const AttentionOptions& options, const CpuRunOptions& cpu) {
  const QkvShape s = options.kv_cache != nullptr ? validate_kv_cache(q, k, v, *options.kv_cache).qkv
                     : q.dtype == DType::E4M3    ? validate_forward_qkv(q, k, v)
                                              : cpu::check_cpu_qkv("flex_attention_cpu", q, k, v);
  CpuAttentionResult r;
  r.shape = {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v};
  r.out.resize(static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q * s.head_dim_v));
  r.lse.resize(static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q));
  const TensorRef out = TensorRef::contiguous(r.out.data(), DType::F32, r.shape);
  const TensorRef lse =
      TensorRef::contiguous(r.lse.data(), DType::F32, {s.batch, s.heads_q, s.seqlen_q});
  flex_attention_cpu_into(q, k, v, out, &lse, options, cpu);
  return r;
}

}  // namespace flexjit
