// The CPU backend on a KV cache (AttentionOptions::kv_cache on host tensors, cpu/KvCacheGather):
// ragged and paged caches against the naive fp64 reference run one sequence at a time on that
// sequence's own keys, with mods that read b; empty sequences, shuffled and shared pages, entries
// never read, lengths past the capacity; and the errors a user gets.
#include <catch2/catch.hpp>

#include <flexjit/cpu.h>
#include <flexjit/error.h>
#include <flexjit/mods.h>
#include <flexjit/paged_kv.h>

#include "ir/Evaluate.h"
#include "support/ReferenceAttention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

using namespace flexjit;

namespace {

// Keys at the end of each sequence: query row i sits at position q_pos[b] + i. The score_mod
// reads b too (a per-sequence bias), so a reference that ran every sequence as b = 0 would differ.
const char* kMods =
    "buffer q_pos: i32[B]\n"
    "buffer seq_bias: f32[B]\n"
    "score_mod = score + seq_bias[b] * (kv_idx - q_idx) / 16.0\n"
    "mask_mod = q_idx + q_pos[b] >= kv_idx\n";

struct Cache {
  int B = 3, Hq = 4, Hkv = 2, Sq = 3, D = 16, Dv = 8;
  int page_size = 0;  // 0: contiguous ragged K / V of `capacity` keys
  int capacity = 40;
  std::vector<int> lens;
};

struct Run {
  std::vector<float> out, lse;
  std::vector<double> ref_out, ref_lse;
};

Run run(const Cache& c, uint32_t seed, bool reference_f64) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto randoms = [&](size_t n) {
    std::vector<float> x(n);
    for (float& e : x)
      e = dist(rng);
    return x;
  };
  const int B = c.B, Hkv = c.Hkv, cap = c.capacity;
  std::vector<float> q = randoms(static_cast<size_t>(B) * c.Hq * c.Sq * c.D);
  // Logical keys [B, Hkv, cap, D] of each sequence; what the cache holds is laid out below.
  std::vector<float> lk = randoms(static_cast<size_t>(B) * Hkv * cap * c.D);
  std::vector<float> lv = randoms(static_cast<size_t>(B) * Hkv * cap * c.Dv);
  std::vector<int> clamped(c.lens.size());
  for (size_t b = 0; b < c.lens.size(); ++b)
    clamped[b] = std::clamp(c.lens[b], 0, cap);

