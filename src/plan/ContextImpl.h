// What a Context holds: the device and the kernel builder (structural memo + compile caches).
// Modules are loaded into the device's context through the process-wide ModuleCache.
#pragma once

#include <flexjit/context.h>

#include "Pipeline.h"
#include "device/Device.h"

namespace flexjit {

struct Context::Impl {
  runtime::Device* device = nullptr;
  KernelBuilder builder;

  explicit Impl(jit::CacheSettings settings) : builder(std::move(settings)) {}
};

// The one way into a Context's state (the public header keeps it opaque).
struct ContextAccess {
  static Context::Impl& impl(const Context& ctx) { return *ctx.impl_; }
};

using ContextImpl = Context::Impl;

inline ContextImpl& impl_of(const Context& ctx) {
  return ContextAccess::impl(ctx);
}

}  // namespace flexjit
