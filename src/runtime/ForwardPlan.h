// The plan flex_attention would run for a call, as text, without running it: what
// `flexjit bench` prints as the chosen config (a tuned one when the tuning table has it).
#pragma once

#include <flexjit/attention.h>

#include "kernels/forward/Forward.h"
#include "plan/Plan.h"
#include "tune/StepTuner.h"

#include <optional>
#include <string>

namespace flexjit::runtime {

// The forward problem of validated inputs: dtype, head dims, GQA, the block mask's full blocks,
// the math mode and, on a KV cache (in.page_table / in.seq_lens), the page_size / seq_lens flags.
kernels::KernelDesc forward_problem_of(const cuda::Arch& arch, const kernels::ForwardInputs& in,
                                       const AttentionOptions& options);

// The facts of `mods` that the forward's defaults read (kernels::InputFacts: a mask_mod, one that
// divides by a run-time value or loads a buffer at kv_idx, a score_mod that reads kv_idx), into
// `in`; every forward call takes them, on a KV cache too.
void set_mod_facts(kernels::ForwardInputs& in, const Mods& mods);

// The one-step forward plan: the registry's forward variant for these inputs (or
// options.variant), its config resolved from options.config (and `tuning`).
Plan plan_forward(const cuda::Arch& arch, const kernels::ForwardInputs& in, const Mods& mods,
                  const AttentionOptions& options, const tune::StepTuning& tuning);

// Why no forward variant can serve these inputs (the registry's reasons); nullopt when one can.
std::optional<std::string> forward_unsupported(const cuda::Arch& arch,
                                               const kernels::ForwardInputs& in,
                                               const AttentionOptions& options);

// Plan::str() of the call (one line per step); a stored tuned config is looked up (cached or
// search mode), nothing is searched or compiled. Throws what the call would for bad inputs.
std::string describe_forward_plan(Context& ctx, const TensorRef& q, const TensorRef& k,
                                  const TensorRef& v, const AttentionOptions& options);

}  // namespace flexjit::runtime