  std::vector<float> k_store, v_store;
  std::vector<int> table;
  TensorRef k, v;
  KvCache cache;
  cache.seq_lens = TensorRef::contiguous(const_cast<int*>(c.lens.data()), DType::I32, {B});
  if (c.page_size == 0) {
    // Contiguous K / V; keys past a sequence's length are NaN (never read).
    k_store = lk, v_store = lv;
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < Hkv; ++h)
        for (int n = clamped[b]; n < cap; ++n) {
          std::fill_n(&k_store[((static_cast<size_t>(b) * Hkv + h) * cap + n) * c.D], c.D, nan);
          std::fill_n(&v_store[((static_cast<size_t>(b) * Hkv + h) * cap + n) * c.Dv], c.Dv, nan);
        }
    k = TensorRef::contiguous(k_store.data(), DType::F32, {B, Hkv, cap, c.D});
    v = TensorRef::contiguous(v_store.data(), DType::F32, {B, Hkv, cap, c.Dv});
  } else {
    // Pools [num_pages, ps, Hkv, D] with shuffled pages and two spare NaN pages; sequence 1
    // shares sequence 0's first page (a common prefix: its logical keys are copied over);
    // entries no sequence reads hold -5.
    const int ps = c.page_size, max_pages = cap / ps;
    const int num_pages = B * max_pages + 2;
    std::vector<int> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    table.assign(static_cast<size_t>(B) * max_pages, -5);
    int next = 0;
    const bool share = B >= 2 && clamped[0] >= ps && clamped[1] >= ps;
    for (int b = 0; b < B; ++b)
      for (int p = 0; p * ps < clamped[b]; ++p)
        table[static_cast<size_t>(b) * max_pages + p] =
            share && b == 1 && p == 0 ? table[0] : perm[next++];
    if (share) {
      for (int h = 0; h < Hkv; ++h)
        for (int n = 0; n < ps; ++n) {
          std::copy_n(&lk[(static_cast<size_t>(h) * cap + n) * c.D], c.D,
                      &lk[((static_cast<size_t>(1) * Hkv + h) * cap + n) * c.D]);
          std::copy_n(&lv[(static_cast<size_t>(h) * cap + n) * c.Dv], c.Dv,
                      &lv[((static_cast<size_t>(1) * Hkv + h) * cap + n) * c.Dv]);
        }
    }
    k_store.assign(static_cast<size_t>(num_pages) * ps * Hkv * c.D, nan);
    v_store.assign(static_cast<size_t>(num_pages) * ps * Hkv * c.Dv, nan);
    for (int b = 0; b < B; ++b)
      for (int n = 0; n < clamped[b]; ++n) {
        const int page = table[static_cast<size_t>(b) * max_pages + n / ps];
        for (int h = 0; h < Hkv; ++h) {
          const size_t slot = (static_cast<size_t>(page) * ps + n % ps) * Hkv + h;
          std::copy_n(&lk[((static_cast<size_t>(b) * Hkv + h) * cap + n) * c.D], c.D,
                      &k_store[slot * c.D]);
          std::copy_n(&lv[((static_cast<size_t>(b) * Hkv + h) * cap + n) * c.Dv], c.Dv,
                      &v_store[slot * c.Dv]);
        }
      }
    k = TensorRef::contiguous(k_store.data(), DType::F32, {num_pages, ps, Hkv, c.D});
    v = TensorRef::contiguous(v_store.data(), DType::F32, {num_pages, ps, Hkv, c.Dv});
    cache.page_table = TensorRef::contiguous(table.data(), DType::I32, {B, max_pages});
  }

  std::vector<int> q_pos(static_cast<size_t>(B));
  std::vector<float> bias(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    q_pos[b] = std::max(0, clamped[b] - c.Sq);
    bias[b] = 0.5f + 0.25f * static_cast<float>(b);
  }
  AttentionOptions opts;
  opts.mods = parse_mods(kMods);
  opts.bindings.buffers = {{"q_pos", TensorRef::contiguous(q_pos.data(), DType::I32, {B})},
                           {"seq_bias", TensorRef::contiguous(bias.data(), DType::F32, {B})}};
  opts.kv_cache = &cache;
  CpuRunOptions cro;
  cro.reference_f64 = reference_f64;
  const CpuAttentionResult got = flex_attention_cpu(
      TensorRef::contiguous(q.data(), DType::F32, {B, c.Hq, c.Sq, c.D}), k, v, opts, cro);
  REQUIRE(got.shape == std::vector<int64_t>{B, c.Hq, c.Sq, c.Dv});

  // The reference: each sequence alone, on its own first len[b] logical keys, with its own
  // q_pos and bias bound as a batch of one (so b = 0 there reads sequence b's values).
  Run r;
  r.out = got.out, r.lse = got.lse;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  for (int b = 0; b < B; ++b) {
    const int len = clamped[b];
    const size_t rows = static_cast<size_t>(c.Hq) * c.Sq;
    if (len == 0) {
      r.ref_out.insert(r.ref_out.end(), rows * c.Dv, 0.0);
      r.ref_lse.insert(r.ref_lse.end(), rows, -std::numeric_limits<double>::infinity());
      continue;
    }
    std::vector<float> sq(q.begin() + static_cast<ptrdiff_t>(b * rows * c.D),
                          q.begin() + static_cast<ptrdiff_t>((b + 1) * rows * c.D));
    std::vector<float> sk, sv;
    for (int h = 0; h < Hkv; ++h) {
      const size_t base = static_cast<size_t>(b) * Hkv + h;
      sk.insert(sk.end(), lk.begin() + static_cast<ptrdiff_t>(base * cap * c.D),
                lk.begin() + static_cast<ptrdiff_t>((base * cap + len) * c.D));
      sv.insert(sv.end(), lv.begin() + static_cast<ptrdiff_t>(base * cap * c.Dv),
                lv.begin() + static_cast<ptrdiff_t>((base * cap + len) * c.Dv));
    }
    ir::EvalEnv env;
    env.buffers["q_pos"] = ir::BufferView{&q_pos[b], DType::I32, {1}, {}};
    env.buffers["seq_bias"] = ir::BufferView{&bias[b], DType::F32, {1}, {}};
    test::AttentionShape s{1, c.Hq, c.Hkv, c.Sq, len, c.D, c.Dv};
    const test::ReferenceResult ref =
        test::reference_attention(opts.mods, s, sq, sk, sv, scale, env);
    r.ref_out.insert(r.ref_out.end(), ref.out.begin(), ref.out.end());
    r.ref_lse.insert(r.ref_lse.end(), ref.lse.begin(), ref.lse.end());
  }
  return r;
}

