// forward/sm90a_wgmma: the Hopper forward (FlashAttention-3 structure) — TMA loads into a
// multi-stage shared-memory ring, a producer warpgroup and 64-row consumer warpgroups with
// register reallocation, wgmma for Q K^T (both operands in shared memory) and P V (P from
// registers) (templates/wgmma_sm90.cuh + forward_sm90.cuh; docs/kernels/forward_sm90.md).
//
// With e4m3 (float8_e4m3fn) q, k, v and descale factors it computes a bf16 out (FJ_FWD_FP8: wgmma
// m64nNk32 e4m3, V^T written by a pre-pass into the workspace, 128 x 128 tiles, head dims
// multiples of 16, qk up to 256 and v up to 128; docs/kernels/forward_sm90.md "FP8").
// Serves sm_90a only, bf16 and f16 (f32 inputs stay on sm80_mma's tf32 path), head dims qk and
// v (independently) any multiple of 8 up to 256, computed in tile dims 64 / 128 / 192 / 256
// (kernels/HeadDims.h; docs/kernels/forward_sm90.md "Head dims"), inputs a TMA tensor map can
// describe (16-byte aligned, strides positive multiples of 16 bytes); everything else falls
// back to forward/sm80_mma with the reason in the `kernels` log. Config: block_m {128, 192} (two or
// three consumer warpgroups), block_n {64, 128, 176, 192}, num_stages {2, 3, 4}, q_tiles {1, 2},
// persistent {0, 1}; the shared memory fj_forward_sm90_smem_bytes() must fit. The sm_90a default
// since its verification on an H100 (docs/kernels/forward_sm90.md "Design notes").
#pragma once

#include "kernels/forward/Forward.h"

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace flexjit::kernels {

// The tile dims forward/sm90a_wgmma compiles (its shared-memory tiles are 64-column chunks of
// the 128-byte swizzle): a head dim runs in the smallest at least as large, so at most 56
// columns of a tile are padding and no 64-column chunk is padding alone.
inline constexpr std::initializer_list<int> kSm90ForwardTileDims = {64, 128, 192, 256};
// With e4m3 q, k, v a 128-byte swizzle row holds 128 elements: tiles of whole rows
// (docs/kernels/forward_sm90.md "FP8").
inline constexpr std::initializer_list<int> kSm90Fp8TileDims = {128, 256};

// Why a wgmma kernel (the sm90a_wgmma variant of any family) cannot serve `problem`: not sm_90a,
// not bf16 / f16, a head dim that is not a multiple of 8 up to the largest of `head_dims` (its
// tile dims, ascending), a gqa_ratio below 1; nullopt when it can.
std::optional<std::string> wgmma_problem_reason(const KernelDesc& problem,
                                                std::initializer_list<int> head_dims);
// Why its inputs cannot be read through TMA tensor maps (alignment, strides); nullopt when they
// can.
std::optional<std::string> wgmma_input_reason(const InputFacts& facts);

// The FjConfig struct of an sm90a_wgmma module (ForwardSm80Mma::config_struct's members and
// `extra`): kHeadDimQK / kHeadDimV are the tile dims `tile_qk` / `tile_v` (shared-memory and
// register layouts), kRealDimQK / kRealDimV the problem's head dims (the k16 steps of the
// products over them, the columns stores write). Equal dims give today's struct plus that line.
std::string sm90_config_struct(const Mods& mods, const KernelDesc& desc, int tile_qk, int tile_v,
                               std::vector<std::string> extra);

class ForwardSm90Wgmma : public ForwardVariant {
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
  // 192-row tiles: 64 (each consumer warpgroup's rows lie in one q block; the union schedule).
  int64_t mask_q_unit(const Params& config) const override;
  void specialize(KernelDesc& desc, const InputFacts& facts) const override;
  std::vector<TemplateText> templates() const override;
  std::vector<std::string> entry_points() const override { return {"flexjit_forward"}; }
  // e4m3: the V^T pre-pass (forward_fp8_vt/block_per_64_keys), launched first; block_m 192 with
  // a mask_mod: the union schedule's kernel (forward_schedule/block_per_tile), launched first
  // where the call has a block mask. In that order.
  std::vector<KernelDesc> companions(const KernelDesc& desc, const Mods& mods) const override;
  cuda::GeneratedSource generate(const Mods& mods, const KernelDesc& desc) const override;
  unsigned smem_bytes(const KernelDesc& desc) const override;
  // persistent = 1: the work counter (zeroed before each launch); block_m 192 with a block
  // mask: the union schedule; e4m3: V^T (fj_forward_fp8_vt_bytes).
  size_t workspace_bytes(const KernelDesc& desc, const ForwardInputs& in) const override;
  std::vector<Launch> launches(const KernelDesc& desc, const ForwardInputs& in,
                               void* workspace) const override;
};

}  // namespace flexjit::kernels
