// Head dims below the sm_80 kernels' tile dims (issue 28): forward/sm80_mma, the sm80 backward
// (preprocess, dK/dV with and without dQ by atomics, dQ, atomic_convert), split-KV decoding
// (decode_split/sm80_mma with both combine variants) and chunked prefill (forward/sm80_mma on a KV
// cache) on head dims that are multiples of 8 but not of 64 (tiles 64 / 128 / 256), qk = v and
// qk != v, against the fp64 CPU reference on fresh random inputs (the seed is printed on
// failure). The sm_90a variants are excluded, so these run the sm80 kernels on any device; each
// case checks the plan's variants. Lengths that no tile divides, GQA, noop / causal / alibi (a
// captured buffer). Small shapes, and the backward and chunked prefill on a subset of the head
// dims: the file's GPU time is mostly the kernels' compiles (about 50 of them).
#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/paged_kv.h>

#include "cpu/BackwardKernel.h"
#include "gpu/BackwardCheck.h"
#include "gpu/GpuTestUtil.h"
#include "gpu/StandardBindings.h"
#include "runtime/BackwardPlan.h"
#include "runtime/ForwardPlan.h"
#include "support/CpuReference.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <numeric>

using namespace flexjit;
using namespace flexjit::test;

namespace {

struct HeadDimCase {
  int dqk, dv;
};

// Every tile's inner dims (32, 48 in the 64 tile; 80 .. 112 in 128; 160, 192 in 256), the tiles'
// own 256, and the qk != v pairs of real models (DeepSeek-V3's 192 / 128, 96 / 64).
const std::vector<HeadDimCase> kCases = {{32, 32},   {48, 48},   {80, 80},   {96, 96},   {112, 112},
                                         {160, 160}, {192, 192}, {256, 256}, {192, 128}, {96, 64}};
const std::vector<std::string> kMods = {"noop", "causal", "alibi"};

// The sm_90a variants excluded (the sm80 kernels on every device) for the forward and the
// backward; decoding has only sm80 kernels.
struct Sm80Only {
  ForwardFamilyScope forward{"sm80_mma"};
  BackwardFamilyScope backward{"sm80_mma"};
};

std::string dims_str(int dqk, int dv) {
  return fmt::format("D={}/{}", dqk, dv);
}

// Device copies of the mods' buffers and params, and their host views for the reference.
struct Bindings {
  std::map<std::string, HostBuffer> buffers;
  std::vector<std::pair<std::string, double>> params;
  std::vector<DeviceTensor> keep;
  ModBindings dev, host;
  ir::EvalEnv env;

