// e4m3 (float8_e4m3fn) attention on sm_90a (issue 31, "FP8"): forward/sm90a_wgmma's FJ_FWD_FP8
// path against the fp64 CPU reference on the dequantized inputs (stored e4m3 value times its
// descale factor), on fresh random inputs (the seed is printed on failure). Each tensor is
// quantized as serving stacks do: per tensor or per head, x / (amax / 448) rounded to e4m3, the
// factor amax / 448 its descale. noop, causal, alibi (a captured buffer), softcap (a score_mod
// with a param), GQA 4:1, lengths no 128-row / 128-key tile divides, head dims 128, 64 and
// 256 / 128, per-tensor and per-head factors; out (bf16) and lse (f32).
//
// The rules (docs/math.md "FP8"): P is rounded to e4m3 (3 mantissa bits) before P V, so an
// element of out may move by up to 2^-4 of sum_j p_j |v_j| (the attention of |V|, which the test
// computes with the reference) plus an allowance of 2^-7 max |V| for the P values below e4m3's
// subnormals, the f32 accumulation and out's bf16 rounding; the relative norm error stays within
// 5e-2. lse comes from f32 scores and sums: the bf16 rule (1e-2 relative).
// Skips without a GPU and where forward/sm90a_wgmma is not selectable (not an sm_90a device).
#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/error.h>
#include <flexjit/paged_kv.h>

#include "gpu/GpuTestUtil.h"
#include "gpu/StandardBindings.h"
#include "ir/Evaluate.h"
#include "runtime/ForwardPlan.h"
#include "support/CpuReference.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

using namespace flexjit;
using namespace flexjit::test;

namespace {

// A quantized tensor: the e4m3 bytes, the descale factors (one, or one per head) and the values
// they stand for (what the reference reads).
struct Fp8Tensor {
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  std::vector<float> descale;
  std::vector<float> dequantized;
};

// N(0, stddev) values of `shape` [B, H, S, D], quantized with amax / 448 per head or per tensor.
Fp8Tensor random_fp8(std::mt19937_64& rng, std::vector<int64_t> shape, bool per_head,
                     float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  const int64_t B = shape[0], H = shape[1], inner = shape[2] * shape[3];
  std::vector<float> x(static_cast<size_t>(B * H * inner));
  for (float& e : x)
    e = dist(rng);
  Fp8Tensor t;
  t.shape = shape;
  std::vector<float> amax(static_cast<size_t>(per_head ? H : 1), 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < inner; ++i) {
        float& a = amax[static_cast<size_t>(per_head ? h : 0)];
        a = std::max(a, std::abs(x[static_cast<size_t>((b * H + h) * inner + i)]));
      }
  for (float a : amax)
    t.descale.push_back(std::max(a, 1e-6f) / 448.0f);
  t.bytes.resize(x.size());
  t.dequantized.resize(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const float f = t.descale[static_cast<size_t>(per_head ? h : 0)];
      for (int64_t i = 0; i < inner; ++i) {
        const size_t j = static_cast<size_t>((b * H + h) * inner + i);
        t.bytes[j] = ir::float_to_e4m3_bits(x[j] / f);
        t.dequantized[j] = ir::e4m3_bits_to_float(t.bytes[j]) * f;
      }
    }
  return t;
}

struct Fp8Case {
  std::string mods;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_kv, dqk, dv;
  bool per_head;
  int block_m = 0;      // 0: the default (192 rows without a mask_mod where they fit, else 128)
  int persistent = -1;  // -1: the default (persistent CTAs with the 192-row default)
};

// Lengths 300 / 333 / 517: no 128-row or 128-key tile divides them; GQA 4:1 in half the cases.
// The default takes 192-row tiles (three consumers, the serial loop; masks through the union
// schedule) where they cover at most an eighth more rows: here all but softcap (256 rows) and
// alibi_causal (qk tile 256), with persistent CTAs (each tile's head's descales); the cases with
// a block_m run the other tile too, one CTA per tile unless persistent is asked for.
const std::vector<Fp8Case> kCases = {
    {"noop", 2, 4, 4, 300, 333, 128, 128, false},
    {"causal", 1, 8, 2, 517, 517, 128, 128, true, 128},
    {"document_causal", 1, 4, 2, 600, 600, 128, 128, false},
    {"alibi_causal", 2, 4, 2, 333, 400, 128, 128, true},
    {"alibi", 2, 4, 1, 300, 300, 128, 128, true},
    {"softcap", 1, 4, 4, 256, 517, 128, 128, false},
    {"causal", 2, 4, 4, 333, 333, 64, 64, false},
    {"alibi_causal", 1, 8, 2, 300, 333, 256, 128, true},
    {"noop", 1, 4, 4, 517, 300, 128, 128, true, 128},
    {"causal", 1, 8, 2, 517, 517, 128, 128, true, 192},
    {"softcap_causal", 2, 4, 1, 300, 333, 128, 128, false, 192},
    {"sliding_window", 1, 4, 4, 700, 700, 128, 128, true, 192},
    // Persistent CTAs asked for: more claims (4 x 16 heads x 3 tiles) than an H100's or H200's
    // 132 CTAs with per-head descales and GQA; 128-row tiles; a masked mod at 192 rows.
    {"causal", 4, 16, 4, 400, 400, 64, 64, true, 192, 1},
    {"alibi", 2, 8, 2, 300, 300, 128, 128, true, 128, 1},
    {"document_causal", 1, 8, 2, 600, 600, 128, 128, true, 192, 1},
};

std::string label_of(const Fp8Case& c) {
  return fmt::format("{} B={} Hq={} Hkv={} Sq={} Skv={} D={}/{} {} descale{}", c.mods, c.batch,
                     c.heads_q, c.heads_kv, c.seqlen_q, c.seqlen_kv, c.dqk, c.dv,
                     c.per_head ? "per-head" : "per-tensor",
                     c.block_m != 0 ? fmt::format(" block_m {}", c.block_m) : "") +
         (c.persistent >= 0 ? fmt::format(" persistent {}", c.persistent) : "");
}

}  // namespace

