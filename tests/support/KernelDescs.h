// Complete kernel descriptions for tests, chosen by the registry as a runtime call would be.
#pragma once

#include "kernels/Registry.h"
#include "kernels/block_mask/BlockMaskBuild.h"
#include "kernels/forward/Forward.h"

#include <string>
#include <string_view>

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

}  // namespace flexjit::test
