// A GPU backward against the CPU backend's fp64 backward of the same function, the check the
// head-dim tests share.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/mods.h>

#include "gpu/GpuTestUtil.h"

#include <string>

namespace flexjit::test {

// A host tensor's values as a contiguous f32 TensorRef (what the CPU backend reads).
TensorRef host_ref(const HostTensor& t);

// Differentiates `mods` in fp64 on the CPU at the GPU forward's out and lse (so that both
// differentiate the same function at the same point) and checks dq, dk, dv and every buffer
// gradient of `g`: finite, relative error at most `tol`. Prints one line of the errors, headed
// by `label`.
void check_backward_f64(const Mods& mods, const ModBindings& host_bindings, const HostTensor& q,
                        const HostTensor& k, const HostTensor& v, const HostTensor& dout,
                        const AttentionResult& fwd, const BackwardResult& g,
                        const std::string& label, double tol = 2e-2);

}  // namespace flexjit::test
