// Decoding on e4m3 KV caches (include/flexjit/paged_kv.h, "FP8 caches"): K / V pools or
// contiguous K / V in e4m3 with per-kv-head f32 scales, q and out bf16 / f16. Fresh random inputs
// every run (the seed is printed on failure), against the CPU backend's fp64 reference on the
// dequantized cache (k_e4m3 * k_scale[h], v_e4m3 * v_scale[h] in f32; docs/math.md "FP8 KV
// caches"), and the CPU backend's own e4m3 cache path (flex_attention_cpu, which dequantizes
// while gathering) against the same reference. Skips without a GPU, and below sm_89 (the
// kernel's e4m3 conversion) after checking the error.
#include <flexjit/attention.h>
#include <flexjit/cpu.h>
#include <flexjit/error.h>
#include <flexjit/paged_kv.h>

#include "gpu/GpuTestUtil.h"
#include "gpu/StandardBindings.h"
#include "ir/Evaluate.h"
#include "support/CpuReference.h"
#include "support/E4m3Cache.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <utility>

using namespace flexjit;
using namespace flexjit::test;

namespace {

struct Fp8Case {
  std::string mods = "noop";
  DType dtype = DType::BF16;  // q and out
  int batch = 1, heads_kv = 1, gqa = 1, seqlen_q = 1, dim_qk = 128, dim_v = 128;
  int capacity = 1;       // Skv (contiguous) or max_pages * page_size
  std::vector<int> lens;  // per sequence (a KvCache is always passed)
  int page_size = 0;      // 0: contiguous [B, Hkv, Skv, D] with seq_lens
  std::map<std::string, int64_t> config;
  // q's standard deviation; the score scale is 1 / (sqrt(dim_qk) q_gain), so the scores keep
  // their spread while q's magnitude leaves f16's range (bf16 q runs in f16 scaled by a power of
  // two: docs/math.md "FP8 KV caches").
  float q_gain = 1.0f;
};

struct Fp8Result {
  ErrorStats gpu, cpu;
  double lse_max_err = 0;
  int64_t lse_mismatched_inf = 0;
};

Fp8Result run_case(Context& ctx, Fp8Case c, std::mt19937_64& rng) {
  const int B = c.batch, Hkv = c.heads_kv, Hq = Hkv * c.gqa, Sq = c.seqlen_q, cap = c.capacity;
  REQUIRE(static_cast<int>(c.lens.size()) == B);
  E4m3Cache kv = random_e4m3_cache(rng, c);  // not const: host TensorRefs view it
  const HostTensor q = random_tensor(rng, c.dtype, {B, Hq, Sq, c.dim_qk}, c.q_gain);
  const float scale = 1.0f / (std::sqrt(static_cast<float>(c.dim_qk)) * c.q_gain);
  const int ps = c.page_size;
  const std::vector<char> q_bytes = q.bytes();
  KvCache host_cache;
  host_cache.seq_lens = TensorRef::contiguous(c.lens.data(), DType::I32, {B});
  if (ps > 0) {
    host_cache.page_table = TensorRef::contiguous(kv.table.data(), DType::I32, {B, cap / ps});
  }
  host_cache.k_scale = TensorRef::contiguous(kv.k_scale.data(), DType::F32, {Hkv});
  host_cache.v_scale = TensorRef::contiguous(kv.v_scale.data(), DType::F32, {Hkv});

  std::vector<DeviceTensor> keep;
  auto dev = [&](DType dtype, std::vector<int64_t> shape, const void* data) {
    keep.push_back(DeviceTensor::from_host(ctx, dtype, std::move(shape), data));
    return keep.back().ref();
  };
  KvCache cache;
  cache.seq_lens = dev(DType::I32, {B}, c.lens.data());
  if (ps > 0) cache.page_table = dev(DType::I32, {B, cap / ps}, kv.table.data());
  cache.k_scale = dev(DType::F32, {Hkv}, kv.k_scale.data());
  cache.v_scale = dev(DType::F32, {Hkv}, kv.v_scale.data());
  const TensorRef dq = dev(c.dtype, {B, Hq, Sq, c.dim_qk}, q_bytes.data());
  const TensorRef dk = dev(DType::E4M3, kv.k_shape, kv.k_store.data());
  const TensorRef dv = dev(DType::E4M3, kv.v_shape, kv.v_store.data());

  AttentionShape s;
  s.batch = B, s.heads_q = Hq, s.heads_kv = Hkv, s.seqlen_q = Sq, s.seqlen_kv = cap;
  s.head_dim_qk = c.dim_qk, s.head_dim_v = c.dim_v;
  Mods mods = standard_mods(c.mods);
  std::map<std::string, HostBuffer> buffers;
  std::vector<std::pair<std::string, double>> params;
  bind_standard_mods(mods, s, rng, buffers, params);
  ModBindings bindings, host_bindings;
  ir::EvalEnv env;
  for (auto& [name, hb] : buffers) {
    bindings.buffers.emplace_back(name, dev(hb.dtype, hb.shape, hb.bytes.data()));
    host_bindings.buffers.emplace_back(name,
                                       TensorRef::contiguous(hb.bytes.data(), hb.dtype, hb.shape));
    env.buffers[name] = ir::BufferView{hb.bytes.data(), hb.dtype, hb.shape, {}};
  }
  bindings.params = host_bindings.params = params;
  for (auto& [n, val] : params)
    env.params[n] = val;

  DeviceTensor out = DeviceTensor::empty(ctx, c.dtype, {B, Hq, Sq, c.dim_v});
  DeviceTensor lse = DeviceTensor::empty(ctx, DType::F32, {B, Hq, Sq});
  out.fill_bytes(0xFF);  // NaN: an element the kernels do not write fails
  lse.fill_bytes(0xFF);
  AttentionOptions o;
  o.mods = mods;
  o.bindings = bindings;
  o.kv_cache = &cache;
  o.config.params = c.config;
  o.scale = scale;
  // The decode plan (split partials in the workspace) for up to 16 query tokens; a prefill chunk
  // takes the forward on sm_90a (tests/gpu/test_prefill_fp8.cpp), decode elsewhere.
  if (Sq <= 16 || ctx.arch() != "sm_90a") {
    CHECK(flex_attention_workspace_bytes(ctx, dq, dk, dv, o) > 0);
  }
  flex_attention_into(ctx, dq, dk, dv, out, &lse.ref(), o);
  ctx.synchronize();
  const std::vector<float> got = download(out), got_lse = download(lse);

  // The reference: fp64 on the dequantized logical cache, the lengths as a mask.
  Mods ref_mods = combine(mods, parse_mods("buffer fj_ref_len: i32[B]\n"
                                           "mask_mod = kv_idx < fj_ref_len[b]",
                                           "reference_lengths.fx"));
  ir::EvalEnv ref_env = env;
  ref_env.buffers["fj_ref_len"] = ir::BufferView{c.lens.data(), DType::I32, {B}, {}};
  const ReferenceResult rr = cpu_reference_attention(ref_mods, s, q.values, kv.k.dequantized,
                                                     kv.v.dequantized, scale, ref_env);

  // The CPU backend on the same host cache (its gather dequantizes).
  AttentionOptions ho;
  ho.mods = mods;
  ho.bindings = host_bindings;
  ho.kv_cache = &host_cache;
  ho.scale = scale;
  CpuRunOptions cro;
  cro.reference_f64 = true;
  const TensorRef hq =
      TensorRef::contiguous(const_cast<char*>(q_bytes.data()), c.dtype, {B, Hq, Sq, c.dim_qk});
  const CpuAttentionResult cpu = flex_attention_cpu(
      hq, TensorRef::contiguous(kv.k_store.data(), DType::E4M3, kv.k_shape),
      TensorRef::contiguous(kv.v_store.data(), DType::E4M3, kv.v_shape), ho, cro);

  Fp8Result r;
  r.gpu = compare(got, rr.out);
  r.cpu = compare(cpu.out, rr.out);
  const LseStats lse_err = compare_lse(got_lse, rr.lse);
  r.lse_max_err = lse_err.max_err;
  r.lse_mismatched_inf = lse_err.mismatched_inf;
  return r;
}

void check_case(Context& ctx, const Fp8Case& c, std::mt19937_64& rng, uint64_t seed) {
  const Fp8Result r = run_case(ctx, c, rng);
  const std::string summary = fmt::format(
      "e4m3 cache {} q {} (x{}) B={} Hkv={} gqa={} Sq={} cap={} lens=[{}] page={} D={}/{} [{}]: "
      "out {}; cpu backend {}; lse max rel err {:.3e}, {} -inf mismatches (seed {})",
      c.mods, to_string(c.dtype), c.q_gain, c.batch, c.heads_kv, c.gqa, c.seqlen_q, c.capacity,
      fmt::join(c.lens, ","), c.page_size, c.dim_qk, c.dim_v, fmt::join(c.config, " "), r.gpu.str(),
      r.cpu.str(), r.lse_max_err, r.lse_mismatched_inf, seed);
  INFO(summary);
  // docs/math.md "FP8 KV caches": the dequantization is exact, so the bf16 / f16 rule holds.
  CHECK(r.gpu.nonfinite == 0);
  CHECK(r.gpu.rel <= tolerance(c.dtype));
  CHECK(r.cpu.nonfinite == 0);
  CHECK(r.cpu.rel <= 1e-5);
  CHECK(r.lse_mismatched_inf == 0);
  CHECK(r.lse_max_err <= 1e-2);
  std::printf("  %s\n", summary.c_str());
}

bool device_takes_e4m3(Context& ctx) {
  const std::string a = ctx.arch();
  return a == "sm_89" || a == "sm_90" || a == "sm_90a";
}

}  // namespace

