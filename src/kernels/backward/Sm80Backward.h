// The sm_80 backward: three variants, one per backward family, sharing one template
// (templates/backward_sm80.cuh; docs/kernels/backward_sm80.md):
//
//   backward_preprocess/sm80   lse2, delta          config: num_warps = 4 (fixed)
//   backward_dkdv/sm80_mma     dK, dV, buffer grads config: block_m (q tile) {32, 64, 128},
//                              block_n (kv tile) {32, 64, 128}, num_warps (a multiple of
//                              block_n / 16: 1 or 2 warps per 16-row slice), num_stages {1, 2},
//                              dq_atomic {0, 1} (also add dQ into an f32 accumulator)
//   backward_dq/sm80_mma       dQ                   config: block_m = 16 * num_warps {32, 64,
//                              128}, block_n {32, 64, 128}, num_warps {2, 4, 8}, num_stages {1, 2}
//   backward_dq/atomic_convert dQ from the accumulator of a dq_atomic dK/dV kernel
//
// Head dims: any multiple of 8 up to 256 (qk and v independently; the dK/dV and dQ kernels
// compute them in tiles of 64 / 128 / 256, kernels/HeadDims.h), bf16 / f16 / f32 (tf32 tensor
// cores), 16-byte aligned rows; the shared memory formulas fj_bwd_*_smem_bytes (of the tile
// dims) must fit the arch.
#pragma once

#include "kernels/backward/Backward.h"

#include <initializer_list>

namespace flexjit::kernels {

// The tile dims of the sm_80 backward kernels (the swizzled tiles need multiples of 64; 192 does
// not split into 16-byte copies over their 64..256 threads). The row kernels take any multiple
// of 8 up to 256 and check against the same list.
inline constexpr std::initializer_list<int> kSm80BackwardTileDims = {64, 128, 256};

// The row kernels of the sm_80 backward: a block of 4 warps per 64 q rows of one (batch, q
// head), no shared memory, no config to tune. Two instances below: the preprocess and the dQ
// convert; `Spec` is all that differs between them.
template <Family F>
class BackwardRowKernelSm80 : public FamilyVariant<F, BackwardInputs> {
 public:
  struct Spec {
    std::string_view name, summary;
    std::string_view entry_point;  // the kernel, compiled under `define` in backward_sm80.cuh
    std::string_view define;
    std::string_view what;  // for the generated source's comment block
    bool auto_select = true;
  };
  explicit BackwardRowKernelSm80(Spec spec) : spec_(spec) {}

  std::string_view name() const override { return spec_.name; }
  std::string_view summary() const override { return spec_.summary; }
  bool auto_select() const override { return spec_.auto_select; }
  std::optional<std::string> unsupported(const KernelDesc& problem,
                                         const InputFacts& facts) const override;
  void validate(const KernelDesc& desc) const override;
  Params default_config(const KernelDesc& problem) const override;
  std::vector<Params> config_space(const KernelDesc& problem) const override;
  std::vector<TemplateText> templates() const override;
  std::vector<std::string> entry_points() const override {
    return {std::string(spec_.entry_point)};
  }
  Mods kernel_mods(const Mods&) const override { return {}; }
  cuda::GeneratedSource generate(const Mods& mods, const KernelDesc& desc) const override;
  unsigned smem_bytes(const KernelDesc&) const override { return 0; }
  std::vector<Launch> launches(const KernelDesc& desc, const BackwardInputs& in,
                               void* workspace) const override;

 private:
  Spec spec_;
};

// backward_preprocess/sm80: lse2 and delta (and a zeroed dQ accumulator) in its workspace.
class BackwardPreprocessSm80 : public BackwardRowKernelSm80<Family::BackwardPreprocess> {
 public:
  BackwardPreprocessSm80();
  size_t workspace_bytes(const KernelDesc& desc, const BackwardInputs& in) const override;
};

// dK / dV and dQ: the mma.sync kernels of family F.
template <Family F>
class BackwardSm80Mma : public FamilyVariant<F, BackwardInputs> {
 public:
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
  std::vector<std::string> entry_points() const override;
  cuda::GeneratedSource generate(const Mods& mods, const KernelDesc& desc) const override;
  unsigned smem_bytes(const KernelDesc& desc) const override;
  // The lse2 / delta slice of the preprocess step (the plan passes it as `workspace`).
  std::vector<Launch> launches(const KernelDesc& desc, const BackwardInputs& in,
                               void* workspace) const override;
};

using BackwardDkDvSm80Mma = BackwardSm80Mma<Family::BackwardDkDv>;
using BackwardDqSm80Mma = BackwardSm80Mma<Family::BackwardDq>;

// backward_dq/atomic_convert: dq = scale * the f32 accumulator that a dK/dV kernel with
// dq_atomic = 1 filled. Not auto-selected: the backward plan names it when its dK/dV step adds
// dQ (runtime/Backward.cpp).
class BackwardDqAtomicConvert : public BackwardRowKernelSm80<Family::BackwardDq> {
 public:
  BackwardDqAtomicConvert();
};

}  // namespace flexjit::kernels
