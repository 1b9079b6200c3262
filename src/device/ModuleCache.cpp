#include "device/ModuleCache.h"

#include "device/CudaDriver.h"

#include <fmt/format.h>

#include <chrono>

namespace flexjit::runtime {

namespace {
// The dynamic shared memory every kernel may use without opting in.
constexpr unsigned kDefaultDynamicSmemBytes = 48 * 1024;
}  // namespace

std::string Kernel::describe() const {
  if (label.empty()) return fmt::format("kernel '{}'", name);
  return fmt::format("kernel '{}' ({})", name, label);
}

ModuleCache& ModuleCache::global() {
  static ModuleCache cache;
  return cache;
}

ModuleCache::~ModuleCache() {
  // The process-wide cache dies at exit, possibly after the driver tore contexts down; its
  // modules go with their contexts, so only an explicitly created cache unloads.
  if (this != &global()) clear();
}

Kernel ModuleCache::get(const std::string& key, const std::vector<char>& cubin,
                        const std::string& name, std::string label) {
  Driver::get().require();
  Kernel kernel{nullptr, name, std::move(label)};
  CUcontext ctx = nullptr;
  FJ_CU(cuCtxGetCurrent, kernel.describe(), &ctx);
  if (ctx == nullptr) {
    throw RuntimeError(fmt::format("no current CUDA context to load {} into (call Device::get)",
                                   kernel.describe()));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& entry = modules_[{ctx, key}];
  auto it = entry.functions.find(name);
  if (it == entry.functions.end()) {
    const auto t0 = std::chrono::steady_clock::now();
    if (entry.module == nullptr) {
      if (cubin.empty()) {
        throw RuntimeError(
            fmt::format("empty cubin for {} (cache key {})", kernel.describe(), key));
      }
      FJ_CU(cuModuleLoadData, fmt::format("{} (cache key {})", kernel.describe(), key),
            &entry.module, cubin.data());
      loads_.modules += 1;
    }
    CUfunction fn = nullptr;
    FJ_CU(cuModuleGetFunction, kernel.describe(), &fn, entry.module, name.c_str());
    it = entry.functions.emplace(name, fn).first;
    loads_.wall_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  kernel.function = it->second;
  return kernel;
}

size_t ModuleCache::num_modules() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return modules_.size();
}

ModuleCache::LoadTotals ModuleCache::load_totals() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return loads_;
}

void ModuleCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  const Driver& d = Driver::get();
  for (auto& [key, entry] : modules_) {
    if (entry.module == nullptr) continue;
    // Unloading needs the module's context; failures (a context already destroyed) leave
    // nothing to free.
    if (d.cuCtxSetCurrent_(key.first) == CUDA_SUCCESS) d.cuModuleUnload_(entry.module);
  }
  modules_.clear();
}

void launch(const Kernel& kernel, Dim3 grid, Dim3 block, unsigned dynamic_smem_bytes,
            CuStream stream, void** args, bool programmatic) {
  Driver::get().require();
  FJ_ASSERT(kernel.function != nullptr, "launch of a kernel that was never loaded");
  if (dynamic_smem_bytes > kDefaultDynamicSmemBytes) {
    int current = 0;
    FJ_CU(cuFuncGetAttribute, kernel.describe(), &current,
          CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, kernel.function);
    if (static_cast<unsigned>(current) < dynamic_smem_bytes) {
      FJ_CU(cuFuncSetAttribute,
            fmt::format("{} (MAX_DYNAMIC_SHARED_SIZE_BYTES = {})", kernel.describe(),
                        dynamic_smem_bytes),
            kernel.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            static_cast<int>(dynamic_smem_bytes));
    }
  }
  if (programmatic && Driver::get().cuLaunchKernelEx_ != nullptr) {
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig config{};
    config.gridDimX = grid.x, config.gridDimY = grid.y, config.gridDimZ = grid.z;
    config.blockDimX = block.x, config.blockDimY = block.y, config.blockDimZ = block.z;
    config.sharedMemBytes = dynamic_smem_bytes;
    config.hStream = stream;
    config.attrs = &attr;
    config.numAttrs = 1;
    FJ_CU(cuLaunchKernelEx, kernel.describe(), &config, kernel.function, args, nullptr);
    return;
  }
  FJ_CU(cuLaunchKernel, kernel.describe(), kernel.function, grid.x, grid.y, grid.z, block.x,
        block.y, block.z, dynamic_smem_bytes, stream, args, nullptr);
}

}  // namespace flexjit::runtime
