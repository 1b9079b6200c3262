// The CPU backend on a KV cache (include/flexjit/paged_kv.h's semantics on host tensors): each
// sequence's keys gathered, through the page table when there is one, into contiguous K / V as
// long as the longest sequence, and the lengths ANDed into the mask_mod (kv_idx < len[b]). The
// forward then runs on the whole batch at once, so mods that read b (q_pos[b], a per-sequence
// document table) see each sequence's own b, and a row whose keys are all masked, or an empty
// sequence, gets out 0 and lse -inf as on the GPU. An e4m3 cache is dequantized while gathered
// (k * k_scale[h], v * v_scale[h] in f32), and q taken to f32 with it, so the forward runs on
// f32 q, k, v: the dequantized inputs the GPU's results are compared with (docs/math.md).
#pragma once

#include <flexjit/attention.h>
#include <flexjit/paged_kv.h>
#include <flexjit/tensor.h>

#include <cstdint>
#include <vector>

namespace flexjit::cpu {

// The name of the lengths buffer the mask reads (a name mods cannot have: RuntimeError if they
// declare it).
inline constexpr const char* kKvLengthBuffer = "fj_kv_len";

struct GatheredKv {
  // [B, Hkv, max_len, D] contiguous, the inputs' dtypes (f32, dequantized, for an e4m3 cache)
  std::vector<char> k_bytes, v_bytes;
  std::vector<float> q_f32;  // an e4m3 cache: q in f32
  std::vector<int> lengths;  // [B], clamped to [0, capacity] as the GPU kernels do
  int64_t max_len = 0;
  TensorRef q;           // the q to run with: the caller's, or a view of q_f32
  TensorRef k, v;        // views of k_bytes / v_bytes
  TensorRef length_ref;  // a view of `lengths`, [B] i32
};

// Reads the host lengths and page table of `cache` (validated by validate_kv_cache into `shape`).
// A length outside [0, capacity] is a RuntimeError with check_pages (the device check's words)
// and clamped without; a page entry a sequence reads that is not a page of the pool is always a
// RuntimeError (on the host it would be read out of bounds).
GatheredKv gather_kv_cache(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                           const KvCache& cache, const KvCacheShape& shape);

// `options` with the lengths mask ANDed into its mods and the lengths bound (kv_cache dropped).
// `g` must outlive the returned options' use.
AttentionOptions with_length_mask(const AttentionOptions& options, const GatheredKv& g);

}  // namespace flexjit::cpu
