// Chunked prefill on e4m3 KV caches (issue 31; docs/kernels/forward_sm90.md "e4m3 KV caches"):
// more than 16 query tokens against K / V pools or contiguous K / V in e4m3 with per-kv-head f32
// scales, q and out bf16 / f16, which on an sm_90a device run forward/sm90a_wgmma (its producer
// converts the tiles). Fresh random inputs every run (the seed is printed on failure), against
// the fp64 reference on the dequantized cache (k_e4m3 * k_scale[h], v_e4m3 * v_scale[h]); the
// conversion is exact, so the bf16 / f16 rule holds (docs/math.md "FP8 KV caches"). Page sizes 1
// .. 256, lengths 0 and inside a tile, shared and shuffled pages, GQA 1 / 4 / 8, mods that read
// buffers (ALiBi slopes, document ids, the chunk's offset). Skips without an sm_90a GPU (elsewhere
// the decode kernels run these calls: tests/gpu/test_decode_fp8.cpp).
#include <flexjit/attention.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>
#include <flexjit/paged_kv.h>

#include "gpu/GpuTestUtil.h"
#include "gpu/StandardBindings.h"
#include "ir/Evaluate.h"
#include "runtime/Decode.h"
#include "support/CpuReference.h"
#include "support/E4m3Cache.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <utility>

using namespace flexjit;
using namespace flexjit::test;

namespace {

struct PrefillCase {
  // A standard mods name, offset_causal (q_pos buffer), or blocks: kBlocks's mask_mod, through
  // a block mask built from it as well (with 192-row tiles, the union schedule).
  std::string mods = "offset_causal";
  DType dtype = DType::BF16;  // q and out
  int batch = 1, heads_kv = 1, gqa = 1, seqlen_q = 64, dim_qk = 128, dim_v = 128;
  int capacity = 128;     // Skv (contiguous) or max_pages * page_size
  std::vector<int> lens;  // per sequence
  int page_size = 0;      // 0: contiguous [B, Hkv, Skv, D] with seq_lens
  std::map<std::string, int64_t> config;
};

// The chunk at the end of each sequence: causal with the offset q_pos[b] = len[b] - Sq.
const char* kOffsetCausal = "buffer q_pos: i32[B]\nmask_mod = q_idx + q_pos[b] >= kv_idx";
const char* kBlocks = "mask_mod = kv_idx < 300 || (kv_idx >= 700 && kv_idx % 5 != q_idx)";

struct PrefillResult {
  ErrorStats out;
  double lse_max_err = 0;
  int64_t lse_mismatched_inf = 0;
  std::string plan;
};

PrefillResult run_case(Context& ctx, const PrefillCase& c, std::mt19937_64& rng) {
  const int B = c.batch, Hkv = c.heads_kv, Hq = Hkv * c.gqa, Sq = c.seqlen_q, cap = c.capacity;
  REQUIRE(static_cast<int>(c.lens.size()) == B);
  const E4m3Cache kv = random_e4m3_cache(rng, c);
  const HostTensor q = random_tensor(rng, c.dtype, {B, Hq, Sq, c.dim_qk});
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.dim_qk));
  const int ps = c.page_size;

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
  const std::vector<char> q_bytes = q.bytes();
  const TensorRef dq = dev(c.dtype, {B, Hq, Sq, c.dim_qk}, q_bytes.data());
  const TensorRef dk = dev(DType::E4M3, kv.k_shape, kv.k_store.data());
  const TensorRef dv = dev(DType::E4M3, kv.v_shape, kv.v_store.data());

  AttentionShape s;
  s.batch = B, s.heads_q = Hq, s.heads_kv = Hkv, s.seqlen_q = Sq, s.seqlen_kv = cap;
  s.head_dim_qk = c.dim_qk, s.head_dim_v = c.dim_v;
  const Mods mods = c.mods == "offset_causal" ? parse_mods(kOffsetCausal, "offset_causal.fx")
                    : c.mods == "blocks"      ? parse_mods(kBlocks, "blocks.fx")
                                              : standard_mods(c.mods);
  std::optional<DeviceBlockMask> bm;
  if (c.mods == "blocks") bm.emplace(create_block_mask(ctx, mods, 1, 1, Sq, cap, 128));
  std::map<std::string, HostBuffer> buffers;
  if (c.mods == "offset_causal") {
    std::vector<int32_t> q_pos(B);
    for (int b = 0; b < B; ++b)
      q_pos[b] = c.lens[b] - Sq;
    buffers["q_pos"] = host_buffer(DType::I32, {B}, q_pos);
  }
  std::vector<std::pair<std::string, double>> params;
  bind_standard_mods(mods, s, rng, buffers, params);
  ModBindings bindings;
  ir::EvalEnv env;
  for (auto& [name, hb] : buffers) {
    bindings.buffers.emplace_back(name, dev(hb.dtype, hb.shape, hb.bytes.data()));
    env.buffers[name] = ir::BufferView{hb.bytes.data(), hb.dtype, hb.shape, {}};
  }
  bindings.params = params;
  for (auto& [n, val] : params)
    env.params[n] = val;

  DeviceTensor out = DeviceTensor::empty(ctx, c.dtype, {B, Hq, Sq, c.dim_v});
  DeviceTensor lse = DeviceTensor::empty(ctx, DType::F32, {B, Hq, Sq});
  out.fill_bytes(0xFF);  // NaN: an element the kernel does not write fails
  lse.fill_bytes(0xFF);
  AttentionOptions o;
  o.mods = mods;
  o.bindings = bindings;
  o.kv_cache = &cache;
  if (bm) o.block_mask = &*bm;
  o.config.params = c.config;
  o.scale = scale;
  PrefillResult r;
  r.plan = runtime::describe_kv_cache_plan(ctx, dq, dk, dv, o);
  flex_attention_into(ctx, dq, dk, dv, out, &lse.ref(), o);
  ctx.synchronize();
  const std::vector<float> got = download(out), got_lse = download(lse);

  // The reference: fp64 on the dequantized logical cache, the lengths as a mask.
  const Mods ref_mods = combine(mods, parse_mods("buffer fj_ref_len: i32[B]\n"
                                                 "mask_mod = kv_idx < fj_ref_len[b]",
                                                 "reference_lengths.fx"));
  ir::EvalEnv ref_env = env;
  ref_env.buffers["fj_ref_len"] = ir::BufferView{c.lens.data(), DType::I32, {B}, {}};
  const ReferenceResult rr = cpu_reference_attention(ref_mods, s, q.values, kv.k.dequantized,
                                                     kv.v.dequantized, scale, ref_env);
  r.out = compare(got, rr.out);
  const LseStats lse_err = compare_lse(got_lse, rr.lse);
  r.lse_max_err = lse_err.max_err;
  r.lse_mismatched_inf = lse_err.mismatched_inf;
  return r;
}

