// decode_split/sm80_mma: the split-KV decoding kernel for sm_80 and newer (templates/
// mma_sm80.cuh + templates/decode_split.cuh; docs/kernels/decode.md). mma.sync m16n8k16 on
// bf16 / f16, the q heads of a GQA group times the query tokens packed into M, cp.async K / V
// pipeline, contiguous or paged K / V.
//
// Config: block_n {32, 64, 128} keys per tile, num_warps {2, 4, 8} (a multiple of rows / 16; the
// warps along N get block_n / (num_warps / (rows / 16)) keys each, a multiple of 16),
// num_stages {1, 2, 3, 4}, num_splits (0: the heuristic, 1..1024: fixed), kv_copy (0: cp.async,
// 1: cp.async.bulk per key row on an mbarrier per stage, 2: the same with L2::evict_first; 1 and 2
// on sm_90+; docs/kernels/decode.md "Bulk K / V copies"). Problem flag kv_e4m3: e4m3 K / V
// converted after the load (sm_89+, head dims multiples of 16, kv_copy 0). Needs 16-byte aligned
// rows. Head dims: any multiple of 8 up to 256, qk and v independently, computed in tiles of 64 /
// 128 / 256 (kernels/HeadDims.h).
#pragma once

#include "kernels/decode/Decode.h"

#include <flexjit_abi.h>

#include <initializer_list>

namespace flexjit::kernels {

// The tile dims decode_split/sm80_mma (and its L2-hint twins) compiles: the swizzled tiles need a
// multiple of 64, and 192 does not split into 16-byte copies over the kernel's 64..256 threads.
inline constexpr std::initializer_list<int> kDecodeSplitTileDims = {64, 128, 256};

//
// The same kernel registers under more names, with an L2 hint on the K / V copies
// (FjConfig::kKvHint; docs/kernels/decode.md, "L2 hints"): sm80_ef (L2::evict_first) and
// sm80_ef256 (L2::evict_first + L2::256B prefetch). Both are experimental and rank above
// sm80_mma (FLEXJIT_ENABLE_VARIANTS=decode_split/sm80_ef256 selects one): sm80_ef256 measured
// +2 % on the H100, but one of its builds (block_n 32, 8 warps, gqa 5) faults with an illegal
// instruction at run time (docs/kernels/decode.md "Design notes": ptxas gives an LDGSTS an odd
// uniform register as its cache-policy descriptor), so it is not the default.
class DecodeSplitSm80Mma : public DecodeSplitVariant {
 public:
  static constexpr const char* kEntry = "flexjit_decode_split";
  static constexpr int kMaxSplitsConfig = 1024;

  // kv_hint: 0 plain cp.async (the default variant; e4m3 K / V still take L2::evict_first,
  // decode_split.cuh's kPolicy), 1 L2::evict_first, 2 L2::evict_first and the L2::256B prefetch
  // size.
  explicit DecodeSplitSm80Mma(int kv_hint = 0) : kv_hint_(kv_hint) {}

  std::string_view name() const override;
  std::string_view summary() const override;
  int priority() const override { return kv_hint_; }
  bool experimental() const override { return kv_hint_ != 0; }
  int kv_hint() const { return kv_hint_; }
  std::optional<std::string> unsupported(const KernelDesc& problem,
                                         const InputFacts& facts) const override;
  void validate(const KernelDesc& desc) const override;
  Params default_config(const KernelDesc& problem) const override;
  std::vector<Params> config_space(const KernelDesc& problem) const override;
  Params resolve_config(const KernelDesc& problem, const Params& overrides,
                        const InputFacts& facts) const override;
  std::vector<TemplateText> templates() const override;
  std::vector<std::string> entry_points() const override { return {kEntry}; }
  cuda::GeneratedSource generate(const Mods& mods, const KernelDesc& desc) const override;
  unsigned smem_bytes(const KernelDesc& desc) const override;
  size_t workspace_bytes(const KernelDesc& desc, const DecodeInputs& in) const override;
  std::vector<Launch> launches(const KernelDesc& desc, const DecodeInputs& in,
                               void* workspace) const override;

  // struct FjConfig { static constexpr int kRows, kBlockN, kNumWarps, kNumStages, kHeadDimQK,
  //   kHeadDimV (the tile dims), kGqaRatio, kPageSize, kRealDimQK, kRealDimV (the problem's head
  //   dims), kKvHint, kKvCopy; static constexpr bool kHasFullBlocks,
  //   kHasScoreMod, kHasMaskMod, kKvFp8; using Element = fj_bf16 | fj_f16; };
  static std::string config_struct(const Mods& mods, const KernelDesc& desc, int kv_hint = 0);

 private:
  int kv_hint_ = 0;
};

// The FjDecodeArgs of a call on `workspace` (null: the partial pointers stay null).
FjDecodeArgs make_decode_args(const DecodeInputs& in, int splits, int rows, void* workspace);

}  // namespace flexjit::kernels
