// FjFwdArgs (templates/flexjit_abi.h) from validated tensors: shared by the forward kernel's
// launch (Attention.cpp) and the naive reference kernel's (ReferenceAttention.cpp).
#pragma once

#include <flexjit/tensor.h>

#include <flexjit_abi.h>

#include <optional>

namespace flexjit::runtime {

// q, k, v, out [B, H, S, D] and lse [B, Hq, Sq] (may be null) as validate_qkv accepted them.
// The block mask is left empty (dense); scale defaults to 1 / sqrt(head_dim_qk).
FjFwdArgs make_fwd_args(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                        const TensorRef& out, const TensorRef* lse, const QkvShape& shape,
                        std::optional<float> scale);

}  // namespace flexjit::runtime
