#include <flexjit/error.h>
#include <flexjit/tensor.h>

#include "util/CheckedMath.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>

namespace flexjit {

namespace {
// DLPack >= 0.8 spells bool kDLBool (code 6); the header Debian ships (0.6) predates it.
constexpr uint8_t kDLBoolCode = 6;
// DLPack >= 1.1 spells float8_e4m3fn kDLFloat8_e4m3fn (code 10).
constexpr uint8_t kDLFloat8E4M3FnCode = 10;
// Alignment, in bytes, that vectorized and asynchronous copies need.
constexpr int64_t kFastPathAlignment = 16;

// Unsigned arithmetic: a shape whose product overflows gives meaningless strides, never UB
// (numel() reports such a shape).
std::vector<int64_t> c_order_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  uint64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = static_cast<int64_t>(s);
    s *= static_cast<uint64_t>(std::max<int64_t>(shape[i], 1));
  }
  return strides;
}
}  // namespace

TensorRef TensorRef::contiguous(void* data, DType dtype, std::vector<int64_t> shape, Device device,
                                int device_index) {
  TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.strides = c_order_strides(shape);
  t.shape = std::move(shape);
  t.device = device;
  t.device_index = device_index;
  return t;
}

int64_t TensorRef::numel() const {
  const std::optional<int64_t> n = checked_product(shape);
  if (!n) {
    throw RuntimeError(fmt::format("tensor {}[{}] has more than 2^63 elements", to_string(dtype),
                                   fmt::join(shape, ", ")));
  }
  return *n;
}

bool TensorRef::is_last_dim_contiguous() const {
  return shape.empty() || shape.back() <= 1 || strides.back() == 1;
}

bool TensorRef::is_contiguous() const {
  std::vector<int64_t> expect = c_order_strides(shape);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] > 1 && strides[i] != expect[i]) return false;
  }
  return true;
}

std::string to_string(TensorRef::Device d, int index) {
  if (d == TensorRef::Device::CPU) return "cpu";
  return fmt::format("cuda:{}", index);
}

std::string TensorRef::str() const {
  return fmt::format("{}[{}] strides [{}] {}", to_string(dtype), fmt::join(shape, ", "),
                     fmt::join(strides, ", "), to_string(device, device_index));
}

TensorRef from_dlpack(const DLTensor& t) {
  TensorRef r;
  const DLDataType dt = t.dtype;
  auto reject = [&]() -> RuntimeError {
    return RuntimeError(fmt::format(
        "unsupported DLPack dtype (code {}, bits {}, lanes {}); flexjit takes float32, float16, "
        "bfloat16, float8_e4m3fn, int32 and bool",
        dt.code, dt.bits, dt.lanes));
  };
  if (dt.lanes != 1) throw reject();
  if (dt.code == kDLFloat && dt.bits == 32) {
    r.dtype = DType::F32;
  } else if (dt.code == kDLFloat && dt.bits == 16) {
    r.dtype = DType::F16;
  } else if (dt.code == kDLBfloat && dt.bits == 16) {
    r.dtype = DType::BF16;
  } else if (dt.code == kDLInt && dt.bits == 32) {
    r.dtype = DType::I32;
  } else if ((dt.code == kDLBoolCode || dt.code == kDLUInt) && dt.bits == 8) {
    r.dtype = DType::Bool;
  } else if (dt.code == kDLFloat8E4M3FnCode && dt.bits == 8) {
    r.dtype = DType::E4M3;
  } else {
    throw reject();
  }
  switch (t.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      r.device = TensorRef::Device::CPU;
      break;
    case kDLCUDA:
    case kDLCUDAManaged:
      r.device = TensorRef::Device::CUDA;
      break;
    default:
      throw RuntimeError(
          fmt::format("unsupported DLPack device type {}; flexjit takes CPU and CUDA tensors",
                      static_cast<int>(t.device.device_type)));
  }
  r.device_index = t.device.device_id;
  if (t.ndim < 0) throw RuntimeError(fmt::format("DLPack tensor has ndim {}", t.ndim));
  if (t.ndim > 0 && t.shape == nullptr) throw RuntimeError("DLPack tensor has a null shape");
  r.shape.assign(t.shape, t.shape + t.ndim);
  for (int i = 0; i < t.ndim; ++i) {
    if (r.shape[i] < 0) {
      throw RuntimeError(
          fmt::format("DLPack tensor has negative extent {} in dim {}", r.shape[i], i));
    }
  }
  if (t.strides == nullptr) {
    r.strides = c_order_strides(r.shape);
  } else {
    r.strides.assign(t.strides, t.strides + t.ndim);
  }
  r.data = static_cast<char*>(t.data) + t.byte_offset;
  return r;
}