// One case against the fp64 reference on the dequantized inputs (the error rules of
// docs/math.md "FP8").
void check_fp8_case(Context* ctx, const Fp8Case& c, std::mt19937_64& rng, uint64_t seed) {
  const std::string label = fmt::format("{} (seed {})", label_of(c), seed);
  INFO(label);
  AttentionShape s;
  s.batch = c.batch;
  s.heads_q = c.heads_q;
  s.heads_kv = c.heads_kv;
  s.seqlen_q = c.seqlen_q;
  s.seqlen_kv = c.seqlen_kv;
  s.head_dim_qk = c.dqk;
  s.head_dim_v = c.dv;
  const Mods mods = standard_mods(c.mods);
  std::map<std::string, HostBuffer> buffers;
  std::vector<std::pair<std::string, double>> params;
  bind_standard_mods(mods, s, rng, buffers, params);
  const Fp8Tensor q = random_fp8(rng, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_qk}, c.per_head);
  const Fp8Tensor k =
      random_fp8(rng, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_qk}, c.per_head);
  const Fp8Tensor v = random_fp8(rng, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_v}, c.per_head);
  auto up = [&](const Fp8Tensor& t) {
    return DeviceTensor::from_host(*ctx, DType::E4M3, t.shape, t.bytes.data());
  };
  auto up_f32 = [&](const std::vector<float>& f) {
    return DeviceTensor::from_host(*ctx, DType::F32, {static_cast<int64_t>(f.size())}, f.data());
  };
  const DeviceTensor dq = up(q), dk = up(k), dv = up(v);
  const DeviceTensor sq = up_f32(q.descale), sk = up_f32(k.descale), sv = up_f32(v.descale);
  std::vector<DeviceTensor> keep;
  ModBindings dev;
  ir::EvalEnv env;
  for (auto& [name, hb] : buffers) {
    keep.push_back(DeviceTensor::from_host(*ctx, hb.dtype, hb.shape, hb.bytes.data()));
    dev.buffers.emplace_back(name, keep.back().ref());
    env.buffers[name] = ir::BufferView{hb.bytes.data(), hb.dtype, hb.shape, {}};
  }
  dev.params = params;
  for (auto& [n, x] : params)
    env.params[n] = x;
  AttentionOptions o;
  o.mods = mods;
  o.bindings = dev;
  o.descale = {sq.ref(), sk.ref(), sv.ref()};
  if (c.block_m != 0) o.config.block_m = c.block_m;
  if (c.persistent >= 0) o.config.params["persistent"] = c.persistent;
  const std::string plan = runtime::describe_forward_plan(*ctx, dq.ref(), dk.ref(), dv.ref(), o);
  CHECK_THAT(step_line(plan, "forward"), Catch::Contains("forward/sm90a_wgmma"));
  if (c.persistent >= 0) {
    CHECK_THAT(step_line(plan, "forward"),
               Catch::Contains(fmt::format("persistent={}", c.persistent)));
  }
  DeviceTensor out =
      DeviceTensor::empty(*ctx, DType::BF16, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v});
  DeviceTensor lse = DeviceTensor::empty(*ctx, DType::F32, {s.batch, s.heads_q, s.seqlen_q});
  out.fill_bytes(0xFF);  // NaN: an element the kernel does not write fails
  lse.fill_bytes(0xFF);
  flex_attention_into(*ctx, dq.ref(), dk.ref(), dv.ref(), out, &lse.ref(), o);
  ctx->synchronize();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim_qk)));
  const ReferenceResult ref =
      cpu_reference_attention(mods, s, q.dequantized, k.dequantized, v.dequantized, scale, env);
  // sum_j p_j |v_j| per element: the reference's attention of |V|.
  std::vector<float> v_abs(v.dequantized.size());
  float v_max = 0.0f;
  for (size_t i = 0; i < v_abs.size(); ++i) {
    v_abs[i] = std::abs(v.dequantized[i]);
    v_max = std::max(v_max, v_abs[i]);
  }
  const ReferenceResult ref_abs =
      cpu_reference_attention(mods, s, q.dequantized, k.dequantized, v_abs, scale, env);
  const std::vector<float> got = download(out);
  const ErrorStats err = compare(got, ref.out);
  int64_t over = 0, first_over = -1;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(ref.out[i])) continue;
    const double bound = std::ldexp(std::abs(ref_abs.out[i]), -4) + std::ldexp(v_max, -7);
    const double e = std::abs(static_cast<double>(got[i]) - ref.out[i]);
    worst_ratio = std::max(worst_ratio, e / bound);
    if (!(e <= bound)) {
      if (first_over < 0) first_over = static_cast<int64_t>(i);
      ++over;
    }
  }
  const LseStats lse_stats = compare_lse(download(lse), ref.lse);
  const double lse_err = lse_stats.max_err;
  INFO("out " << err.str() << "; elements past the P-rounding bound " << over << " (first "
              << first_over << "), worst error / bound " << worst_ratio << "; lse max rel err "
              << lse_err);
  CHECK(err.nonfinite == 0);
  CHECK(err.rel <= 5e-2);
  CHECK(over == 0);
  CHECK(lse_stats.mismatched_inf == 0);
  CHECK(lse_err <= 1e-2);
  std::printf("  fp8 forward %s: out %s, worst error / bound %.3f; lse max rel err %.3e\n",
              label.c_str(), err.str().c_str(), worst_ratio, lse_err);
}

