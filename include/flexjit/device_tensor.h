// DeviceTensor: device memory owned by flexjit, viewed as a TensorRef (C-order strides).
#pragma once

#include <flexjit/export.h>

#include <flexjit/context.h>
#include <flexjit/tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace flexjit {

class FLEXJIT_API DeviceTensor {
 public:
  DeviceTensor() = default;
  // Uninitialised device memory of `shape` (C order) on ctx's device.
  static DeviceTensor empty(Context& ctx, DType dtype, std::vector<int64_t> shape);
  // A device copy of host data (C order, `dtype` elements; f16/bf16 as uint16 bits).
  static DeviceTensor from_host(Context& ctx, DType dtype, std::vector<int64_t> shape,
                                const void* host_data);

  bool defined() const { return mem_ != nullptr; }
  const TensorRef& ref() const { return ref_; }
  operator const TensorRef&() const { return ref_; }  // NOLINT
  size_t bytes() const;

  // Synchronous copies of the whole tensor.
  void copy_from_host(const void* src);
  void copy_to_host(void* dst) const;
  template <typename T>
  std::vector<T> to_host() const {
    std::vector<T> v(bytes() / sizeof(T));
    copy_to_host(v.data());
    return v;
  }
  void fill_bytes(uint8_t value);

 private:
  std::shared_ptr<void> mem_;  // owns a runtime::DeviceBuffer
  TensorRef ref_;
};

}  // namespace flexjit
