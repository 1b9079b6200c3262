// Split-KV decoding on the GPU against the CPU backend's fp64 reference, on fresh random inputs
// every run (the seed is printed on failure): contiguous K / V through flex_attention's automatic
// dispatch, ragged lengths, paged pools with shuffled and shared pages, every standard mod, GQA
// ratios 1..8, 1..16 query tokens, KV lengths 1 .. 131072, fully masked rows, block masks, and
// check_pages. The reference runs per sequence on the gathered (contiguous) K / V of its length.
// Skips with "skipped: no GPU (...)" on machines without one.
#include <flexjit/attention.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>
#include <flexjit/paged_kv.h>

#include "gpu/GpuTestUtil.h"
#include "gpu/StandardBindings.h"
#include "runtime/ForwardPlan.h"
#include "support/CliPath.h"
#include "support/CpuReference.h"
#include "util/Npy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>

using namespace flexjit;
using namespace flexjit::test;
using flexjit::test::run_cli;

namespace {

struct DecodeCase {
  std::string label;
  DType dtype = DType::BF16;
  int batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1, dim_qk = 128, dim_v = 128;
  int capacity = 1;            // Skv (contiguous) or max_pages * page_size
  std::vector<int> lens;       // per sequence; empty: every sequence has `capacity` keys
  int page_size = 0;           // 0: contiguous K / V
  bool kv_cache = false;       // pass a KvCache (lengths / pages); else flex_attention's dispatch
  bool shared_prefix = false;  // sequences 0 and 1 share their first full pages
  bool head_major = false;     // pools stored [num_pages, Hkv, page_size, D], passed as a view
  Mods mods;
  std::map<std::string, HostBuffer> buffers;
  std::vector<std::pair<std::string, double>> params;
  const DeviceBlockMask* block_mask = nullptr;
  // Chunked prefill: the call must take the forward on the cache (no workspace), not decode.
  bool expect_forward = false;
  // The forward variant the call must run ("sm80_mma", "sm90a_wgmma"; AttentionOptions::variant,
  // which fails the call where that variant cannot serve it), or "" for automatic selection.
  std::string variant;
  // decode_split config overrides (AttentionOptions::config.params: "kv_copy", "num_stages",
  // "block_n", ...).
  std::map<std::string, int64_t> config;
  double tol = 0;  // 0: tolerance(dtype)
  // A text the plan that runs must hold (runtime::describe_forward_plan: "block_m=192"), or "".
  std::string expect_plan;
};

// Buffers and params of the standard mods, sized for indices up to the capacity.
// The standard mods' buffers and params (gpu/StandardBindings.h), sized for the KV capacity.
void bind_standard(DecodeCase& c, std::mt19937_64& rng) {
  AttentionShape s;
  s.heads_q = c.heads_q;
  s.seqlen_q = c.seqlen_q;
  s.seqlen_kv = c.capacity;
  bind_standard_mods(c.mods, s, rng, c.buffers, c.params);
}

struct Result {
  ErrorStats out_err;
  double lse_max_err = 0;
  int64_t lse_mismatched_inf = 0;
  size_t workspace_bytes = 0;
  std::string plan;  // with DecodeCase::expect_plan: the plan's description
  std::vector<float> out, lse;
  std::vector<double> ref_lse;
};

Result run_case(Context& ctx, DecodeCase& c, std::mt19937_64& rng) {
  const int B = c.batch, Hq = c.heads_q, Hkv = c.heads_kv, Sq = c.seqlen_q, cap = c.capacity;
  std::vector<int> lens = c.lens.empty() ? std::vector<int>(B, cap) : c.lens;
  REQUIRE(static_cast<int>(lens.size()) == B);
  const HostTensor q = random_tensor(rng, c.dtype, {B, Hq, Sq, c.dim_qk});
  // Logical K / V [B, Hkv, cap, D]; keys past a sequence's length are NaN (never read).
  HostTensor k = random_tensor(rng, c.dtype, {B, Hkv, cap, c.dim_qk});
  HostTensor v = random_tensor(rng, c.dtype, {B, Hkv, cap, c.dim_v});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int ps = c.page_size;
  const int shared_pages =
      c.shared_prefix && B >= 2 && ps > 0 ? std::min(lens[0], lens[1]) / ps : 0;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < Hkv; ++h) {
      for (int n = 0; n < cap; ++n) {
        for (HostTensor* t : {&k, &v}) {
          const int D = static_cast<int>(t->shape[3]);
          float* row = &t->values[((static_cast<size_t>(b) * Hkv + h) * cap + n) * D];
          if (n >= lens[b]) {
            std::fill(row, row + D, nan);
          } else if (b == 1 && n < shared_pages * ps) {  // a common prefix: sequence 0's keys
            const float* src = &t->values[((static_cast<size_t>(0) * Hkv + h) * cap + n) * D];
            std::copy(src, src + D, row);
          }
        }
      }
    }
  }

  std::vector<DeviceTensor> keep;
  TensorRef dk, dv;
  KvCache cache;
  if (ps > 0) {
    // Pools with shuffled pages (plus spare NaN pages); sequence 1 reuses sequence 0's first
    // `shared_pages` pages.
    const int max_pages = cap / ps;
    const int pages_needed = B * max_pages - shared_pages;
    const int num_pages = pages_needed + 3;
    std::vector<int> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int> table(static_cast<size_t>(B) * max_pages, -1);
    int next = 0;
    for (int b = 0; b < B; ++b) {
      for (int p = 0; p < max_pages; ++p) {
        const bool reads = p * ps < lens[b];
        int& e = table[static_cast<size_t>(b) * max_pages + p];
        if (b == 1 && p < shared_pages) {
          e = table[p];
        } else {
          e = perm[next++];
        }
        if (!reads && rng() % 2 == 0) e = -7;  // never read: may hold anything
      }
    }
    HostTensor kp, vp;
    for (auto [pool, src] : {std::pair{&kp, &k}, std::pair{&vp, &v}}) {
      const int D = static_cast<int>(src->shape[3]);
      pool->dtype = c.dtype;
      pool->shape = {num_pages, ps, Hkv, D};
      pool->values.assign(static_cast<size_t>(num_pages) * ps * Hkv * D, nan);
      for (int b = 0; b < B; ++b) {
        for (int p = 0; p < max_pages; ++p) {
          const int e = table[static_cast<size_t>(b) * max_pages + p];
          if (e < 0) continue;
          for (int slot = 0; slot < ps; ++slot)
            for (int h = 0; h < Hkv; ++h)
              for (int d = 0; d < D; ++d)
                pool->values[(c.head_major ? (static_cast<size_t>(e) * Hkv + h) * ps + slot
                                           : (static_cast<size_t>(e) * ps + slot) * Hkv + h) *
                                 D +
                             d] =
                    src->values[((static_cast<size_t>(b) * Hkv + h) * cap + p * ps + slot) * D + d];
        }
      }
    }
    keep.push_back(upload(ctx, kp));
    dk = keep.back().ref();
    keep.push_back(upload(ctx, vp));
    dv = keep.back().ref();
    if (c.head_major) {  // the [num_pages, page_size, Hkv, D] view of head-major storage
      for (TensorRef* t : {&dk, &dv}) {
        const int64_t D = t->shape[3];
        t->strides = {Hkv * ps * D, D, ps * D, 1};
      }
    }
    keep.push_back(DeviceTensor::from_host(ctx, DType::I32, {B, max_pages}, table.data()));
    cache.page_table = keep.back().ref();
  } else {
    keep.push_back(upload(ctx, k));
    dk = keep.back().ref();
    keep.push_back(upload(ctx, v));
    dv = keep.back().ref();
  }
  keep.push_back(DeviceTensor::from_host(ctx, DType::I32, {B}, lens.data()));
  cache.seq_lens = keep.back().ref();
  const DeviceTensor dq = upload(ctx, q);

  ModBindings bindings;
  ir::EvalEnv env;
  for (auto& [name, hb] : c.buffers) {
    keep.push_back(DeviceTensor::from_host(ctx, hb.dtype, hb.shape, hb.bytes.data()));
    bindings.buffers.emplace_back(name, keep.back().ref());
    env.buffers[name] = ir::BufferView{hb.bytes.data(), hb.dtype, hb.shape, {}};
  }
  bindings.params = c.params;
  for (auto& [n, val] : c.params)
    env.params[n] = val;

  DeviceTensor out = DeviceTensor::empty(ctx, c.dtype, {B, Hq, Sq, c.dim_v});
  DeviceTensor lse = DeviceTensor::empty(ctx, DType::F32, {B, Hq, Sq});
  out.fill_bytes(0xFF);  // NaN: an element the kernels do not write fails
  lse.fill_bytes(0xFF);
  AttentionOptions o;
  o.mods = c.mods;
  o.bindings = bindings;
  o.block_mask = c.block_mask;
  o.variant = c.variant;
  o.config.params = c.config;
  if (c.kv_cache || ps > 0) o.kv_cache = &cache;
  Result r;
  r.workspace_bytes = flex_attention_workspace_bytes(ctx, dq, dk, dv, o);
  if (!c.expect_plan.empty()) r.plan = runtime::describe_forward_plan(ctx, dq, dk, dv, o);
  flex_attention_into(ctx, dq, dk, dv, out, &lse.ref(), o);
  ctx.synchronize();
  r.out = download(out);
  r.lse = download(lse);

  // The reference: the whole batch on the logical (gathered) K / V of capacity `cap`, with the
  // lengths as a mask (kv_idx < len[b]), so mods that read b (q_pos[b]) see each sequence's b.
  // A sequence of length 0 has every row masked: out 0, lse -inf.
  Mods ref_mods = c.mods;
  if (!ref_mods.mask_mod.defined() && c.block_mask && c.block_mask->meta().mods.mask_mod.defined())
    ref_mods = combine(c.mods, c.block_mask->meta().mods);
  ref_mods = combine(ref_mods, parse_mods("buffer fj_ref_len: i32[B]\n"
                                          "mask_mod = kv_idx < fj_ref_len[b]",
                                          "reference_lengths.fx"));
  ir::EvalEnv ref_env = env;
  ref_env.buffers["fj_ref_len"] = ir::BufferView{lens.data(), DType::I32, {B}, {}};
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.dim_qk));
  AttentionShape s;
  s.batch = B, s.heads_q = Hq, s.heads_kv = Hkv, s.seqlen_q = Sq, s.seqlen_kv = cap;
  s.head_dim_qk = c.dim_qk, s.head_dim_v = c.dim_v;
  // Keys past a sequence's length are NaN in k / v (the kernels must never read them); the
  // reference masks them, and reads zeros there so that 0 * NaN cannot reach its sums.
  auto zeroed = [](std::vector<float> x) {
    for (float& e : x)
      if (std::isnan(e)) e = 0.0f;
    return x;
  };
  const ReferenceResult rr = cpu_reference_attention(ref_mods, s, q.values, zeroed(k.values),
                                                     zeroed(v.values), scale, ref_env);
  const std::vector<double>& ref_out = rr.out;
  r.ref_lse = rr.lse;
  r.out_err = compare(r.out, ref_out);
  const LseStats lse_err = compare_lse(r.lse, r.ref_lse);
  r.lse_max_err = lse_err.max_err;
  r.lse_mismatched_inf = lse_err.mismatched_inf;
  return r;
}

