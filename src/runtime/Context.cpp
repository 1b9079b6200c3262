#include <flexjit/context.h>
#include <flexjit/device_tensor.h>
#include <flexjit/error.h>

#include "runtime/ContextImpl.h"

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

size_t DeviceTensor::bytes() const {
  return mem_ ? static_cast<size_t>(ref_.numel()) * dtype_size(ref_.dtype) : 0;
}

void DeviceTensor::copy_from_host(const void* src) {
  if (!mem_) throw RuntimeError("copy into an undefined DeviceTensor");
  static_cast<runtime::DeviceBuffer*>(mem_.get())->copy_from_host(src, bytes());
}

void DeviceTensor::copy_to_host(void* dst) const {
  if (!mem_) throw RuntimeError("copy from an undefined DeviceTensor");
  static_cast<const runtime::DeviceBuffer*>(mem_.get())->copy_to_host(dst, bytes());
}

void DeviceTensor::fill_bytes(uint8_t value) {
  if (!mem_) throw RuntimeError("fill of an undefined DeviceTensor");
  static_cast<runtime::DeviceBuffer*>(mem_.get())->fill_bytes(value);
}

}  // namespace flexjit
