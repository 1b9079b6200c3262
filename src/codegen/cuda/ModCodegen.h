// Lowering of mods to CUDA device functions with fixed signatures (the "hooks" the kernel
// templates call; the templates never see the IR):
//
//   struct alignas(8) FjModParams { ... };   // see ModParamLayout.h; + static_asserts
//   __device__ __forceinline__ float fj_score_mod(const FjModParams& mp, float score,
//                                                 int b, int h, int q_idx, int kv_idx);
//   __device__ __forceinline__ bool fj_mask_mod(const FjModParams& mp,
//                                               int b, int h, int q_idx, int kv_idx);
//
// Both functions are always emitted: an absent score_mod returns `score`, an absent mask_mod
// returns `true`. Bodies are straight-line SSA (`const float t3 = ...;`), one temporary per
// distinct IR node; structurally equal sub-expressions share a temporary even when they are
// distinct nodes. Every operator lowers to a prelude function (templates/prelude.cuh) that
// implements the language's semantics (wrapping i32 arithmetic, floor division and modulo,
// saturating int(x)); see docs/codegen.md for the table.
//
// Select lowers to `c ? a : b` with both a and b computed first as temporaries: both branches
// are evaluated. That is correct because mods have no side effects and captured-buffer loads
// are in bounds by the user's contract for every (b, h, q_idx, kv_idx) in the problem, in
// either branch.
#pragma once

#include <flexjit/mods.h>

#include <cstdint>
#include <string>

namespace flexjit::cuda {

// The FjModParams struct, its layout asserts and the two device functions, for type-checked
// mods. Throws CompileError if a buffer or param name is not an identifier.
std::string generate_mod_functions(const Mods& mods);

// Whether the kernel must apply the mod at all: false when it is absent or the identity
// (score_mod exactly `score`, mask_mod exactly `true`), so templates can skip the call.
bool has_score_mod(const Mods& mods);
bool has_mask_mod(const Mods& mods);

// Exact C literals: an f32 constant in its shortest round-trip decimal form with an `f` suffix
// ("0.1f", "(-2.5f)", "16777216.0f"; inf and nan as __int_as_float bit patterns), an i32
// constant ("7", "(-7)", "(-2147483647 - 1)"). Negative values are parenthesised so that they
// can be used as operands verbatim.
std::string cuda_float_literal(float v);
std::string cuda_int_literal(int64_t v);

}  // namespace flexjit::cuda
