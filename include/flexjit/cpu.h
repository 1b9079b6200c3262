// flex_attention on the CPU backend: the same call as attention.h, on host tensors, without a
// GPU or a Context. The mods are JIT-compiled through LLVM for the host CPU (docs/cpu_backend.md);
// a mask_mod gets a CPU block mask (128 x 128 tiles), so empty tiles are skipped.
//
//   std::vector<float> q(...), k(...), v(...), out(B * H * S * D);
//   auto t = [](std::vector<float>& x, int64_t S) {
//     return TensorRef::contiguous(x.data(), DType::F32, {B, H, S, D}); };
//   flex_attention_cpu_into(t(q, S), t(k, S), t(v, S), t(out, S), nullptr,
//                           {.mods = standard_mods("causal")});
//
// flex_attention_into (attention.h) dispatches here when q, k and v are CPU tensors.
#pragma once

#include <flexjit/export.h>

#include <flexjit/attention.h>
#include <flexjit/tensor.h>

#include <cstdint>
#include <vector>

namespace flexjit {

struct CpuRunOptions {
  int num_threads = 0;  // 0: std::thread::hardware_concurrency()
  // The fp64 reference mode: products, softmax and accumulation in double, rounded to f32 at
  // the end (the mods evaluate in f32 either way). Slower; for checking.
  bool reference_f64 = false;
};

struct CpuAttentionResult {
  std::vector<int64_t> shape;  // out: [B, Hq, Sq, Dv]
  std::vector<float> out;      // contiguous
  std::vector<float> lse;      // [B, Hq, Sq], natural log; -inf for fully masked rows
};

// q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv]: CPU tensors of f32 / f16 / bf16,
// or e4m3 with options.descale (CPU tensors; computed in f32 from the dequantized values), any
// strides with the last dim contiguous. options.bindings' buffers must be CPU tensors;
// options.block_mask (a GPU mask), stream and config are ignored. options.kv_cache (paged_kv.h)
// is honored on host tensors: k and v are then pools [num_pages, page_size, Hkv, D] with a page
// table, or [B, Hkv, Skv, D] with ragged lengths, and every page entry a sequence reads is checked
// against the pool (RuntimeError). Throws RuntimeError for
// invalid inputs (as flex_attention does), CompileError for mods that do not type check.
FLEXJIT_API CpuAttentionResult flex_attention_cpu(const TensorRef& q, const TensorRef& k,
                                                  const TensorRef& v,
                                                  const AttentionOptions& options = {},
                                                  const CpuRunOptions& cpu = {});

// The same into caller-owned CPU tensors: out [B, Hq, Sq, Dv] f32 contiguous, lse [B, Hq, Sq]
// f32 contiguous (may be null).
FLEXJIT_API void flex_attention_cpu_into(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                                         const TensorRef& out, const TensorRef* lse,
                                         const AttentionOptions& options = {},
                                         const CpuRunOptions& cpu = {});

}  // namespace flexjit
