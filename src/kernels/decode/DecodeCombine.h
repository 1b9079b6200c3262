// decode_combine/warp_per_row: merges the split kernel's partials (templates/decode_combine.cuh;
// docs/kernels/decode.md). One warp per (b, h, q) row; only a sink_mod's mods reach it
// (Variant::kernel_mods), so one kernel per dtype and Dv serves every mods without one. Config:
// num_warps {1, 2, 4, 8} rows per CTA. The module also holds the opt-in page check of a KV cache
// (templates/decode_check.cuh: kCheckInit, kCheckPages; launched by runtime/Decode.cpp, not by
// launches()). Head dims: Dv any multiple of 8 up to 256; the lanes divide a row as for its tile
// dim (64 / 128 / 256) and skip the padding.
#pragma once

#include "kernels/decode/Decode.h"

#include <initializer_list>

namespace flexjit::kernels {

// The tile dims of the combine kernel (kernels/HeadDims.h): a row of Dv floats is divided among
// the lanes as one of the tile's, 64 / 128 / 256 (warp_batched: tile / 16 lanes per split).
inline constexpr std::initializer_list<int> kDecodeCombineTileDims = {64, 128, 256};

//
// decode_combine/warp_batched (the default since 2026-11-25's H100 sweep, ranked above
// warp_per_row, which stays selectable by name): the same kernel with the warp's lanes divided
// among the splits
// (FjConfig::kSplitLanes): Dv / 16 lanes per split, so up to 32 / (Dv / 16) splits (4 at Dv =
// 128) are loaded in one round trip instead of one round trip per split.
class DecodeCombineWarpPerRow : public DecodeCombineVariant {
 public:
  static constexpr const char* kEntry = "flexjit_decode_combine";
  static constexpr const char* kCheckInit = "flexjit_decode_check_init";
  static constexpr const char* kCheckPages = "flexjit_decode_check_pages";

  // split_lanes: false the split loop of one warp (warp_per_row); true the warp's lanes
  // divided among the splits (warp_batched).
  explicit DecodeCombineWarpPerRow(bool split_lanes = false) : split_lanes_(split_lanes) {}

  std::string_view name() const override { return split_lanes_ ? "warp_batched" : "warp_per_row"; }
  int priority() const override { return split_lanes_ ? 1 : 0; }
  bool experimental() const override { return false; }
  std::string_view summary() const override;
  std::optional<std::string> unsupported(const KernelDesc& problem,
                                         const InputFacts& facts) const override;
  void validate(const KernelDesc& desc) const override;
  Params default_config(const KernelDesc& problem) const override;
  std::vector<Params> config_space(const KernelDesc& problem) const override;
  std::vector<TemplateText> templates() const override;
  std::vector<std::string> entry_points() const override {
    return {kEntry, kCheckInit, kCheckPages};
  }
  // Only a sink_mod changes the combine (the row's sink joins its denominator): then the whole
  // mods reach it, so that its FjModParams is the call's (DecodeInputs::mod_params); without
  // one, none do and one kernel per dtype and Dv serves every mods.
  Mods kernel_mods(const Mods& mods) const override {
    return mods.sink_mod.defined() ? mods : Mods{};
  }
  cuda::GeneratedSource generate(const Mods& mods, const KernelDesc& desc) const override;
  unsigned smem_bytes(const KernelDesc&) const override { return 0; }
  // Reads the split step's workspace (the plan gives the combine step that slice).
  std::vector<Launch> launches(const KernelDesc& desc, const DecodeInputs& in,
                               void* workspace) const override;

 private:
  bool split_lanes_ = false;
};

}  // namespace flexjit::kernels
