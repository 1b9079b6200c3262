// decode_combine/warp_per_row: merges the split kernel's partials (templates/decode_combine.cuh;
// docs/kernels/decode.md). One warp per (b, h, q) row; no mods reach it (Variant::kernel_mods),
// so one kernel per dtype and Dv serves every mod. Config: num_warps {1, 2, 4, 8} rows per CTA.
// The module also holds the opt-in page check of a KV cache (templates/decode_check.cuh:
// kCheckInit, kCheckPages; launched by runtime/Decode.cpp, not by launches()).
#pragma once

#include "kernels/decode/Decode.h"

namespace flexjit::kernels {

//
// decode_combine/warp_batched (experimental, ranked above warp_per_row; FLEXJIT_ENABLE_VARIANTS=
// decode_combine/warp_batched): the same kernel issuing the partial loads of 8 splits before
// it uses any (FjConfig::kBatch), so a row costs about one L2 round trip per 8 splits instead
// of one per split.
class DecodeCombineWarpPerRow : public DecodeCombineVariant {
 public:
  static constexpr const char* kEntry = "flexjit_decode_combine";
  static constexpr const char* kCheckInit = "flexjit_decode_check_init";
  static constexpr const char* kCheckPages = "flexjit_decode_check_pages";

  // batch: 0 the split loop as written (warp_per_row); > 0 loads of `batch` splits issued
  // together (warp_batched).
  explicit DecodeCombineWarpPerRow(int batch = 0) : batch_(batch) {}

  std::string_view name() const override { return batch_ > 0 ? "warp_batched" : "warp_per_row"; }
  int priority() const override { return batch_ > 0 ? 1 : 0; }
  bool experimental() const override { return batch_ > 0; }
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
  Mods kernel_mods(const Mods&) const override { return Mods{}; }
  cuda::GeneratedSource generate(const Mods& mods, const KernelDesc& desc) const override;
  unsigned smem_bytes(const KernelDesc&) const override { return 0; }
  // Reads the split step's workspace (the plan gives the combine step that slice).
  std::vector<Launch> launches(const KernelDesc& desc, const DecodeInputs& in,
                               void* workspace) const override;

 private:
  int batch_ = 0;
};

}  // namespace flexjit::kernels
