// The CPU layout of a mod set's captured buffers and runtime parameters, and its host packer.
//
// JIT'ed CPU mod functions take `const uint64_t* params`: a flat array of 64-bit slots, laid out
// in Mods::buffers then Mods::params order:
//
//   per buffer of rank r:  slot 0          data pointer (const void*, as an integer)
//                          slots 1 .. r    extent of dim d (int64, at least 1)
//                          slots r+1 .. 2r stride of dim d (int64, in elements)
//   per param:             one slot; f32 bits, i32 value, or bool 0 / 1 in the low 32 bits
//
// Loads clamp every index into [0, extent) (see LlvmCodegen.h), so a buffer bound to an empty
// tensor is packed as a one-element view of a zero constant: it reads as 0, never faults.
// One slot of padding is kept when a mod set has no buffers and no params, so that `data()` is
// never null.
#pragma once

#include <flexjit/mods.h>

#include "binding/ModArgs.h"

#include <cstdint>
#include <vector>

namespace flexjit::llvmjit {

struct CpuModParamLayout {
  std::vector<int> buffer_slot;  // per Mods::buffers entry: index of its pointer slot
  std::vector<int> param_slot;   // per Mods::params entry: index of its slot
  int num_slots = 1;
};

CpuModParamLayout cpu_layout_of(const Mods& mods);

// The slots for `mods` with `args` from runtime::bind_mod_args(mods, ..., Device::CPU), which
// checked everything (docs/attention.md, "Bindings").
std::vector<uint64_t> pack_cpu_mod_params(const Mods& mods, const runtime::BoundModArgs& args);

// pack_cpu_mod_params(mods, runtime::bind_mod_args(mods, bindings, TensorRef::Device::CPU)):
// RuntimeError for bindings bind_mod_args rejects.
std::vector<uint64_t> pack_cpu_mod_params(const Mods& mods, const ModBindings& bindings);

}  // namespace flexjit::llvmjit