Result check_case(Context& ctx, DecodeCase& c, std::mt19937_64& rng, uint64_t seed) {
  const Result r = run_case(ctx, c, rng);
  const std::string lens = fmt::format("{}", fmt::join(c.lens, ","));
  const std::string summary = fmt::format(
      "{}{} {} B={} Hq={} Hkv={} Sq={} cap={} lens=[{}] page={}{} D={}/{} mods {}: out {}; lse "
      "max rel err {:.3e}, {} -inf mismatches (seed {})",
      c.variant.empty() ? "" : c.variant + ": ",
      c.config.empty() ? c.label : fmt::format("{} [{}]", c.label, fmt::join(c.config, " ")),
      to_string(c.dtype), c.batch, c.heads_q, c.heads_kv, c.seqlen_q, c.capacity, lens, c.page_size,
      c.head_major ? " head-major" : "", c.dim_qk, c.dim_v, c.mods.name, r.out_err.str(),
      r.lse_max_err, r.lse_mismatched_inf, seed);
  INFO(summary);
  CHECK(r.out_err.nonfinite == 0);
  CHECK(r.out_err.rel <= (c.tol > 0 ? c.tol : tolerance(c.dtype)));
  CHECK(r.lse_mismatched_inf == 0);
  CHECK(r.lse_max_err <= 1e-2);
  if (!c.expect_plan.empty()) CHECK_THAT(r.plan, Catch::Contains(c.expect_plan));
  // The plan that ran: the forward needs no workspace (but for a 192-row forward's union schedule
  // of a block mask: the plan says which), split + combine do.
  if (c.expect_forward && !c.expect_plan.empty()) {
    CHECK_THAT(r.plan, Catch::Contains("forward/"));
  } else if (c.expect_forward) {
    CHECK(r.workspace_bytes == 0);
  } else {
    CHECK(r.workspace_bytes > 0);
  }
  std::printf("  %s\n", summary.c_str());
  return r;
}

