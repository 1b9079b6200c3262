// forward_fp8_vt/block_per_64_keys: V^T of e4m3 v for the sm_90a forward (templates/
// forward_fp8_vt.cuh; FjFp8VtArgs in flexjit_abi.h; docs/kernels/forward_sm90.md "FP8"): wgmma's
// e4m3 path takes P V's B operand K-major only, so the forward reads V^T [B, Hkv, Dv, skv_pad]
// from its workspace, written first by this kernel. One CTA of 256 threads per 64 keys of one
// (b, kv head).
//
// The e4m3 forward's companion (kernels::Variant::companions, as the union schedule): no mods
// reach it, so one kernel per arch and head dim v serves every e4m3 forward, built beside it.
// Its problem: arch, dtype e4m3 and head_dim_v (v's real head dim, a multiple of 16; head_dim_qk
// mirrors it). No config keys.
#pragma once

#include "kernels/Family.h"
#include "kernels/KernelDesc.h"
#include "kernels/forward_companions/Companion.h"

#include <flexjit_abi.h>

#include <cstdint>

namespace flexjit::kernels {

// One V^T pre-pass: its arguments and the launch's extent (batch; FjFp8VtArgs has the rest).
struct Fp8VtInputs {
  FjFp8VtArgs args{};
  int64_t batch = 0;
};

class Fp8VtBlockPer64Keys : public CompanionVariant<Family::ForwardFp8Vt, Fp8VtInputs> {
 public:
  static constexpr const char* kEntry = "flexjit_forward_fp8_vt";
  static constexpr int kThreads = 256;
  static constexpr int kKeys = 64;  // keys per CTA

  Fp8VtBlockPer64Keys() : CompanionVariant("forward_fp8_vt.cuh") {}

  std::string_view name() const override { return "block_per_64_keys"; }
  std::string_view summary() const override;
  std::optional<std::string> unsupported(const KernelDesc& problem,
                                         const InputFacts& facts) const override;
  std::vector<std::string> entry_points() const override { return {kEntry}; }
  cuda::GeneratedSource generate(const Mods& mods, const KernelDesc& desc) const override;
  std::vector<Launch> launches(const KernelDesc& desc, const Fp8VtInputs& in,
                               void* workspace) const override;
};

// The problem of the V^T pre-pass on `arch` for v's head dim `head_dim_v`.
KernelDesc fp8_vt_problem(const cuda::Arch& arch, int head_dim_v);

// The complete description of that kernel (the e4m3 forward's companion).
KernelDesc fp8_vt_desc(const cuda::Arch& arch, int head_dim_v);

// The family's record (kernels/Family.h): no workload kind of its own (the sm_90a e4m3 forward
// builds and launches it), no config keys.
FamilyInfo forward_fp8_vt_family();

}  // namespace flexjit::kernels
