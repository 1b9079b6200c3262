#include "kernels/decode/Decode.h"

#include <flexjit/error.h>

#include "kernels/MathMode.h"
#include "kernels/Registry.h"

#include <flexjit_abi.h>

#include <fmt/format.h>

#include <algorithm>

namespace flexjit::kernels {

int decode_rows(int64_t gqa_ratio, int64_t seqlen_q) {
  const int64_t packed = std::max<int64_t>(1, gqa_ratio * seqlen_q);
  for (int rows : {16, 32, 64}) {
    if (packed <= rows) return rows;
  }
  return 128;
}

int64_t decode_row_groups(int64_t gqa_ratio, int64_t seqlen_q, int rows) {
  const int64_t packed = std::max<int64_t>(1, gqa_ratio * seqlen_q);
  return (packed + rows - 1) / rows;
}

KernelDesc decode_split_problem(const cuda::Arch& arch, DType dtype, int head_dim_qk,
                                int head_dim_v, int gqa_ratio, int rows, int page_size,
                                bool full_blocks, bool kv_fp8) {
  KernelDesc d;
  d.family = Family::DecodeSplit;
  d.arch = arch;
  d.dtype = dtype;
  d.head_dim_qk = head_dim_qk;
  d.head_dim_v = head_dim_v;
  d.gqa_ratio = gqa_ratio;
  d.flags.set("rows", rows);
  d.flags.set("page_size", page_size);
  d.flags.set("full_blocks", full_blocks ? 1 : 0);
  if (kv_fp8) d.flags.set("kv_e4m3", 1);
  set_math_mode(d, MathMode::Auto);
  return d;
}

KernelDesc decode_combine_problem(const cuda::Arch& arch, DType dtype, int head_dim_v) {
  KernelDesc d;
  d.family = Family::DecodeCombine;
  d.arch = arch;
  d.dtype = dtype;
  d.head_dim_qk = head_dim_v;
  d.head_dim_v = head_dim_v;
  return d;
}

FamilyInfo decode_split_family() {
  FamilyInfo f;
  f.family = Family::DecodeSplit;
  f.name = "decode_split";
  f.summary = "split-KV decoding: partial out and LSE per KV split";
  f.kind = "decode";
  f.math = true;
  f.config_keys = {block_n_key(),
                   num_warps_key(),
                   num_stages_key(),
                   {"num_splits", "splits of the KV range (0: from the SM count and the KV length)",
                    0, INT32_MAX, /*launch_only=*/true},
                   {"kv_copy",
                    "K/V loads: 0 cp.async of 16 bytes per thread, 1 cp.async.bulk per key row "
                    "completing on an mbarrier per stage (sm_90+), 2 the same with an "
                    "L2::evict_first cache policy",
                    0, 2}};
  f.kv_pages = true;
  f.problem = [](const KernelQuery& q, const cuda::Arch& arch) {
    if (q.seqlen_q < 1) {
      throw UnsupportedError(fmt::format("seqlen_q must be at least 1, not {}", q.seqlen_q));
    }
    KernelDesc problem = decode_split_problem(
        arch, q.dtype, q.head_dim_qk, q.head_dim_v ? q.head_dim_v : q.head_dim_qk, q.gqa_ratio,
        decode_rows(q.gqa_ratio, q.seqlen_q), q.page_size, q.full_blocks, q.kv_e4m3);
    set_math_mode(problem, q.math);
    return problem;
  };
  return f;
}

FamilyInfo decode_combine_family() {
  FamilyInfo f;
  f.family = Family::DecodeCombine;
  f.name = "decode_combine";
  f.summary = "the LSE-weighted combine of the splits' partials";
  f.kind = "decode";
  f.config_keys = {num_warps_key()};
  f.problem = [](const KernelQuery& q, const cuda::Arch& arch) {
    return decode_combine_problem(arch, q.dtype, q.head_dim_v ? q.head_dim_v : q.head_dim_qk);
  };
  return f;
}

InputFacts decode_facts(const DecodeInputs& in) {
  InputFacts f;
  f.aligned16 = in.aligned16;
  f.alignment_blocker = in.alignment_blocker;
  if (in.block_mask != nullptr) {
    f.mask_q_block = in.block_mask->meta().q_block_size;
    f.mask_kv_block = in.block_mask->meta().kv_block_size;
  }
  f.seqlen_q = in.seqlen_q;
  f.seqlen_kv = in.seqlen_kv;
  return f;
}

int decode_num_splits(int64_t ctas_per_split, int64_t seqlen_kv, int block_n, int sm_count,
                      int ctas_per_sm) {
  const int64_t slots = static_cast<int64_t>(std::max(1, sm_count)) * std::max(1, ctas_per_sm);
  int64_t splits = slots / std::max<int64_t>(1, ctas_per_split);
  const int64_t tiles = (seqlen_kv + block_n - 1) / block_n;
  splits = std::min(splits, tiles / kMinTilesPerSplit);
  splits = std::min<int64_t>(splits, kMaxDecodeSplits);
  return static_cast<int>(std::max<int64_t>(1, splits));
}

int resolve_num_splits(const KernelDesc& d, const DecodeInputs& in) {
  const int64_t fixed = d.config.at("num_splits");
  if (fixed > 0) return static_cast<int>(fixed);
  const Variant& v = Registry::global().get(d.family, d.variant);
  const unsigned smem = std::max(1u, v.smem_bytes(d));
  // Shared memory bounds the CTAs an SM holds; the splits count on at most 2: with 3 (2-stage
  // tiles leave room for them) the anchors' shape took 6 splits and ran at 2.35 TB/s, with 2
  // (4 splits, the same kernel) at 2.52 (H100, docs/kernels/decode.md "Design notes").
  const int per_sm = std::clamp(static_cast<int>(cuda::max_smem_per_block(d.arch) / smem), 1, 2);
  const int rows = d.flags.at_int("rows");
  const int64_t ctas = in.batch * in.heads_kv * decode_row_groups(d.gqa_ratio, in.seqlen_q, rows);
  return decode_num_splits(ctas, in.seqlen_kv, d.config.at_int("block_n"), in.sm_count, per_sm);
}

size_t decode_workspace_bytes(const DecodeInputs& in, int splits) {
  const auto rows = static_cast<size_t>(in.batch * in.heads_q * in.seqlen_q);
  return rows * static_cast<size_t>(splits) * (static_cast<size_t>(in.head_dim_v) + 1) *
         sizeof(float);
}

}  // namespace flexjit::kernels
