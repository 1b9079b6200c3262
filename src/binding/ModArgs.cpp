#include "binding/ModArgs.h"

#include <flexjit/error.h>

#include "binding/ModParamLayout.h"
#include "ir/IR.h"
#include "ir/Visitor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>

namespace flexjit::runtime {

namespace {

std::string declaration(const Buffer& b) {
  return fmt::format("{}[{}]", to_string(b.dtype()), fmt::join(b.decl()->dims, ", "));
}

template <typename Named>
std::string names_of(const std::vector<Named>& v) {
  if (v.empty()) return "none";
  std::vector<std::string> n;
  for (const auto& x : v)
    n.push_back(x.name());
  return fmt::format("{}", fmt::join(n, ", "));
}

// Checks one bound tensor against its declaration.
void check_buffer(const Buffer& decl, const TensorRef& t, TensorRef::Device device,
                  int device_index) {
  const std::string what = fmt::format("buffer '{}' (declared {})", decl.name(), declaration(decl));
  if (t.dtype != decl.dtype()) {
    throw RuntimeError(fmt::format("{} is bound to a {} tensor; expected {}", what,
                                   to_string(t.dtype), to_string(decl.dtype())));
  }
  if (t.ndim() != decl.rank()) {
    throw RuntimeError(fmt::format("{} is bound to a tensor of {} dims; expected {}", what,
                                   t.ndim(), decl.rank()));
  }
  if (static_cast<int>(t.strides.size()) != t.ndim()) {
    throw RuntimeError(
        fmt::format("{}: the tensor has {} strides for {} dims", what, t.strides.size(), t.ndim()));
  }
  for (int d = 0; d < t.ndim(); ++d) {
    const std::string& dim = decl.decl()->dims[d];
    char* end = nullptr;
    const long long n = std::strtoll(dim.c_str(), &end, 10);
    const bool numeric = !dim.empty() && end != nullptr && *end == '\0';
    if (numeric && t.shape[d] != n) {
      throw RuntimeError(
          fmt::format("{}: dim {} has extent {}; the declaration says {}", what, d, t.shape[d], n));
    }
    if (t.shape[d] < 0) {
      throw RuntimeError(fmt::format("{}: dim {} has negative extent {}", what, d, t.shape[d]));
    }
  }
  const bool same_device =
      t.device == device && (device == TensorRef::Device::CPU || t.device_index == device_index);
  if (!same_device) {
    throw RuntimeError(fmt::format("{} is on {}; the kernel runs on {}", what,
                                   to_string(t.device, t.device_index),
                                   to_string(device, device_index)));
  }
  if (t.data == nullptr && t.numel() > 0) {
    throw RuntimeError(fmt::format("{} has a null data pointer", what));
  }
}

// Checks that a bound buffer covers the call's index range in every dim named after one.
void check_buffer_extents(const Buffer& decl, const TensorRef& t, const CallExtents& call) {
  for (int d = 0; d < t.ndim(); ++d) {
    const std::string& dim = decl.decl()->dims[d];
    int64_t need = -1;
    std::string why;
    if (dim == "B") {
      need = call.batch;
      why = fmt::format("{} sequences in the batch (b < {})", need, need);
    } else if (dim == "H" || dim == "Hq") {
      need = call.heads_q;
      why = fmt::format("{} query heads (h < {})", need, need);
    } else if (dim == "Hkv") {
      need = call.heads_kv;
      why = fmt::format("{} key/value heads", need);
    } else if (dim == "Sq") {
      need = call.seqlen_q;
      why = fmt::format("{} query positions (q_idx < {})", need, need);
    } else if (dim == "Skv") {
      need = call.seqlen_kv;
      why = fmt::format("{} key positions (kv_idx < {})", need, need);
    } else if (dim == "S") {
      need = std::max(call.seqlen_q, call.seqlen_kv);
      why = call.seqlen_kv < 0 ? fmt::format("{} query positions (q_idx < {})", need, need)
                               : fmt::format("Sq = {} and Skv = {} (S covers q_idx and kv_idx)",
                                             call.seqlen_q, call.seqlen_kv);
    }
    if (need >= 0 && t.shape[d] < need) {
      throw RuntimeError(fmt::format(
          "buffer '{}' (declared {}): dim {} ({}) has {} entries, but this call has {}; the mods "
          "would read past its end",
          decl.name(), declaration(decl), d, dim, t.shape[d], why));
    }
  }
}

int32_t param_i32(const Param& p, double v) {
  if (!std::isfinite(v) || v != std::floor(v) || v < std::numeric_limits<int32_t>::min() ||
      v > std::numeric_limits<int32_t>::max()) {
    throw RuntimeError(
        fmt::format("param '{}' is i32, but its value {} is not an integer in the "
                    "i32 range",
                    p.name(), v));
  }
  return static_cast<int32_t>(v);
}

int32_t param_bool(const Param& p, double v) {
  if (v != 0.0 && v != 1.0) {
    throw RuntimeError(
        fmt::format("param '{}' is bool, but its value {} is not 0 or 1", p.name(), v));
  }
  return v != 0.0 ? 1 : 0;
}

// The index of the buffer `name` in mods.buffers; RuntimeError when it declares none.
size_t buffer_index(const Mods& mods, const std::string& name) {
  size_t i = 0;
  while (i < mods.buffers.size() && mods.buffers[i].name() != name)
    ++i;
  if (i == mods.buffers.size()) {
    throw RuntimeError(
        fmt::format("a tensor is bound to buffer '{}', which the mods '{}' do not "
                    "declare (their buffers: {})",
                    name, mods.name, names_of(mods.buffers)));
  }
  return i;
}

// The index of the param `name` in mods.params; RuntimeError when it declares none.
size_t param_index(const Mods& mods, const std::string& name) {
  size_t i = 0;
  while (i < mods.params.size() && mods.params[i].name() != name)
    ++i;
  if (i == mods.params.size()) {
    throw RuntimeError(
        fmt::format("a value is given for param '{}', which the mods '{}' do not "
                    "declare (their params: {})",
                    name, mods.name, names_of(mods.params)));
  }
  return i;
}

// The index of `name` in `v` (a Mods' buffers or params), or v.size().
template <typename Named>
size_t index_of(const std::vector<Named>& v, const std::string& name) {
  size_t i = 0;
  while (i < v.size() && v[i].name() != name)
    ++i;
  return i;
}

}  // namespace

BoundModArgs bind_mod_args(const Mods& mods, const ModBindings& bindings, TensorRef::Device device,
                           int device_index, const Mods* declared, const CallExtents* call) {
  // Bindings by declaration index; unknown and repeated names are errors.
  const Mods& names = declared != nullptr ? *declared : mods;
  std::vector<const TensorRef*> buffers(mods.buffers.size(), nullptr);
  std::vector<std::optional<double>> params(mods.params.size());
  std::set<std::string> seen_buffers, seen_params;
  for (const auto& [name, tensor] : bindings.buffers) {
    buffer_index(names, name);
    if (!seen_buffers.insert(name).second) {
      throw RuntimeError(fmt::format("buffer '{}' is bound twice", name));
    }
    const size_t i = index_of(mods.buffers, name);
    if (i < buffers.size()) buffers[i] = &tensor;
  }
  for (const auto& [name, value] : bindings.params) {
    param_index(names, name);
    if (!seen_params.insert(name).second) {
      throw RuntimeError(fmt::format("param '{}' is given twice", name));
    }
    const size_t i = index_of(mods.params, name);
    if (i < params.size()) params[i] = value;
  }
  for (size_t i = 0; i < mods.buffers.size(); ++i) {
    if (buffers[i] == nullptr) {
      throw RuntimeError(
          fmt::format("buffer '{}' ({}) is not bound; pass {} tensor for it "
                      "in bindings.buffers",
                      mods.buffers[i].name(), declaration(mods.buffers[i]),
                      device == TensorRef::Device::CPU ? "a host" : "a device"));
    }
    check_buffer(mods.buffers[i], *buffers[i], device, device_index);
    if (call != nullptr) check_buffer_extents(mods.buffers[i], *buffers[i], *call);
  }
  BoundModArgs out;
  out.buffers = std::move(buffers);
  for (size_t i = 0; i < mods.params.size(); ++i) {
    const Param& p = mods.params[i];
    if (!params[i]) params[i] = p.decl()->default_value;
    if (!params[i]) {
      throw RuntimeError(
          fmt::format("param '{}' ({}) has no default value; give one in "
                      "bindings.params",
                      p.name(), to_string(p.type())));
    }
    if (p.type() == ScalarType::I32) param_i32(p, *params[i]);
    if (p.type() == ScalarType::Bool) param_bool(p, *params[i]);
    out.params.push_back(*params[i]);
  }
  return out;
}

std::vector<uint64_t> pack_mod_params(const Mods& mods, const BoundModArgs& args,
                                      void* check_record) {
  FJ_ASSERT(args.buffers.size() == mods.buffers.size() && args.params.size() == mods.params.size(),
            "bound mod args do not match the mods");
  const cuda::ModParamLayout layout = cuda::layout_of(mods, check_record != nullptr);
  FJ_ASSERT(layout.size % 8 == 0 && layout.size >= 8, "FjModParams size is not a multiple of 8");
  std::vector<uint64_t> words(static_cast<size_t>(layout.size) / 8, 0);
  auto* bytes = reinterpret_cast<unsigned char*>(words.data());
  for (const cuda::ModParamField& f : layout.fields) {
    FJ_ASSERT(f.offset >= 0 && f.offset + f.size <= layout.size, "field outside FjModParams");
    switch (f.kind) {
      case cuda::ModParamField::BufferPtr: {
        const uint64_t ptr = reinterpret_cast<uintptr_t>(args.buffers[f.buffer_index]->data);
        std::memcpy(bytes + f.offset, &ptr, 8);
        break;
      }
      case cuda::ModParamField::BufferStride: {
        const int64_t stride = args.buffers[f.buffer_index]->strides[f.dim];
        std::memcpy(bytes + f.offset, &stride, 8);
        break;
      }
      case cuda::ModParamField::ParamF32: {
        const float v = static_cast<float>(args.params[f.param_index]);
        std::memcpy(bytes + f.offset, &v, 4);
        break;
      }
      case cuda::ModParamField::ParamI32: {
        const int32_t v = param_i32(mods.params[f.param_index], args.params[f.param_index]);
        std::memcpy(bytes + f.offset, &v, 4);
        break;
      }
      case cuda::ModParamField::ParamBool: {
        const int32_t v = param_bool(mods.params[f.param_index], args.params[f.param_index]);
        std::memcpy(bytes + f.offset, &v, 4);
        break;
      }
      case cuda::ModParamField::BufferExtent: {
        const int64_t extent = args.buffers[f.buffer_index]->shape[f.dim];
        std::memcpy(bytes + f.offset, &extent, 8);
        break;
      }
      case cuda::ModParamField::CheckRecord: {
        const uint64_t ptr = reinterpret_cast<uintptr_t>(check_record);
        std::memcpy(bytes + f.offset, &ptr, 8);
        break;
      }
    }
  }
  return words;
}

std::vector<uint64_t> pack_mod_params(const Mods& mods, const ModBindings& bindings,
                                      int device_index) {
  return pack_mod_params(mods,
                         bind_mod_args(mods, bindings, TensorRef::Device::CUDA, device_index));
}

ir::EvalEnv eval_env_of(const Mods& mods, const BoundModArgs& args) {
  FJ_ASSERT(args.buffers.size() == mods.buffers.size() && args.params.size() == mods.params.size(),
            "bound mod args do not match the mods");
  ir::EvalEnv env;
  for (size_t i = 0; i < mods.buffers.size(); ++i) {
    const TensorRef& t = *args.buffers[i];
    env.buffers[mods.buffers[i].name()] = ir::BufferView{t.data, t.dtype, t.shape, t.strides};
  }
  for (size_t i = 0; i < mods.params.size(); ++i)
    env.params[mods.params[i].name()] = args.params[i];
  return env;
}

}  // namespace flexjit::runtime
