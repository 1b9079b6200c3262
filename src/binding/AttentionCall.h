// What the forward (Attention.cpp) and the backward (Backward.cpp) check and derive the same way
// from a call's inputs and AttentionOptions.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/tensor.h>

#include "binding/Fp8Descales.h"
#include "device/CudaDriver.h"

#include <cstdint>
#include <vector>

namespace flexjit::runtime {

// RuntimeError unless `t` has `shape`, `dtype`, the device of `like`, a contiguous last dim,
// no negative stride and data when it has elements: "<name> has shape [..]; expected <what> =
// [..]" and the like.
void check_tensor(const char* name, const TensorRef& t, const std::vector<int64_t>& shape,
                  const char* what, DType dtype, const TensorRef& like);

// RuntimeError unless q (and so k, v) is on the context's CUDA device `device_index`.
void check_on_device(const TensorRef& q, int device_index);

// RuntimeError unless the call fits the kernels' launch limits: sequence lengths below 2^31,
// heads and batches within gridDim.y / gridDim.z (65535).
void check_launch_limits(const QkvShape& shape);

// out [B, Hq, Sq, Dv] (attention_out_dtype of q's) and lse [B, Hq, Sq] f32 (may be null) on q's
// device.
void check_attention_outputs(const TensorRef& q, const QkvShape& shape, const TensorRef& out,
                             const TensorRef* lse);

// Zero-length KV: softmax over nothing. out = 0 and lse = -inf (docs/attention.md "Semantics at
// the edges"), written with memsets on `stream`; no kernel.
void write_empty_attention(const TensorRef& out, const TensorRef* lse, CUstream stream);

// RuntimeError unless the block mask was built for these lengths, a batch and head count of 1
// or the call's, and has its kv_* arrays on the device.
void check_block_mask(const DeviceBlockMask& mask, const QkvShape& shape);

// The mods the kernels apply: options.mods, with the block mask's mask_mod when options.mods
// has none (partial tiles must apply the predicate the mask was built from).
Mods effective_mods(const AttentionOptions& options);

// Zeros every element of `t` (any strides with the last dim contiguous) on `stream`: one memset
// when contiguous, else one 2D memset per leading index.
void zero_fill(const TensorRef& t, CUstream stream);

// The descale factors of e4m3 q, k, v (AttentionOptions::descale) as kernels read them:
// RuntimeError naming the factor unless each given one is f32[1] or f32[heads] (q: Hq, k and v:
// Hkv), contiguous, on q's device; and unless q is e4m3 when any is given. None for other dtypes.
Fp8Descales check_descales(const Fp8Descale& d, const TensorRef& q, const QkvShape& s);
// A call on a KV cache takes no descale factors: an e4m3 cache keeps q in bf16 / f16 and carries
// its own per-kv-head scales (KvCache::k_scale / v_scale). RuntimeError naming the factor given.
void check_no_descales_on_kv_cache(const Fp8Descale& d);

}  // namespace flexjit::runtime
