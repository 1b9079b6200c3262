// DeviceTensor: device memory viewed as a TensorRef (C-order strides): memory flexjit allocated
// (empty, from_host) or memory it borrows from another owner (borrow: a PyTorch / CuPy tensor).
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
  // A view of device memory that flexjit does not own (another framework's tensor), no copy.
  // `ref` must be a CUDA tensor in C order (dims of extent 1 may have any stride) with a data
  // pointer unless it is empty; anything else is a RuntimeError naming what is wrong ("a
  // borrowed tensor must be C-contiguous: i32[2, 8] strides [1, 2] cuda:0"). The result and its
  // copies share `owner`, which keeps the memory alive: it is released (its deleter run, on
  // whichever thread drops the last copy) with the last of them. A null owner: the caller keeps
  // the memory alive for as long as any copy exists. The copies below work on borrowed memory
  // too (they write into the owner's tensor).
  static DeviceTensor borrow(const TensorRef& ref, std::shared_ptr<void> owner);

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
  // Keeps the memory alive: a runtime::DeviceBuffer, or a borrowed tensor's owner.
  std::shared_ptr<void> mem_;
  TensorRef ref_;
};

}  // namespace flexjit