  void bind(Context& ctx, const Mods& mods, const AttentionShape& s, std::mt19937_64& rng) {
    bind_standard_mods(mods, s, rng, buffers, params);
    for (auto& [name, hb] : buffers) {
      keep.push_back(DeviceTensor::from_host(ctx, hb.dtype, hb.shape, hb.bytes.data()));
      dev.buffers.emplace_back(name, keep.back().ref());
      host.buffers.emplace_back(name, TensorRef::contiguous(hb.bytes.data(), hb.dtype, hb.shape));
      env.buffers[name] = ir::BufferView{hb.bytes.data(), hb.dtype, hb.shape, {}};
    }
    dev.params = host.params = params;
    for (auto& [n, x] : params)
      env.params[n] = x;
  }
};

// Max relative lse error over rows finite in both, and the rows where exactly one is -inf.
std::pair<double, int64_t> lse_errors(const std::vector<float>& got,
                                      const std::vector<double>& ref) {
  double err = 0;
  int64_t bad = 0;
  for (size_t j = 0; j < ref.size(); ++j) {
    if (!std::isfinite(got[j]) || !std::isfinite(ref[j])) {
      bad += std::isfinite(got[j]) != std::isfinite(ref[j]) || std::isnan(got[j]);
      continue;
    }
    err = std::max(err, std::abs(got[j] - ref[j]) / std::max(1.0, std::abs(ref[j])));
  }
  return {err, bad};
}

// One forward of `dtype` inputs on forward/sm80_mma against the reference.
void check_forward(Context& ctx, const HeadDimCase& c, int i, DType dtype, std::mt19937_64& rng,
                   uint64_t seed) {
  const std::string mods_name = kMods[static_cast<size_t>(i) % kMods.size()];
  AttentionShape s;
  // Alternately MHA with B = 2 and GQA 2:1 with B = 1; 200 queries, 200 or 233 keys: no tile
  // (32 .. 128 rows) divides them.
  s.batch = i % 2 == 0 ? 2 : 1;
  s.heads_q = 4;
  s.heads_kv = i % 2 == 0 ? 4 : 2;
  s.seqlen_q = 200;
  s.seqlen_kv = i % 3 == 0 ? 233 : 200;
  s.head_dim_qk = c.dqk;
  s.head_dim_v = c.dv;
  const std::string label = fmt::format("{} {} {} B={} Hq={} Hkv={} Sq={} Skv={} (seed {})",
                                        mods_name, to_string(dtype), dims_str(c.dqk, c.dv), s.batch,
                                        s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_kv, seed);
  INFO(label);
  const Mods mods = standard_mods(mods_name);
  Bindings bind;
  bind.bind(ctx, mods, s, rng);
  const HostTensor q = random_tensor(rng, dtype, {s.batch, s.heads_q, s.seqlen_q, c.dqk});
  const HostTensor k = random_tensor(rng, dtype, {s.batch, s.heads_kv, s.seqlen_kv, c.dqk});
  const HostTensor v = random_tensor(rng, dtype, {s.batch, s.heads_kv, s.seqlen_kv, c.dv});
  const DeviceTensor dq = upload(ctx, q), dk = upload(ctx, k), dv = upload(ctx, v);
  AttentionOptions o;
  o.mods = mods;
  o.bindings = bind.dev;
  const std::string plan = runtime::describe_forward_plan(ctx, dq.ref(), dk.ref(), dv.ref(), o);
  CHECK_THAT(step_line(plan, "forward"), Catch::Contains("forward/sm80_mma"));
  DeviceTensor out = DeviceTensor::empty(ctx, dtype, {s.batch, s.heads_q, s.seqlen_q, c.dv});
  DeviceTensor lse = DeviceTensor::empty(ctx, DType::F32, {s.batch, s.heads_q, s.seqlen_q});
  out.fill_bytes(0xFF);  // NaN: an element the kernel does not write fails
  lse.fill_bytes(0xFF);
  flex_attention_into(ctx, dq.ref(), dk.ref(), dv.ref(), out, &lse.ref(), o);
  ctx.synchronize();
  // The default scale is 1 / sqrt(head_dim_qk), the real one.
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dqk)));
  const ReferenceResult ref =
      cpu_reference_attention(mods, s, q.values, k.values, v.values, scale, bind.env);
  const ErrorStats err = compare(download(out), ref.out);
  const auto [lse_err, lse_bad] = lse_errors(download(lse), ref.lse);
  INFO("out " << err.str() << "; lse max rel err " << lse_err);
  CHECK(err.nonfinite == 0);
  CHECK(err.rel <= tolerance(dtype));
  CHECK(lse_bad == 0);
  CHECK(lse_err <= 1e-2);
  std::printf("  forward %s: out %s; lse max rel err %.3e\n", label.c_str(), err.str().c_str(),
              lse_err);
}

// Decoding (or chunked prefill) of `sq` query tokens against a KV cache: contiguous K / V
// (page_size 0, ragged = false), ragged contiguous K / V (seq_lens) or a paged pool of
// `page_size`-key pages with shuffled pages.
struct CacheCase {
  int sq = 1;
  int page_size = 0;
  bool ragged = false;
  bool warp_per_row = false;  // the combine by decode_combine/warp_per_row (else warp_batched)
};

