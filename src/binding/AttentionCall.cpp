#include "binding/AttentionCall.h"

#include "device/ModuleCache.h"

#include <flexjit/block_mask.h>
#include <flexjit/error.h>

#include <fmt/format.h>

#include <climits>
#include <string>

namespace flexjit::runtime {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

}  // namespace

void check_tensor(const char* name, const TensorRef& t, const std::vector<int64_t>& shape,
                  const char* what, DType dtype, const TensorRef& like) {
  if (t.shape != shape) {
    throw RuntimeError(fmt::format("{} has shape {}; expected {} = {}", name, shape_str(t.shape),
                                   what, shape_str(shape)));
  }
  if (t.strides.size() != t.shape.size()) {
    throw RuntimeError(
        fmt::format("{} has {} strides for {} dims", name, t.strides.size(), t.shape.size()));
  }
  if (t.dtype != dtype) {
    throw RuntimeError(
        fmt::format("{} has dtype {}; expected {}", name, to_string(t.dtype), to_string(dtype)));
  }
  if (t.device != like.device || t.device_index != like.device_index) {
    throw RuntimeError(fmt::format("{} is on {} but q is on {}", name,
                                   to_string(t.device, t.device_index),
                                   to_string(like.device, like.device_index)));
  }
  if (!t.is_last_dim_contiguous()) {
    throw RuntimeError(
        fmt::format("last dim of {} is not contiguous (stride {})", name, t.strides.back()));
  }
  for (size_t d = 0; d < t.strides.size(); ++d) {
    if (t.strides[d] < 0) {
      throw RuntimeError(
          fmt::format("{} has a negative stride in dim {} ({})", name, d, t.strides[d]));
    }
  }
  if (t.data == nullptr && t.numel() > 0) {
    throw RuntimeError(fmt::format("{} has a null data pointer", name));
  }
}

void check_on_device(const TensorRef& q, int device_index) {
  if (q.device != TensorRef::Device::CUDA || q.device_index != device_index) {
    throw RuntimeError(fmt::format("q, k and v are on {}; the context's device is {}",
                                   to_string(q.device, q.device_index),
                                   to_string(TensorRef::Device::CUDA, device_index)));
  }
}

void check_launch_limits(const QkvShape& s) {
  if (s.seqlen_q > INT_MAX || s.seqlen_kv > INT_MAX) {
    throw RuntimeError(fmt::format("sequence lengths must be below 2^31 (Sq={}, Skv={})",
                                   s.seqlen_q, s.seqlen_kv));
  }
  if (s.heads_q > kMaxGridDimYZ || s.batch > kMaxGridDimYZ) {
    throw RuntimeError(fmt::format("at most {} heads and {} batches per call (Hq={}, B={})",
                                   kMaxGridDimYZ, kMaxGridDimYZ, s.heads_q, s.batch));
  }
}

void check_attention_outputs(const TensorRef& q, const QkvShape& s, const TensorRef& out,
                             const TensorRef* lse) {
  check_tensor("out", out, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v}, "[B, Hq, Sq, Dv]",
               attention_out_dtype(q.dtype), q);
  if (lse != nullptr) {
    check_tensor("lse", *lse, {s.batch, s.heads_q, s.seqlen_q}, "[B, Hq, Sq]", DType::F32, q);
  }
}

void write_empty_attention(const TensorRef& out, const TensorRef* lse, CUstream stream) {
  zero_fill(out, stream);
  if (lse == nullptr || lse->numel() == 0) return;
  constexpr unsigned kNegInfBits = 0xff800000u;
  if (lse->is_contiguous()) {
    FJ_CU(cuMemsetD32Async, "lse", reinterpret_cast<CUdeviceptr>(lse->data), kNegInfBits,
          static_cast<size_t>(lse->numel()), stream);
    return;
  }
  for (int64_t b = 0; b < lse->shape[0]; ++b) {
    for (int64_t h = 0; h < lse->shape[1]; ++h) {
      auto* base = static_cast<float*>(lse->data) + b * lse->strides[0] + h * lse->strides[1];
      FJ_CU(cuMemsetD32Async, "lse", reinterpret_cast<CUdeviceptr>(base), kNegInfBits,
            static_cast<size_t>(lse->shape[2]), stream);
    }
  }
}

void check_block_mask(const DeviceBlockMask& dbm, const QkvShape& s) {
  const BlockMask& m = dbm.meta();
  if (m.seqlen_q != s.seqlen_q || m.seqlen_kv != s.seqlen_kv) {
    throw RuntimeError(
        fmt::format("the block mask was built for Sq={}, Skv={} but the inputs have Sq={}, Skv={}",
                    m.seqlen_q, m.seqlen_kv, s.seqlen_q, s.seqlen_kv));
  }
  if (m.batch != 1 && m.batch != s.batch) {
    throw RuntimeError(
        fmt::format("the block mask has batch {}; expected 1 or B={}", m.batch, s.batch));
  }
  if (m.heads != 1 && m.heads != s.heads_q) {
    throw RuntimeError(
        fmt::format("the block mask has {} heads; expected 1 or Hq={}", m.heads, s.heads_q));
  }
  if (!dbm.kv_num_blocks.defined() || !dbm.kv_indices.defined()) {
    throw RuntimeError("the block mask has no kv_num_blocks / kv_indices on the device");
  }
}

