// The CUDA driver API, loaded with dlopen("libcuda.so.1") on first use.
//
// flexjit never links libcuda: the library and the CLI must load, compile and emit kernels on a
// machine without a driver. cuda.h (from the toolkit) supplies the types and prototypes only.
// Every entry point is looked up by the name cuda.h maps it to (cuMemAlloc -> cuMemAlloc_v2,
// cuCtxCreate -> cuCtxCreate_v4, cuDevicePrimaryCtxRelease -> cuDevicePrimaryCtxRelease_v2, ...),
// so the pointer's type and the symbol always agree; no cuGetProcAddress.
//
// This header includes <cuda.h>; include it only from src/runtime/*.cpp. Code outside the
// runtime (the CLI, tests) uses the cuda.h-free interfaces of Device.h and ModuleCache.h.
#pragma once

#include <flexjit/error.h>

#include <cuda.h>

#include <string>
#include <string_view>

namespace flexjit::runtime {

// X(name): every driver entry point flexjit uses. `name` is the cuda.h spelling; the macro
// expansion of `name` is the exported symbol.
#define FLEXJIT_DRIVER_FUNCTIONS(X) \
  X(cuInit)                         \
  X(cuDriverGetVersion)             \
  X(cuGetErrorName)                 \
  X(cuGetErrorString)               \
  X(cuDeviceGetCount)               \
  X(cuDeviceGet)                    \
  X(cuDeviceGetName)                \
  X(cuDeviceGetAttribute)           \
  X(cuDevicePrimaryCtxRetain)       \
  X(cuDevicePrimaryCtxRelease)      \
  X(cuCtxSetCurrent)                \
  X(cuCtxGetCurrent)                \
  X(cuCtxSynchronize)               \
  X(cuModuleLoadData)               \
  X(cuModuleUnload)                 \
  X(cuModuleGetFunction)            \
  X(cuFuncSetAttribute)             \
  X(cuFuncGetAttribute)             \
  X(cuLaunchKernel)                 \
  X(cuMemAlloc)                     \
  X(cuMemFree)                      \
  X(cuMemAllocAsync)                \
  X(cuMemFreeAsync)                 \
  X(cuMemcpyHtoD)                   \
  X(cuMemcpyDtoH)                   \
  X(cuMemcpyDtoDAsync)              \
  X(cuMemcpy2DAsync)                \
  X(cuMemsetD8)                     \
  X(cuMemsetD8Async)                \
  X(cuMemsetD32Async)               \
  X(cuMemsetD2D8Async)              \
  X(cuMemsetD2D32Async)             \
  X(cuStreamSynchronize)            \
  X(cuStreamCreate)                 \
  X(cuStreamDestroy)                \
  X(cuEventCreate)                  \
  X(cuEventDestroy)                 \
  X(cuEventRecord)                  \
  X(cuEventSynchronize)             \
  X(cuEventQuery)                   \
  X(cuStreamWaitEvent)              \
  X(cuStreamIsCapturing)            \
  X(cuStreamBeginCapture)           \
  X(cuStreamEndCapture)             \
  X(cuGraphInstantiateWithFlags)    \
  X(cuGraphLaunch)                  \
  X(cuGraphExecDestroy)             \
  X(cuGraphDestroy)                 \
  X(cuEventElapsedTime)             \
  X(cuTensorMapEncodeTiled)

// The loaded driver. Obtain it with Driver::get(); check available() before calling anything.
class Driver {
 public:
  // The process-wide instance. The first call dlopens libcuda.so.1, resolves every entry point
  // and calls cuInit(0); it never throws.
  static const Driver& get();

  // True when libcuda loaded, every entry point resolved, cuInit succeeded and at least one
  // device exists. Otherwise unavailable_reason() says which step failed.
  bool available() const { return available_; }
  const std::string& unavailable_reason() const { return reason_; }
  int driver_version() const { return driver_version_; }  // 13000 for CUDA 13.0
  int device_count() const { return device_count_; }

  // Throws RuntimeError unless available(): "CUDA driver unavailable: <reason>".
  void require() const;

  // Function pointers, one per FLEXJIT_DRIVER_FUNCTIONS entry (null when unavailable).
#define FLEXJIT_DRIVER_MEMBER(name) decltype(&name) name##_ = nullptr;
  FLEXJIT_DRIVER_FUNCTIONS(FLEXJIT_DRIVER_MEMBER)
#undef FLEXJIT_DRIVER_MEMBER

  // Optional entry points: null when the driver lacks them (launch() then falls back).
  decltype(&cuLaunchKernelEx) cuLaunchKernelEx_ = nullptr;  // CUDA 11.8+: launch attributes

  // "CUDA_ERROR_INVALID_VALUE: invalid argument" (names from cuGetErrorName/String).
  std::string describe(CUresult r) const;

  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

 private:
  Driver();
  void load();
  bool available_ = false;
  std::string reason_;
  int driver_version_ = 0;
  int device_count_ = 0;
};

// Throws RuntimeError "<call> failed for <what>: CUDA_ERROR_...: <text>" unless r is
// CUDA_SUCCESS. `what` names the object the call acted on ("kernel 'flexjit_forward' (forward
// alibi bf16 d128)", "device 0"); when empty the " for ..." part is left out.
void check(CUresult r, std::string_view call, std::string_view what = {});

}  // namespace flexjit::runtime

// Calls a driver entry point through the loaded table and checks the result:
//   FJ_CU(cuMemAlloc, what, &ptr, bytes);
// The error message names the call as written ("cuMemAlloc"), not its versioned symbol.
#define FJ_CU(name, what, ...) \
  ::flexjit::runtime::check(::flexjit::runtime::Driver::get().name##_(__VA_ARGS__), #name, (what))
