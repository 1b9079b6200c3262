// e4m3 KV caches for the GPU tests of decoding and chunked prefill on them (tests/gpu/
// test_decode_fp8.cpp, test_prefill_fp8.cpp): random e4m3 K / V with their dequantized values,
// page pools through a table, and a whole random cache (random_e4m3_cache). `Case` has batch,
// heads_kv, capacity (keys per sequence), lens (keys of each sequence) and page_size.
#pragma once

#include "ir/Evaluate.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
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

// A random e4m3 cache of `c`: per-kv-head scales in [0.002, 0.05), K and V (random_e4m3), sequence
// 1 starting with sequence 0's first full pages (a shared prefix: the same keys); with pages
// (c.page_size > 0), pools in a shuffled order through a table whose shared-prefix entries are the
// same in both rows and whose entries past a sequence's length are sometimes invalid (never
// read), plus two spare pages.
struct E4m3Cache {
  std::vector<float> k_scale, v_scale;    // [Hkv]
  E4m3Tensor k, v;                        // logical [B, Hkv, cap, D]: the reference's input
  std::vector<int> table;                 // [B, cap / page_size]; empty without pages
  std::vector<uint8_t> k_store, v_store;  // what the kernels read: the logical bytes or the pools
  std::vector<int64_t> k_shape, v_shape;
};

template <class Case>
E4m3Cache random_e4m3_cache(std::mt19937_64& rng, const Case& c) {
  const int B = c.batch, Hkv = c.heads_kv, cap = c.capacity, ps = c.page_size;
  std::uniform_real_distribution<float> scale_dist(0.002f, 0.05f);
  E4m3Cache kv;
  kv.k_scale.resize(Hkv);
  kv.v_scale.resize(Hkv);
  for (int h = 0; h < Hkv; ++h) {
    kv.k_scale[h] = scale_dist(rng);
    kv.v_scale[h] = scale_dist(rng);
  }
  const int shared_pages = ps > 0 && B >= 2 ? std::min(c.lens[0], c.lens[1]) / ps : 0;
  kv.k = random_e4m3(rng, c, c.dim_qk, kv.k_scale);
  kv.v = random_e4m3(rng, c, c.dim_v, kv.v_scale);
  for (E4m3Tensor* t : {&kv.k, &kv.v}) {
    const size_t dim = t == &kv.k ? c.dim_qk : c.dim_v;
    for (int h = 0; h < Hkv; ++h) {
      const size_t src = static_cast<size_t>(h) * cap * dim;
      const size_t dst = (static_cast<size_t>(Hkv) + h) * cap * dim;
      std::copy_n(&t->bytes[src], shared_pages * ps * dim, &t->bytes[dst]);
      std::copy_n(&t->dequantized[src], shared_pages * ps * dim, &t->dequantized[dst]);
    }
  }
  kv.k_store = kv.k.bytes;
  kv.v_store = kv.v.bytes;
  kv.k_shape = {B, Hkv, cap, c.dim_qk};
  kv.v_shape = {B, Hkv, cap, c.dim_v};
  if (ps > 0) {
    const int max_pages = cap / ps;
    const int num_pages = B * max_pages - shared_pages + 2;
    std::vector<int> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    kv.table.assign(static_cast<size_t>(B) * max_pages, -1);
    int next = 0;
    for (int b = 0; b < B; ++b)
      for (int p = 0; p < max_pages; ++p) {
        int& e = kv.table[static_cast<size_t>(b) * max_pages + p];
        e = b == 1 && p < shared_pages ? kv.table[p] : perm[next++];
        if (p * ps >= c.lens[b] && rng() % 2 == 0) e = -5;  // never read
      }
    kv.k_store = to_pool(kv.k.bytes, c, c.dim_qk, kv.table, num_pages);
    kv.v_store = to_pool(kv.v.bytes, c, c.dim_v, kv.table, num_pages);
    kv.k_shape = {num_pages, ps, Hkv, c.dim_qk};
    kv.v_shape = {num_pages, ps, Hkv, c.dim_v};
  }
  return kv;
}

}  // namespace flexjit::test