template <typename T>
const T& pick(std::mt19937_64& rng, const std::vector<T>& v) {
  return v[rng() % v.size()];
}

// A chunk of queries at the end of each sequence: causal with each sequence's offset captured
// as a buffer (q_pos[b] = length - Sq).
Mods offset_causal_mods() {
  return parse_mods("buffer q_pos: i32[B]\nmask_mod = q_idx + q_pos[b] >= kv_idx",
                    "offset_causal.fx");
}

// The forward variants a chunked prefill test runs by name: sm80_mma and, on an sm_90a device,
// sm90a_wgmma (both read KV caches); "" (automatic selection) where no sm90 variant runs.
std::vector<std::string> prefill_variants(Context& ctx) {
  const std::vector<std::string> families = forward_families(ctx);
  if (std::find(families.begin(), families.end(), "sm90a_wgmma") == families.end()) return {""};
  return {"sm80_mma", "sm90a_wgmma"};
}

// Row `row` (of [B, Hq, Sq]) saw no key: out exactly 0 over its `dim_v` values, lse -inf.
void check_masked_row(const Result& r, size_t row, int dim_v) {
  CHECK((std::isinf(r.lse[row]) && r.lse[row] < 0));
  for (int d = 0; d < dim_v; ++d)
    CHECK(r.out[row * dim_v + d] == 0.0f);
}

// Every row of every sequence without keys (c.lens[b] = 0): out 0, lse -inf.
void check_empty_sequences(const Result& r, const DecodeCase& c) {
  for (int b = 0; b < c.batch; ++b) {
    if (c.lens[b] != 0) continue;
    for (int h = 0; h < c.heads_q; ++h) {
      for (int qi = 0; qi < c.seqlen_q; ++qi) {
        INFO(c.label << " b=" << b << " h=" << h << " q=" << qi);
        check_masked_row(r, (static_cast<size_t>(b) * c.heads_q + h) * c.seqlen_q + qi, c.dim_v);
      }
    }
  }
}

// A chunked prefill's mods by name: "offset_causal" is the chunk at the end of each sequence
// (q_pos[b] = c.lens[b] - Sq), any other a standard mods name.
void set_prefill_mods(DecodeCase& c, const std::string& mods) {
  if (mods != "offset_causal") {
    c.mods = standard_mods(mods);
    return;
  }
  c.mods = offset_causal_mods();
  std::vector<int32_t> pos;
  for (int len : c.lens)
    pos.push_back(len - c.seqlen_q);
  c.buffers["q_pos"] = host_buffer(DType::I32, {c.batch}, pos);
}

// forward/sm90a_wgmma by name on a KV cache of `page`-key pages (0: ragged contiguous K / V),
// shared pages, the forward's plan expected; bf16 or f16 and 1 or 2 kv heads at random.
DecodeCase sm90_prefill_case(std::mt19937_64& rng, int page, int gqa, int sq, int cap,
                             const std::vector<int>& lens, int dqk, int dv) {
  DecodeCase c;
  c.variant = "sm90a_wgmma";
  c.dtype = rng() % 2 ? DType::BF16 : DType::F16;
  c.batch = static_cast<int>(lens.size());
  c.heads_kv = 1 + static_cast<int>(rng() % 2);
  c.heads_q = c.heads_kv * gqa;
  c.seqlen_q = sq;
  c.capacity = cap;
  c.lens = lens;
  c.page_size = page;
  c.kv_cache = true;
  c.shared_prefix = page > 0;
  c.expect_forward = true;
  c.dim_qk = dqk;
  c.dim_v = dv;
  return c;
}

std::string cache_label(int page) {
  return page > 0 ? fmt::format("{}-key pages", page) : "ragged contiguous";
}

}  // namespace

TEST_CASE("decode: every standard mod, contiguous K/V, flex_attention's automatic dispatch",
          "[gpu][decode]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::pair<int, int>> dims = {{64, 64}, {128, 128}, {256, 256}, {128, 64}};
  for (const std::string& name : standard_mod_names()) {
    DecodeCase c;
    c.label = "contiguous " + name;
    c.dtype = rng() % 2 ? DType::BF16 : DType::F16;
    c.mods = standard_mods(name);
    c.batch = 2;
    c.heads_kv = 2;
    c.heads_q = 2 * (1 + static_cast<int>(rng() % 8));
    c.seqlen_q = 1 + static_cast<int>(rng() % 16);
    c.capacity = pick(rng, std::vector<int>{1, 17, 1000});
    std::tie(c.dim_qk, c.dim_v) = pick(rng, dims);
    bind_standard(c, rng);
    check_case(*ctx, c, rng, seed);
  }
}