void check_case(Context& ctx, const PrefillCase& c, std::mt19937_64& rng, uint64_t seed) {
  const PrefillResult r = run_case(ctx, c, rng);
  const std::string summary = fmt::format(
      "e4m3 cache prefill {} q {} B={} Hkv={} gqa={} Sq={} cap={} lens=[{}] page={} D={}/{} [{}]: "
      "out {}; lse max rel err {:.3e}, {} -inf mismatches (seed {})\n  plan: {}",
      c.mods, to_string(c.dtype), c.batch, c.heads_kv, c.gqa, c.seqlen_q, c.capacity,
      fmt::join(c.lens, ","), c.page_size, c.dim_qk, c.dim_v, fmt::join(c.config, " "), r.out.str(),
      r.lse_max_err, r.lse_mismatched_inf, seed, r.plan);
  INFO(summary);
  // A prefill chunk (more than 16 query tokens) takes the forward on the cache, with the e4m3
  // flag (src/runtime/Decode.cpp, choose_kv_cache_plan).
  CHECK_THAT(r.plan, Catch::Contains("forward/sm90a_wgmma") && Catch::Contains("kv_e4m3=1"));
  if (c.config.count("block_m") > 0)
    CHECK_THAT(r.plan, Catch::Contains(fmt::format("block_m={}", c.config.at("block_m"))));
  // docs/math.md "FP8 KV caches": the conversion is exact, so the bf16 / f16 rule holds.
  CHECK(r.out.nonfinite == 0);
  CHECK(r.out.rel <= tolerance(c.dtype));
  CHECK(r.lse_mismatched_inf == 0);
  CHECK(r.lse_max_err <= 1e-2);
  std::printf("  %s\n", summary.c_str());
}

bool on_sm90a(Context& ctx) {
  return ctx.arch() == "sm_90a";
}

// A prefill chunk's shape on an e4m3 cache of `page`-key pages (0: ragged contiguous K / V).
struct PrefillShape {
  int page, gqa, sq, cap;
  std::vector<int> lens;
  const char* mods;
  int dqk, dv;
};

// Each shape's case (q bf16 or f16 and 1 or 2 kv heads at random, `config` asked for) against
// the fp64 reference.
void check_shapes(Context& ctx, const std::vector<PrefillShape>& shapes,
                  const std::map<std::string, int64_t>& config, std::mt19937_64& rng,
                  uint64_t seed) {
  for (const PrefillShape& sh : shapes) {
    PrefillCase c;
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
    c.config = config;
    check_case(ctx, c, rng, seed);
  }
}

}  // namespace