namespace {

void check_rank(const TensorRef& t, const char* name, const char* expected) {
  if (t.ndim() != 4) {
    throw RuntimeError(fmt::format("{} has {} dims; expected {}", name, t.ndim(), expected));
  }
}

void check_layout(const TensorRef& t, const char* name) {
  for (int i = 0; i < t.ndim(); ++i) {
    if (t.shape[i] < 0) {
      throw RuntimeError(
          fmt::format("{} has a negative extent in dim {} ({})", name, i, t.shape[i]));
    }
  }
  const std::optional<int64_t> numel = checked_product(t.shape);
  if (!numel) {
    throw RuntimeError(fmt::format("{} of shape [{}] has more than 2^63 elements", name,
                                   fmt::join(t.shape, ", ")));
  }
  for (int i = 0; i < t.ndim(); ++i) {
    if (t.strides[i] < 0) {
      throw RuntimeError(
          fmt::format("{} has a negative stride in dim {} ({})", name, i, t.strides[i]));
    }
  }
  if (!t.is_last_dim_contiguous()) {
    throw RuntimeError(
        fmt::format("last dim of {} is not contiguous (stride {})", name, t.strides.back()));
  }
  if (t.data == nullptr && *numel > 0) {
    throw RuntimeError(fmt::format("{} has a null data pointer", name));
  }
}

void check_same(int64_t a, int64_t b, const char* what) {
  if (a != b) throw RuntimeError(fmt::format("{} differ: {} vs {}", what, a, b));
}

// Records the first reason the fast path is impossible.
void check_alignment(const TensorRef& t, const char* name, QkvShape& s) {
  if (!s.fast_path) return;
  const auto addr = reinterpret_cast<uintptr_t>(t.data);
  if (addr % kFastPathAlignment != 0) {
    s.fast_path = false;
    s.fast_path_blocker =
        fmt::format("data pointer of {} is not {}-byte aligned", name, kFastPathAlignment);
    return;
  }
  const int64_t elem = dtype_size(t.dtype);
  for (int i = 0; i + 1 < t.ndim(); ++i) {
    if (t.shape[i] > 1 && (t.strides[i] * elem) % kFastPathAlignment != 0) {
      s.fast_path = false;
      s.fast_path_blocker = fmt::format(
          "stride of {} in dim {} ({} elements = {} bytes) is not a multiple of {} bytes", name, i,
          t.strides[i], t.strides[i] * elem, kFastPathAlignment);
      return;
    }
  }
  if ((t.shape.back() * elem) % kFastPathAlignment != 0) {
    s.fast_path = false;
    s.fast_path_blocker = fmt::format("head dim of {} ({} bytes) is not a multiple of {} bytes",
                                      name, t.shape.back() * elem, kFastPathAlignment);
  }
}

}  // namespace

DType attention_out_dtype(DType qkv) {
  return qkv == DType::E4M3 ? DType::BF16 : qkv;
}

QkvShape validate_qkv(const TensorRef& q, const TensorRef& k, const TensorRef& v) {
  if (q.dtype == DType::E4M3) {
    throw UnsupportedError(
        "q has dtype e4m3; this call takes f16, bf16 or f32 (e4m3 q, k, v run only in the forward: "
        "flex_attention on sm_90a, or the CPU backend)");
  }
  return validate_forward_qkv(q, k, v);
}

QkvShape validate_forward_qkv(const TensorRef& q, const TensorRef& k, const TensorRef& v) {
  check_rank(q, "q", "[B, Hq, Sq, D]");
  check_rank(k, "k", "[B, Hkv, Skv, D]");
  check_rank(v, "v", "[B, Hkv, Skv, Dv]");
  for (const TensorRef* t : {&q, &k, &v}) {
    if (t->strides.size() != t->shape.size()) {
      throw RuntimeError(fmt::format("tensor {} has {} strides for {} dims", t->str(),
                                     t->strides.size(), t->shape.size()));
    }
  }
  if (q.dtype != DType::F16 && q.dtype != DType::BF16 && q.dtype != DType::F32 &&
      q.dtype != DType::E4M3) {
    throw RuntimeError(
        fmt::format("q has dtype {}; attention takes f16, bf16, f32 or e4m3", to_string(q.dtype)));
  }
  if (k.dtype != q.dtype || v.dtype != q.dtype) {
    throw RuntimeError(fmt::format("q, k and v must share one dtype: q is {}, k is {}, v is {}",
                                   to_string(q.dtype), to_string(k.dtype), to_string(v.dtype)));
  }
  const std::string qdev = to_string(q.device, q.device_index);
  for (auto [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    const std::string dev = to_string(t->device, t->device_index);
    if (dev != qdev) {
      throw RuntimeError(fmt::format("q is on {} but {} is on {}", qdev, name, dev));
    }
  }
  check_same(q.shape[0], k.shape[0], "q and k batch sizes");
  check_same(k.shape[0], v.shape[0], "k and v batch sizes");
  check_same(k.shape[1], v.shape[1], "k and v head counts");
  check_same(k.shape[2], v.shape[2], "k and v sequence lengths");
  check_same(q.shape[3], k.shape[3], "q and k head dims");
  QkvShape s;
  s.batch = q.shape[0];
  s.heads_q = q.shape[1];
  s.heads_kv = k.shape[1];
  s.seqlen_q = q.shape[2];
  s.seqlen_kv = k.shape[2];
  s.head_dim_qk = q.shape[3];
  s.head_dim_v = v.shape[3];
  if (s.heads_kv <= 0 || s.heads_q % s.heads_kv != 0) {
    throw RuntimeError(fmt::format("Hq={} is not a multiple of Hkv={}", s.heads_q, s.heads_kv));
  }
  check_layout(q, "q");
  check_layout(k, "k");
  check_layout(v, "v");
  check_alignment(q, "q", s);
  check_alignment(k, "k", s);
  check_alignment(v, "v", s);
  return s;
}

}  // namespace flexjit
