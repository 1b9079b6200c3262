// The sm_90a backward: backward_dkdv/sm90a_wgmma and backward_dq/sm90a_wgmma, one template
// (templates/backward_sm90.cuh, on wgmma_sm90.cuh's TMA / mbarrier / wgmma pieces and the
// sm_80 backward's element step; docs/kernels/backward_sm90.md). The preprocess stays
// backward_preprocess/sm80.
//
//   backward_dkdv/sm90a_wgmma  one CTA per 128-key tile: producer warpgroup (TMA), two consumer
//                              warpgroups of 64 kv rows. config: block_m (q tile) {64, 128},
//                              block_n {128}, num_stages {1, 2, 3}
//   backward_dq/sm90a_wgmma    one CTA per 128-query tile, the forward's schedule. config:
//                              block_m {128}, block_n (kv tile) {64, 128}, num_stages {1, 2, 3}
//
// Serves sm_90a, bf16 / f16, head dims any multiple of 8 up to 128 (qk and v independently;
// computed in tile dims 64 / 128, docs/kernels/backward_sm90.md "Head dims"), inputs a TMA tensor
// map can describe, block masks whose sparse blocks the tiles divide; everything else falls
// back to the sm80_mma variants with the reason in the `kernels` log. The sm_90a default since
// its verification on an H100 (docs/kernels/backward_sm90.md, "Status").
#pragma once

#include "kernels/backward/Backward.h"

namespace flexjit::kernels {

template <Family F>
class BackwardSm90Wgmma : public FamilyVariant<F, BackwardInputs> {
 public:
  std::string_view name() const override { return "sm90a_wgmma"; }
  std::string_view summary() const override;
  int priority() const override { return 10; }  // ahead of sm80_mma where it applies
  std::optional<std::string> unsupported(const KernelDesc& problem,
                                         const InputFacts& facts) const override;
  void validate(const KernelDesc& desc) const override;
  Params default_config(const KernelDesc& problem) const override;
  std::vector<Params> config_space(const KernelDesc& problem) const override;
  Params resolve_config(const KernelDesc& problem, const Params& overrides,
                        const InputFacts& facts) const override;
  void specialize(KernelDesc& desc, const InputFacts& facts) const override;
  std::vector<TemplateText> templates() const override;
  std::vector<std::string> entry_points() const override;
  cuda::GeneratedSource generate(const Mods& mods, const KernelDesc& desc) const override;
  unsigned smem_bytes(const KernelDesc& desc) const override;
  // The lse2 / delta slice of the preprocess step (the plan passes it as `workspace`).
  std::vector<Launch> launches(const KernelDesc& desc, const BackwardInputs& in,
                               void* workspace) const override;
};

using BackwardDkDvSm90Wgmma = BackwardSm90Wgmma<Family::BackwardDkDv>;
using BackwardDqSm90Wgmma = BackwardSm90Wgmma<Family::BackwardDq>;

}  // namespace flexjit::kernels
