#include <flexjit/context.h>
#include <flexjit/device_tensor.h>
#include <flexjit/error.h>

#include "device/CudaDriver.h"
#include "plan/ContextImpl.h"

#include <fmt/format.h>

namespace flexjit {

namespace {
jit::CacheSettings settings_for(const ContextOptions& o) {
  jit::CacheSettings s = jit::CacheSettings::from_env();
  if (!o.cache_dir.empty()) s.dir = o.cache_dir;
  if (o.disable_cache) s.enabled = false;
  return s;
}
}  // namespace

Context::Context(ContextOptions options) : impl_(std::make_unique<Impl>(settings_for(options))) {
  impl_->device = &runtime::Device::get(options.device);
}

Context::~Context() = default;

std::string Context::device_name() const {
  return impl_->device->name();
}
std::string Context::arch() const {
  return impl_->device->arch();
}
int Context::sm_count() const {
  return impl_->device->sm_count();
}
void Context::synchronize() const {
  impl_->device->synchronize();
}

DeviceTensor DeviceTensor::empty(Context& ctx, DType dtype, std::vector<int64_t> shape) {
  DeviceTensor t;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw RuntimeError(fmt::format("negative extent {} in a tensor shape", d));
    n *= d;
  }
  auto buf = std::make_shared<runtime::DeviceBuffer>(*impl_of(ctx).device,
                                                     static_cast<size_t>(n) * dtype_size(dtype));
  t.ref_ = TensorRef::contiguous(buf->data(), dtype, std::move(shape), TensorRef::Device::CUDA,
                                 impl_of(ctx).device->index());
  t.mem_ = std::move(buf);
  return t;
}

DeviceTensor DeviceTensor::from_host(Context& ctx, DType dtype, std::vector<int64_t> shape,
                                     const void* host_data) {
  DeviceTensor t = empty(ctx, dtype, std::move(shape));
  t.copy_from_host(host_data);
  return t;
}

DeviceTensor DeviceTensor::borrow(const TensorRef& ref, std::shared_ptr<void> owner) {
  if (ref.device != TensorRef::Device::CUDA) {
    throw RuntimeError(
        fmt::format("a borrowed tensor must be in CUDA device memory: {} is not", ref.str()));
  }
  if (ref.strides.size() != ref.shape.size()) {
    throw RuntimeError(fmt::format("a borrowed tensor has {} strides for {} dims: {}",
                                   ref.strides.size(), ref.shape.size(), ref.str()));
  }
  for (size_t i = 0; i < ref.shape.size(); ++i) {
    if (ref.shape[i] < 0) {
      throw RuntimeError(fmt::format("a borrowed tensor has negative extent {} in dim {}: {}",
                                     ref.shape[i], i, ref.str()));
    }
  }
  const int64_t n = ref.numel();  // RuntimeError when the shape overflows
  if (!ref.is_contiguous()) {
    throw RuntimeError(fmt::format("a borrowed tensor must be C-contiguous: {}", ref.str()));
  }
  if (ref.data == nullptr && n > 0) {
    throw RuntimeError(fmt::format("a borrowed tensor has a null data pointer: {}", ref.str()));
  }
  // Never null, so that defined() holds: the aliasing constructor shares owner's control block
  // (none for a null owner) and points at a tag.
  static char borrowed_tag = 0;
  DeviceTensor t;
  t.ref_ = TensorRef::contiguous(ref.data, ref.dtype, ref.shape, TensorRef::Device::CUDA,
                                 ref.device_index);
  t.mem_ = std::shared_ptr<void>(std::move(owner), &borrowed_tag);
  return t;
}

size_t DeviceTensor::bytes() const {
  return mem_ ? static_cast<size_t>(ref_.numel()) * dtype_size(ref_.dtype) : 0;
}

// The copies go through ref_.data, which is the memory of both kinds (a DeviceBuffer's or a
// borrowed tensor's), in the primary context of the tensor's device.
void DeviceTensor::copy_from_host(const void* src) {
  if (!mem_) throw RuntimeError("copy into an undefined DeviceTensor");
  if (bytes() == 0) return;
  runtime::Device::get(ref_.device_index);  // makes its context current
  FJ_CU(cuMemcpyHtoD, fmt::format("{} bytes into {}", bytes(), ref_.str()),
        reinterpret_cast<CUdeviceptr>(ref_.data), src, bytes());
}

void DeviceTensor::copy_to_host(void* dst) const {
  if (!mem_) throw RuntimeError("copy from an undefined DeviceTensor");
  if (bytes() == 0) return;
  runtime::Device::get(ref_.device_index);
  FJ_CU(cuMemcpyDtoH, fmt::format("{} bytes from {}", bytes(), ref_.str()), dst,
        reinterpret_cast<CUdeviceptr>(ref_.data), bytes());
}

void DeviceTensor::fill_bytes(uint8_t value) {
  if (!mem_) throw RuntimeError("fill of an undefined DeviceTensor");
  if (bytes() == 0) return;
  runtime::Device::get(ref_.device_index);
  FJ_CU(cuMemsetD8, fmt::format("{} bytes of {}", bytes(), ref_.str()),
        reinterpret_cast<CUdeviceptr>(ref_.data), value, bytes());
}

}  // namespace flexjit
