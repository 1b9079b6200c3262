// The naive GPU reference of flex_attention (templates/reference.cuh): fp32 math with the
// scores of every row materialized in a device workspace, the mask_mod evaluated at every
// position, no block mask, no tiling. Slow and memory hungry (B·Hq·Sq·Skv floats of workspace)
// but independent of the forward kernel's fast path: tests compare against it at shapes too
// large for the CPU reference.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/context.h>

namespace flexjit::runtime {

// out = softmax(score_mod(scale · q kᵀ) masked by mask_mod) · v, as flex_attention_into
// computes it, for q, k, v of f32, f16 or bf16 (any strides, last dim contiguous; no alignment
// requirement). `out` has q's dtype; `lse` may be null. Synchronous: returns when the result is
// written (the workspace is freed). Throws RuntimeError for invalid inputs or bindings.
void reference_attention_into(Context& ctx, const TensorRef& q, const TensorRef& k,
                              const TensorRef& v, const TensorRef& out, const TensorRef* lse,
                              const Mods& mods, const ModBindings& bindings = {},
                              std::optional<float> scale = std::nullopt);

}  // namespace flexjit::runtime
