// e4m3 KV caches for the GPU tests of decoding and chunked prefill on them (tests/gpu/
// test_decode_fp8.cpp, test_prefill_fp8.cpp): random e4m3 K / V with their dequantized values,
// and page pools through a table. `Case` has batch, heads_kv, capacity (keys per sequence),
// lens (keys of each sequence) and page_size.
#pragma once

#include "ir/Evaluate.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace flexjit::test {

// An e4m3 NaN byte: what a cache holds past each sequence's length and in spare pages, which no
// kernel may read (a tile the length cuts is zero-filled there).
constexpr uint8_t kE4m3Nan = 0x7f;

// An e4m3 tensor's bytes and their dequantized values (times the kv head's scale).
struct E4m3Tensor {
  std::vector<uint8_t> bytes;
  std::vector<float> dequantized;
};

// Logical [B, Hkv, cap, D] e4m3 values: N(0, 1) / scale[h] rounded to e4m3 (|x| <= 448: a
// per-head quantizer's values), NaN bytes past each sequence's length (0 in `dequantized`: the
// reference masks those keys).
template <class Case>
E4m3Tensor random_e4m3(std::mt19937_64& rng, const Case& c, int dim,
                       const std::vector<float>& scale) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t n = static_cast<size_t>(c.batch) * c.heads_kv * c.capacity * dim;
  E4m3Tensor t;
  t.bytes.resize(n);
  t.dequantized.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const int key = static_cast<int>(i / dim % c.capacity);
    const int h = static_cast<int>(i / dim / c.capacity % c.heads_kv);
    const int b = static_cast<int>(i / dim / c.capacity / c.heads_kv);
    if (key >= c.lens[b]) {
      t.bytes[i] = kE4m3Nan;
      t.dequantized[i] = 0.0f;
      continue;
    }
    t.bytes[i] = ir::float_to_e4m3_bits(normal(rng) / scale[h]);
    t.dequantized[i] = ir::e4m3_bits_to_float(t.bytes[i]) * scale[h];
  }
  return t;
}

// Pools [num_pages, page_size, Hkv, D] of `logical` [B, Hkv, cap, D] through `table` ([B,
// cap / page_size]; entries < 0 unused); spare pages hold NaN bytes.
template <class Case>
std::vector<uint8_t> to_pool(const std::vector<uint8_t>& logical, const Case& c, int dim,
                             const std::vector<int>& table, int num_pages) {
  const int ps = c.page_size, max_pages = c.capacity / ps;
  std::vector<uint8_t> pool(static_cast<size_t>(num_pages) * ps * c.heads_kv * dim, kE4m3Nan);
  for (int b = 0; b < c.batch; ++b)
    for (int p = 0; p < max_pages; ++p) {
      const int e = table[static_cast<size_t>(b) * max_pages + p];
      if (e < 0) continue;
      for (int slot = 0; slot < ps; ++slot)
        for (int h = 0; h < c.heads_kv; ++h)
          std::copy_n(
              &logical[((static_cast<size_t>(b) * c.heads_kv + h) * c.capacity + p * ps + slot) *
                       dim],
              dim, &pool[((static_cast<size_t>(e) * ps + slot) * c.heads_kv + h) * dim]);
    }
  return pool;
}

}  // namespace flexjit::test
