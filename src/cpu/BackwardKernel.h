// The FlexAttention backward pass on the CPU: dQ, dK, dV and the gradients of the score_mod's
// captured float buffers, in fp32 and in an fp64 reference mode (the FlashAttention backward,
// with the score_mod's derivatives JIT-compiled through LLVM: codegen/llvm/BackwardCodegen.h).
//
// Per (b, h) with S' = score_mod(scale * Q K^T) masked to -inf and P = exp(S' - lse):
//   dP = dO V^T;  D_i = sum(dO_i * O_i);  dS' = P * (dP - D);  dS = dS' * d score_mod / d score
//   dQ = scale * dS K;  dK = scale * dS^T Q;  dV = P^T dO;  grad buf += dS' * d score_mod / d buf
// GQA: dK / dV of kv head g sum over the query heads of its group. Masked entries (P = 0)
// contribute nothing, not even NaN from a derivative evaluated there; a row whose lse is -inf
// (fully masked, or Skv = 0) has zero gradients. Zero-length Q or KV: zero gradients.
//
// Work items are (b, kv head) spread over std::threads, so each item owns its dK / dV rows;
// buffer gradients are accumulated per thread and summed at the end.
#pragma once

#include <flexjit/mods.h>

#include "cpu/ForwardKernel.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace flexjit::cpu {

struct CpuBackwardOptions {
  std::optional<double> scale;  // default 1 / sqrt(D); must equal the forward's
  int num_threads = 0;          // 0: std::thread::hardware_concurrency()
  // The incoming gradient of the lse, [B, Hq, Sq] contiguous (rows as lse), when the loss uses
  // the forward's lse: dS = P * (dP - delta + dlse). Null: none.
  const float* dlse = nullptr;
};

template <typename T>
struct CpuGradients {
  std::vector<T> dq;  // [B, Hq, Sq, D], contiguous
  std::vector<T> dk;  // [B, Hkv, Skv, D]
  std::vector<T> dv;  // [B, Hkv, Skv, Dv]
  // Per captured float buffer (f32 / f16 / bf16) of the mods, by name: contiguous row-major
  // over the bound buffer's shape (zeros where the score_mod never reads it). Integer and bool
  // buffers have no entry.
  std::map<std::string, std::vector<T>> buffers;
};

// fp32 backward. q, k, v as for cpu_attention_forward; out [B, Hq, Sq, Dv] and lse [B, Hq, Sq]
// contiguous, as the fp32 forward writes them; dout [B, Hq, Sq, Dv] of q's dtype, any strides
// (last dim contiguous). Throws RuntimeError for inconsistent shapes (naming the tensor), bad
// bindings or tensors the forward would reject; CompileError if the mods do not type check.
CpuGradients<float> cpu_attention_backward(const Mods& mods, const ModBindings& bindings,
                                           const TensorRef& q, const TensorRef& k,
                                           const TensorRef& v, const float* out, const float* lse,
                                           const TensorRef& dout,
                                           const CpuBackwardOptions& options = {});

// The fp64 reference mode (out / lse from cpu_attention_forward_f64): products, sums and
// gradients in double; the mods and their derivatives in f32 semantics, as in the forward.
CpuGradients<double> cpu_attention_backward_f64(const Mods& mods, const ModBindings& bindings,
                                                const TensorRef& q, const TensorRef& k,
                                                const TensorRef& v, const double* out,
                                                const double* lse, const TensorRef& dout,
                                                const CpuBackwardOptions& options = {});

}  // namespace flexjit::cpu
