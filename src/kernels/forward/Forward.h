// The forward family: out = softmax(score_mod(scale · Q Kᵀ) masked by mask_mod) · V and the
// log-sum-exp, per (batch, query head). Its variants (sm80_mma here; the test suite's naive
// reference; later sm90a_wgmma) share the problem description, the inputs and the kernel ABI
// (FjFwdArgs in templates/flexjit_abi.h).
//
// Problem flags (KernelDesc::flags):
//   divisible    1 when Sq % block_m == 0 and Skv % block_n == 0 (bounds checks compiled out)
//   full_blocks  1 when the block mask carries full_* arrays (full tiles skip the mask_mod)
//   fast_math    1: the score_mod's transcendentals use hardware approximations (MathMode.h)
#pragma once

#include <flexjit/attention.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/tensor.h>

#include "kernels/Variant.h"
#include "tune/TuningOutputs.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace flexjit::kernels {

// What a forward launch reads and writes, as the runtime validated it.
struct ForwardInputs {
  TensorRef q, k, v, out;
  std::optional<TensorRef> lse;
  QkvShape shape;
  std::optional<float> scale;                   // default 1 / sqrt(head_dim_qk)
  const DeviceBlockMask* block_mask = nullptr;  // null: every tile, mask_mod everywhere
  std::vector<uint64_t> mod_params;             // the FjModParams bytes (runtime/ModArgs.h)
};

using ForwardVariant = FamilyVariant<Family::Forward, ForwardInputs>;

}  // namespace flexjit::kernels

// The autotuner compares out and lse of a candidate config with the default's.
template <>
struct flexjit::tune::TuningOutputs<flexjit::kernels::ForwardInputs> {
  static constexpr bool kCompared = true;
  static std::vector<TensorRef> of(const kernels::ForwardInputs& in, kernels::Family) {
    std::vector<TensorRef> v = {in.out};
    if (in.lse) v.push_back(*in.lse);
    return v;
  }
  static std::vector<TensorRef> accumulated(const kernels::ForwardInputs&, kernels::Family) {
    return {};
  }
};

namespace flexjit::kernels {

// The forward problem of a call (no variant, no config yet); fast_math as MathMode::Auto resolves
// it (set_math_mode changes it).
KernelDesc forward_problem(const cuda::Arch& arch, DType dtype, int head_dim_qk, int head_dim_v,
                           int gqa_ratio, bool divisible, bool full_blocks);

// The input facts of a call: alignment, the block mask's tile size, the lengths.
InputFacts forward_facts(const ForwardInputs& in);

// The config overrides a caller's BlockConfig asks for: nonzero fields only (zeros are left to
// the variant). UnsupportedError for a negative field.
Params config_overrides(const BlockConfig& config);

// "fj_bf16", "fj_f16", "float": the template's Element type; InternalError for other dtypes.
const char* element_type(DType dtype);

}  // namespace flexjit::kernels
