// Tests keep their buffers and params in the interpreter's environment (ir::EvalEnv, which the
// reference interpreter reads); the CPU kernels and builders take ModBindings, as the public API
// does. This adapts one to the other.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/mods.h>

#include "ir/Evaluate.h"

namespace flexjit::test {

// The host-tensor bindings of the buffers and params in `env` that `mods` declares (others are
// left out, as the interpreter ignores them); a BufferView without strides is C order.
inline ModBindings host_bindings(const Mods& mods, const ir::EvalEnv& env) {
  ModBindings out;
  for (const Buffer& b : mods.buffers) {
    auto it = env.buffers.find(b.name());
    if (it == env.buffers.end()) continue;
    const ir::BufferView& v = it->second;
    TensorRef t = TensorRef::contiguous(const_cast<void*>(v.data), v.dtype, v.shape);
    if (!v.strides.empty()) t.strides = v.strides;
    out.buffers.emplace_back(b.name(), t);
  }
  for (const Param& p : mods.params) {
    auto it = env.params.find(p.name());
    if (it != env.params.end()) out.params.emplace_back(p.name(), it->second);
  }
  return out;
}

}  // namespace flexjit::test
