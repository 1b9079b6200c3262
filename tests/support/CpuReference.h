// The GPU tests' reference: the CPU backend's fp64 mode (cpu/ForwardKernel.h), with the same
// signature as the interpreter reference (support/ReferenceAttention.h), which it matches to
// 1e-12 ([cpu] tests in tests/unit/test_cpu_attention.cpp) and outruns by orders of magnitude.
#pragma once

#include "support/ReferenceAttention.h"

namespace flexjit::test {

// q [B, Hq, Sq, Dqk], k [B, Hkv, Skv, Dqk], v [B, Hkv, Skv, Dv], all contiguous f32.
ReferenceResult cpu_reference_attention(const Mods& mods, const AttentionShape& s,
                                        const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, float scale,
                                        const ir::EvalEnv& bindings);

}  // namespace flexjit::test
