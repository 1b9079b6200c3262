// The plan flex_attention would run for a call, as text, without running it: what
// `flexjit bench` prints as the chosen config (a tuned one when the tuning table has it).
#pragma once

#include <flexjit/attention.h>

#include <string>

namespace flexjit::runtime {

// Plan::str() of the call (one line per step); a stored tuned config is looked up (cached or
// search mode), nothing is searched or compiled. Throws what the call would for bad inputs.
std::string describe_forward_plan(Context& ctx, const TensorRef& q, const TensorRef& k,
                                  const TensorRef& v, const AttentionOptions& options);

}  // namespace flexjit::runtime
