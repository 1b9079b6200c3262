// The split-KV decoding families (docs/kernels/decode.md): decode_split computes, for every
// (batch, kv head, row group, split), the attention of the packed rows (the q heads of the GQA
// group times the query tokens) against one share of the KV range and writes a partial out and
// LSE to the workspace; decode_combine merges the splits into out [B, Hq, Sq, Dv] and the LSE.
// Both families read the same inputs (DecodeInputs) and the ABI structs FjDecodeArgs /
// FjDecodeCombineArgs (templates/flexjit_abi.h).
//
// decode_split problem flags (KernelDesc::flags):
//   rows         packed rows per CTA: 16, 32, 64 or 128 (gqa * Sq rounded up, at most 128)
//   page_size    0 for contiguous K / V, else the page size of the paged pools (1..256, 2^k)
//   full_blocks  1 when the block mask carries full_* arrays (full tiles skip the mask_mod)
//   fast_math    1: the score_mod's transcendentals use hardware approximations (MathMode.h)
//   kv_e4m3      1: K / V are e4m3 with per-kv-head f32 scales (an e4m3 KV cache); absent for
//                2-byte K / V (descriptions of bf16 / f16 caches are unchanged)
// decode_split config: block_n, num_warps, num_stages, and num_splits (0: from the SM count and
// the KV length at plan time, decode_num_splits; otherwise that many).
#pragma once

#include <flexjit/device_block_mask.h>
#include <flexjit/tensor.h>

#include "kernels/Family.h"
#include "kernels/TuningOutputs.h"
#include "kernels/Variant.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace flexjit::kernels {

// What the decode launches read and write, as the runtime validated it.
struct DecodeInputs {
  TensorRef q, k, v, out;  // k, v: [B, Hkv, Skv, D] or pools [num_pages, page_size, Hkv, D]
  std::optional<TensorRef> lse;
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0;
  int64_t seqlen_kv = 0;  // contiguous: Skv; paged: the table capacity max_pages * page_size
  int64_t head_dim_qk = 0, head_dim_v = 0;
  std::optional<float> scale;  // default 1 / sqrt(head_dim_qk)
  // Paged K / V: the table [B, max_pages] (null: contiguous) and the page size.
  const int* page_table = nullptr;
  int64_t page_table_stride_b = 0;
  int page_size = 0;
  const int* seq_lens = nullptr;  // [B] device int32, or null: seqlen_kv for every sequence
  // An e4m3 KV cache (k, v of dtype E4M3): the [heads_kv] f32 scales (KvCache::k_scale /
  // v_scale); q and out stay bf16 / f16.
  bool kv_fp8 = false;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  const DeviceBlockMask* block_mask = nullptr;
  std::vector<uint64_t> mod_params;  // the FjModParams bytes (binding/ModArgs.h)
  // The device: what the split heuristic reads.
  int sm_count = 0;
  // Every data pointer and stride 16-byte aligned; otherwise `alignment_blocker` says what.
  bool aligned16 = true;
  std::string alignment_blocker;
  // Set when planning: the splits of the KV range (config num_splits, or the heuristic).
  int num_splits = 1;
};

using DecodeSplitVariant = FamilyVariant<Family::DecodeSplit, DecodeInputs>;
using DecodeCombineVariant = FamilyVariant<Family::DecodeCombine, DecodeInputs>;

}  // namespace flexjit::kernels

// The autotuner compares out and lse with the default config's, for both steps: a decode_split
// candidate runs with the combine after it (tune::StepTuning::after), since its partials depend
// on its split count; a decode_combine candidate after the planned split.
template <>
struct flexjit::kernels::TuningOutputs<flexjit::kernels::DecodeInputs> {
  static constexpr bool kCompared = true;
  static std::vector<TensorRef> of(const kernels::DecodeInputs& in, kernels::Family) {
    std::vector<TensorRef> v = {in.out};
    if (in.lse) v.push_back(*in.lse);
    return v;
  }
  static std::vector<TensorRef> accumulated(const kernels::DecodeInputs&, kernels::Family) {
    return {};
  }
};

namespace flexjit::kernels {

// Packed rows per CTA for `gqa_ratio` q heads per kv head and `seqlen_q` query tokens: the
// product rounded up to 16, 32, 64 or 128 (at most 128; more rows take several row groups).
int decode_rows(int64_t gqa_ratio, int64_t seqlen_q);
// CTAs along the packed rows of one kv head: ceil(gqa_ratio * seqlen_q / rows).
int64_t decode_row_groups(int64_t gqa_ratio, int64_t seqlen_q, int rows);

// The decode_split problem of a call (no variant, no config yet); fast_math as MathMode::Auto
// resolves it (set_math_mode changes it; MathMode.h).
// kv_fp8: e4m3 K / V (flag kv_e4m3; `dtype` stays q's).
KernelDesc decode_split_problem(const cuda::Arch& arch, DType dtype, int head_dim_qk,
                                int head_dim_v, int gqa_ratio, int rows, int page_size,
                                bool full_blocks, bool kv_fp8 = false);
// The decode_combine problem: only the element type and Dv shape it.
KernelDesc decode_combine_problem(const cuda::Arch& arch, DType dtype, int head_dim_v);

// The records of the two decoding families (kernels/Family.h), of kind "decode" in plan order:
// decode_split (math; config keys block_n, num_warps, num_stages, num_splits; a query's problem
// is decode_split_problem with decode_rows(gqa_ratio, seqlen_q), page_size and full_blocks) and
// decode_combine (config key num_warps; decode_combine_problem of the query's head_dim_v).
FamilyInfo decode_split_family();
FamilyInfo decode_combine_family();

// The input facts of a call: alignment, the block mask's tile size, the lengths.
InputFacts decode_facts(const DecodeInputs& in);

// The split heuristic: as many splits as fill the GPU once — sm_count * ctas_per_sm CTAs over
// the `ctas_per_split` (batch * kv heads * row groups) CTAs of one split — but at least
// kMinTilesPerSplit KV tiles of `block_n` keys per split, at most kMaxDecodeSplits, at least 1.
inline constexpr int kMaxDecodeSplits = 128;
inline constexpr int kMinTilesPerSplit = 2;
int decode_num_splits(int64_t ctas_per_split, int64_t seqlen_kv, int block_n, int sm_count,
                      int ctas_per_sm);

// The splits a call uses with this complete decode_split description: config num_splits when
// nonzero, else decode_num_splits with the CTAs per SM that the kernel's shared memory allows.
// The split kernel's workspace and grid follow it (not `in.num_splits`), so every candidate
// config of the tuner runs with its own split count; the combine reads `in.num_splits`.
int resolve_num_splits(const KernelDesc& split_desc, const DecodeInputs& in);

// Bytes of the split partials (o_part then lse_part, f32) for `splits` splits.
size_t decode_workspace_bytes(const DecodeInputs& in, int splits);

}  // namespace flexjit::kernels
