#include "device/Device.h"

#include "device/CudaDriver.h"

#include <fmt/format.h>

#include <map>
#include <memory>
#include <mutex>

namespace flexjit::runtime {

static_assert(sizeof(CUdeviceptr) == sizeof(unsigned long long), "CUdeviceptr is 64-bit");

bool cuda_available(std::string* reason) {
  const Driver& d = Driver::get();
  if (reason != nullptr) *reason = d.available() ? std::string() : d.unavailable_reason();
  return d.available();
}

std::string arch_for_compute_capability(int major, int minor) {
  return fmt::format("sm_{}{}{}", major, minor, major >= 9 ? "a" : "");
}

Device& Device::get(int index) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<Device>> devices;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = devices.find(index);
  if (it == devices.end()) {
    it = devices.emplace(index, std::unique_ptr<Device>(new Device(index))).first;
  }
  it->second->make_current();
  return *it->second;
}

Device::Device(int index) : index_(index) {
  const Driver& d = Driver::get();
  d.require();
  if (index < 0 || index >= d.device_count()) {
    throw RuntimeError(
        fmt::format("device {} requested but only {} present", index, d.device_count()));
  }
  const std::string what = fmt::format("device {}", index);
  CUdevice dev = 0;
  FJ_CU(cuDeviceGet, what, &dev, index);
  char name[256] = {};
  FJ_CU(cuDeviceGetName, what, name, static_cast<int>(sizeof(name) - 1), dev);
  name_ = name;
  FJ_CU(cuDeviceGetAttribute, what, &cc_major_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  FJ_CU(cuDeviceGetAttribute, what, &cc_minor_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  FJ_CU(cuDeviceGetAttribute, what, &sm_count_, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  FJ_CU(cuDeviceGetAttribute, what, &max_smem_optin_,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
  FJ_CU(cuDevicePrimaryCtxRetain, what, &context_, dev);
}

void Device::make_current() const {
  FJ_CU(cuCtxSetCurrent, fmt::format("device {}", index_), context_);
}

void Device::synchronize() const {
  make_current();
  FJ_CU(cuCtxSynchronize, fmt::format("device {}", index_));
}

std::string Device::str() const {
  return fmt::format("device {} ({}, {}, {} SMs)", index_, name_, arch(), sm_count_);
}

DeviceBuffer::DeviceBuffer(Device& device, size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  device.make_current();
  CUdeviceptr p = 0;
  FJ_CU(cuMemAlloc, fmt::format("{} bytes on {}", bytes, device.str()), &p, bytes);
  ptr_ = p;
}

DeviceBuffer::~DeviceBuffer() {
  release();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = 0;
  o.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = 0;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::release() noexcept {
  // A failed free (context already torn down at exit) cannot be reported from a destructor;
  // the memory goes with the context.
  if (ptr_ != 0) Driver::get().cuMemFree_(ptr_);
  ptr_ = 0;
  bytes_ = 0;
}

namespace {
void check_size(size_t bytes, size_t have, const char* op) {
  if (bytes > have) {
    throw RuntimeError(
        fmt::format("{} of {} bytes exceeds the device buffer's {} bytes", op, bytes, have));
  }
}
}  // namespace

void DeviceBuffer::copy_from_host(const void* src, size_t bytes) {
  check_size(bytes, bytes_, "copy to device");
  if (bytes == 0) return;
  FJ_CU(cuMemcpyHtoD, fmt::format("{} bytes", bytes), ptr_, src, bytes);
}

void DeviceBuffer::copy_to_host(void* dst, size_t bytes) const {
  check_size(bytes, bytes_, "copy to host");
  if (bytes == 0) return;
  FJ_CU(cuMemcpyDtoH, fmt::format("{} bytes", bytes), dst, ptr_, bytes);
}

void DeviceBuffer::fill_bytes(uint8_t value) {
  if (bytes_ == 0) return;
  FJ_CU(cuMemsetD8, fmt::format("{} bytes", bytes_), ptr_, value, bytes_);
}

}  // namespace flexjit::runtime