TEST_CASE("decode: paged KV cache, ragged lengths, shuffled and shared pages, GQA 1..8",
          "[gpu][decode]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  struct Shape {
    int page, gqa, sq, cap;
    std::vector<int> lens;
    const char* mods;
    bool head_major = false;
  };
  const std::vector<Shape> shapes = {
      {16, 1, 1, 1024, {1000, 17, 1, 0}, "noop"},
      {16, 3, 4, 1024, {1000, 1000, 512, 33}, "alibi", /*head_major=*/true},
      {1, 5, 1, 64, {17, 64, 1}, "softcap"},
      {256, 6, 2, 8448, {8193, 8193, 300}, "causal"},
      {1, 7, 16, 48, {48, 17}, "relative_bias"},
      {256, 8, 16, 1024, {1, 1000}, "sliding_window"},
      {16, 2, 8, 256, {200, 256, 129, 16}, "t5_bucketed_bias"},
      {64, 4, 3, 512, {511, 400}, "document_causal", /*head_major=*/true},
  };
  for (const Shape& sh : shapes) {
    DecodeCase c;
    c.label = fmt::format("paged ({}-key pages{}, gqa {})", sh.page,
                          sh.head_major ? ", head-major" : "", sh.gqa);
    c.head_major = sh.head_major;
    c.dtype = rng() % 2 ? DType::BF16 : DType::F16;
    c.mods = standard_mods(sh.mods);
    c.batch = static_cast<int>(sh.lens.size());
    c.heads_kv = 1 + static_cast<int>(rng() % 2);
    c.heads_q = c.heads_kv * sh.gqa;
    c.seqlen_q = sh.sq;
    c.capacity = sh.cap;
    c.lens = sh.lens;
    c.page_size = sh.page;
    c.shared_prefix = true;
    c.dim_qk = c.dim_v = pick(rng, std::vector<int>{64, 128});
    bind_standard(c, rng);
    check_case(*ctx, c, rng, seed);
  }
}

TEST_CASE("decode: bulk K/V copies (kv_copy 1, 2) on contiguous, ragged and paged caches",
          "[gpu][decode][kv_copy]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (ctx->arch() != "sm_90a" && ctx->arch() != "sm_90") {
    SUCCEED("skipped: kv_copy needs sm_90 (this device: " + ctx->arch() + ")");
    return;
  }
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  struct Shape {
    int page, gqa, sq, cap;
    std::vector<int> lens;  // empty: contiguous K / V through the dispatch, every key
    const char* mods;
    int dqk, dv;
    std::map<std::string, int64_t> config;  // besides kv_copy
  };
  const std::vector<Shape> shapes = {
      // The anchors' shape (GQA 4, one token) and its config space's corners.
      {0, 4, 1, 8192, {}, "noop", 128, 128, {}},
      {0, 4, 4, 4096, {}, "alibi", 128, 128, {{"num_stages", 1}}},
      {0,
       4,
       1,
       2048,
       {},
       "softcap",
       128,
       128,
       {{"block_n", 32}, {"num_warps", 2}, {"num_stages", 4}}},
      {0,
       4,
       1,
       4096,
       {},
       "noop",
       128,
       128,
       {{"block_n", 128}, {"num_warps", 4}, {"num_stages", 2}, {"num_splits", 7}}},
      // Ragged contiguous: lengths 0, 1 and ends inside a tile; head dims below their tiles.
      {0, 3, 2, 1000, {1000, 0, 1, 999, 65}, "causal", 40, 72, {}},
      // Paged: every page size class, shuffled and shared pages, 1 and 4 tokens, GQA 1..8.
      {1, 5, 1, 64, {17, 64, 1}, "softcap", 128, 128, {}},
      {16, 1, 4, 1024, {1000, 17, 0, 1024}, "noop", 64, 64, {}},
      {16, 4, 1, 2048, {2048, 2047, 16}, "relative_bias", 128, 128, {{"num_stages", 4}}},
      {64, 8, 16, 512, {511, 400}, "document_causal", 128, 64, {}},
      {256, 6, 2, 8448, {8193, 8193, 300}, "sliding_window", 256, 256, {}},
      {32,
       2,
       8,
       256,
       {200, 256, 129, 0},
       "t5_bucketed_bias",
       96,
       96,
       {{"block_n", 32}, {"num_warps", 2}}},
  };
  for (int kv_copy : {1, 2}) {
    for (const Shape& sh : shapes) {
      DecodeCase c;
      c.label = sh.page > 0       ? fmt::format("paged ({}-key pages, gqa {})", sh.page, sh.gqa)
                : sh.lens.empty() ? fmt::format("contiguous (gqa {})", sh.gqa)
                                  : fmt::format("ragged (gqa {})", sh.gqa);
      c.dtype = rng() % 2 ? DType::BF16 : DType::F16;
      c.mods = standard_mods(sh.mods);
      c.batch = sh.lens.empty() ? 2 : static_cast<int>(sh.lens.size());
      c.heads_kv = 1 + static_cast<int>(rng() % 2);
      c.heads_q = c.heads_kv * sh.gqa;
      c.seqlen_q = sh.sq;
      c.capacity = sh.cap;
      c.lens = sh.lens;
      c.kv_cache = !sh.lens.empty();
      c.page_size = sh.page;
      c.shared_prefix = sh.page > 0;
      c.dim_qk = sh.dqk;
      c.dim_v = sh.dv;
      c.config = sh.config;
      c.config["kv_copy"] = kv_copy;
      bind_standard(c, rng);
      check_case(*ctx, c, rng, seed);
    }
  }
}

TEST_CASE("decode: bulk K/V copies at small shapes (compute-sanitizer)",
          "[gpu][decode][kv_copy][small]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (ctx->arch() != "sm_90a" && ctx->arch() != "sm_90") {
    SUCCEED("skipped: kv_copy needs sm_90 (this device: " + ctx->arch() + ")");
    return;
  }
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  // Partial tiles, a length 0, 1- and 16-key pages, 1 and 2 stages (a stage's barrier reused).
  for (int kv_copy : {1, 2}) {
    for (int page : {0, 1, 16}) {
      DecodeCase c;
      c.label = fmt::format("small (pages {})", page);
      c.mods = standard_mods("alibi");
      c.batch = 3;
      c.heads_kv = 2;
      c.heads_q = 6;
      c.seqlen_q = 2;
      c.capacity = 272;
      c.lens = {272, 0, 97};
      c.kv_cache = true;
      c.page_size = page;
      c.shared_prefix = page > 0;
      c.dim_qk = c.dim_v = 64;
      c.config = {{"kv_copy", kv_copy}, {"num_stages", page == 16 ? 1 : 2}, {"num_splits", 3}};
      bind_standard(c, rng);
      check_case(*ctx, c, rng, seed);
    }
  }
}