TEST_CASE("decode fp8: e4m3 caches of every page size, ragged lengths, shared pages, GQA",
          "[gpu][decode][fp8]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  if (!device_takes_e4m3(*ctx)) {
    Fp8Case c;
    c.lens = {1};
    CHECK_THROWS_WITH(run_case(*ctx, c, rng), Catch::Contains("needs sm_89 or newer"));
    return;
  }
  struct Shape {
    int page, gqa, sq, cap;
    std::vector<int> lens;
    const char* mods;
    int dqk, dv;
    std::map<std::string, int64_t> config;
  };
  const std::vector<Shape> shapes = {
      // The anchors' decode shape (GQA 4, one token), full and ragged, 1 and 4 tokens.
      {0, 4, 1, 8192, {8192, 8192}, "noop", 128, 128, {}},
      {0, 4, 4, 2048, {2048, 1000, 0, 1}, "alibi", 128, 128, {}},
      {16, 4, 1, 8192, {8192, 8191, 17}, "noop", 128, 128, {}},
      {16, 4, 4, 1024, {1000, 1024, 16, 0}, "causal", 128, 128, {}},
      // Page sizes 1 .. 256, GQA 1 .. 8, head dims 64 .. 256 and qk != v.
      {1, 5, 1, 64, {17, 64, 1}, "softcap", 128, 128, {}},
      {2, 3, 2, 96, {95, 3}, "relative_bias", 64, 64, {}},
      {32, 7, 3, 512, {511, 300, 33}, "sliding_window", 128, 64, {}},
      {64, 8, 16, 512, {511, 400}, "document_causal", 64, 64, {}},
      {128, 2, 8, 1024, {1024, 129, 0}, "t5_bucketed_bias", 96, 96, {}},
      {256, 1, 1, 8448, {8193, 8193, 300}, "noop", 256, 256, {}},
      // Config corners: 1 stage, 32-key tiles on 2 warps, 128-key tiles, a fixed split count.
      {16, 4, 1, 2048, {2048, 2000}, "noop", 128, 128, {{"num_stages", 1}}},
      {0, 4, 1, 2048, {2048, 1}, "alibi", 128, 128, {{"block_n", 32}, {"num_warps", 2}}},
      {0,
       4,
       1,
       4096,
       {4096, 4000},
       "noop",
       128,
       128,
       {{"block_n", 128}, {"num_stages", 2}, {"num_splits", 7}}},
      // A chunk of 40 query tokens (more than the 16 of the decode dispatch): the forward on an
      // sm_90a device (docs/kernels/forward_sm90.md "e4m3 KV caches"), the decode kernels on
      // sm_89 / sm_90 (docs/kernels/decode.md "FP8 KV caches").
      {16, 2, 40, 256, {256, 100}, "noop", 128, 128, {}},
  };
  for (const Shape& sh : shapes) {
    Fp8Case c;
    c.mods = sh.mods;
    c.dtype = rng() % 2 ? DType::BF16 : DType::F16;
    c.batch = static_cast<int>(sh.lens.size());
    c.heads_kv = 1 + static_cast<int>(rng() % 2);
    c.gqa = sh.gqa;
    c.seqlen_q = sh.sq;
    c.capacity = sh.cap;
    c.lens = sh.lens;
    c.page_size = sh.page;
    c.dim_qk = sh.dqk;
    c.dim_v = sh.dv;
    c.config = sh.config;
    check_case(*ctx, c, rng, seed);
  }
}