TEST_CASE("e4m3 forward on sm_90a matches the fp64 reference on the dequantized inputs",
          "[gpu][fp8]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!sm90a_wgmma_selectable(*ctx)) return;
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (const Fp8Case& c : kCases)
    check_fp8_case(ctx, c, rng, seed);
}

// Persistent CTAs (each tile with its head's descales) and one CTA per tile at small shapes, for
// compute-sanitizer: 192 and 128 rows, a masked mod through the union schedule, GQA.
TEST_CASE("e4m3 forward on sm_90a at small shapes", "[gpu][fp8][small]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!sm90a_wgmma_selectable(*ctx)) return;
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int persistent : {0, 1}) {
    check_fp8_case(ctx, {"causal", 2, 4, 2, 200, 230, 128, 128, true, 192, persistent}, rng, seed);
    check_fp8_case(ctx, {"noop", 1, 2, 1, 130, 140, 128, 128, false, 128, persistent}, rng, seed);
  }
}

TEST_CASE("e4m3 inputs: the calls that cannot run them say so", "[gpu][fp8]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  std::mt19937_64 rng(fresh_seed());
  const Fp8Tensor q = random_fp8(rng, {1, 2, 64, 128}, false);
  const DeviceTensor dq = DeviceTensor::from_host(*ctx, DType::E4M3, q.shape, q.bytes.data());
  // The backward takes no e4m3 inputs.
  AttentionOptions o;
  DeviceTensor out = DeviceTensor::empty(*ctx, DType::BF16, {1, 2, 64, 128});
  DeviceTensor dout = DeviceTensor::empty(*ctx, DType::BF16, {1, 2, 64, 128});
  DeviceTensor lse = DeviceTensor::empty(*ctx, DType::F32, {1, 2, 64});
  CHECK_THROWS_AS(flex_attention_backward(*ctx, dq, dq, dq, out, lse, dout, o), UnsupportedError);
  // out must be bf16 for e4m3 inputs.
  DeviceTensor out16 = DeviceTensor::empty(*ctx, DType::F16, {1, 2, 64, 128});
  CHECK_THROWS_WITH(flex_attention_into(*ctx, dq.ref(), dq.ref(), dq.ref(), out16, nullptr, o),
                    Catch::Contains("out") && Catch::Contains("bf16"));
  // A descale factor of the wrong extent names itself and what it takes.
  const std::vector<float> three = {1.0f, 1.0f, 1.0f};
  const DeviceTensor bad = DeviceTensor::from_host(*ctx, DType::F32, {3}, three.data());
  o.descale.k = bad.ref();
  CHECK_THROWS_WITH(flex_attention_into(*ctx, dq.ref(), dq.ref(), dq.ref(), out, nullptr, o),
                    Catch::Contains("descale.k") && Catch::Contains("f32[2] (Hkv = 2"));
  // On an sm_80-class device (no sm_90a) the error names the variant that takes e4m3.
  if (!sm90a_wgmma_selectable(*ctx)) {
    o.descale = {};
    CHECK_THROWS_WITH(flex_attention_into(*ctx, dq.ref(), dq.ref(), dq.ref(), out, nullptr, o),
                      Catch::Contains("e4m3"));
  }
}