TEST_CASE("decode: ragged contiguous K/V and a 131072-key sequence", "[gpu][decode]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  DecodeCase ragged;
  ragged.label = "ragged contiguous";
  ragged.mods = standard_mods("alibi_causal");
  ragged.batch = 3, ragged.heads_kv = 2, ragged.heads_q = 8, ragged.seqlen_q = 2;
  ragged.capacity = 1000;
  ragged.lens = {1000, 17, 0};
  ragged.kv_cache = true;
  bind_standard(ragged, rng);
  check_case(*ctx, ragged, rng, seed);

  DecodeCase big;
  big.label = "long paged";
  big.mods = standard_mods("softcap");
  big.batch = 1, big.heads_kv = 1, big.heads_q = 4, big.seqlen_q = 1;
  big.capacity = 131072;
  big.lens = {131072};
  big.page_size = 256;
  bind_standard(big, rng);
  check_case(*ctx, big, rng, seed);
}

TEST_CASE("decode: fully masked rows give out 0 and lse -inf, never NaN", "[gpu][decode]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  DecodeCase c;
  c.label = "masked rows";
  // Query 0 sees nothing; head 1 sees nothing; the others see keys up to their index * 100.
  c.mods = parse_mods("mask_mod = q_idx > 0 && h != 1 && kv_idx <= q_idx * 100", "masked.fx");
  c.batch = 2, c.heads_kv = 1, c.heads_q = 4, c.seqlen_q = 3;
  c.capacity = 1024;
  c.lens = {1024, 150};
  c.page_size = 16;
  const Result r = check_case(*ctx, c, rng, seed);
  for (int b = 0; b < 2; ++b) {
    for (int h = 0; h < 4; ++h) {
      for (int qi = 0; qi < 3; ++qi) {
        const size_t row = (static_cast<size_t>(b) * 4 + h) * 3 + qi;
        if (qi != 0 && h != 1) continue;
        INFO("b=" << b << " h=" << h << " q=" << qi);
        check_masked_row(r, row, 128);
      }
    }
  }
}

TEST_CASE("decode: block masks skip tiles and apply the mask_mod on partial ones",
          "[gpu][decode]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Mods mask =
      parse_mods("mask_mod = kv_idx < 300 || (kv_idx >= 700 && kv_idx % 5 != q_idx)", "blocks.fx");
  for (int paged = 0; paged < 2; ++paged) {
    DecodeCase c;
    c.label = paged ? "block mask, paged" : "block mask, contiguous";
    c.batch = 2, c.heads_kv = 2, c.heads_q = 8, c.seqlen_q = 4;
    c.capacity = 1024;
    c.lens = {1024, 800};
    c.page_size = paged ? 16 : 0;
    c.kv_cache = true;
    const DeviceBlockMask bm = create_block_mask(*ctx, mask, 1, 1, c.seqlen_q, c.capacity, 128);
    c.block_mask = &bm;
    check_case(*ctx, c, rng, seed);
  }
}

TEST_CASE("decode: check_pages reports the first bad entry; bad inputs fail before launch",
          "[gpu][decode]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const int B = 2, max_pages = 4, ps = 16, Hkv = 1, D = 64;
  std::mt19937_64 rng(fresh_seed());
  const HostTensor q = random_tensor(rng, DType::BF16, {B, 2, 1, D});
  const HostTensor pool = random_tensor(rng, DType::BF16, {8, ps, Hkv, D});
  const DeviceTensor dq = upload(*ctx, q), dpool = upload(*ctx, pool);
  std::vector<int> table = {0, 1, 2, 3, 4, 5, 9, 7};  // [1][2] = 9: not a page of 8
  std::vector<int> lens = {64, 40};
  const DeviceTensor dt = DeviceTensor::from_host(*ctx, DType::I32, {B, max_pages}, table.data());
  const DeviceTensor dl = DeviceTensor::from_host(*ctx, DType::I32, {B}, lens.data());
  KvCache cache;
  cache.page_table = dt;
  cache.seq_lens = dl;
  cache.check_pages = true;
  AttentionOptions o;
  o.kv_cache = &cache;
  CHECK_THROWS_WITH(flex_attention(*ctx, dq, dpool, dpool, o),
                    Catch::Contains("page_table[1][2] = 9 is not a page of the pool (0 .. 7)"));
  lens[1] = 65;
  const DeviceTensor dl2 = DeviceTensor::from_host(*ctx, DType::I32, {B}, lens.data());
  cache.seq_lens = dl2;
  CHECK_THROWS_WITH(flex_attention(*ctx, dq, dpool, dpool, o),
                    Catch::Contains("seq_lens[1] = 65 is beyond the page table's capacity of 64"));
  // Ragged contiguous K / V: lengths only.
  const HostTensor kc = random_tensor(rng, DType::BF16, {B, Hkv, 48, D});
  const DeviceTensor dkc = upload(*ctx, kc);
  const std::vector<int> ragged = {48, 49};
  const DeviceTensor dr = DeviceTensor::from_host(*ctx, DType::I32, {B}, ragged.data());
  KvCache lens_only;
  lens_only.seq_lens = dr;
  lens_only.check_pages = true;
  AttentionOptions ro;
  ro.kv_cache = &lens_only;
  CHECK_THROWS_WITH(flex_attention(*ctx, dq, dkc, dkc, ro),
                    Catch::Contains("seq_lens[1] = 49 is beyond the 48 keys of k and v"));
  // Unsupported head dim (not a multiple of 8): an UnsupportedError before any launch.
  const HostTensor q100 = random_tensor(rng, DType::BF16, {B, 2, 1, 100});
  const HostTensor pool100 = random_tensor(rng, DType::BF16, {8, ps, Hkv, 100});
  const DeviceTensor dq100 = upload(*ctx, q100), dp100 = upload(*ctx, pool100);
  cache.check_pages = false;
  CHECK_THROWS_AS(flex_attention(*ctx, dq100, dp100, dp100, o), UnsupportedError);
  // f32 pools: the decode kernels take bf16 / f16, so even one query token runs on the forward
  // (tf32) on the cache (its numerics: "chunked prefill ... f32" below).
  const HostTensor q32 = random_tensor(rng, DType::F32, {B, 2, 1, D});
  const HostTensor p32 = random_tensor(rng, DType::F32, {8, ps, Hkv, D});
  const DeviceTensor dq32 = upload(*ctx, q32), dp32 = upload(*ctx, p32);
  table[6] = 2;
  const DeviceTensor dt2 = DeviceTensor::from_host(*ctx, DType::I32, {B, max_pages}, table.data());
  lens[1] = 40;
  const DeviceTensor dl3 = DeviceTensor::from_host(*ctx, DType::I32, {B}, lens.data());
  cache.page_table = dt2;
  cache.seq_lens = dl3;
  CHECK(flex_attention_workspace_bytes(*ctx, dq32, dp32, dp32, o) == 0);
  CHECK_NOTHROW(flex_attention(*ctx, dq32, dp32, dp32, o));
}

