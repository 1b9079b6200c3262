#include "device/CudaDriver.h"

#include <fmt/format.h>

#include <dlfcn.h>

namespace flexjit::runtime {

namespace {
// Expands a macro argument before stringizing: FLEXJIT_SYMBOL(cuMemAlloc) is "cuMemAlloc_v2".
#define FLEXJIT_SYMBOL_(x) #x
#define FLEXJIT_SYMBOL(x) FLEXJIT_SYMBOL_(x)
}  // namespace

const Driver& Driver::get() {
  static const Driver driver;
  return driver;
}

Driver::Driver() {
  load();
}

void Driver::load() {
  // RTLD_LOCAL keeps libcuda's symbols out of the global namespace; the handle is never closed
  // (the driver must outlive every module and context the process creates).
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    reason_ = fmt::format("cannot load libcuda.so.1 ({})", err ? err : "unknown dlopen error");
    return;
  }
#define FLEXJIT_DRIVER_RESOLVE(name)                                                            \
  name##_ = reinterpret_cast<decltype(&name)>(dlsym(lib, FLEXJIT_SYMBOL(name)));                \
  if (name##_ == nullptr) {                                                                     \
    reason_ = fmt::format("libcuda.so.1 does not export {} (driver older than CUDA {}.{}?)",    \
                          FLEXJIT_SYMBOL(name), CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10); \
    return;                                                                                     \
  }
  FLEXJIT_DRIVER_FUNCTIONS(FLEXJIT_DRIVER_RESOLVE)
#undef FLEXJIT_DRIVER_RESOLVE
  cuLaunchKernelEx_ =
      reinterpret_cast<decltype(&cuLaunchKernelEx)>(dlsym(lib, FLEXJIT_SYMBOL(cuLaunchKernelEx)));

  if (CUresult r = cuInit_(0); r != CUDA_SUCCESS) {
    reason_ = fmt::format("cuInit failed: {}", describe(r));
    return;
  }
  if (CUresult r = cuDriverGetVersion_(&driver_version_); r != CUDA_SUCCESS) {
    reason_ = fmt::format("cuDriverGetVersion failed: {}", describe(r));
    return;
  }
  if (CUresult r = cuDeviceGetCount_(&device_count_); r != CUDA_SUCCESS) {
    reason_ = fmt::format("cuDeviceGetCount failed: {}", describe(r));
    return;
  }
  if (device_count_ == 0) {
    reason_ = "the CUDA driver reports no device";
    return;
  }
  available_ = true;
}

void Driver::require() const {
  if (!available_) throw RuntimeError(fmt::format("CUDA driver unavailable: {}", reason_));
}

std::string Driver::describe(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName_ == nullptr || cuGetErrorName_(r, &name) != CUDA_SUCCESS) name = nullptr;
  if (cuGetErrorString_ == nullptr || cuGetErrorString_(r, &text) != CUDA_SUCCESS) text = nullptr;
  if (name == nullptr) return fmt::format("CUresult {}", static_cast<int>(r));
  if (text == nullptr) return name;
  return fmt::format("{}: {}", name, text);
}

void check(CUresult r, std::string_view call, std::string_view what) {
  if (r == CUDA_SUCCESS) return;
  const std::string detail = Driver::get().describe(r);
  if (what.empty()) throw RuntimeError(fmt::format("{} failed: {}", call, detail));
  throw RuntimeError(fmt::format("{} failed for {}: {}", call, what, detail));
}

}  // namespace flexjit::runtime
