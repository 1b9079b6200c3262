// A KV cache for decoding: per-sequence KV lengths (ragged batches) and, optionally, K and V in
// page pools read through a page table — the layout serving engines keep their cache in.
// flex_attention takes one through AttentionOptions::kv_cache (docs/runtime.md, "Decoding and
// KV caches"; the kernels: docs/kernels/decode.md): up to 16 query tokens run the split-KV decode
// kernels, a longer q (a prefill chunk appended to the cached sequences) the forward kernel
// reading K / V through the page table.
//
//   // K / V pools [num_pages, page_size, Hkv, D]; table [B, max_pages] and lengths [B] int32,
//   // all on the device.
//   KvCache cache{.seq_lens = lens, .page_table = table};
//   auto [out, lse] = flex_attention(ctx, q, k_pool, v_pool,
//                                    {.mods = standard_mods("causal"), .kv_cache = &cache});
//
// Semantics: sequence b attends to its first seq_lens[b] keys; key n of sequence b is slot
// n % page_size of pool page page_table[b][n / page_size]. Mods and block masks see the logical
// kv_idx n (0 .. seq_lens[b] - 1) and, as in the forward, q_idx is the row of q (0 .. Sq - 1):
// to place the queries at the end of each sequence, capture the offsets in a buffer
// (`mask_mod = q_idx + q_pos[b] >= kv_idx`). A block mask is built for Sq x (max_pages *
// page_size) keys (or Sq x Skv without pages). A sequence of length 0, or a row whose keys are
// all masked, gets out 0 and lse -inf.
//
// FP8 caches: K and V (pools or contiguous) of dtype e4m3 (float8_e4m3fn) with per-kv-head f32
// scales k_scale / v_scale ([Hkv]); the cache holds k / k_scale[h] rounded to e4m3, and attention
// runs on the dequantized keys k_e4m3 * k_scale[h] and values v_e4m3 * v_scale[h]. q stays bf16 or
// f16 and out has q's dtype. Decoding moves half the bytes of a bf16 cache (docs/kernels/decode.md,
// "FP8 KV caches"; the error rule: docs/math.md).
//
// On host tensors (q, k, v, the table and the lengths all on the CPU) flex_attention_cpu runs
// the same semantics (cpu.h): it gathers each sequence's keys through the table and masks the
// keys past its length. The backward takes no KV cache (UnsupportedError).
#pragma once

#include <flexjit/export.h>

#include <flexjit/tensor.h>

#include <cstdint>

namespace flexjit {

struct KvCache {
  // [B] int32 on the device: the KV length of each sequence. Required with a page table;
  // without one it makes K / V [B, Hkv, Skv, D] ragged (sequence b reads its first seq_lens[b]
  // keys; Skv is the longest). Lengths are read on the device: a length above the capacity
  // (Skv, or max_pages * page_size) is clamped to it unless check_pages reports it. (On the CPU
  // backend, flex_attention_cpu, a length outside [0, capacity] is always a RuntimeError.)
  TensorRef seq_lens;
  // [B, max_pages] int32 on the device, rows contiguous: the pool pages of each sequence, in
  // order. Left empty (no data, no shape), K and V are contiguous [B, Hkv, Skv, D]; given, they
  // are pools [num_pages, page_size, Hkv, D] (page_size a power of two from 1 to 256, any
  // strides with the last dim contiguous: a head-major pool [num_pages, Hkv, page_size, D] is
  // passed as that view, strides [Hkv * page_size * D, D, page_size * D, 1]). Entries past a
  // sequence's length are never read, so they may hold anything; pages may be shared between
  // sequences (a common prefix).
  TensorRef page_table;
  // Before launching, check on the device every length against the capacity and every page a
  // sequence reads against the pool (a small kernel on the call's stream, which is then
  // synchronized to read the verdict): RuntimeError naming the first bad entry
  // ("page_table[3][17] = 912 is not a page of the pool (0 .. 511); ..."). For debugging a
  // cache manager; off by default.
  bool check_pages = false;
  // e4m3 caches (k and v of dtype E4M3): [Hkv] f32 dequantization scales on q's device, one per
  // kv head: key n of head h is k[..., n, h, :] * k_scale[h], its value v[...] * v_scale[h].
  // Both are required with e4m3 pools and refused with bf16 / f16 / f32 ones (RuntimeError
  // naming the tensor: "k_scale has shape [4]; expected [Hkv] = [8]").
  TensorRef k_scale;
  TensorRef v_scale;
};

// What validate_kv_cache learned about a call on a KV cache.
struct KvCacheShape {
  // seqlen_kv is the capacity: Skv, or max_pages * page_size when paged.
  QkvShape qkv;
  bool paged = false;
  int64_t num_pages = 0, page_size = 0, max_pages = 0;  // paged only
  bool fp8 = false;                                     // k and v are e4m3, with k_scale / v_scale
};

// Checks q [B, Hq, Sq, D] and k, v against `cache` (contiguous K / V with ragged lengths, or
// pools with a page table) without touching device memory, and throws RuntimeError naming the
// first problem: a table or lengths tensor of the wrong dtype ("page_table has dtype i64;
// expected i32"), rank or shape, or on another device; pools whose page sizes, heads or head
// dims disagree; a page size that is not a power of two from 1 to 256; a capacity of 2^31 keys
// or more; a table or lengths tensor on another device than q; for e4m3 pools, v or k not e4m3 as
// well, q not bf16 / f16, a missing scale or one of the wrong dtype, shape, device or layout
// (scales given for pools that are not e4m3, too). Head dims and dtypes the kernels
// cannot run are UnsupportedErrors from the kernel selection (flex_attention), also before any
// launch. Host tensors pass (the CPU backend runs them).
FLEXJIT_API KvCacheShape validate_kv_cache(const TensorRef& q, const TensorRef& k,
                                           const TensorRef& v, const KvCache& cache);

}  // namespace flexjit