TEST_CASE("fp8 prefill: e4m3 caches of every page size, lengths 0 and inside a tile, GQA 1/4/8",
          "[gpu][prefill][fp8]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!on_sm90a(*ctx)) {
    WARN("skipped: the forward reads e4m3 KV caches on sm_90a only (this GPU: " << ctx->arch()
                                                                                << ")");
    return;
  }
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<PrefillShape> shapes = {
      // Contiguous K / V with lengths: full, cut inside a tile, 0, shorter than the chunk.
      {0, 4, 300, 1024, {1024, 700, 0, 129}, "offset_causal", 128, 128},
      // Every power-of-two page size: 1 .. 4 keys (gathered), 8 .. 64 (per-page boxes on bf16;
      // here converted like every e4m3 tile), 128 and 256 (a page holds whole tiles).
      {1, 1, 200, 256, {256, 255, 77}, "alibi", 128, 128},
      {2, 8, 130, 512, {511, 3}, "document", 64, 64},
      {4, 4, 64, 512, {512, 400}, "offset_causal", 96, 96},
      {8, 4, 257, 768, {768, 760, 0}, "offset_causal", 128, 128},
      {16, 4, 2048 / 8, 1024, {1024, 1024, 500}, "offset_causal", 128, 128},
      {32, 8, 100, 512, {300, 511}, "softcap", 128, 64},
      {64, 1, 129, 1024, {1000, 1024}, "alibi_causal", 256, 256},
      {128, 4, 96, 1024, {1024, 129, 0}, "relative_bias", 192, 128},
      {256, 8, 333, 1024, {1024, 1023, 1}, "offset_causal", 64, 64},
  };
  check_shapes(*ctx, shapes, {}, rng, seed);
}

TEST_CASE("fp8 prefill: both q dtypes, KV tiles of 64 and 192 keys, 2 and 3 stages",
          "[gpu][prefill][fp8]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!on_sm90a(*ctx)) {
    WARN("skipped: the forward reads e4m3 KV caches on sm_90a only");
    return;
  }
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (DType dtype : {DType::BF16, DType::F16}) {
    for (const std::map<std::string, int64_t>& config : std::vector<std::map<std::string, int64_t>>{
             {}, {{"block_n", 64}}, {{"block_n", 192}, {"num_stages", 2}}, {{"num_stages", 3}}}) {
      PrefillCase c;
      c.dtype = dtype;
      c.batch = 2;
      c.heads_kv = 2;
      c.gqa = 4;
      c.seqlen_q = 200;
      c.capacity = 768;
      c.lens = {768, 450};
      c.page_size = 16;
      c.dim_qk = c.dim_v = 64;
      c.config = config;
      check_case(*ctx, c, rng, seed);
    }
  }
}

// 192-row tiles on an e4m3 cache (three consumer warpgroups; the loaders stage and convert every
// tile in 32 registers): gathers of 1-key pages, 16- and 256-key pages, ragged contiguous K / V,
// lengths 0 and inside a tile, GQA, d 64 / 96 / 128, a block mask's union schedule (the
// offset_causal chunk is a mask_mod without one, `blocks` a block mask whose entries carry status
// bits above the tile; document masks load at kv_idx).
TEST_CASE("fp8 prefill: e4m3 caches in 192-row tiles", "[gpu][prefill][fp8]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!on_sm90a(*ctx)) {
    WARN("skipped: the forward reads e4m3 KV caches on sm_90a only");
    return;
  }
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<PrefillShape> shapes = {
      {0, 4, 300, 1024, {1024, 700, 0, 129}, "offset_causal", 128, 128},
      {1, 1, 200, 256, {256, 255, 77}, "alibi", 128, 128},
      {16, 4, 385, 1024, {1024, 1000, 500}, "offset_causal", 128, 128},
      {256, 8, 333, 1024, {1024, 1023, 1}, "offset_causal", 64, 64},
      {16, 2, 200, 768, {768, 450, 0}, "document", 96, 96},
      {4, 4, 192, 512, {512, 400}, "softcap", 128, 128},
      {16, 2, 200, 1024, {1024, 800, 0}, "blocks", 128, 128},
      {0, 4, 130, 1024, {1024, 513}, "blocks", 64, 64},
  };
  check_shapes(*ctx, shapes, {{"block_m", 192}}, rng, seed);
}

TEST_CASE("fp8 prefill: e4m3 caches at small shapes (compute-sanitizer)",
          "[gpu][prefill][fp8][small]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!on_sm90a(*ctx)) {
    WARN("skipped: the forward reads e4m3 KV caches on sm_90a only");
    return;
  }
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (int page : {0, 1, 16, 128}) {
    PrefillCase c;
    c.dtype = page % 2 ? DType::F16 : DType::BF16;
    c.batch = 3;
    c.heads_kv = 1;
    c.gqa = 4;
    c.seqlen_q = 40;
    c.capacity = 256;
    c.lens = {256, 0, 131};
    c.page_size = page;
    c.dim_qk = c.dim_v = 64;
    check_case(*ctx, c, rng, seed);
  }
}
