// NVRTC for tests that compile CUDA text directly (a driver test kernel, the templates spliced
// with stand-ins), without going through flexjit's KernelCompiler.
#pragma once

#include <string>
#include <vector>

namespace flexjit::test {

struct NvrtcOutput {
  bool ok = false;
  std::string log;          // the NVRTC log, or which call failed
  std::vector<char> cubin;  // filled when `want_cubin` and ok (needs an sm_XX architecture)
};

// Compiles `src` (file name `name` in messages) with `options`.
NvrtcOutput nvrtc_compile(const std::string& src, const std::string& name,
                          const std::vector<std::string>& options, bool want_cubin = false);

}  // namespace flexjit::test