// Chunked prefill: more than 16 query tokens on a KV cache take the forward (by name: sm80_mma,
// and sm90a_wgmma on an sm_90a device) with K / V read through the page table (or bounded by the
// ragged lengths), against the same fp64 reference on gathered keys. The chunk is the last Sq
// tokens of each sequence: causal with the offset captured as a buffer (q_idx + q_pos[b] >= kv_idx,
// q_pos[b] = len - Sq), so a sequence shorter than the chunk has fully masked rows (out 0, lse
// -inf), and an empty one only such rows.
TEST_CASE("decode: chunked prefill through the forward on a paged cache, shuffled and shared pages",
          "[gpu][decode][prefill]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  struct Shape {
    int page, gqa, sq, cap;
    std::vector<int> lens;
    const char* mods;  // "offset_causal": the chunk at the end of each sequence
  };
  const std::vector<Shape> shapes = {
      {16, 4, 17, 1024, {1000, 17, 0, 513}, "offset_causal"},
      {1, 1, 128, 256, {256, 130, 1}, "offset_causal"},
      {64, 3, 300, 8448, {8193, 300, 4000}, "offset_causal"},
      {256, 1, 1000, 2048, {2048, 1000, 1500}, "offset_causal"},
      {16, 4, 128, 1024, {1024, 900, 64}, "alibi"},
      {64, 3, 17, 512, {511, 200}, "softcap"},
      {1, 4, 300, 512, {500, 301}, "document_causal"},
      {256, 1, 128, 4096, {4096, 0}, "sliding_window"},
  };
  for (const std::string& variant : prefill_variants(*ctx))
    for (const Shape& sh : shapes) {
      DecodeCase c;
      c.variant = variant;
      c.label = fmt::format("prefill ({}-key pages, gqa {}, {})", sh.page, sh.gqa, sh.mods);
      c.dtype = rng() % 2 ? DType::BF16 : DType::F16;
      c.batch = static_cast<int>(sh.lens.size());
      c.heads_kv = 1 + static_cast<int>(rng() % 2);
      c.heads_q = c.heads_kv * sh.gqa;
      c.seqlen_q = sh.sq;
      c.capacity = sh.cap;
      c.lens = sh.lens;
      c.page_size = sh.page;
      c.shared_prefix = true;
      c.expect_forward = true;
      c.dim_qk = c.dim_v = pick(rng, std::vector<int>{64, 128});
      set_prefill_mods(c, sh.mods);
      bind_standard(c, rng);
      check_case(*ctx, c, rng, seed);
    }
}

// Tiny shapes for compute-sanitizer (gpu_check.sh / gpu_check_paged.sh run "[gpu][small]"):
// every page-size regime of the loads (a page per row, pages smaller and larger than the tile)
// and ragged contiguous K / V, with lengths that end inside a tile and one of 0.
TEST_CASE("decode: chunked prefill at small shapes", "[gpu][decode][prefill][small]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (const std::string& variant : prefill_variants(*ctx))
    for (int page : {0, 1, 16, 128}) {
      DecodeCase c;
      c.variant = variant;
      c.label = fmt::format("small prefill (page {})", page);
      c.mods = offset_causal_mods();
      c.batch = 3, c.heads_kv = 1, c.heads_q = 3, c.seqlen_q = 40;
      c.capacity = 256;
      c.lens = {200, 37, 0};
      c.buffers["q_pos"] = host_buffer(DType::I32, {3}, std::vector<int32_t>{160, -3, -40});
      c.page_size = page;
      c.kv_cache = true;
      c.shared_prefix = true;
      c.expect_forward = true;
      c.dim_qk = c.dim_v = 64;
      const Result r = check_case(*ctx, c, rng, seed);
      // Rows before the cache's start (q_idx < 3 of sequence 1) and every row of the empty
      // sequence 2 see no key: out exactly 0, lse -inf.
      for (int b = 1; b < 3; ++b) {
        for (int h = 0; h < 3; ++h) {
          for (int qi = 0; qi < (b == 1 ? 3 : 40); ++qi) {
            const size_t row = (static_cast<size_t>(b) * 3 + h) * 40 + qi;
            INFO(variant << " page " << page << " b=" << b << " h=" << h << " q=" << qi);
            check_masked_row(r, row, 64);
          }
        }
      }
    }
}

TEST_CASE("decode: chunked prefill on ragged contiguous K/V, block masks, f32 (tf32) pools",
          "[gpu][decode][prefill]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Mods offset_causal = offset_causal_mods();
  for (const std::string& variant : prefill_variants(*ctx)) {
    DecodeCase ragged;
    ragged.variant = variant;
    ragged.label = "prefill, ragged contiguous";
    ragged.mods = offset_causal;
    ragged.batch = 3, ragged.heads_kv = 2, ragged.heads_q = 6, ragged.seqlen_q = 300;
    ragged.capacity = 1000;
    ragged.lens = {1000, 17, 0};
    ragged.buffers["q_pos"] = host_buffer(DType::I32, {3}, std::vector<int32_t>{700, -283, -300});
    ragged.kv_cache = true;
    ragged.expect_forward = true;
    check_case(*ctx, ragged, rng, seed);
  }

  const Mods mask =
      parse_mods("mask_mod = kv_idx < 300 || (kv_idx >= 700 && kv_idx % 5 != q_idx)", "blocks.fx");
  for (const std::string& variant : prefill_variants(*ctx))
    for (int paged = 0; paged < 2; ++paged) {
      DecodeCase c;
      c.variant = variant;
      c.label = paged ? "prefill, block mask, paged" : "prefill, block mask, ragged";
      c.batch = 2, c.heads_kv = 2, c.heads_q = 8, c.seqlen_q = 200;
      c.capacity = 1024;
      c.lens = {1024, 800};
      c.page_size = paged ? 16 : 0;
      c.kv_cache = true;
      c.expect_forward = true;
      const DeviceBlockMask bm = create_block_mask(*ctx, mask, 1, 1, c.seqlen_q, c.capacity, 128);
      c.block_mask = &bm;
      check_case(*ctx, c, rng, seed);
    }

  for (int sq : {1, 129}) {
    DecodeCase c;
    c.label = "prefill, f32 pools (tf32)";
    c.dtype = DType::F32;
    c.tol = 1e-3;
    c.mods = standard_mods("causal");
    c.batch = 2, c.heads_kv = 1, c.heads_q = 2, c.seqlen_q = sq;
    c.capacity = 512;
    c.lens = {512, 130};
    c.page_size = 16;
    c.shared_prefix = true;
    c.expect_forward = true;  // the decode kernels take bf16 / f16 only
    check_case(*ctx, c, rng, seed);
  }
}

