// The plan flex_attention_backward would run for a call, as text, without running it: what
// `flexjit bench --backward --autotune ...` prints as the chosen dK/dV and dQ configs (tuned ones
// when the tuning table has them).
#pragma once

#include <flexjit/attention.h>
#include <flexjit/backward.h>

#include <string>

namespace flexjit::runtime {

// Plan::str() of the backward of q, k, v (one line per step: preprocess, dK/dV, dQ), with
// stand-ins for out, lse, dout and the buffer gradients in the inputs' layouts; a stored tuned
// config is looked up (cached or search mode), nothing is searched or compiled. "(no kernel)"
// when the backward launches none (empty lengths). Throws what the call would for bad inputs.
std::string describe_backward_plan(Context& ctx, const TensorRef& q, const TensorRef& k,
                                   const TensorRef& v, const AttentionOptions& options,
                                   const BackwardOptions& backward = {});

}  // namespace flexjit::runtime
