// forward_schedule/block_per_tile: a block mask as the union schedule that the sm_90a forward's
// 192-row tiles read (templates/forward_schedule.cuh; FjUnionScheduleArgs in flexjit_abi.h;
// docs/kernels/forward_sm90.md "Union schedule"). One CTA of 256 threads per (b, h, query tile)
// of the mask.
//
// The forward's companion (kernels::Variant::companions): ForwardSm90Wgmma names it for 192-row
// tiles with a mask_mod, KernelBuilder builds it beside the forward (its own NVRTC program, on
// another thread), and the forward's launches() puts this variant's launch before its own, with
// Launch::companion set. No mods reach it, so one kernel per arch serves every forward: in the
// forward's own module it was ~0.1-0.2 s of every cold compile (docs/caching.md). The family has
// no workload kind and no config keys; `flexjit compile --kernel forward_schedule` builds it.
#pragma once

#include "kernels/Family.h"
#include "kernels/KernelDesc.h"
#include "kernels/forward_companions/Companion.h"

#include <flexjit_abi.h>

#include <cstdint>
#include <functional>

namespace flexjit::kernels {

// One union schedule's launch: the arguments (the caller's block mask, where the headers and
// entries go, the tiles) and its rows (the mask's batch x heads x query tiles).
struct UnionScheduleInputs {
  FjUnionScheduleArgs args{};
  int64_t rows = 0;
  // Right after the launch on its stream (device/MaskScheduleCache.h's record that it was built);
  // empty: nothing.
  std::function<void(runtime::CuStream)> after;
};

class UnionScheduleBlockPerTile
    : public CompanionVariant<Family::ForwardSchedule, UnionScheduleInputs> {
 public:
  static constexpr const char* kEntry = "flexjit_forward_union_schedule";
  static constexpr int kThreads = 256;  // a CTA's threads (FjScheduleConfig::kThreads)

  UnionScheduleBlockPerTile() : CompanionVariant("forward_schedule.cuh") {}

  std::string_view name() const override { return "block_per_tile"; }
  std::string_view summary() const override;
  std::optional<std::string> unsupported(const KernelDesc& problem,
                                         const InputFacts& facts) const override;
  std::vector<std::string> entry_points() const override { return {kEntry}; }
  cuda::GeneratedSource generate(const Mods& mods, const KernelDesc& desc) const override;
  // Dynamic shared memory per launch (2 bytes per KV tile): launches().
  std::vector<Launch> launches(const KernelDesc& desc, const UnionScheduleInputs& in,
                               void* workspace) const override;
};

// The problem of the union schedule's kernel on `arch` (no dtype, dims or flags shape it).
KernelDesc union_schedule_problem(const cuda::Arch& arch);

// The complete description of that kernel (the forward's companion).
KernelDesc union_schedule_desc(const cuda::Arch& arch);

// The family's record (kernels/Family.h): no workload kind of its own (the sm_90a forward builds
// and launches it), no config keys.
FamilyInfo forward_schedule_family();

}  // namespace flexjit::kernels
