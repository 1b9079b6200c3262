// Complete kernel descriptions for tests, chosen by the registry as a runtime call would be.
#pragma once

#include "kernels/Registry.h"
#include "kernels/backward/Backward.h"
#include "kernels/block_mask/BlockMaskBuild.h"
#include "kernels/forward/Forward.h"

#include <string>
#include <string_view>
#include <vector>

namespace flexjit::test {

// The forward kernel for `arch` with default config (or `variant` when named), as
// flex_attention would build it for inputs with no block mask of unknown lengths.
inline kernels::KernelDesc forward_desc(const std::string& arch, DType dtype, int head_dim_qk,
                                        int head_dim_v, int gqa_ratio = 1,
                                        std::string_view variant = {},
                                        const kernels::Params& overrides = {}) {
  return kernels::Registry::global().complete(
      kernels::forward_problem(cuda::Arch::parse(arch), dtype, head_dim_qk, head_dim_v, gqa_ratio,
                               /*divisible=*/false, /*full_blocks=*/true),
      kernels::InputFacts{}, overrides, variant);
}

inline kernels::KernelDesc block_mask_desc(const std::string& arch, int block_size) {
  return kernels::Registry::global().complete(
      kernels::block_mask_problem(cuda::Arch::parse(arch), block_size, block_size),
      kernels::InputFacts{});
}

// The kernels of the default backward plan (bf16, head dim 128, no GQA, full blocks) as
// plan_backward completes them: preprocess, dK/dV, and dQ (the conversion of the dK/dV kernel's
// accumulator where it adds dQ by atomics or bulk reductions, sm90a_wgmma's default, else the
// dQ kernel).
inline std::vector<kernels::KernelDesc> backward_plan_descs(const char* arch) {
  using kernels::Family;
  const cuda::Arch a = cuda::Arch::parse(arch);
  const kernels::Registry& reg = kernels::Registry::global();
  auto problem = [&](Family f) {
    return kernels::backward_problem(f, a, DType::BF16, 128, 128, 1, true);
  };
  const kernels::KernelDesc dkdv = reg.complete(problem(Family::BackwardDkDv), {});
  const bool dq_atomic = dkdv.config.get("dq_atomic").value_or(0) == 1;
  const kernels::KernelDesc dq =
      dq_atomic ? reg.complete(problem(Family::BackwardDq), {},
                               {{"dq_layout", kernels::dq_accum_layout(dkdv)}}, "atomic_convert")
                : reg.complete(problem(Family::BackwardDq), {});
  return {reg.complete(problem(Family::BackwardPreprocess), {}), dkdv, dq};
}

}  // namespace flexjit::test
