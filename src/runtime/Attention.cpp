// flex_attention on the GPU: validation, kernel choice (ForwardSpec), build through the
// context's KernelBuilder, argument packing and launch. See docs/attention.md.
#include <flexjit/attention.h>
#include <flexjit/block_mask.h>
#include <flexjit/cpu.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>

#include "codegen/cuda/ForwardSpec.h"
#include "runtime/ContextImpl.h"
#include "runtime/CudaDriver.h"
#include "runtime/FwdArgs.h"
#include "runtime/ModArgs.h"
#include "tune/Defaults.h"
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

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
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

// The fast path (cp.async, 16-byte vector loads) needs 16-byte aligned rows; the kernel has no
// other path, so anything else is refused rather than computed wrong.
void require_aligned(const QkvShape& s, const TensorRef& out) {
  if (!s.fast_path) {
    throw RuntimeError(fmt::format(
        "the forward kernel needs 16-byte aligned data pointers and strides: {}; make the tensor "
        "contiguous (or pad its rows) first",
        s.fast_path_blocker));
  }
  if (!aligned16(out.data)) {
    throw RuntimeError(
        "the forward kernel needs 16-byte aligned data pointers and strides: data "
        "pointer of out is not 16-byte aligned");
  }
  const int es = dtype_size(out.dtype);
  for (int d = 0; d < 3; ++d) {
    if (out.shape[d] > 1 && (out.strides[d] * es) % 16 != 0) {
      throw RuntimeError(fmt::format(
          "the forward kernel needs 16-byte aligned data pointers and strides: stride of out in "
          "dim {} ({} elements = {} bytes) is not a multiple of 16 bytes",
          d, out.strides[d], out.strides[d] * es));
    }
  }
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

// The block configuration: options.config over the defaults, adjusted (when the caller left
// block_m / block_n open) so that the block mask's sparse block sizes are multiples of them.
cuda::ForwardConfig choose_config(const cuda::ForwardSpec& spec, const BlockConfig& user,
                                  const BlockMask* mask) {
  cuda::ForwardConfig c = tune::default_forward_config(spec);
  if (user.block_m) c.block_m = user.block_m;
  if (user.block_n) c.block_n = user.block_n;
  if (user.num_warps) c.num_warps = user.num_warps;
  if (user.num_stages) c.num_stages = user.num_stages;
  if (mask == nullptr) return c;
  if (mask->q_block_size % c.block_m != 0 && !user.block_m) {
    for (int m : {128, 64}) {
      if (m <= c.block_m && mask->q_block_size % m == 0) {
        c.block_m = m;
        break;
      }
    }
    if (!user.num_warps) c.num_warps = std::min(c.num_warps, c.block_m / 16);
  }
  if (mask->kv_block_size % c.block_n != 0 && !user.block_n) {
    for (int n : {128, 64, 32}) {
      if (n <= c.block_n && mask->kv_block_size % n == 0) {
        c.block_n = n;
        break;
      }
    }
  }
  if (mask->q_block_size % c.block_m != 0 || mask->kv_block_size % c.block_n != 0) {
    throw UnsupportedError(fmt::format(
        "the block mask's sparse blocks ({}x{}) are not multiples of the kernel's {}x{} tiles; "
        "build the mask with a block size that is a multiple of 128 (or of 64 and 32), or pass a "
        "config whose block_m / block_n divide it",
        mask->q_block_size, mask->kv_block_size, c.block_m, c.block_n));
  }
  return c;
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

}  // namespace

void flex_attention_into(Context& ctx, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                         const TensorRef& out, const TensorRef* lse,
                         const AttentionOptions& options) {
  const QkvShape s = validate_qkv(q, k, v);
  if (q.device == TensorRef::Device::CPU) {  // host tensors: the CPU backend (cpu.h)
    flex_attention_cpu_into(q, k, v, out, lse, options);
    return;
  }
  const int device_index = ctx.impl().device->index();
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
  const Mods mods = effective_mods(options);
  // Bindings are checked even when nothing runs, so a mistake shows on the first call.
  const std::vector<uint64_t> mod_params =
      runtime::pack_mod_params(mods, options.bindings, device_index);

  ctx.impl().device->make_current();
  if (s.batch == 0 || s.heads_q == 0 || s.seqlen_q == 0) return;  // nothing to write
  if (s.seqlen_kv == 0) {
    write_empty_kv_result(out, lse, options.stream);
    return;
  }
  require_aligned(s, out);

  cuda::ForwardSpec spec;
  spec.dtype = q.dtype;
  spec.head_dim_qk = static_cast<int>(s.head_dim_qk);
  spec.head_dim_v = static_cast<int>(s.head_dim_v);
  spec.gqa_ratio = static_cast<int>(s.heads_q / s.heads_kv);
  spec.arch = cuda::Arch::parse(ctx.arch());
  const BlockMask* mask_meta = options.block_mask ? &options.block_mask->meta() : nullptr;
  spec.config = choose_config(spec, options.config, mask_meta);
  spec.is_divisible =
      s.seqlen_q % spec.config.block_m == 0 && s.seqlen_kv % spec.config.block_n == 0;
  spec.has_full_blocks = options.block_mask != nullptr &&
                         options.block_mask->full_kv_num_blocks.defined() &&
                         options.block_mask->full_kv_indices.defined();
  spec.validate();

  const BuiltKernel built = ctx.impl().builder.build_forward(mods, spec);
  const runtime::Kernel kernel = ctx.impl().load(built.compiled);

  FjFwdArgs a = runtime::make_fwd_args(q, k, v, out, lse, s, options.scale);
  if (options.block_mask != nullptr) {
    const DeviceBlockMask& d = *options.block_mask;
    BlockMaskDevicePointers ptrs;
    ptrs.kv_num_blocks = static_cast<const int*>(d.kv_num_blocks.ref().data);
    ptrs.kv_indices = static_cast<const int*>(d.kv_indices.ref().data);
    if (spec.has_full_blocks) {
      ptrs.full_kv_num_blocks = static_cast<const int*>(d.full_kv_num_blocks.ref().data);
      ptrs.full_kv_indices = static_cast<const int*>(d.full_kv_indices.ref().data);
    }
    fill_block_mask_args(*mask_meta, ptrs, &a.mask);
  }

  const unsigned smem = static_cast<unsigned>(
      fj_forward_smem_bytes(spec.config.block_m, spec.config.block_n, spec.head_dim_qk,
                            spec.head_dim_v, dtype_size(spec.dtype), spec.config.num_stages));
  runtime::Dim3 grid{
      static_cast<unsigned>((s.seqlen_q + spec.config.block_m - 1) / spec.config.block_m),
      static_cast<unsigned>(s.heads_q), static_cast<unsigned>(s.batch)};
  runtime::Dim3 block{static_cast<unsigned>(spec.config.num_warps * 32), 1, 1};
  void* args[] = {&a, const_cast<uint64_t*>(mod_params.data())};
  FJ_LOG("runtime", "flex_attention: {} grid ({}, {}, {}) smem {} ({})", spec.str(), grid.x, grid.y,
         grid.z, smem, jit::to_string(built.compiled.outcome));
  runtime::launch(kernel, grid, block, smem, static_cast<runtime::CuStream>(options.stream), args);
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
