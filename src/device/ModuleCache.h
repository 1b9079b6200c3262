// Loaded kernels: cubins become CUmodules once per (context, cache key), and launches go
// through one checked helper whose errors name the kernel.
//
// cuda.h-free (see Device.h): handles are pointers to the driver's opaque structs.
#pragma once

#include "device/Device.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct CUmod_st;
struct CUfunc_st;

namespace flexjit::runtime {

using CuModule = ::CUmod_st*;
using CuFunction = ::CUfunc_st*;

// A kernel ready to launch: the function and the names its error messages use.
struct Kernel {
  CuFunction function = nullptr;
  std::string name;   // the entry point: "flexjit_forward"
  std::string label;  // what it computes: "forward alibi bf16 d128" (may be empty)
  // "kernel 'flexjit_forward' (forward alibi bf16 d128)"
  std::string describe() const;
};

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// The largest gridDim.y and gridDim.z a launch takes (gridDim.x takes 2^31 - 1).
constexpr int64_t kMaxGridDimYZ = 65535;

// Loaded modules keyed by (context, cache key). The cache key is the caller's identity for the
// cubin (the JIT cache key: a hash of the spliced source, options and arch), so a cubin is
// loaded once per context however many times it is asked for. Thread-safe.
class ModuleCache {
 public:
  // The process-wide cache.
  static ModuleCache& global();

  // The kernel `name` of the cubin identified by `key`, loaded into the current context (make a
  // Device current first) on the first request. Throws RuntimeError naming the key or kernel
  // when the driver rejects the image (wrong arch, corrupt) or the entry point is missing.
  Kernel get(const std::string& key, const std::vector<char>& cubin, const std::string& name,
             std::string label = {});

  size_t num_modules() const;
  // Module loads (cuModuleLoadData and the first cuModuleGetFunction of each kernel) since the
  // process started: how many and their host wall time. `flexjit bench --first-call` reads them
  // around a call.
  struct LoadTotals {
    uint64_t modules = 0;
    double wall_ms = 0;
  };
  LoadTotals load_totals() const;
  // Unloads every module (in each module's own context). Kernels obtained earlier dangle.
  void clear();

  ModuleCache() = default;
  ~ModuleCache();
  ModuleCache(const ModuleCache&) = delete;
  ModuleCache& operator=(const ModuleCache&) = delete;

 private:
  struct Entry {
    CuModule module = nullptr;
    std::map<std::string, CuFunction> functions;
  };
  mutable std::mutex mutex_;
  std::map<std::pair<CuContext, std::string>, Entry> modules_;
  LoadTotals loads_;  // under mutex_
};

// Launches `kernel` with `args` (one pointer per kernel parameter, as cuLaunchKernel takes).
// Dynamic shared memory above the 48 KiB default first raises the function's
// MAX_DYNAMIC_SHARED_SIZE_BYTES. Errors: RuntimeError "cuLaunchKernel failed for kernel
// 'flexjit_forward' (forward alibi bf16 d128): CUDA_ERROR_INVALID_VALUE: invalid argument".
// `programmatic`: a programmatic dependent launch (sm_90+, cuLaunchKernelEx with
// PROGRAMMATIC_STREAM_SERIALIZATION): the kernel may start while the stream's previous kernel
// is still running and must wait (griddepcontrol.wait) before it reads that kernel's results;
// a plain launch where the driver has no cuLaunchKernelEx.
void launch(const Kernel& kernel, Dim3 grid, Dim3 block, unsigned dynamic_smem_bytes,
            CuStream stream, void** args, bool programmatic = false);

}  // namespace flexjit::runtime
