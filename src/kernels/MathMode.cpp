#include "kernels/MathMode.h"

#include "util/Env.h"
#include "util/PrivateFiles.h"

#include <fmt/format.h>

namespace flexjit {

std::string_view to_string(MathMode m) {
  switch (m) {
    case MathMode::Auto:
      return "auto";
    case MathMode::Exact:
      return "exact";
    case MathMode::Approx:
      return "approx";
  }
  return "?";
}

std::optional<MathMode> parse_math_mode(std::string_view s) {
  for (MathMode m : {MathMode::Auto, MathMode::Exact, MathMode::Approx}) {
    if (s == to_string(m)) return m;
  }
  return std::nullopt;
}

namespace kernels {

bool default_fast_math(DType dtype) {
  // bf16 / f16 inputs carry more rounding than the approximations add, and their GPU tests
  // ([gpu][fastmath]) hold approx kernels to the dtypes' usual rules; softcap runs 1.32x faster
  // on an H100 (docs/math.md). f32 inputs keep the exact functions: their tf32 rule is tighter.
  // e4m3 inputs (3 mantissa bits) likewise take the approximations.
  return dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::E4M3;
}

bool resolve_fast_math(MathMode mode, DType dtype) {
  if (mode == MathMode::Auto) {
    if (const auto v = env::get("FLEXJIT_MATH")) {
      if (const auto m = parse_math_mode(*v)) {
        mode = *m;
      } else {
        files::warn_once("math", fmt::format("FLEXJIT_MATH='{}' is not one of auto, exact, approx; "
                                             "using auto (approx for bf16 / f16, exact for f32)",
                                             *v));
      }
    }
  }
  switch (mode) {
    case MathMode::Exact:
      return false;
    case MathMode::Approx:
      return true;
    case MathMode::Auto:
      break;
  }
  return default_fast_math(dtype);
}

void set_math_mode(KernelDesc& problem, MathMode mode) {
  problem.flags.set(kFastMathFlag, resolve_fast_math(mode, problem.dtype) ? 1 : 0);
}

cuda::MathFunctions math_functions(const KernelDesc& desc) {
  return desc.flags.get(kFastMathFlag).value_or(0) == 1 ? cuda::MathFunctions::Approx
                                                        : cuda::MathFunctions::Exact;
}

std::optional<std::string> fast_math_flag_error(const KernelDesc& desc) {
  const auto v = desc.flags.get(kFastMathFlag);
  if (!v || *v == 0 || *v == 1) return std::nullopt;
  return fmt::format(
      "flag 'fast_math' must be 0 (exact transcendentals) or 1 (hardware approximations), not {} "
      "({})",
      *v, desc.str());
}

}  // namespace kernels

}  // namespace flexjit
