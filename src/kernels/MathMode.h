// The math mode of a kernel (docs/math.md): the problem flag `fast_math` of the families whose
// kernels splice a score_mod (forward, backward_dkdv, backward_dq, decode_split). 1: the
// score_mod's transcendentals lower to hardware approximations (cuda::MathFunctions::Approx);
// 0 or absent: the exact functions. Being a flag, it reaches the description's text, its hash
// and the generated source, so kernels of the two modes never share a cache entry.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/types.h>

#include "codegen/cuda/ModCodegen.h"
#include "kernels/KernelDesc.h"

#include <optional>
#include <string>

namespace flexjit::kernels {

inline constexpr const char* kFastMathFlag = "fast_math";

// Auto's rule without the environment: approximations for bf16 and f16 inputs, exact for f32
// (tf32 tensor cores, whose error rule is tighter); docs/math.md says why.
bool default_fast_math(DType dtype);

// Whether `mode` asks for approximations for inputs of `dtype`. Auto reads FLEXJIT_MATH (auto |
// exact | approx; an unknown value is one warning, then auto), else default_fast_math.
bool resolve_fast_math(MathMode mode, DType dtype);

// Sets the fast_math flag of a problem description from `mode` (resolve_fast_math).
void set_math_mode(KernelDesc& problem, MathMode mode);

// The functions a description's source uses: Approx when its fast_math flag is 1.
cuda::MathFunctions math_functions(const KernelDesc& desc);

// Why a description's fast_math flag is invalid (set to anything but 0 or 1); nullopt when it is
// absent (exact: a description written before the flag existed keeps its meaning), 0 or 1.
std::optional<std::string> fast_math_flag_error(const KernelDesc& desc);

}  // namespace flexjit::kernels
