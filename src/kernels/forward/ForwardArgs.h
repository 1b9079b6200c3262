// The forward kernels' argument struct FjFwdArgs (templates/flexjit_abi.h) from a call's
// inputs: shared by every forward variant's launch.
#pragma once

#include <flexjit/block_mask.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/tensor.h>

#include <flexjit_abi.h>

#include <optional>

namespace flexjit::kernels {

// q, k, v, out [B, H, S, D] and lse [B, Hq, Sq] (may be null) as validate_qkv accepted them.
// The block mask is left empty (dense); scale defaults to 1 / sqrt(head_dim_qk).
FjFwdArgs make_fwd_args(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                        const TensorRef& out, const TensorRef* lse, const QkvShape& shape,
                        std::optional<float> scale);

// The device block mask as kernels read it (strides 0 for a broadcast batch / head); its
// full_* pointers only when `with_full_blocks` and the mask has them.
FjBlockMaskArgs block_mask_args(const DeviceBlockMask& mask, bool with_full_blocks);

// The transposed q_* arrays in the kv_* fields (rows are kv blocks, columns q blocks,
// q_block_size the kv block size): the backward's dK/dV kernel walks them (FjBwdArgs::mask_t).
FjBlockMaskArgs transposed_block_mask_args(const DeviceBlockMask& mask, bool with_full_blocks);

// The same from a host mask's shape and the device addresses of its arrays (any may be null).
FjBlockMaskArgs block_mask_args(const BlockMask& meta, const int* kv_num_blocks,
                                const int* kv_indices, const int* full_kv_num_blocks,
                                const int* full_kv_indices);

}  // namespace flexjit::kernels
