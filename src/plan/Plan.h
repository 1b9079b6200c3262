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
#include <flexjit/tensor.h>

#include "Pipeline.h"
#include "device/ModuleCache.h"
#include "kernels/Registry.h"
#include "kernels/TuningOutputs.h"

#include <functional>
#include <memory>
#include <string>
#include <string_view>
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

// What a tuner needs of a step beyond the Variant interface; plan_step binds it.
struct StepIo {
  std::function<std::vector<kernels::Launch>(const kernels::KernelDesc&, void* workspace)> launches;
  std::function<size_t(const kernels::KernelDesc&)> workspace_bytes;
  std::vector<TensorRef> outputs;      // compared with the default's; empty: not compared
  std::vector<TensorRef> accumulated;  // zeroed before every run (TuningOutputs::accumulated)
};

// A step's description as the registry completed it, and how its variant was chosen.
struct CompletedStep {
  kernels::KernelDesc desc;  // complete: variant and config set
  kernels::Selection selection;
};

// Where plan_step gets a tuned step from. Planning knows only this interface; the autotuner
// (tune::StepTuning, tune/StepTuner.h) implements it and the entry points hand one to the plans
// they build, so nothing a plan is made of depends on tuning.
class Tuner {
 public:
  virtual ~Tuner() = default;
  // False: plan_step asks nothing; the registry completes the step with the variant's defaults
  // (below the caller's values).
  virtual bool active() const = 0;
  // The step completed by the registry once: its variant selected for `problem` (or `forced`, a
  // variant the caller named) with the caller's overrides `caller`, and its config resolved with
  // the tuned values below `caller`'s (none tuned: the defaults). `io` is the step's launches and
  // outputs on the call's inputs. The description is the one plan_step launches, not completed
  // again.
  virtual CompletedStep complete(const kernels::KernelDesc& problem,
                                 const kernels::InputFacts& facts, const Mods& mods,
                                 const kernels::Params& caller, std::string_view forced,
                                 const StepIo& io) const = 0;
  // A tuner that is never active: the plan of an untuned call.
  static const Tuner& none();
};

// The caller's overrides with the tuned values below them: a value the caller set wins.
kernels::Params below(const kernels::Params& caller, const kernels::Params& tuned);

// Plans one step of family variant V for `inputs`: the registry selects the variant for
// `problem` (or takes `forced`), resolves its config with `overrides`, and the step launches
// V::launches(desc, inputs, workspace). With `tuner` active (tune::step_tuning(ctx,
// options.autotune, options.stream) makes one), the tuner completes the step, a tuned config
// (stored, or searched now on these inputs) below `overrides` (tune/StepTuner.h,
// docs/tuning.md). Either way the step's description is completed once.
template <typename V>
PlanStep plan_step(const kernels::KernelDesc& problem, const typename V::InputsType& inputs,
                   const kernels::InputFacts& facts, const Mods& mods,
                   const kernels::Params& overrides = {}, std::string_view forced = {},
                   const Tuner& tuner = Tuner::none()) {
  const kernels::Registry& reg = kernels::Registry::global();
  PlanStep step;
  if (tuner.active()) {
    StepIo io;
    io.launches = [&inputs](const kernels::KernelDesc& d, void* ws) {
      return kernels::variant_as<V>(kernels::Registry::global(), d).launches(d, inputs, ws);
    };
    io.workspace_bytes = [&inputs](const kernels::KernelDesc& d) {
      return kernels::variant_as<V>(kernels::Registry::global(), d).workspace_bytes(d, inputs);
    };
    using Outputs = kernels::TuningOutputs<typename V::InputsType>;
    io.outputs = Outputs::of(inputs, V::kFamily);
    io.accumulated = Outputs::accumulated(inputs, V::kFamily);
    CompletedStep done = tuner.complete(problem, facts, mods, overrides, forced, io);
    step.desc = std::move(done.desc);
    step.selection = std::move(done.selection);
  } else {
    step.desc = reg.complete(problem, facts, overrides, forced, &step.selection);
  }
  const V& variant = kernels::variant_as<V>(reg, step.desc);
  step.mods = mods;
  step.workspace_bytes = variant.workspace_bytes(step.desc, inputs);
  step.launches = [&variant, desc = step.desc, inputs](void* ws) {
    return variant.launches(desc, inputs, ws);
  };
  return step;
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
