// A GPU forward's out and lse against the fp64 reference (support/CpuReference.h), the check the
// sm_90a head-dim and document-mask tests share.
#pragma once

#include "gpu/GpuTestUtil.h"
#include "support/ReferenceAttention.h"

#include <string>
#include <vector>

namespace flexjit::test {

// out and lse (downloaded) against `ref`: no non-finite output, out's relative error within
// tolerance(dtype), the same -inf rows and lse within 1e-2. Prints one line of the errors,
// headed by `label`.
void check_forward_f64(const std::vector<float>& out, const std::vector<float>& lse,
                       const ReferenceResult& ref, const std::string& label,
                       DType dtype = DType::BF16);

}  // namespace flexjit::test
