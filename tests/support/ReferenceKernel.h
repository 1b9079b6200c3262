// forward/reference: a naive GPU attention kernel (tests/support/reference.cuh) — fp32 math,
// the scores of every row materialized in the plan's workspace, the mask_mod evaluated at every
// position, no block mask, no tiling. Slow and memory hungry (B·Hq·Sq·Skv floats) but
// independent of the fast variants: tests compare against it at shapes too large for the CPU
// reference.
//
// It is an ordinary forward variant that the test suite registers from outside the library —
// one template, one class, one registration — and runs through the public API:
// AttentionOptions::variant = "reference". It is never auto-selected.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/context.h>

#include "kernels/forward/Forward.h"

namespace flexjit::test {

class ForwardReference : public kernels::ForwardVariant {
 public:
  static constexpr const char* kName = "reference";
  std::string_view name() const override { return kName; }
  std::string_view summary() const override;
  bool auto_select() const override { return false; }
  std::optional<std::string> unsupported(const kernels::KernelDesc& problem,
                                         const kernels::InputFacts& facts) const override;
  void validate(const kernels::KernelDesc& desc) const override;
  kernels::Params default_config(const kernels::KernelDesc&) const override { return {}; }
  std::vector<kernels::Params> config_space(const kernels::KernelDesc&) const override {
    return {kernels::Params{}};
  }
  std::vector<kernels::TemplateText> templates() const override;
  std::vector<std::string> entry_points() const override { return {"flexjit_reference_forward"}; }
  cuda::GeneratedSource generate(const Mods& mods, const kernels::KernelDesc& desc) const override;
  unsigned smem_bytes(const kernels::KernelDesc&) const override { return 0; }
  size_t workspace_bytes(const kernels::KernelDesc& desc,
                         const kernels::ForwardInputs& in) const override;
  std::vector<kernels::Launch> launches(const kernels::KernelDesc& desc,
                                        const kernels::ForwardInputs& in,
                                        void* workspace) const override;
};

// Registers ForwardReference in kernels::Registry::global() (once; later calls do nothing).
void register_reference_variant();

// out = softmax(score_mod(scale · q kᵀ) masked by mask_mod) · v through forward/reference, for
// q, k, v of f32, f16 or bf16 (any strides, last dim contiguous, no alignment requirement).
// Synchronous: returns when the result is written.
void reference_attention_into(Context& ctx, const TensorRef& q, const TensorRef& k,
                              const TensorRef& v, const TensorRef& out, const TensorRef* lse,
                              const Mods& mods, const ModBindings& bindings = {},
                              std::optional<float> scale = std::nullopt);

}  // namespace flexjit::test
