// block_mask/warp_per_tile: create_block_mask on the GPU (templates/block_mask.cuh). One module,
// two entry points launched in order on one stream:
//   flexjit_block_mask_classify  one warp per (b, h, tile the host analysis left undecided)
//                                evaluates the mask_mod over the tile (skipped when every tile
//                                was decided on the host);
//   flexjit_block_mask_index     one warp per kv_* row and per q_* column writes the arrays.
// Problem flags: q_block, kv_block (the sparse tile size). Config: num_warps of the classify
// kernel (one tile each). Only the mask_mod reaches the source (Variant::kernel_mods).
#pragma once

#include "kernels/Family.h"
#include "kernels/TuningOutputs.h"
#include "kernels/Variant.h"

#include <flexjit_abi.h>

#include <cstdint>
#include <vector>

namespace flexjit::kernels {

// What the block-mask launches read and write: the output arrays and sizes, the mask's
// parameters, and the host analysis' verdicts on the device.
struct BlockMaskInputs {
  FjBlockMaskBuildArgs args{};
  std::vector<uint64_t> mod_params;  // FjModParams of mask_only(mods)
  const void* hints = nullptr;       // [num_q_blocks * num_kv_blocks] verdicts, or null
  const void* tiles = nullptr;       // the undecided tile numbers, or null for all
  void* kinds = nullptr;             // [Bm * Hm * tiles] classify output, or null
  int64_t num_unknown = 0;           // tiles to classify per (b, h)
};

using BlockMaskVariant = FamilyVariant<Family::BlockMask, BlockMaskInputs>;

}  // namespace flexjit::kernels

// The autotuner compares every array a candidate config writes with the default's (exactly).
template <>
struct flexjit::kernels::TuningOutputs<flexjit::kernels::BlockMaskInputs> {
  static constexpr bool kCompared = true;
  static std::vector<TensorRef> accumulated(const kernels::BlockMaskInputs&, kernels::Family) {
    return {};
  }
  static std::vector<TensorRef> of(const kernels::BlockMaskInputs& in, kernels::Family) {
    const FjBlockMaskBuildArgs& a = in.args;
    const int64_t B = a.batch, H = a.heads, nq = a.num_q_blocks, nkv = a.num_kv_blocks;
    std::vector<TensorRef> v;
    auto add = [&](int* p, std::vector<int64_t> shape) {
      if (p != nullptr) {
        v.push_back(
            TensorRef::contiguous(p, DType::I32, std::move(shape), TensorRef::Device::CUDA));
      }
    };
    add(a.kv_num_blocks, {B, H, nq});
    add(a.kv_indices, {B, H, nq, nkv});
    add(a.full_kv_num_blocks, {B, H, nq});
    add(a.full_kv_indices, {B, H, nq, nkv});
    add(a.q_num_blocks, {B, H, nkv});
    add(a.q_indices, {B, H, nkv, nq});
    add(a.full_q_num_blocks, {B, H, nkv});
    add(a.full_q_indices, {B, H, nkv, nq});
    return v;
  }
};

namespace flexjit::kernels {

KernelDesc block_mask_problem(const cuda::Arch& arch, int q_block, int kv_block);

// The block-mask family's record (kernels/Family.h): no workload kind of its own (a manifest
// builds it for a workload whose mods have a mask_mod), no math mode, no config keys; a query's
// problem is block_mask_problem with its block_size both ways.
FamilyInfo block_mask_family();

class BlockMaskWarpPerTile : public BlockMaskVariant {
 public:
  static constexpr const char* kClassify = "flexjit_block_mask_classify";
  static constexpr const char* kIndex = "flexjit_block_mask_index";

  std::string_view name() const override { return "warp_per_tile"; }
  std::string_view summary() const override;
  std::optional<std::string> unsupported(const KernelDesc& problem,
                                         const InputFacts& facts) const override;
  void validate(const KernelDesc& desc) const override;
  Params default_config(const KernelDesc& problem) const override;
  std::vector<Params> config_space(const KernelDesc& problem) const override;
  std::vector<TemplateText> templates() const override;
  std::vector<std::string> entry_points() const override { return {kClassify, kIndex}; }
  Mods kernel_mods(const Mods& mods) const override { return mask_only(mods); }
  cuda::GeneratedSource generate(const Mods& mods, const KernelDesc& desc) const override;
  unsigned smem_bytes(const KernelDesc&) const override { return 0; }
  std::vector<Launch> launches(const KernelDesc& desc, const BlockMaskInputs& in,
                               void* workspace) const override;
};

}  // namespace flexjit::kernels
