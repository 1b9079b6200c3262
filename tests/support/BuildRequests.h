// A plan's build requests for tests: one (mods, description) pair per description, borrowed
// (KernelBuilder::build_all takes pointers; `mods` and `descs` must outlive the requests).
#pragma once

#include "Pipeline.h"

#include <vector>

namespace flexjit::test {

inline std::vector<BuildRequest> build_requests(const Mods& mods,
                                                const std::vector<kernels::KernelDesc>& descs) {
  std::vector<BuildRequest> out;
  for (const kernels::KernelDesc& d : descs)
    out.push_back({&mods, &d});
  return out;
}

}  // namespace flexjit::test
