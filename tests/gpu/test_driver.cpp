// The driver layer on a real GPU: allocation, copies, module loading and a launch. On a machine
// without a driver or device the test reports "skipped: no GPU (<reason>)" and passes.
#include "device/Device.h"
#include "device/ModuleCache.h"
#include "support/Nvrtc.h"

#include <catch2/catch.hpp>

#include <numeric>

using namespace flexjit;
using namespace flexjit::runtime;

namespace {

constexpr const char* kAxpy = R"(
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

std::vector<char> compile_cubin(const std::string& src, const std::string& arch) {
  const test::NvrtcOutput r =
      test::nvrtc_compile(src, "axpy.cu", {"--gpu-architecture=" + arch}, /*want_cubin=*/true);
  INFO(r.log);
  REQUIRE(r.ok);
  return r.cubin;
}

}  // namespace

TEST_CASE("arch strings for compute capabilities", "[runtime]") {
  CHECK(arch_for_compute_capability(8, 0) == "sm_80");
  CHECK(arch_for_compute_capability(8, 9) == "sm_89");
  CHECK(arch_for_compute_capability(9, 0) == "sm_90a");
  CHECK(arch_for_compute_capability(10, 0) == "sm_100a");
}

TEST_CASE("without a driver, device calls fail with the reason", "[runtime]") {
  std::string reason;
  if (cuda_available(&reason)) {
    SUCCEED("a driver is present; covered by the [gpu] test");
    return;
  }
  CHECK_FALSE(reason.empty());
  CHECK_THROWS_WITH(Device::get(0), "CUDA driver unavailable: " + reason);
}

TEST_CASE("driver: allocate, copy, load an NVRTC kernel, launch", "[gpu][runtime][small]") {
  std::string reason;
  if (!cuda_available(&reason)) {
    WARN("skipped: no GPU (" << reason << ")");
    return;
  }
  Device& dev = Device::get(0);
  INFO(dev.str());
  CHECK(dev.sm_count() > 0);
  CHECK(dev.max_shared_memory_optin() >= 48 * 1024);
  CHECK(dev.arch().rfind("sm_", 0) == 0);
  CHECK_THROWS_WITH(Device::get(1000), Catch::Contains("device 1000 requested but only"));

  const int n = 1000;
  std::vector<float> x(n), y(n);
  std::iota(x.begin(), x.end(), 0.0f);
  std::fill(y.begin(), y.end(), 1.0f);
  DeviceBuffer dx = DeviceBuffer::from_host(dev, x);
  DeviceBuffer dy = DeviceBuffer::from_host(dev, y);
  CHECK_THROWS_WITH(dx.copy_to_host(y.data(), (n + 1) * sizeof(float)),
                    Catch::Contains("exceeds the device buffer's 4000 bytes"));

  // Strip the "a" suffix: a plain sm_XY cubin loads on the device too.
  std::string arch = dev.arch();
  if (arch.back() == 'a') arch.pop_back();
  const std::vector<char> cubin = compile_cubin(kAxpy, arch);
  ModuleCache cache;
  Kernel k = cache.get("axpy-test", cubin, "axpy", "test axpy f32");
  CHECK(k.describe() == "kernel 'axpy' (test axpy f32)");
  cache.get("axpy-test", cubin, "axpy");
  CHECK(cache.num_modules() == 1);
  CHECK_THROWS_WITH(cache.get("axpy-test", cubin, "nope"),
                    Catch::StartsWith("cuModuleGetFunction failed for kernel 'nope'") &&
                        Catch::Contains("CUDA_ERROR_NOT_FOUND"));

  float a = 2.0f;
  void* px = dx.data();
  void* py = dy.data();
  int nn = n;
  void* args[] = {&a, &px, &py, &nn};
  launch(k, {(n + 127) / 128, 1, 1}, {128, 1, 1}, 0, nullptr, args);
  dev.synchronize();
  std::vector<float> out = dy.to_host<float>();
  for (int i = 0; i < n; ++i)
    REQUIRE(out[i] == 2.0f * i + 1.0f);

  // A launch the driver rejects names the kernel and the CUDA error.
  CHECK_THROWS_WITH(launch(k, {1, 1, 1}, {4096, 1, 1}, 0, nullptr, args),
                    Catch::StartsWith("cuLaunchKernel failed for kernel 'axpy' (test axpy f32): "
                                      "CUDA_ERROR_INVALID_VALUE"));
  dy.fill_bytes(0);
  CHECK(dy.to_host<float>()[7] == 0.0f);
}
