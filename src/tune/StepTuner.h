// Autotuning at plan time (docs/tuning.md): StepTuning is the runtime::Tuner (plan/Plan.h) that
// the entry points hand to the plans they build; runtime::plan_step has it complete a step, so
// every family's plan is tuned the same way, through the Variant interface and the family's
// launches. The caller's explicit config values always win over tuned ones (runtime::below()).
// The registry selects the step's variant once; the candidates of a search and the step itself
// are completed with that selection, each once: the step's description is the stored winner's
// (checked against the call's workspace), the searched winner's own, or the defaults'.
//
//   off     no lookup: the variant's defaults table;
//   cached  the stored winner for this key (tune/TuningKey.h), else the defaults;
//   search  the stored winner, else: prune the config space (tune/Prune.h), compile every
//           candidate in parallel, run the default and compare every candidate's outputs with
//           its (the dtype's tolerance), time the survivors with CUDA events (warm-up, median of
//           repeats, L2 flushed before each), store the fastest.
// Candidates run on the call's own inputs and outputs (the outputs are rewritten by the winner
// afterwards), on a scratch workspace. Every run of a candidate starts from the same state: the
// outputs the family adds into (TuningOutputs::accumulated: the backward's buffer gradients) are
// zeroed and the step it reads the workspace of (StepTuning::before: the backward's preprocess,
// which also zeroes the dQ accumulator) runs again, outside the timed region. Steps that turn a
// candidate's workspace into the outputs (StepTuning::after: decoding's combine after the split)
// run with it, inside the timed region, so that a config that moves work between them (the
// split count) is timed and checked whole. A candidate that fails to compile, launch or match is
// reported and skipped, never fatal; a kernel fault that poisons the CUDA context is not
// recoverable.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/tensor.h>

#include "kernels/Variant.h"
#include "plan/ContextImpl.h"
#include "plan/Plan.h"

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flexjit::tune {

enum class Mode { Off, Cached, Search };
const char* to_string(Mode m);  // "off", "cached", "search"
// "off" | "cached" | "search" (any case); nullopt otherwise.
std::optional<Mode> parse_mode(std::string_view s);
// The mode of an AutotuneMode: FromEnv reads FLEXJIT_AUTOTUNE (unset or empty: off; a value
// that is none of the three is a warning, then off).
Mode resolve_mode(AutotuneMode m);
// FLEXJIT_PRINT_AUTOTUNING=1: every candidate's time, each pruned config's reason and the winner
// go to stderr.
bool print_enabled();

// A step of the same plan that runs with every candidate of the step being tuned: complete,
// built by the tuner through the context's builder (runtime::PlanStep has the same members;
// companion_of makes one from it).
struct CompanionStep {
  kernels::KernelDesc desc;
  Mods mods;
  size_t workspace_bytes = 0;
  std::function<std::vector<kernels::Launch>(void* workspace)> launches;
};

// A planned step as the tuner runs it beside another's candidates (StepTuning::before, ::after).
inline CompanionStep companion_of(const runtime::PlanStep& step) {
  return {step.desc, step.mods, step.workspace_bytes, step.launches};
}

// How a step is tuned: the context (device, builder, its cache directory) and the mode. The
// runtime::Tuner of a plan: complete_step() below.
struct StepTuning final : runtime::Tuner {
  ContextImpl* ctx = nullptr;
  Mode mode = Mode::Off;
  runtime::CuStream stream = nullptr;  // where candidates run (the caller's stream)
  // The earlier step whose workspace slice the tuned step reads (PlanStep::workspace_of): run on
  // a scratch slice before every run of a candidate (untimed), which launches on that slice.
  std::optional<CompanionStep> before;
  // The later steps that read the candidate's workspace and write the compared outputs, made for
  // each candidate (their launches may depend on its config); timed with the candidate. Their
  // own workspace_bytes must be 0: they launch on the candidate's workspace.
  std::function<std::vector<CompanionStep>(const kernels::KernelDesc& candidate)> after;
  // Appended to the shape bucket of the key: what else decides the family's best config
  // ("ctas64": decoding's split count follows the CTAs of one split). Empty: nothing.
  std::string bucket_extra;
  // > 0: the workspace the caller gave (AttentionOptions::workspace) and the step's slice of it:
  // candidates that need more are pruned, and a stored winner that needs more is not used (the
  // defaults run). 0: the plan allocates its own.
  size_t workspace_limit = 0;
  bool active() const override { return ctx != nullptr && mode != Mode::Off; }
  runtime::CompletedStep complete(const kernels::KernelDesc& problem,
                                  const kernels::InputFacts& facts, const Mods& mods,
                                  const kernels::Params& caller, std::string_view forced,
                                  const runtime::StepIo& io) const override;
};
// For a call on `ctx` with `mode`; `stream` is a CUstream (null: the default stream).
StepTuning step_tuning(Context& ctx, AutotuneMode mode, void* stream);
// The tuning of a call that plans without launching (a workspace size, a plan description):
// `search` becomes `cached`, so the plan is the one the call itself runs after a search.
StepTuning lookup_only(StepTuning tuning);

// A step completed with its tuned config (runtime::Tuner::complete): `problem` is the step's
// problem as given to Registry::complete; `caller` the caller's overrides (they select the
// variant, and win over tuned values); `forced` a variant the caller named. The config is the
// stored winner's, else (search) the winner of a search run now, else the defaults. A variant
// whose config space holds one config is not searched (nothing to choose). Inactive: the
// registry's complete() of the caller's overrides.
runtime::CompletedStep complete_step(const StepTuning& tuning, const kernels::KernelDesc& problem,
                                     const kernels::InputFacts& facts, const Mods& mods,
                                     const kernels::Params& caller, std::string_view forced,
                                     const runtime::StepIo& io);

// How many searches this process has run (each times a step's candidates): what tests read to
// see that a stored winner is used without timing.
uint64_t search_count();

// Elementwise agreement of a candidate's output with the reference's, values widened to double:
// |a - r| <= atol + rtol |r| with the dtype's tolerance (bf16 2e-2, f16 5e-3, f32 2e-3: tiles
// change the order of fp32 sums, rounding then differs in the last bits; i32 and bool exact);
// a NaN or infinity is
// accepted only where the reference has the same. Empty when they agree, else the first
// mismatch: "element 1234: 0.51 vs 0.75 (tolerance 0.035)".
std::string compare_outputs(DType dtype, const std::vector<double>& reference,
                            const std::vector<double>& candidate);

}  // namespace flexjit::tune