// The mainloop converts e4m3 in registers (docs/kernels/decode.md "FP8 KV caches"): K's dims are
// read in a permuted order that Q's columns follow, V's output columns come out as even / odd
// dims that the epilogue reorders, an odd count of 16-dim chunks reads the zero chunk after the
// real dim. Every tile dim with even and odd chunk counts, qk != v, with bf16 and with f16 q.
TEST_CASE("decode fp8: head dims 48 .. 256 with bf16 and f16 q", "[gpu][decode][fp8]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!device_takes_e4m3(*ctx)) return;  // the first test case checks the error
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::pair<int, int>> dims = {{64, 64},  {128, 128}, {256, 256}, {48, 48},
                                                 {80, 112}, {208, 96},  {240, 256}, {128, 64}};
  for (const auto& [dqk, dv] : dims) {
    for (const DType dtype : {DType::BF16, DType::F16}) {
      Fp8Case c;
      c.mods = dqk == 80 ? "alibi" : "noop";
      c.dtype = dtype;
      c.batch = 2;
      c.heads_kv = 2;
      c.gqa = 4;
      c.seqlen_q = dqk == 48 ? 3 : 1;
      c.capacity = 1040;
      c.lens = {1040, 333};
      c.page_size = dqk == 208 ? 16 : 0;
      c.dim_qk = dqk;
      c.dim_v = dv;
      check_case(*ctx, c, rng, seed);
    }
  }
  // bf16 q far outside f16's range (up to ~5e6) and deep in its subnormals (~1e-7): the power of
  // two of the f16 mainloop keeps both exact; f16 q itself cannot hold them (bf16 only).
  for (const float gain : {1e6f, 1e-7f, 3e-30f}) {
    Fp8Case c;
    c.dtype = DType::BF16;
    c.batch = 2;
    c.heads_kv = 2;
    c.gqa = 4;
    c.capacity = 1040;
    c.lens = {1040, 333};
    c.page_size = 16;
    c.q_gain = gain;
    check_case(*ctx, c, rng, seed);
  }
}

