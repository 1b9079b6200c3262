// forward/sm80_mma: the FlashAttention-2-structured forward for sm_80 and newer —
// mma.sync (m16n8k16 bf16/f16, m16n8k8 tf32 for f32 inputs), ldmatrix and a cp.async K/V
// pipeline (templates/mma_sm80.cuh + attention_sm80.cuh + forward_common.cuh + forward_sm80.cuh;
// docs/kernels/forward_sm80.md).
//
// Config: block_m {64, 128} query rows per CTA, block_n {32, 64, 128} keys per iteration,
// num_warps {4, 8} (block_m / num_warps a multiple of 16), num_stages {1, 2, 3}; the shared
// memory fj_forward_smem_bytes() must fit the arch. Needs 16-byte aligned rows. Head dims: any
// multiple of 8 up to 256 (qk and v independently), computed in tiles of 64 / 128 / 256.
#pragma once

#include "kernels/forward/Forward.h"

#include <initializer_list>

namespace flexjit::kernels {

// The tile dims forward/sm80_mma compiles (kernels/HeadDims.h): a head dim, any multiple of 8 up
// to 256 for qk and v independently, runs in the smallest tile at least as large. The swizzled
// tiles (FjSwizzledTile) need a multiple of 64, and 192 does not split into 16-byte copies over
// 128 or 256 threads.
inline constexpr std::initializer_list<int> kSm80ForwardTileDims = {64, 128, 256};

class ForwardSm80Mma : public ForwardVariant {
 public:
  // The texts spliced around the generated parts; the defaults are the embedded templates.
  // Tests pass their own to check the assembly with a small kernel.
  struct Templates {
    std::string_view abi, prelude, mma, attention, common, kernel;
  };
  ForwardSm80Mma();
  explicit ForwardSm80Mma(Templates templates) : templates_(templates) {}

  std::string_view name() const override { return "sm80_mma"; }
  std::string_view summary() const override;
  std::optional<std::string> unsupported(const KernelDesc& problem,
                                         const InputFacts& facts) const override;
  void validate(const KernelDesc& desc) const override;
  Params default_config(const KernelDesc& problem) const override;
  std::vector<Params> config_space(const KernelDesc& problem) const override;
  Params resolve_config(const KernelDesc& problem, const Params& overrides,
                        const InputFacts& facts) const override;
  void specialize(KernelDesc& desc, const InputFacts& facts) const override;
  std::vector<TemplateText> templates() const override;
  std::vector<std::string> entry_points() const override { return {"flexjit_forward"}; }
  cuda::GeneratedSource generate(const Mods& mods, const KernelDesc& desc) const override;
  unsigned smem_bytes(const KernelDesc& desc) const override;
  std::vector<Launch> launches(const KernelDesc& desc, const ForwardInputs& in,
                               void* workspace) const override;

  // The generated `struct FjConfig` the template reads:
  //   struct FjConfig { static constexpr int kBlockM, kBlockN, kNumWarps, kNumStages,
  //     kHeadDimQK, kHeadDimV, kGqaRatio; static constexpr bool kIsDivisible, kHasFullBlocks,
  //     kHasScoreMod, kHasMaskMod; using Element = fj_bf16 | fj_f16 | float; };
  // kHasScoreMod / kHasMaskMod are false for absent or identity mods (see ModCodegen.h).
  // `extra` members (whole declarations) come before Element: the backward's kernels share the
  // struct and add theirs. kHeadDimQK / kHeadDimV are desc's head dims: generate() passes the
  // tile dims and adds the problem's as kRealDimQK / kRealDimV in `extra`.
  static std::string config_struct(const Mods& mods, const KernelDesc& desc,
                                   const std::vector<std::string>& extra = {});

 private:
  Templates templates_;
};

}  // namespace flexjit::kernels