void check(const Run& r, double tol) {
  REQUIRE(r.out.size() == r.ref_out.size());
  for (float x : r.out)
    REQUIRE_FALSE(std::isnan(x));
  CHECK(test::relative_error(r.out, r.ref_out) <= tol);
  REQUIRE(r.lse.size() == r.ref_lse.size());
  for (size_t i = 0; i < r.lse.size(); ++i) {
    INFO("lse row " << i);
    if (std::isinf(r.ref_lse[i])) {
      CHECK((std::isinf(r.lse[i]) && r.lse[i] < 0));
    } else {
      CHECK(std::abs(r.lse[i] - r.ref_lse[i]) <= tol * std::max(1.0, std::abs(r.ref_lse[i])));
    }
  }
}

}  // namespace

TEST_CASE("CPU KV cache: ragged and paged caches match each sequence run alone", "[cpu][decode]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  const bool f64 = GENERATE(false, true);
  const int page_size = GENERATE(0, 1, 4, 16);
  INFO("page size " << page_size << (f64 ? ", fp64 mode" : ", fp32"));
  Cache c;
  c.page_size = page_size;
  c.capacity = 48;
  c.lens = {37, 48, 0};  // ragged, full, empty
  check(run(c, seed, f64), f64 ? 1e-6 : 1e-4);
  // More query rows than keys (q_pos = 0 where Sq > len): later rows see every key.
  c.lens = {2, 17, 5};
  c.Sq = 4;
  check(run(c, seed + 1, f64), f64 ? 1e-6 : 1e-4);
}

TEST_CASE("CPU KV cache: lengths outside [0, capacity] are errors, with or without check_pages",
          "[cpu][decode][errors]") {
  Cache c;
  c.page_size = 8;
  c.capacity = 32;
  c.lens = {32, 9, 32};
  check(run(c, 7, true), 1e-6);

  std::vector<float> q(1 * 2 * 1 * 16, 0.5f), pool(4 * 8 * 1 * 16, 0.25f);
  std::vector<int> lens = {40}, table = {0, 1, 2, 3};
  KvCache cache;
  cache.seq_lens = TensorRef::contiguous(lens.data(), DType::I32, {1});
  cache.page_table = TensorRef::contiguous(table.data(), DType::I32, {1, 4});
  AttentionOptions opts;
  opts.kv_cache = &cache;
  const TensorRef tq = TensorRef::contiguous(q.data(), DType::F32, {1, 2, 1, 16});
  const TensorRef tp = TensorRef::contiguous(pool.data(), DType::F32, {4, 8, 1, 16});
  // On the host the lengths are checked always (they used to run clamped to [0, 32] without
  // check_pages: a silently different answer).
  for (bool check_pages : {false, true}) {
    INFO("check_pages " << check_pages);
    cache.check_pages = check_pages;
    lens = {40};
    CHECK_THROWS_WITH(
        flex_attention_cpu(tq, tp, tp, opts),
        Catch::Contains("seq_lens[0] = 40 is beyond the page table's capacity of 32"));
    lens = {-5};
    CHECK_THROWS_WITH(flex_attention_cpu(tq, tp, tp, opts), Catch::Contains("seq_lens[0] = -5"));
  }
  // A page a sequence reads that is not in the pool: always an error on the host.
  lens = {20};
  table = {0, 3, 9, -1};  // key 16..19 read page 9 of 4; page 3's slot -1 is never read
  cache.check_pages = false;
  CHECK_THROWS_WITH(flex_attention_cpu(tq, tp, tp, opts),
                    Catch::Contains("page_table[0][2] = 9 is not a page of the pool (0 .. 3)"));
  table = {0, 3, 1, -1};
  CHECK(flex_attention_cpu(tq, tp, tp, opts).out.size() == 2 * 16);
  // The lengths buffer's name is the backend's.
  opts.mods = parse_mods("buffer fj_kv_len: i32[B]\nmask_mod = kv_idx < fj_kv_len[b]");
  opts.bindings.buffers = {{"fj_kv_len", cache.seq_lens}};
  CHECK_THROWS_WITH(flex_attention_cpu(tq, tp, tp, opts),
                    Catch::Contains("the mods declare a buffer named 'fj_kv_len'"));
  // Lengths on another device than q.
  opts.mods = {};
  opts.bindings = {};
  cache.seq_lens.device = TensorRef::Device::CUDA;
  CHECK_THROWS_WITH(flex_attention_cpu(tq, tp, tp, opts),
                    Catch::Contains("seq_lens is on cuda:0 but q is on cpu"));
}
