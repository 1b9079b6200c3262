// The FlexAttention forward pass on the CPU: out = softmax(mods(q k^T * scale)) v and the
// log-sum-exp of each row, with the score_mod / mask_mod JIT-compiled through LLVM
// (codegen/llvm/LlvmCodegen.h).
//
// Semantics match the GPU kernels at the edges: a row whose every score is masked (or -inf)
// gets out = 0 and lse = -inf, never NaN; a zero-length query computes nothing; a zero-length
// key / value gives every row out = 0, lse = -inf. GQA: query head h reads kv head
// h / (Hq / Hkv). lse is the natural log of the row's sum of exp(score) (after the mods).
//
// Implementation: work items are (b, h, q tile) spread over std::threads; each runs a blocked
// online softmax over kv tiles of 64 (K tile transposed so that the q.k inner products
// vectorise over kv), calling the JIT'ed row function once per (query row, kv tile). With a
// block mask, empty tiles are skipped and full tiles skip the mask_mod.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/block_mask.h>
#include <flexjit/mods.h>
#include <flexjit/tensor.h>

#include <cstdint>
#include <optional>

namespace flexjit::cpu {

struct CpuForwardOptions {
  std::optional<double> scale;  // default 1 / sqrt(D)
  int num_threads = 0;          // 0: std::thread::hardware_concurrency()
  // Optional tile sparsity (cpu_create_block_mask, or any valid BlockMask). Its seqlen_q /
  // seqlen_kv must equal the call's, its batch / heads be 1 or equal to B / Hq. Without one,
  // the mask_mod (if any) is evaluated everywhere.
  const BlockMask* block_mask = nullptr;
  // Use the AVX2 + FMA fp32 kernels where the CPU has them; false forces the baseline x86-64
  // kernels (for tests: both must agree with the reference).
  bool allow_avx2 = true;
};

// fp32 forward. q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv]: CPU TensorRefs of
// one dtype (f32, or f16 / bf16 bit patterns widened exactly on load), any strides with the
// last dim contiguous (checked by validate_qkv). Writes out [B, Hq, Sq, Dv] and lse [B, Hq, Sq],
// both contiguous. `bindings` gives the mods' parameter values and buffers (host tensors) by
// name, checked by runtime::bind_mod_args. Throws RuntimeError naming the offending tensor or
// binding for inputs validate_qkv rejects, extents past the i32 range, a bad block mask or bad
// bindings; CompileError if the mods do not type check.
void cpu_attention_forward(const Mods& mods, const ModBindings& bindings, const TensorRef& q,
                           const TensorRef& k, const TensorRef& v, float* out, float* lse,
                           const CpuForwardOptions& options = {});

// The fp64 reference mode: inner products, softmax and accumulation in double; the mods still
// evaluate in their f32 semantics (the score is rounded to float for a score_mod and widened
// back). Same shapes and errors as above.
void cpu_attention_forward_f64(const Mods& mods, const ModBindings& bindings, const TensorRef& q,
                               const TensorRef& k, const TensorRef& v, double* out, double* lse,
                               const CpuForwardOptions& options = {});

// The checks both directions share: validate_qkv(q, k, v), CPU tensors, the sizes the mods'
// i32 indices can address. `who` prefixes the messages ("CPU attention").
QkvShape check_cpu_qkv(const char* who, const TensorRef& q, const TensorRef& k, const TensorRef& v);

}  // namespace flexjit::cpu
