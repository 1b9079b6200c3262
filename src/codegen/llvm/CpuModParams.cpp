#include "codegen/llvm/CpuModParams.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>

namespace flexjit::llvmjit {

namespace {

// What an empty buffer reads as: every dtype's zero (8 bytes covers all element sizes).
alignas(8) const uint64_t kZeroElement = 0;

}  // namespace

CpuModParamLayout cpu_layout_of(const Mods& mods) {
  CpuModParamLayout layout;
  int slot = 0;
  for (const Buffer& b : mods.buffers) {
    layout.buffer_slot.push_back(slot);
    slot += 1 + 2 * b.decl()->rank();
  }
  for (size_t i = 0; i < mods.params.size(); ++i)
    layout.param_slot.push_back(slot++);
  layout.num_slots = slot > 0 ? slot : 1;
  return layout;
}

std::vector<uint64_t> pack_cpu_mod_params(const Mods& mods, const runtime::BoundModArgs& args) {
  FJ_ASSERT(args.buffers.size() == mods.buffers.size() && args.params.size() == mods.params.size(),
            "bound mod args do not match the mods");
  CpuModParamLayout layout = cpu_layout_of(mods);
  std::vector<uint64_t> slots(static_cast<size_t>(layout.num_slots), 0);
  for (size_t bi = 0; bi < mods.buffers.size(); ++bi) {
    const TensorRef& view = *args.buffers[bi];
    const int rank = mods.buffers[bi].rank();
    const size_t s = static_cast<size_t>(layout.buffer_slot[bi]);
    if (view.numel() == 0) {
      slots[s] = std::bit_cast<uint64_t>(&kZeroElement);
      for (int d = 0; d < rank; ++d) {
        slots[s + 1 + d] = 1;
        slots[s + 1 + rank + d] = 0;
      }
      continue;
    }
    slots[s] = std::bit_cast<uint64_t>(view.data);
    for (int d = 0; d < rank; ++d) {
      slots[s + 1 + d] = static_cast<uint64_t>(view.shape[d]);
      slots[s + 1 + rank + d] = static_cast<uint64_t>(view.strides[d]);
    }
  }
  for (size_t pi = 0; pi < mods.params.size(); ++pi) {
    const double v = args.params[pi];
    uint32_t bits = 0;
    switch (mods.params[pi].type()) {
      case ScalarType::F32:
        bits = std::bit_cast<uint32_t>(static_cast<float>(v));
        break;
      case ScalarType::I32:  // range-checked by bind_mod_args
        bits = static_cast<uint32_t>(static_cast<int32_t>(v));
        break;
      case ScalarType::Bool:
        bits = v != 0.0 ? 1u : 0u;
        break;
    }
    slots[static_cast<size_t>(layout.param_slot[pi])] = bits;
  }
  return slots;
}

std::vector<uint64_t> pack_cpu_mod_params(const Mods& mods, const ModBindings& bindings) {
  return pack_cpu_mod_params(mods, runtime::bind_mod_args(mods, bindings, TensorRef::Device::CPU));
}

}  // namespace flexjit::llvmjit