// forward/sm90a_wgmma on a KV cache (docs/kernels/forward_sm90.md "KV caches"), by name: every
// power-of-two page size from 1 to 256 (cp.async gathers below the 128- or 64-key tile, TMA boxes
// from it up), ragged contiguous K / V, lengths of 0 and lengths that end inside a tile (the cut
// tile gathered; the NaN the cache holds past a length never read), shared and shuffled pages,
// head-major pools, GQA 4:1, head dims 64, 128, 256 (64-key tiles) and
// 192 / 128, Sq no tile divides, and mods that read buffers: the chunk's offset q_pos[b]
// (mask_mod q_idx + q_pos[b] >= kv_idx), ALiBi's slopes, document ids (the mask_mod's column
// load) and a relative-bias table (the score_mod's diagonal load).
TEST_CASE("decode: chunked prefill on forward/sm90a_wgmma, every page size",
          "[gpu][decode][prefill][sm90]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (prefill_variants(*ctx).size() < 2) {
    WARN("skipped: forward/sm90a_wgmma needs an sm_90a device");
    return;
  }
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  struct Shape {
    int page, gqa, sq, cap, dqk, dv;
    std::vector<int> lens;
    const char* mods;  // "offset_causal": the chunk at the end of each sequence
    bool head_major;
  };
  const std::vector<Shape> shapes = {
      {1, 4, 200, 512, 128, 128, {500, 0, 301}, "offset_causal", false},
      {2, 4, 130, 512, 128, 128, {512, 129, 7}, "offset_causal", false},
      {4, 1, 257, 768, 64, 64, {768, 300, 0}, "offset_causal", true},
      {8, 4, 128, 1024, 128, 128, {1000, 17, 513}, "offset_causal", false},
      {16, 4, 300, 1024, 128, 128, {1024, 900, 0, 301}, "offset_causal", false},
      {16, 4, 200, 1024, 128, 128, {1000, 130}, "offset_causal", true},
      {32, 2, 100, 1024, 64, 64, {1000, 511}, "alibi", false},
      {64, 4, 300, 2048, 128, 128, {2048, 1000, 65}, "offset_causal", false},
      {64, 1, 129, 1024, 256, 256, {1024, 200}, "offset_causal", true},
      {128, 4, 300, 2048, 128, 128, {2047, 300, 0}, "offset_causal", false},
      {128, 4, 250, 1024, 192, 128, {1024, 700}, "offset_causal", false},
      {256, 4, 500, 2048, 128, 128, {2048, 1300, 1}, "offset_causal", true},
      {256, 2, 200, 1024, 64, 64, {1024, 555}, "document_causal", false},
      {0, 4, 300, 1000, 128, 128, {1000, 17, 0, 640}, "offset_causal", false},
      {0, 4, 200, 1000, 64, 64, {999, 128}, "relative_bias_causal", false},
      {0, 1, 150, 700, 256, 256, {700, 65}, "softcap", false},
      {32, 4, 200, 512, 128, 128, {512, 200}, "relative_bias_causal", false},
  };
  for (const Shape& sh : shapes) {
    DecodeCase c = sm90_prefill_case(rng, sh.page, sh.gqa, sh.sq, sh.cap, sh.lens, sh.dqk, sh.dv);
    c.label = fmt::format("sm90 prefill ({}, gqa {}, {})", cache_label(sh.page), sh.gqa, sh.mods);
    c.head_major = sh.head_major;
    set_prefill_mods(c, sh.mods);
    bind_standard(c, rng);
    check_empty_sequences(check_case(*ctx, c, rng, seed), c);
  }
}

