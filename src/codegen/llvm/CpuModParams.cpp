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

bool is_number(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

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

std::vector<uint64_t> pack_cpu_mod_params(const Mods& mods, const ir::EvalEnv& bindings) {
  CpuModParamLayout layout = cpu_layout_of(mods);
  std::vector<uint64_t> slots(static_cast<size_t>(layout.num_slots), 0);
  for (size_t bi = 0; bi < mods.buffers.size(); ++bi) {
    const ir::BufferDecl& decl = *mods.buffers[bi].decl();
    auto it = bindings.buffers.find(decl.name);
    if (it == bindings.buffers.end()) {
      throw RuntimeError(fmt::format("no data bound to buffer '{}'", decl.name));
    }
    const ir::BufferView& view = it->second;
    if (view.dtype != decl.dtype) {
      throw RuntimeError(fmt::format("buffer '{}' is declared {} but bound to {} data", decl.name,
                                     to_string(decl.dtype), to_string(view.dtype)));
    }
    const int rank = decl.rank();
    if (static_cast<int>(view.shape.size()) != rank ||
        (!view.strides.empty() && static_cast<int>(view.strides.size()) != rank)) {
      throw RuntimeError(fmt::format("buffer '{}' has {} dims but is bound to a tensor of {}",
                                     decl.name, rank, view.shape.size()));
    }
    int64_t elements = 1;
    for (int d = 0; d < rank; ++d) {
      if (view.shape[d] < 0) {
        throw RuntimeError(
            fmt::format("buffer '{}' dim {} has negative extent {}", decl.name, d, view.shape[d]));
      }
      if (is_number(decl.dims[d]) && std::to_string(view.shape[d]) != decl.dims[d]) {
        throw RuntimeError(fmt::format("buffer '{}' dim {} is declared {} but bound with extent {}",
                                       decl.name, d, decl.dims[d], view.shape[d]));
      }
      elements *= view.shape[d];
    }
    if (elements > 0 && view.data == nullptr) {
      throw RuntimeError(fmt::format("buffer '{}' is bound to a null pointer", decl.name));
    }
    const size_t s = static_cast<size_t>(layout.buffer_slot[bi]);
    if (elements == 0) {
      slots[s] = std::bit_cast<uint64_t>(&kZeroElement);
      for (int d = 0; d < rank; ++d) {
        slots[s + 1 + d] = 1;
        slots[s + 1 + rank + d] = 0;
      }
      continue;
    }
    slots[s] = std::bit_cast<uint64_t>(view.data);
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      slots[s + 1 + d] = static_cast<uint64_t>(view.shape[d]);
      int64_t st = view.strides.empty() ? stride : view.strides[d];
      slots[s + 1 + rank + d] = static_cast<uint64_t>(st);
      stride *= view.shape[d];
    }
  }
  for (size_t pi = 0; pi < mods.params.size(); ++pi) {
    const ir::ParamDecl& p = *mods.params[pi].decl();
    auto it = bindings.params.find(p.name);
    double v;
    if (it != bindings.params.end()) {
      v = it->second;
    } else if (p.default_value) {
      v = *p.default_value;
    } else {
      throw RuntimeError(fmt::format("no value for param '{}' ({}) and it has no default", p.name,
                                     to_string(p.type)));
    }
    uint32_t bits = 0;
    switch (p.type) {
      case ScalarType::F32:
        bits = std::bit_cast<uint32_t>(static_cast<float>(v));
        break;
      case ScalarType::I32:
        if (!(v == std::floor(v) && v >= std::numeric_limits<int32_t>::min() &&
              v <= std::numeric_limits<int32_t>::max())) {
          throw RuntimeError(fmt::format("param '{}' is i32 but its value {} is not", p.name, v));
        }
        bits = static_cast<uint32_t>(static_cast<int32_t>(v));
        break;
      case ScalarType::Bool:
        if (v != 0.0 && v != 1.0) {
          throw RuntimeError(fmt::format("param '{}' is bool but its value is {}", p.name, v));
        }
        bits = v != 0.0 ? 1u : 0u;
        break;
    }
    slots[static_cast<size_t>(layout.param_slot[pi])] = bits;
  }
  return slots;
}

}  // namespace flexjit::llvmjit