TEST_CASE("a GPU call on an e4m3 KV cache refuses the forward's descale factors", "[gpu][fp8]") {
  // The decode and forward paths on a cache read KvCache::k_scale / v_scale; descale factors
  // beside them were once ignored without a word (a wrong answer for whoever meant them).
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const int64_t B = 1, Hq = 2, Hkv = 1, Sq = 1, S = 16, D = 64;
  std::vector<uint16_t> qb(static_cast<size_t>(B * Hq * Sq * D), 0x3f80);  // bf16 1.0
  std::vector<uint8_t> kvb(static_cast<size_t>(B * Hkv * S * D), 0x38);    // e4m3 1.0
  const std::vector<int32_t> lens = {static_cast<int32_t>(S)};
  const std::vector<float> scale = {1.0f};
  const DeviceTensor q = DeviceTensor::from_host(*ctx, DType::BF16, {B, Hq, Sq, D}, qb.data());
  const DeviceTensor k = DeviceTensor::from_host(*ctx, DType::E4M3, {B, Hkv, S, D}, kvb.data());
  const DeviceTensor v = DeviceTensor::from_host(*ctx, DType::E4M3, {B, Hkv, S, D}, kvb.data());
  const DeviceTensor sl = DeviceTensor::from_host(*ctx, DType::I32, {B}, lens.data());
  const DeviceTensor ks = DeviceTensor::from_host(*ctx, DType::F32, {Hkv}, scale.data());
  KvCache cache;
  cache.seq_lens = sl;
  cache.k_scale = ks;
  cache.v_scale = ks;
  AttentionOptions o;
  o.kv_cache = &cache;
  o.descale.v = ks.ref();
  CHECK_THROWS_WITH(flex_attention(*ctx, q, k, v, o),
                    Catch::Contains("descale.v was given with a KV cache"));
  o.descale = {};
  const AttentionResult r = flex_attention(*ctx, q, k, v, o);  // the same call without them runs
  for (float x : download(r.out))
    REQUIRE(x == 1.0f);
}
