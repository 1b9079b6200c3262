// What a Context holds: the device, the kernel builder (structural memo + compile caches) and
// the process-wide module cache.
#pragma once

#include <flexjit/context.h>

#include "Pipeline.h"
#include "runtime/Device.h"
#include "runtime/ModuleCache.h"

namespace flexjit {

struct Context::Impl {
  runtime::Device* device = nullptr;
  KernelBuilder builder;
  runtime::ModuleCache* modules = nullptr;

  explicit Impl(jit::CacheSettings settings) : builder(std::move(settings)) {}

  // The loaded kernel of a compile result (module loaded once per context).
  runtime::Kernel load(const jit::CompileResult& r) {
    device->make_current();
    return modules->get(r.kernel->key, r.kernel->cubin, r.kernel->kernel_name, r.kernel->label);
  }
};

}  // namespace flexjit
