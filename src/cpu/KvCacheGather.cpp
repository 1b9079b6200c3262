// gather_kv_cache and with_length_mask (cpu/KvCacheGather.h).
#include "cpu/KvCacheGather.h"

#include "binding/KvCache.h"
#include "ir/Evaluate.h"

#include <flexjit/error.h>
#include <flexjit/mods.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace flexjit::cpu {

namespace {

int32_t read_i32(const TensorRef& t, int64_t offset) {
  int32_t x = 0;
  std::memcpy(&x, static_cast<const char*>(t.data) + offset * 4, 4);
  return x;
}

float read_f32(const TensorRef& t, int64_t offset) {
  float x = 0;
  std::memcpy(&x, static_cast<const char*>(t.data) + offset * 4, 4);
  return x;
}

// An e4m3 row of `d` values times `scale` as f32 at dst.
void dequantize_row(const uint8_t* src, int64_t d, float scale, char* dst) {
  for (int64_t i = 0; i < d; ++i) {
    const float x = ir::e4m3_bits_to_float(src[i]) * scale;
    std::memcpy(dst + i * 4, &x, 4);
  }
}

// Copies key n of (b, h) into row (b, h, n) of a [B, Hkv, max_len, D] contiguous array; `table`
// is the page table's host copy ([B, max_pages], empty without pages). An e4m3 source is
// dequantized into f32 with scale[h] (`scale`: the cache's k_scale or v_scale).
void gather_one(const TensorRef& src, std::vector<char>& dst, const KvCacheShape& shape,
                const std::vector<int>& table, const GatheredKv& g, const TensorRef& scale) {
  const int64_t batch = shape.qkv.batch, hkv = shape.qkv.heads_kv;
  const int64_t d = src.shape[3];
  const size_t es = static_cast<size_t>(dtype_size(src.dtype));
  const size_t row_bytes = static_cast<size_t>(d) * es;
  const size_t dst_row_bytes = static_cast<size_t>(d) * (shape.fp8 ? 4 : es);
  dst.assign(static_cast<size_t>(batch * hkv * g.max_len) * dst_row_bytes, 0);
  const char* base = static_cast<const char*>(src.data);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = g.lengths[static_cast<size_t>(b)];
    for (int64_t h = 0; h < hkv; ++h) {
      const float s = shape.fp8 ? read_f32(scale, h * scale.strides[0]) : 1.0f;
      for (int64_t n = 0; n < len; ++n) {
        int64_t offset;  // elements
        if (shape.paged) {
          const int64_t page =
              table[static_cast<size_t>(b * shape.max_pages + n / shape.page_size)];
          offset =
              page * src.strides[0] + (n % shape.page_size) * src.strides[1] + h * src.strides[2];
        } else {
          offset = b * src.strides[0] + h * src.strides[1] + n * src.strides[2];
        }
        char* row = dst.data() + static_cast<size_t>((b * hkv + h) * g.max_len + n) * dst_row_bytes;
        const char* from = base + static_cast<size_t>(offset) * es;
        if (shape.fp8) {
          dequantize_row(reinterpret_cast<const uint8_t*>(from), d, s, row);
        } else {
          std::memcpy(row, from, row_bytes);
        }
      }
    }
  }
}

}  // namespace

GatheredKv gather_kv_cache(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                           const KvCache& cache, const KvCacheShape& shape) {
  const int64_t batch = shape.qkv.batch;
  GatheredKv g;
  std::vector<int> lens(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b)
    lens[static_cast<size_t>(b)] = read_i32(cache.seq_lens, b * cache.seq_lens.strides[0]);
  // The table's rows as check_kv_cache_entries reads them (row stride max_pages).
  std::vector<int> table;
  if (shape.paged) {
    table.resize(static_cast<size_t>(batch * shape.max_pages));
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t p = 0; p < shape.max_pages; ++p) {
        table[static_cast<size_t>(b * shape.max_pages + p)] =
            read_i32(cache.page_table, b * cache.page_table.strides[0] + p);
      }
    }
  }
  // The lengths are on the host, so checking them is cheap: a length outside [0, capacity] or a
  // page a length reads that is not in the pool is always a RuntimeError naming the entry (the
  // GPU kernels clamp lengths unless check_pages, since there they live on the device).
  runtime::check_kv_cache_entries(lens, table, shape.max_pages, shape);
  g.lengths = lens;
  g.max_len = g.lengths.empty() ? 0 : *std::max_element(g.lengths.begin(), g.lengths.end());
  gather_one(k, g.k_bytes, shape, table, g, cache.k_scale);
  gather_one(v, g.v_bytes, shape, table, g, cache.v_scale);
  const int64_t hkv = shape.qkv.heads_kv;
  const DType kv_dtype = shape.fp8 ? DType::F32 : k.dtype;
  g.k = TensorRef::contiguous(g.k_bytes.data(), kv_dtype, {batch, hkv, g.max_len, k.shape[3]});
  g.v = TensorRef::contiguous(g.v_bytes.data(), kv_dtype, {batch, hkv, g.max_len, v.shape[3]});
  g.q = q;
  if (shape.fp8) {  // q (bf16 / f16, any strides) in f32, contiguous
    const std::vector<int64_t>& qs = q.shape;
    g.q_f32.resize(static_cast<size_t>(qs[0] * qs[1] * qs[2] * qs[3]));
    const auto* bits = static_cast<const uint16_t*>(q.data);
    size_t i = 0;
    for (int64_t b = 0; b < qs[0]; ++b)
      for (int64_t h = 0; h < qs[1]; ++h)
        for (int64_t s = 0; s < qs[2]; ++s)
          for (int64_t d = 0; d < qs[3]; ++d) {
            const uint16_t x =
                bits[b * q.strides[0] + h * q.strides[1] + s * q.strides[2] + d * q.strides[3]];
            g.q_f32[i++] =
                q.dtype == DType::F16 ? ir::f16_bits_to_float(x) : ir::bf16_bits_to_float(x);
          }
    g.q = TensorRef::contiguous(g.q_f32.data(), DType::F32, qs);
  }
  g.length_ref = TensorRef::contiguous(g.lengths.data(), DType::I32, {batch});
  return g;
}

AttentionOptions with_length_mask(const AttentionOptions& options, const GatheredKv& g) {
  for (const Buffer& b : options.mods.buffers) {
    if (b.name() == kKvLengthBuffer) {
      throw RuntimeError(fmt::format(
          "the mods declare a buffer named '{}', the name the CPU backend gives the KV cache's "
          "lengths; rename it",
          kKvLengthBuffer));
    }
  }
  AttentionOptions o = options;
  o.kv_cache = nullptr;
  const Mods lengths =
      parse_mods(fmt::format("buffer {0}: i32[B]\nmask_mod = kv_idx < {0}[b]", kKvLengthBuffer),
                 "<kv cache lengths>");
  o.mods = combine(options.mods, lengths);
  o.mods.name = options.mods.name;
  o.bindings.buffers.emplace_back(kKvLengthBuffer, g.length_ref);
  return o;
}

}  // namespace flexjit::cpu