void check_cache(Context& ctx, const HeadDimCase& c, int i, const CacheCase& cc,
                 std::mt19937_64& rng, uint64_t seed) {
  const bool prefill = cc.sq > 16;
  const int B = 2, Hq = 4, Hkv = 2, cap = 160;
  // Ragged lengths that no tile divides (and a short one, below one 32-key tile).
  const std::vector<int> lens = {prefill ? 150 : 77, i % 2 == 0 ? 131 : 21};
  const bool on_cache = cc.page_size > 0 || cc.ragged;
  // Decoding: noop or alibi (causal would leave a decode row its first Sq keys only); prefill:
  // the three mods in turn.
  const std::string mods_name =
      prefill ? kMods[static_cast<size_t>(i + 1) % kMods.size()] : (i % 2 == 0 ? "alibi" : "noop");
  const std::string layout = cc.page_size > 0 ? fmt::format("paged ({}-key pages)", cc.page_size)
                                              : (cc.ragged ? "ragged" : "contiguous");
  const std::string label =
      fmt::format("{} {} {} {} Sq={} lens=[{}, {}]{} (seed {})", prefill ? "prefill" : "decode",
                  layout, mods_name, dims_str(c.dqk, c.dv), cc.sq, lens[0], lens[1],
                  cc.warp_per_row ? " warp_per_row" : "", seed);
  INFO(label);
  const Mods mods = standard_mods(mods_name);
  AttentionShape s;
  s.batch = B, s.heads_q = Hq, s.heads_kv = Hkv, s.seqlen_q = cc.sq, s.seqlen_kv = cap;
  s.head_dim_qk = c.dqk, s.head_dim_v = c.dv;
  Bindings bind;
  bind.bind(ctx, mods, s, rng);
  const HostTensor q = random_tensor(rng, DType::BF16, {B, Hq, cc.sq, c.dqk});
  HostTensor k = random_tensor(rng, DType::BF16, {B, Hkv, cap, c.dqk});
  HostTensor v = random_tensor(rng, DType::BF16, {B, Hkv, cap, c.dv});
  // Keys past a sequence's length are NaN on a cache: the kernels must never read them.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (on_cache) {
    for (HostTensor* t : {&k, &v}) {
      const int D = static_cast<int>(t->shape[3]);
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < Hkv; ++h)
          for (int n = lens[b]; n < cap; ++n)
            std::fill_n(&t->values[((static_cast<size_t>(b) * Hkv + h) * cap + n) * D], D, nan);
    }
  }
  std::vector<DeviceTensor> keep;
  TensorRef dk, dv;
  KvCache cache;
  if (cc.page_size > 0) {
    // Pools [num_pages, page_size, Hkv, D] with shuffled pages and two spare NaN pages.
    const int ps = cc.page_size, max_pages = cap / ps, num_pages = B * max_pages + 2;
    std::vector<int> perm(static_cast<size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int> table(perm.begin(), perm.begin() + B * max_pages);
    for (const HostTensor* src : {&k, &v}) {
      const int D = static_cast<int>(src->shape[3]);
      HostTensor pool;
      pool.dtype = DType::BF16;
      pool.shape = {num_pages, ps, Hkv, D};
      pool.values.assign(static_cast<size_t>(num_pages) * ps * Hkv * D, nan);
      for (int b = 0; b < B; ++b)
        for (int p = 0; p < max_pages; ++p)
          for (int slot = 0; slot < ps; ++slot)
            for (int h = 0; h < Hkv; ++h)
              std::copy_n(
                  &src->values[((static_cast<size_t>(b) * Hkv + h) * cap + p * ps + slot) * D], D,
                  &pool.values[((static_cast<size_t>(table[b * max_pages + p]) * ps + slot) * Hkv +
                                h) *
                               D]);
      keep.push_back(upload(ctx, pool));
    }
    dk = keep[0].ref();
    dv = keep[1].ref();
    keep.push_back(DeviceTensor::from_host(ctx, DType::I32, {B, max_pages}, table.data()));
    cache.page_table = keep.back().ref();
  } else {
    keep.push_back(upload(ctx, k));
    keep.push_back(upload(ctx, v));
    dk = keep[0].ref();
    dv = keep[1].ref();
  }
  keep.push_back(DeviceTensor::from_host(ctx, DType::I32, {B}, lens.data()));
  cache.seq_lens = keep.back().ref();
  const DeviceTensor dq = upload(ctx, q);

  AttentionOptions o;
  o.mods = mods;
  o.bindings = bind.dev;
  if (on_cache) o.kv_cache = &cache;
  std::unique_ptr<FamilyScope> combine_scope;
  if (cc.warp_per_row) {
    // "sm80_mma" excludes the listed variants: the combine falls to warp_per_row.
    combine_scope = std::make_unique<FamilyScope>(
        "sm80_mma", std::vector<std::string>{"decode_combine/warp_batched"});
  }
  const std::string plan = runtime::describe_forward_plan(ctx, dq.ref(), dk, dv, o);
  if (prefill) {
    CHECK_THAT(step_line(plan, "forward"), Catch::Contains("forward/sm80_mma"));
  } else {
    CHECK_THAT(step_line(plan, "decode_split"), Catch::Contains("decode_split/sm80_mma"));
    CHECK_THAT(step_line(plan, "decode_combine"),
               Catch::Contains(cc.warp_per_row ? "decode_combine/warp_per_row"
                                               : "decode_combine/warp_batched"));
  }
  DeviceTensor out = DeviceTensor::empty(ctx, DType::BF16, {B, Hq, cc.sq, c.dv});
  DeviceTensor lse = DeviceTensor::empty(ctx, DType::F32, {B, Hq, cc.sq});
  out.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  flex_attention_into(ctx, dq.ref(), dk, dv, out, &lse.ref(), o);
  ctx.synchronize();

  // The reference on the logical K / V with the lengths as a mask (zeros where K / V are NaN).
  const std::vector<int> ref_lens = on_cache ? lens : std::vector<int>{cap, cap};
  const Mods ref_mods =
      combine(mods, parse_mods("buffer fj_ref_len: i32[B]\nmask_mod = kv_idx < fj_ref_len[b]",
                               "reference_lengths.fx"));
  ir::EvalEnv env = bind.env;
  env.buffers["fj_ref_len"] = ir::BufferView{ref_lens.data(), DType::I32, {B}, {}};
  auto zeroed = [](std::vector<float> x) {
    for (float& e : x)
      if (std::isnan(e)) e = 0.0f;
    return x;
  };
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dqk)));
  const ReferenceResult ref = cpu_reference_attention(ref_mods, s, q.values, zeroed(k.values),
                                                      zeroed(v.values), scale, env);
  const ErrorStats err = compare(download(out), ref.out);
  const auto [lse_err, lse_bad] = lse_errors(download(lse), ref.lse);
  INFO("out " << err.str() << "; lse max rel err " << lse_err);
  CHECK(err.nonfinite == 0);
  CHECK(err.rel <= tolerance(DType::BF16));
  CHECK(lse_bad == 0);
  CHECK(lse_err <= 1e-2);
  std::printf("  %s: out %s; lse max rel err %.3e\n", label.c_str(), err.str().c_str(), lse_err);
}

}  // namespace