Mods effective_mods(const AttentionOptions& o) {
  if (o.mods.mask_mod.defined() || o.block_mask == nullptr) return o.mods;
  const Mods& from_mask = o.block_mask->meta().mods;
  if (!from_mask.mask_mod.defined()) return o.mods;
  // Only the mask_mod (and what it captures): a score_mod the mask was built alongside is not
  // the caller's to apply.
  const Expr mask = from_mask.mask_mod;
  Mods m = Mods::from_mask([&](Expr, Expr, Expr, Expr) { return mask; });
  m.name = from_mask.name;
  if (!o.mods.score_mod.defined() && o.mods.buffers.empty() && o.mods.params.empty()) return m;
  return combine(o.mods, m);
}

void zero_fill(const TensorRef& t, CUstream stream) {
  if (t.numel() == 0) return;
  const int es = dtype_size(t.dtype);
  if (t.is_contiguous()) {
    FJ_CU(cuMemsetD8Async, "zeroing a tensor", reinterpret_cast<CUdeviceptr>(t.data), 0,
          static_cast<size_t>(t.numel()) * es, stream);
    return;
  }
  // Rows of the last dim, pitch = the second-to-last stride, one 2D memset per leading index.
  const size_t rank = t.shape.size();
  FJ_ASSERT(rank >= 2, "zero_fill of a strided 1-d tensor");
  const int64_t rows = t.shape[rank - 2], cols = t.shape[rank - 1];
  int64_t outer = 1;
  for (size_t d = 0; d + 2 < rank; ++d)
    outer *= t.shape[d];
  for (int64_t o = 0; o < outer; ++o) {
    int64_t offset = 0, rest = o;
    for (size_t d = rank - 2; d-- > 0;) {
      offset += (rest % t.shape[d]) * t.strides[d];
      rest /= t.shape[d];
    }
    auto* base = static_cast<char*>(t.data) + offset * es;
    const size_t pitch =
        rows > 1 ? static_cast<size_t>(t.strides[rank - 2]) * es : static_cast<size_t>(cols) * es;
    FJ_CU(cuMemsetD2D8Async, "zeroing a tensor", reinterpret_cast<CUdeviceptr>(base), pitch, 0,
          static_cast<size_t>(cols) * es, static_cast<size_t>(rows), stream);
  }
}

void check_no_descales_on_kv_cache(const Fp8Descale& d) {
  if (!d.q && !d.k && !d.v) return;
  throw RuntimeError(fmt::format(
      "descale.{} was given with a KV cache: descale factors apply to e4m3 q, k, v without one; "
      "an e4m3 KV cache keeps q in bf16 / f16 and takes KvCache::k_scale / v_scale (per kv "
      "head)",
      d.q   ? "q"
      : d.k ? "k"
            : "v"));
}

Fp8Descales check_descales(const Fp8Descale& d, const TensorRef& q, const QkvShape& s) {
  const bool given = d.q || d.k || d.v;
  if (q.dtype != DType::E4M3) {
    if (given) {
      throw RuntimeError(fmt::format(
          "descale factors were given for {} inputs; they apply to e4m3 (float8_e4m3fn) q, k, v "
          "only",
          to_string(q.dtype)));
    }
    return {};
  }
  Fp8Descales out;
  auto one = [&](const std::optional<TensorRef>& t, const char* name, int64_t heads,
                 const char* heads_name, const float*& ptr, int& stride) {
    if (!t) return;
    const std::string dev = to_string(t->device, t->device_index);
    const std::string qdev = to_string(q.device, q.device_index);
    if (t->dtype != DType::F32 || t->ndim() != 1 || (t->shape[0] != 1 && t->shape[0] != heads) ||
        dev != qdev || (t->shape[0] > 1 && t->strides[0] != 1) || t->data == nullptr) {
      throw RuntimeError(fmt::format(
          "descale.{} is {}; expected f32[1] (per tensor) or f32[{}] ({} = {}: per head), "
          "contiguous, on {}",
          name, t->str(), heads, heads_name, heads, qdev));
    }
    ptr = static_cast<const float*>(t->data);
    stride = t->shape[0] == 1 ? 0 : 1;
  };
  one(d.q, "q", s.heads_q, "Hq", out.q, out.q_stride);
  one(d.k, "k", s.heads_kv, "Hkv", out.k, out.k_stride);
  one(d.v, "v", s.heads_kv, "Hkv", out.v, out.v_stride);
  return out;
}

}  // namespace flexjit::runtime
