#include "support/Nvrtc.h"

// The test target does not get the CUDA include directory; declare the few NVRTC entry points
// used here (C linkage, same signatures as nvrtc.h) when the header is not reachable.
#if __has_include(<nvrtc.h>)
#include <nvrtc.h>
#else
extern "C" {
typedef struct _nvrtcProgram* nvrtcProgram;
typedef int nvrtcResult;
nvrtcResult nvrtcCreateProgram(nvrtcProgram*, const char*, const char*, int, const char* const*,
                               const char* const*);
nvrtcResult nvrtcCompileProgram(nvrtcProgram, int, const char* const*);
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram, size_t*);
nvrtcResult nvrtcGetProgramLog(nvrtcProgram, char*);
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram, size_t*);
nvrtcResult nvrtcGetCUBIN(nvrtcProgram, char*);
nvrtcResult nvrtcDestroyProgram(nvrtcProgram*);
}
#endif

namespace flexjit::test {

NvrtcOutput nvrtc_compile(const std::string& src, const std::string& name,
                          const std::vector<std::string>& options, bool want_cubin) {
  NvrtcOutput out;
  nvrtcProgram prog = nullptr;
  if (nvrtcCreateProgram(&prog, src.c_str(), name.c_str(), 0, nullptr, nullptr) != 0) {
    out.log = "nvrtcCreateProgram failed";
    return out;
  }
  std::vector<const char*> opts;
  for (const std::string& o : options)
    opts.push_back(o.c_str());
  out.ok = nvrtcCompileProgram(prog, static_cast<int>(opts.size()), opts.data()) == 0;
  size_t n = 0;
  nvrtcGetProgramLogSize(prog, &n);
  out.log.assign(n, '\0');
  nvrtcGetProgramLog(prog, out.log.data());
  if (out.ok && want_cubin) {
    n = 0;
    if (nvrtcGetCUBINSize(prog, &n) == 0 && n > 0) {
      out.cubin.resize(n);
      if (nvrtcGetCUBIN(prog, out.cubin.data()) != 0) out.cubin.clear();
    }
    if (out.cubin.empty()) {
      out.ok = false;
      out.log += "\nno cubin (the options need an sm_XX architecture)";
    }
  }
  nvrtcDestroyProgram(&prog);
  return out;
}

}  // namespace flexjit::test