TEST_CASE(
    "head dims on sm80_mma: the forward in tiles of 64 / 128 / 256 matches the fp64 "
    "reference",
    "[gpu][head_dims]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  Sm80Only scope;
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < kCases.size(); ++i)
    check_forward(*ctx, kCases[i], static_cast<int>(i), DType::BF16, rng, seed);
  // f32 inputs (tf32 tensor cores: 16-byte chunks of 4 elements), a qk != v pair inside the
  // 128 and 64 tiles.
  check_forward(*ctx, {96, 64}, 1, DType::F32, rng, seed);
}

TEST_CASE(
    "head dims on sm80_mma: the backward (dQ by a second pass and by atomics) matches the "
    "fp64 reference",
    "[gpu][head_dims]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  Sm80Only scope;
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  // Seven of the cases (every tile, the inner dims of each, the qk != v pairs), to keep the
  // file's compile time down: 48, 80, 112, 160, 256, 192 / 128, 96 / 64.
  for (size_t i : {1, 2, 4, 5, 7, 8, 9}) {
    const HeadDimCase& c = kCases[i];
    // The forward test's mods for the case: its forward kernel is built already.
    const std::string mods_name = kMods[i % kMods.size()];
    // dQ by fp32 atomics into the accumulator (rows of dq_accum_dim floats: 128 for d = 80, 192
    // for 160 in the 256 tile, 192 for 192 / 128) on every third case.
    const bool atomic = i % 3 == 2;
    AttentionShape s;
    s.batch = 1;
    s.heads_q = 4;
    s.heads_kv = i % 2 == 0 ? 4 : 2;
    s.seqlen_q = 100;
    s.seqlen_kv = i % 2 == 0 ? 133 : 100;
    s.head_dim_qk = c.dqk;
    s.head_dim_v = c.dv;
    const std::string label =
        fmt::format("{} {} Hkv={} Sq={} Skv={} dq {} (seed {})", mods_name, dims_str(c.dqk, c.dv),
                    s.heads_kv, s.seqlen_q, s.seqlen_kv, atomic ? "atomic" : "second pass", seed);
    INFO(label);
    const Mods mods = standard_mods(mods_name);
    Bindings bind;
    bind.bind(*ctx, mods, s, rng);
    const HostTensor q = random_tensor(rng, DType::BF16, {1, s.heads_q, s.seqlen_q, c.dqk});
    const HostTensor k = random_tensor(rng, DType::BF16, {1, s.heads_kv, s.seqlen_kv, c.dqk});
    const HostTensor v = random_tensor(rng, DType::BF16, {1, s.heads_kv, s.seqlen_kv, c.dv});
    const HostTensor dout = random_tensor(rng, DType::BF16, {1, s.heads_q, s.seqlen_q, c.dv});
    const DeviceTensor dq = upload(*ctx, q), dk = upload(*ctx, k), dv = upload(*ctx, v);
    const DeviceTensor ddout = upload(*ctx, dout);
    AttentionOptions o;
    o.mods = mods;
    o.bindings = bind.dev;
    o.return_lse = true;
    BackwardOptions bo;
    bo.dq_mode = atomic ? BackwardOptions::DqMode::Atomic : BackwardOptions::DqMode::SecondPass;
    const std::string plan =
        runtime::describe_backward_plan(*ctx, dq.ref(), dk.ref(), dv.ref(), o, bo);
    CHECK_THAT(step_line(plan, "backward_dkdv"), Catch::Contains("backward_dkdv/sm80_mma"));
    CHECK_THAT(step_line(plan, "backward_dq"),
               Catch::Contains(atomic ? "backward_dq/atomic_convert" : "backward_dq/sm80_mma"));
    AttentionResult fwd = flex_attention(*ctx, dq, dk, dv, o);
    BackwardResult g = flex_attention_backward(*ctx, dq, dk, dv, fwd.out, fwd.lse, ddout, o, bo);
    ctx->synchronize();
    check_backward_f64(mods, bind.host, q, k, v, dout, fwd, g,
                       label);  // bf16: 2e-2, test_backward.cpp's rule
  }
}

TEST_CASE(
    "head dims on sm80: decoding (contiguous, paged, ragged) and chunked prefill match the "
    "fp64 reference",
    "[gpu][head_dims][decode]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  Sm80Only scope;
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < kCases.size(); ++i) {
    const int n = static_cast<int>(i);
    // Decoding: two query tokens, the layouts in turn, every other case through warp_per_row.
    CacheCase d;
    d.sq = 2;
    d.page_size = n % 3 == 1 ? 16 : 0;
    d.ragged = n % 3 == 2;
    d.warp_per_row = n % 2 == 1;
    check_cache(*ctx, kCases[i], n, d, rng, seed);
    // Chunked prefill: a 40-token chunk through the forward on a paged (16-key pages) or ragged
    // cache, on every other case (32, 80, 112, 192, 192 / 128).
    if (n % 2 == 1) continue;
    CacheCase p;
    p.sq = 40;
    p.page_size = n % 4 == 0 ? 16 : 0;
    p.ragged = n % 4 == 2;
    check_cache(*ctx, kCases[i], n, p, rng, seed);
  }
}
