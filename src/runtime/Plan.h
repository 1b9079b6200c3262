// A runtime call as a plan: validate → plan → build → launch.
//
//   validate  the call's inputs (the API functions: Attention.cpp, CreateBlockMask.cpp);
//   plan      which kernels in which order, each a complete KernelDesc chosen by the registry
//             (kernels/Registry.h), and the device workspace they need;
//   build     every step's kernel through the context's KernelBuilder (memo, memory and disk
//             caches, NVRTC) and its module loaded — build_plan();
//   launch    the steps' launches in order on one stream, on a workspace that the caller gave
//             or that is allocated and freed in stream order around them — launch_plan().
//
// A one-kernel forward is a plan with one step; the backward (preprocess, dK/dV, dQ) and
// split-KV decoding (split, combine) are plans with several.
#pragma once

#include <flexjit/attention.h>

#include "Pipeline.h"
#include "kernels/Registry.h"
#include "runtime/ModuleCache.h"
#include "tune/StepTuner.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace flexjit::runtime {

struct PlanStep {
  kernels::KernelDesc desc;  // complete: variant and config set
  Mods mods;                 // as the caller gave them (the variant keeps what its kernel needs)
  kernels::Selection selection;
  size_t workspace_offset = 0;  // into the plan's workspace (256-byte aligned)
  size_t workspace_bytes = 0;
  // >= 0: the step launches on the slice of that earlier step instead of its own (a step that
  // consumes what an earlier one left in its workspace: split-KV decoding's combine, the
  // backward's dK/dV and dQ reading lse2 / delta).
  int workspace_of = -1;
  // The step's launches on its slice of the workspace (null when it needs none).
  std::function<std::vector<kernels::Launch>(void* workspace)> launches;
};

struct Plan {
  std::vector<PlanStep> steps;
  size_t workspace_bytes = 0;

  // Appends a step, placing its workspace slice after the others'.
  void add(PlanStep step);
  // "forward/sm80_mma sm_90a bf16 ... (workspace 0 bytes)", one line per step.
  std::string str() const;
};

// Plans one step of family variant V for `inputs`: the registry selects the variant for
// `problem` (or takes `forced`), resolves its config with `overrides`, and the step launches
// V::launches(desc, inputs, workspace). With `tuning` active (tune::step_tuning(ctx,
// options.autotune, options.stream)), a tuned config (stored, or searched now on these inputs)
// comes in below `overrides` (tune/StepTuner.h, docs/tuning.md).
template <typename V>
PlanStep plan_step(const kernels::KernelDesc& problem, const typename V::InputsType& inputs,
                   const kernels::InputFacts& facts, const Mods& mods,
                   const kernels::Params& overrides = {}, std::string_view forced = {},
                   const tune::StepTuning& tuning = {}) {
  const kernels::Registry& reg = kernels::Registry::global();
  kernels::Params tuned;
  if (tuning.active()) {
    tune::StepIo io;
    io.launches = [&inputs](const kernels::KernelDesc& d, void* ws) {
      return kernels::variant_as<V>(kernels::Registry::global(), d).launches(d, inputs, ws);
    };
    io.workspace_bytes = [&inputs](const kernels::KernelDesc& d) {
      return kernels::variant_as<V>(kernels::Registry::global(), d).workspace_bytes(d, inputs);
    };
    io.outputs = tune::TuningOutputs<typename V::InputsType>::of(inputs, V::kFamily);
    io.accumulated = tune::TuningOutputs<typename V::InputsType>::accumulated(inputs, V::kFamily);
    tuned = tune::tuned_overrides(tuning, problem, facts, mods, overrides, forced, io);
  }
  PlanStep step;
  step.desc = reg.complete(problem, facts, tune::below(overrides, tuned), forced, &step.selection);
  const V& variant = kernels::variant_as<V>(reg, step.desc);
  step.mods = mods;
  step.workspace_bytes = variant.workspace_bytes(step.desc, inputs);
  step.launches = [&variant, desc = step.desc, inputs](void* ws) {
    return variant.launches(desc, inputs, ws);
  };
  return step;
}

// A planned step as the tuner runs it beside another's candidates (tune::StepTuning::before,
// ::after).
inline tune::CompanionStep companion_of(const PlanStep& step) {
  return {step.desc, step.mods, step.workspace_bytes, step.launches};
}

// The built kernels of a plan, one per step (modules loaded on the context's device).
struct BuiltPlan {
  std::vector<BuiltKernel> kernels;
};

BuiltPlan build_plan(KernelBuilder& builder, const Plan& plan);

// Launches every step in order on `stream` on `device` (made current; modules are loaded into
// it on first use). `given` is the caller's workspace (data null: none):
// used when large enough (RuntimeError naming both sizes otherwise); without one, the plan's
// workspace is allocated with cuMemAllocAsync on `stream` and freed with cuMemFreeAsync after
// the last launch, so nothing waits.
void launch_plan(Device& device, const Plan& plan, const BuiltPlan& built, CuStream stream,
                 const Workspace& given);

}  // namespace flexjit::runtime
