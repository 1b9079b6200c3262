// A CUDA device as flexjit uses it: selection, its primary context, the properties that shape
// kernel choice (arch, SM count, shared memory), and device memory (DeviceBuffer).
//
// This header does not include cuda.h, so the CLI and tests can use it; driver handles appear
// as pointers to the opaque structs cuda.h declares (CUcontext is CUctx_st*).
#pragma once

#include <flexjit/error.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct CUctx_st;
struct CUstream_st;

namespace flexjit::runtime {

using CuContext = ::CUctx_st*;
using CuStream = ::CUstream_st*;  // null is the legacy default stream

// True when the CUDA driver is loaded and reports a device; otherwise false, with the reason
// ("cannot load libcuda.so.1 (...)", "the CUDA driver reports no device") in *reason.
bool cuda_available(std::string* reason = nullptr);

// The NVRTC target for a compute capability: sm_80, sm_86, sm_89; "a" (arch-specific features
// such as wgmma) from cc 9.0 on: sm_90a, sm_100a, sm_120a.
std::string arch_for_compute_capability(int major, int minor);

class Device {
 public:
  // The device with this ordinal, its primary context retained (for the life of the process:
  // primary contexts are shared with every other CUDA user in it, so flexjit never resets or
  // releases them) and made current on the calling thread. Throws RuntimeError when the driver
  // is unavailable or the ordinal is out of range ("device 3 requested but only 2 present").
  static Device& get(int index = 0);

  int index() const { return index_; }
  const std::string& name() const { return name_; }  // "NVIDIA H100 80GB HBM3"
  int cc_major() const { return cc_major_; }
  int cc_minor() const { return cc_minor_; }
  std::string arch() const { return arch_for_compute_capability(cc_major_, cc_minor_); }
  int sm_count() const { return sm_count_; }
  int max_shared_memory_optin() const { return max_smem_optin_; }  // bytes per block
  CuContext context() const { return context_; }

  // Makes this device's primary context current on the calling thread.
  void make_current() const;
  // Waits for all work in the context; a kernel fault surfaces here as a RuntimeError.
  void synchronize() const;
  // "device 0 (NVIDIA H100 80GB HBM3, sm_90a, 132 SMs)" for messages and logs.
  std::string str() const;

  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

 private:
  explicit Device(int index);
  int index_ = 0;
  std::string name_;
  int cc_major_ = 0, cc_minor_ = 0, sm_count_ = 0, max_smem_optin_ = 0;
  CuContext context_ = nullptr;
};

// Device memory owned by one object (cuMemAlloc / cuMemFree) in the context current at
// allocation time. For tests and the CLI; the attention API takes caller-owned TensorRefs.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates `bytes` in `device`'s primary context (made current). Zero bytes allocates
  // nothing and data() is null.
  DeviceBuffer(Device& device, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr_)); }
  size_t size() const { return bytes_; }

  // Synchronous copies of `bytes` (at most size(); RuntimeError otherwise) and a byte memset.
  void copy_from_host(const void* src, size_t bytes);
  void copy_to_host(void* dst, size_t bytes) const;
  void fill_bytes(uint8_t value);

  template <typename T>
  static DeviceBuffer from_host(Device& device, const std::vector<T>& v) {
    DeviceBuffer buf(device, v.size() * sizeof(T));
    buf.copy_from_host(v.data(), buf.size());
    return buf;
  }
  template <typename T>
  std::vector<T> to_host() const {
    std::vector<T> v(bytes_ / sizeof(T));
    copy_to_host(v.data(), v.size() * sizeof(T));
    return v;
  }

 private:
  void release() noexcept;
  unsigned long long ptr_ = 0;  // CUdeviceptr
  size_t bytes_ = 0;
};

}  // namespace flexjit::runtime
