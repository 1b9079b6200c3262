// cp_merge/warp_per_row: the GPU's lse merge of context parallelism's partial results
// (templates/cp_merge.cuh; the host's is cp/LseMerge.h). A kernel family of its own, registered
// in kernels/builtins/Builtins.cpp, compiled and cached like every other (NVRTC, memory and disk
// caches) and launched through a plan step (plan/Plan.h). It takes no mods: one kernel per
// dtype serves every call. Config: num_warps {1, 2, 4, 8} rows per CTA.
//
// Three entry points on the same inputs:
//   flexjit_cp_merge       acc, acc_lse  <-  merge(acc, acc_lse, part, part_lse)
//   flexjit_cp_finalize    out, out_lse  <-  acc, acc_lse (out in the dtype of q)
//   flexjit_cp_accumulate  acc rows      +=  part (the backward's dK / dV, buffer gradients)
#pragma once

#include <flexjit/tensor.h>

#include "kernels/Family.h"
#include "kernels/KernelDesc.h"
#include "kernels/Variant.h"

namespace flexjit::cp {

// One merge, finalize or accumulate over a query chunk's rows [B, H, S].
struct MergeInputs {
  enum class Mode { Merge, Finalize, Accumulate };
  Mode mode = Mode::Merge;
  int64_t batch = 0, heads = 0, seqlen = 0, dv = 0;
  // [B, H, S, dv] f32, contiguous; accumulate: [B, H, acc_seqlen, dv], the rows from acc_row0.
  float* acc = nullptr;
  int64_t acc_seqlen = 0, acc_row0 = 0;
  float* acc_lse = nullptr;            // merge, finalize: [B, H, S] f32, contiguous
  TensorRef part;                      // merge, accumulate: [B, H, S, dv] of the kernel's dtype
  TensorRef part_lse;                  // merge: [B, H, S] f32
  TensorRef out;                       // finalize: [B, H, S, dv] of the kernel's dtype
  const TensorRef* out_lse = nullptr;  // finalize: [B, H, S] f32 or null
};

using MergeVariant = kernels::FamilyVariant<kernels::Family::CpMerge, MergeInputs>;

class MergeWarpPerRow : public MergeVariant {
 public:
  static constexpr const char* kMerge = "flexjit_cp_merge";
  static constexpr const char* kFinalize = "flexjit_cp_finalize";
  static constexpr const char* kAccumulate = "flexjit_cp_accumulate";

  std::string_view name() const override { return "warp_per_row"; }
  std::string_view summary() const override;
  std::optional<std::string> unsupported(const kernels::KernelDesc& problem,
                                         const kernels::InputFacts& facts) const override;
  void validate(const kernels::KernelDesc& desc) const override;
  kernels::Params default_config(const kernels::KernelDesc& problem) const override;
  std::vector<kernels::Params> config_space(const kernels::KernelDesc& problem) const override;
  std::vector<kernels::TemplateText> templates() const override;
  std::vector<std::string> entry_points() const override {
    return {kMerge, kFinalize, kAccumulate};
  }
  Mods kernel_mods(const Mods&) const override { return Mods{}; }
  cuda::GeneratedSource generate(const Mods& mods, const kernels::KernelDesc& desc) const override;
  unsigned smem_bytes(const kernels::KernelDesc&) const override { return 0; }
  std::vector<kernels::Launch> launches(const kernels::KernelDesc& desc, const MergeInputs& in,
                                        void* workspace) const override;
};

// The problem of a merge of `dtype` rows of `dv` elements on `arch`.
kernels::KernelDesc merge_problem(const cuda::Arch& arch, DType dtype, int dv);

// The family's record (kernels/Family.h): no workload kind of its own (a context-parallel call
// plans it), num_warps only.
kernels::FamilyInfo cp_merge_family();

}  // namespace flexjit::cp