// forward/sm90a_wgmma's 192-row tiles on a KV cache (three consumer warpgroups, loaders in 32
// registers; the default at d 128 where no mask_mod loads a buffer at kv_idx), by config: every
// way a tile reaches shared memory (gathers of 1- and 4-key pages, a TMA box per page of 16 and
// 32 keys, one box per tile of 256-key pages and ragged contiguous K / V, the cut tile), lengths
// of 0 and inside a tile, GQA, the union schedule over a block mask (tiles past a sequence's
// length listed, a sequence without keys), the loop without a block mask and without a mask_mod,
// d 64's overlapped loop and d 128's serial one, against the fp64 reference.
TEST_CASE("decode: chunked prefill on forward/sm90a_wgmma in 192-row tiles",
          "[gpu][decode][prefill][sm90]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (prefill_variants(*ctx).size() < 2) {
    WARN("skipped: forward/sm90a_wgmma needs an sm_90a device");
    return;
  }
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Mods blocks =
      parse_mods("mask_mod = kv_idx < 300 || (kv_idx >= 700 && kv_idx % 5 != q_idx)", "blocks.fx");
  struct Shape {
    int page, gqa, sq, cap, d;
    std::vector<int> lens;
    const char* mods;       // "offset_causal": the chunk at the end of each sequence; "blocks": the
                            // block mask above (its mask_mod through the mask)
    bool defaults = false;  // no block_m asked for: the default's choice, from the plan
  };
  const std::vector<Shape> shapes = {
      {1, 4, 200, 512, 128, {500, 0, 301}, "offset_causal"},
      {4, 2, 385, 1024, 128, {1024, 390, 7}, "offset_causal"},
      {16, 4, 300, 1024, 128, {1024, 900, 0, 301}, "offset_causal"},
      {32, 1, 192, 1024, 128, {1000, 513}, "alibi"},
      {256, 4, 500, 2048, 128, {2048, 1300, 1}, "offset_causal"},
      {0, 4, 300, 1000, 128, {1000, 17, 0, 640}, "offset_causal"},
      {16, 2, 200, 1024, 128, {1024, 800, 0}, "blocks"},
      {0, 2, 200, 1024, 128, {1024, 513}, "blocks"},
      {16, 4, 250, 1024, 64, {1024, 700, 0}, "offset_causal"},
      {2, 1, 130, 512, 64, {512, 200}, "blocks"},
      {16, 2, 200, 768, 64, {768, 129}, "noop"},
      {0, 4, 300, 1000, 128, {999, 128}, "relative_bias_causal"},
      {64, 2, 256, 1024, 128, {1024, 555}, "document_causal"},
      // The defaults (no block_m asked for): 192 rows at d 128, 128 for a mask_mod that loads
      // document ids at kv_idx.
      {16, 4, 300, 1024, 128, {1024, 700, 0}, "offset_causal", true},
      {16, 2, 300, 1024, 128, {1024, 513}, "document_causal", true},
  };
  for (const Shape& sh : shapes) {
    DecodeCase c = sm90_prefill_case(rng, sh.page, sh.gqa, sh.sq, sh.cap, sh.lens, sh.d, sh.d);
    const std::string mods = sh.mods;
    if (!sh.defaults) c.config = {{"block_m", 192}};
    c.expect_plan = mods == "document_causal" && sh.defaults ? "block_m=128" : "block_m=192";
    c.label = fmt::format("sm90 prefill, 192 rows ({}, gqa {}, d {}, {}{})", cache_label(sh.page),
                          sh.gqa, sh.d, mods, sh.defaults ? ", defaults" : "");
    std::optional<DeviceBlockMask> bm;
    if (mods == "blocks") {
      // 192-row tiles read the mask as a union schedule, compiled with the call's mask_mod.
      bm.emplace(create_block_mask(*ctx, blocks, 1, 1, c.seqlen_q, c.capacity, 128));
      c.block_mask = &*bm;
      c.mods = blocks;
    } else {
      set_prefill_mods(c, mods);
    }
    bind_standard(c, rng);
    check_empty_sequences(check_case(*ctx, c, rng, seed), c);
  }
}

TEST_CASE("decode: flexjit run on a paged KV cache matches the fp64 reference (--check)",
          "[gpu][decode]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("flexjit-decode-run-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const char* name, DType dtype, std::vector<int64_t> shape,
                   const std::vector<char>& bytes) {
    npy::Array a = npy::make_array(dtype, std::move(shape));
    REQUIRE(a.bytes.size() == bytes.size());
    std::memcpy(a.bytes.data(), bytes.data(), bytes.size());
    npy::write((dir / name).string(), a);
    return (dir / name).string();
  };
  auto ints = [](const std::vector<int32_t>& v) {
    std::vector<char> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  // Two query tokens take the decode plan; 40 (a prefill chunk) the forward on the cache.
  const int sq = GENERATE(2, 40);
  INFO("Sq " << sq);
  const HostTensor q = random_tensor(rng, DType::BF16, {2, 6, sq, 64});
  const HostTensor pool = random_tensor(rng, DType::BF16, {12, 16, 2, 64});
  const std::vector<int32_t> table = {7, 2, 9, 0, 11, 3, 5, 1, 4, 6, 8, 10};  // [2, 6]
  const std::vector<int32_t> lens = {90, 33};
  std::vector<float> slopes(6);
  for (int h = 0; h < 6; ++h)
    slopes[h] = std::exp2(-8.0f * (h + 1) / 6);
  std::vector<char> slope_bytes(slopes.size() * 4);
  std::memcpy(slope_bytes.data(), slopes.data(), slope_bytes.size());
  const std::string args = fmt::format(
      "run --mods alibi --buffer slopes={} --q {} --k {} --v {} --page-table {} --seq-lens {} "
      "--check-pages --check --repeat 1 --json",
      write("slopes.npy", DType::F32, {6}, slope_bytes),
      write("q.npy", DType::BF16, {2, 6, sq, 64}, q.bytes()),
      write("k.npy", DType::BF16, {12, 16, 2, 64}, pool.bytes()),
      write("v.npy", DType::BF16, {12, 16, 2, 64}, pool.bytes()),
      write("table.npy", DType::I32, {2, 6}, ints(table)),
      write("lens.npy", DType::I32, {2}, ints(lens)));
  std::string out;
  const int rc = run_cli(args, &out);
  INFO("flexjit " << args << "\n" << out);
  REQUIRE(rc == 0);
  const auto brace = out.find('{');
  REQUIRE(brace != std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(out.substr(brace));
  CHECK(j.at("nan").get<int64_t>() == 0);
  CHECK(j.at("nonfinite_mismatches_vs_fp64").get<int64_t>() == 0);
  CHECK(j.at("max_rel_error_vs_fp64").get<double>() <= 2e-2);
  // The plan is logged under FLEXJIT_LOG=kernels: split then combine, or the forward.
  REQUIRE(run_cli(args, &out, "FLEXJIT_LOG=kernels") == 0);
  if (sq == 2) {
    CHECK_THAT(out, Catch::Contains("flex_attention: decode plan") &&
                        Catch::Contains("pages of 16") &&
                        Catch::Contains("selected decode_split/sm80_mma") &&
                        Catch::Contains("selected decode_combine/warp_batched"));
  } else {
    // The Hopper forward reads the cache on an sm_90a device; sm80_mma elsewhere.
    const bool sm90 = prefill_variants(*ctx).size() == 2;
    CHECK_THAT(out, Catch::Contains("flex_attention: forward plan on the KV cache") &&
                        Catch::Contains("pages of 16") && Catch::Contains("chunked prefill") &&
                        Catch::Contains(sm90 ? "selected forward/sm90a_wgmma"
                                             : "selected forward/sm80_mma"));
  }
  std::filesystem::remove_all(dir);
}