TEST_CASE("decode fp8: e4m3 caches at small shapes (compute-sanitizer)",
          "[gpu][decode][fp8][small]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!device_takes_e4m3(*ctx)) return;  // the test case above checks the error
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (int page : {0, 1, 16}) {
    Fp8Case c;
    c.mods = "alibi";
    c.batch = 3;
    c.heads_kv = 2;
    c.gqa = 3;
    c.seqlen_q = 2;
    c.capacity = 272;
    c.lens = {272, 0, 97};
    c.page_size = page;
    c.dim_qk = c.dim_v = 64;
    c.config = {{"num_stages", page == 16 ? 1 : 3}, {"num_splits", 3}};
    check_case(*ctx, c, rng, seed);
  }
}

TEST_CASE("decode fp8: bad e4m3 caches fail before any launch, naming the tensor",
          "[gpu][decode][fp8]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const int B = 2, Hkv = 2, Hq = 4, D = 128, P = 4, ps = 16;
  DeviceTensor q = DeviceTensor::empty(*ctx, DType::BF16, {B, Hq, 1, D});
  DeviceTensor k = DeviceTensor::empty(*ctx, DType::E4M3, {P, ps, Hkv, D});
  DeviceTensor v = DeviceTensor::empty(*ctx, DType::E4M3, {P, ps, Hkv, D});
  DeviceTensor v16 = DeviceTensor::empty(*ctx, DType::BF16, {P, ps, Hkv, D});
  DeviceTensor table = DeviceTensor::empty(*ctx, DType::I32, {B, 2});
  DeviceTensor lens = DeviceTensor::empty(*ctx, DType::I32, {B});
  DeviceTensor scale = DeviceTensor::empty(*ctx, DType::F32, {Hkv});
  DeviceTensor scale3 = DeviceTensor::empty(*ctx, DType::F32, {3});
  DeviceTensor scale16 = DeviceTensor::empty(*ctx, DType::BF16, {Hkv});
  std::vector<float> host_scale(Hkv, 1.0f);
  KvCache cache;
  cache.seq_lens = lens.ref();
  cache.page_table = table.ref();
  cache.k_scale = scale.ref();
  cache.v_scale = scale.ref();
  auto call = [&](const KvCache& c, const DeviceTensor& vv) {
    AttentionOptions o;
    o.kv_cache = &c;
    (void)flex_attention(*ctx, q, k, vv, o);
  };
  KvCache c = cache;
  c.k_scale = {};
  CHECK_THROWS_WITH(call(c, v), Catch::Contains("an e4m3 KV cache needs k_scale: [Hkv] = [2] f32"));
  c = cache;
  c.v_scale = scale3.ref();
  CHECK_THROWS_WITH(call(c, v), Catch::Contains("v_scale has shape [3]; expected [Hkv] = [2]"));
  c = cache;
  c.k_scale = scale16.ref();
  CHECK_THROWS_WITH(call(c, v), Catch::Contains("k_scale has dtype bf16; expected f32"));
  c = cache;
  c.k_scale = TensorRef::contiguous(host_scale.data(), DType::F32, {Hkv});
  CHECK_THROWS_WITH(call(c, v), Catch::Contains("k_scale is on cpu but q is on cuda"));
  CHECK_THROWS_WITH(call(cache, v16),
                    Catch::Contains("k is e4m3 and v is bf16; an e4m3 KV cache has both"));
  // Scales with a bf16 cache are refused rather than ignored.
  DeviceTensor k16 = DeviceTensor::empty(*ctx, DType::BF16, {P, ps, Hkv, D});
  AttentionOptions o;
  o.kv_cache = &cache;
  CHECK_THROWS_WITH(flex_attention(*ctx, q, k16, v16, o),
                    Catch::Contains("the KV cache has k_scale but k and v are bf16"));
}
