// NVRTC: CUDA source to cubin for one explicit target, with resource usage from the compile.
#pragma once

#include "jit/ResourceUsage.h"

#include <cstdint>
#include <string>
#include <vector>

namespace flexjit::jit {

// What to compile. The source is complete (templates already spliced, no #include to resolve).
struct CompileRequest {
  std::string source;
  std::string kernel_name;           // the __global__ function; extern "C" names are simplest
  std::string arch;                  // "sm_80", "sm_90a", ...
  std::vector<std::string> options;  // extra NVRTC options ("-DFOO=1", "--use_fast_math")
  std::string label;                 // for logs and dumps: "forward alibi bf16 d128"
};

// A compiled kernel, as the caches hold it.
struct CompiledKernel {
  std::string key;  // cache_key() of the request
  std::string arch;
  std::string kernel_name;  // the symbol to look up in the module (cuModuleGetFunction)
  std::string label;
  std::vector<char> cubin;
  std::string log;  // NVRTC program log (warnings, ptxas info)
  ResourceUsage usage;
  double compile_ms = 0;
};

// NVRTC's version, "13.0".
std::string nvrtc_version();

// The options NVRTC is given for `req`, in order: flexjit's defaults, the arch, then req.options.
// The cache key hashes these (sorted), so changing a default invalidates old entries.
std::vector<std::string> nvrtc_options(const CompileRequest& req);

// Compiles `req` to cubin (no caching; key is left empty). Throws JitError when NVRTC rejects
// the source or options: the message names the label, kernel, arch and options and carries the
// log with the numbered source lines around each error.
CompiledKernel nvrtc_compile(const CompileRequest& req);

// How many times this process has called NVRTC (nvrtc_compile, successful or not): what tests
// read to show that a warmed cache compiles nothing (docs/tuning.md, "Relocation").
uint64_t nvrtc_compile_count();

}  // namespace flexjit::jit
