// flex_attention on the GPU against the CPU fp64 reference (small shapes) and the naive fp32
// GPU reference (large shapes), on fresh random inputs every run (the seed is printed on
// failure). Skips with "skipped: no GPU (...)" on machines without one.
#include <flexjit/attention.h>
#include <flexjit/block_mask.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>

#include "Pipeline.h"
#include "binding/ModArgs.h"
#include "binding/ModParamLayout.h"
#include "device/CudaDriver.h"
#include "device/Device.h"
#include "device/MaskScheduleCache.h"
#include "device/ModuleCache.h"
#include "gpu/GpuTestUtil.h"
#include "gpu/StandardBindings.h"
#include "kernels/forward/Sm90Wgmma.h"
#include "support/CpuReference.h"
#include "support/KernelDescs.h"
#include "support/RandomExpr.h"
#include "support/ReferenceAttention.h"
#include "support/ReferenceKernel.h"
#include "util/Npy.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "support/CliPath.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>

using namespace flexjit;
using flexjit::test::run_cli;
using namespace flexjit::test;

namespace {

enum class Layout { Contiguous, SlicedTransposed };

struct Case {
  std::string label;
  DType dtype = DType::BF16;
  AttentionShape shape;
  Mods mods;
  std::map<std::string, HostBuffer> buffers;
  std::vector<std::pair<std::string, double>> params;
  std::optional<float> scale;
  const DeviceBlockMask* block_mask = nullptr;
  Layout layout = Layout::Contiguous;
  bool force_gpu_reference = false;
  BlockConfig config;  // zeros: the variant's defaults
};

struct CaseResult {
  std::vector<float> out, lse;
  ErrorStats out_err;
  double lse_max_err = 0;
  int64_t lse_mismatched_inf = 0;
  bool ref_finite = true;
};

// Buffers and params for the standard mods (and the block-mask builders' doc_ids), sized so that
// every index the mods form is in range for the case's shape.
void bind_standard(Case& c, std::mt19937_64& rng) {
  bind_standard_mods(c.mods, c.shape, rng, c.buffers, c.params);
}

// q / k / v on the device in the case's layout. SlicedTransposed stores [B, S, H + 2, D] and
// views heads 1..H as [B, H, S, D] (strides [S·(H+2)·D, D, (H+2)·D, 1]); the unused heads hold
// NaN so that a read outside the view poisons the result.
struct DeviceInput {
  DeviceTensor storage;
  TensorRef view;
};

DeviceInput place(Context& ctx, const HostTensor& t, Layout layout) {
  DeviceInput d;
  if (layout == Layout::Contiguous) {
    d.storage = upload(ctx, t);
    d.view = d.storage.ref();
    return d;
  }
  const int64_t B = t.shape[0], H = t.shape[1], S = t.shape[2], D = t.shape[3], Hb = H + 2;
  HostTensor big;
  big.dtype = t.dtype;
  big.shape = {B, S, Hb, D};
  big.values.assign(static_cast<size_t>(B * S * Hb * D), std::numeric_limits<float>::quiet_NaN());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t x = 0; x < D; ++x)
          big.values[((b * S + s) * Hb + h + 1) * D + x] = t.values[((b * H + h) * S + s) * D + x];
  d.storage = upload(ctx, big);
  d.view = d.storage.ref();
  d.view.data = static_cast<char*>(d.view.data) + D * dtype_size(t.dtype);
  d.view.shape = t.shape;
  d.view.strides = {S * Hb * D, D, Hb * D, 1};
  return d;
}

CaseResult run_case(Context& ctx, Case& c, std::mt19937_64& rng) {
  const AttentionShape& s = c.shape;
  INFO("case: " << c.label << " (" << to_string(c.dtype) << " B=" << s.batch << " Hq=" << s.heads_q
                << " Hkv=" << s.heads_kv << " Sq=" << s.seqlen_q << " Skv=" << s.seqlen_kv
                << " D=" << s.head_dim_qk << "/" << s.head_dim_v << " mods " << c.mods.name << ")");
  const HostTensor q = random_tensor(rng, c.dtype, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_qk});
  const HostTensor k =
      random_tensor(rng, c.dtype, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_qk});
  const HostTensor v =
      random_tensor(rng, c.dtype, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_v});
  const DeviceInput dq = place(ctx, q, c.layout), dk = place(ctx, k, c.layout),
                    dv = place(ctx, v, c.layout);

  std::vector<DeviceTensor> keep;
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

  DeviceTensor out =
      DeviceTensor::empty(ctx, c.dtype, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v});
  DeviceTensor lse = DeviceTensor::empty(ctx, DType::F32, {s.batch, s.heads_q, s.seqlen_q});
  out.fill_bytes(0xFF);  // NaN everywhere: an element the kernel does not write fails
  lse.fill_bytes(0xFF);
  AttentionOptions o;
  o.mods = c.mods;
  o.block_mask = c.block_mask;
  o.bindings = bindings;
  o.scale = c.scale;
  o.config = c.config;
  flex_attention_into(ctx, dq.view, dk.view, dv.view, out, &lse.ref(), o);
  ctx.synchronize();

  CaseResult r;
  r.out = download(out);
  r.lse = download(lse);
  std::vector<double> ref_out, ref_lse;
  const double work = static_cast<double>(s.batch) * s.heads_q * s.seqlen_q * s.seqlen_kv;
  // The CPU backend's fp64 mode handles small and medium shapes in seconds.
  if (!c.force_gpu_reference && work <= (1 << 23)) {
    const float scale = c.scale ? *c.scale : static_cast<float>(1.0 / std::sqrt(s.head_dim_qk));
    // The block mask's mask_mod applies when the mods have none (as flex_attention does).
    Mods ref_mods = c.mods;
    if (!ref_mods.mask_mod.defined() && c.block_mask &&
        c.block_mask->meta().mods.mask_mod.defined())
      ref_mods = combine(c.mods, c.block_mask->meta().mods);
    ReferenceResult rr =
        cpu_reference_attention(ref_mods, s, q.values, k.values, v.values, scale, env);
    ref_out = std::move(rr.out);
    ref_lse = std::move(rr.lse);
  } else {
    const DeviceTensor fq = upload_f32(ctx, q), fk = upload_f32(ctx, k), fv = upload_f32(ctx, v);
    DeviceTensor ro = DeviceTensor::empty(ctx, DType::F32, out.ref().shape);
    DeviceTensor rl = DeviceTensor::empty(ctx, DType::F32, lse.ref().shape);
    Mods ref_mods = c.mods;
    if (!ref_mods.mask_mod.defined() && c.block_mask &&
        c.block_mask->meta().mods.mask_mod.defined())
      ref_mods = combine(c.mods, c.block_mask->meta().mods);
    test::reference_attention_into(ctx, fq, fk, fv, ro, &rl.ref(), ref_mods, bindings, c.scale);
    for (float x : download(ro))
      ref_out.push_back(x);
    for (float x : download(rl))
      ref_lse.push_back(x);
  }
  for (double x : ref_out)
    r.ref_finite &= std::isfinite(x);
  r.out_err = compare(r.out, ref_out);
  const LseStats lse_err = compare_lse(r.lse, ref_lse);
  r.lse_max_err = lse_err.max_err;
  r.lse_mismatched_inf = lse_err.mismatched_inf;
  return r;
}

void check_case(Context& ctx, Case& c, std::mt19937_64& rng, uint64_t seed) {
  const CaseResult r = run_case(ctx, c, rng);
  const AttentionShape& s = c.shape;
  const std::string summary = fmt::format(
      "{} {} B={} Hq={} Hkv={} Sq={} Skv={} D={}/{}: out {}; lse max rel err {:.3e}, "
      "{} -inf mismatches (seed {})",
      c.label, to_string(c.dtype), s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_kv,
      s.head_dim_qk, s.head_dim_v, r.out_err.str(), r.lse_max_err, r.lse_mismatched_inf, seed);
  INFO(summary);
  if (!r.ref_finite) {
    WARN("reference has NaN/Inf; compared only finite elements: " << summary);
  }
  CHECK(r.out_err.nonfinite == 0);
  CHECK(r.out_err.rel <= tolerance(c.dtype));
  CHECK(r.lse_mismatched_inf == 0);
  CHECK(r.lse_max_err <= 1e-2);
  std::printf("  %s\n", summary.c_str());
}

AttentionShape make_shape(int B, int Hq, int Hkv, int Sq, int Skv, int Dqk, int Dv) {
  AttentionShape s;
  s.batch = B, s.heads_q = Hq, s.heads_kv = Hkv, s.seqlen_q = Sq, s.seqlen_kv = Skv;
  s.head_dim_qk = Dqk, s.head_dim_v = Dv;
  return s;
}

template <typename T>
const T& pick(std::mt19937_64& rng, const std::vector<T>& v) {
  return v[rng() % v.size()];
}

}  // namespace

TEST_CASE("forward: every standard mod matches the reference", "[gpu][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::forward_families(*ctx)));
  test::ForwardFamilyScope family_scope(family);
  INFO("forward family: " << family);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (const std::string& name : standard_mod_names()) {
    for (int big = 0; big < 2; ++big) {
      Case c;
      c.label = name + (big ? " (GPU reference)" : " (CPU reference)");
      c.dtype = rng() % 2 ? DType::BF16 : DType::F16;
      c.mods = standard_mods(name);
      c.shape = big ? make_shape(2, 4, 2, 1000, 1000, 128, 128)
                    : make_shape(1, 2, 1, 129, 200, pick(rng, std::vector<int>{64, 128}), 64);
      c.force_gpu_reference = big;
      bind_standard(c, rng);
      check_case(*ctx, c, rng, seed);
    }
  }
}

TEST_CASE("forward: a zero or negative softmax scale matches the reference",
          "[gpu][forward][small]") {
  // The Hopper forward takes positive scales only (InputFacts::scale_positive); these run on
  // the sm_80 kernel there and must give the reference's answer everywhere.
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (const char* name : {"noop", "causal", "alibi_causal"}) {
    for (float scale : {-0.125f, 0.0f}) {
      Case c;
      c.label = fmt::format("{} scale {}", name, scale);
      c.dtype = rng() % 2 ? DType::BF16 : DType::F16;
      c.mods = standard_mods(name);
      c.shape = make_shape(1, 2, 1, 129, 200, 128, 128);
      c.scale = scale;
      bind_standard(c, rng);
      check_case(*ctx, c, rng, seed);
    }
  }
}

TEST_CASE("forward: random shapes, GQA, head dims, dtypes and layouts", "[gpu][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::forward_families(*ctx)));
  test::ForwardFamilyScope family_scope(family);
  INFO("forward family: " << family);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<int> lengths = {1, 17, 127, 128, 129, 1000, 4096};
  const std::vector<int> ratios = {1, 2, 3, 4, 8};
  const std::vector<std::pair<int, int>> dims = {{64, 64}, {128, 128}, {256, 256}, {128, 64}};
  const std::vector<std::string> mods = {"noop", "causal", "alibi_causal", "softcap",
                                         "sliding_window"};
  for (int i = 0; i < 16; ++i) {
    Case c;
    const int ratio = pick(rng, ratios);
    const int hkv = 1 + rng() % 2;
    const int sq = pick(rng, lengths), skv = rng() % 3 == 0 ? sq : pick(rng, lengths);
    const auto [dqk, dv] = pick(rng, dims);
    const int batch = sq * skv >= 1000 * 1000 ? 1 : 1 + rng() % 2;
    c.shape = make_shape(batch, hkv * ratio, hkv, sq, skv, dqk, dv);
    c.dtype = rng() % 2 ? DType::BF16 : DType::F16;
    c.mods = standard_mods(pick(rng, mods));
    c.layout = rng() % 2 ? Layout::SlicedTransposed : Layout::Contiguous;
    if (rng() % 4 == 0) c.scale = 0.5f / std::sqrt(static_cast<float>(dqk));
    c.label = fmt::format("random shape {} ({})", i,
                          c.layout == Layout::Contiguous ? "contiguous" : "sliced+transposed");
    bind_standard(c, rng);
    check_case(*ctx, c, rng, seed);
  }
}

// The sm90a_wgmma configs that no default selects (the head-dim-64 candidates of issue 10:
// three consumer warpgroups with block_m 192, block_n 176 / 192, 2 or 4 stages) on ragged
// lengths, GQA, every mod kind (none, mask only, score_mod, buffer loads) and a scale other
// than the default; docs/kernels/forward_sm90.md "Configs". Three test
// cases share them out (tile shapes / q tiles / persistent), so that scripts/gpu_suite.sh's
// parallel shards run them side by side.
namespace {

struct Sm90Cfg {
  int block_m, block_n, num_stages, dqk, dv;
  int q_tiles = 1;
  int persistent = -1;
};

void check_sm90_configs(Context& ctx, const std::vector<Sm90Cfg>& configs) {
  if (!sm90a_wgmma_selectable(ctx)) return;
  test::ForwardFamilyScope family_scope("sm90a_wgmma");
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::string> mods = {
      "noop",           "causal",          "alibi_causal",
      "softcap_causal", "document_causal", "relative_bias_causal"};
  for (const Sm90Cfg& k : configs) {
    for (size_t m = 0; m < mods.size(); ++m) {
      Case c;
      const bool big = m % 2 == 0;
      if (k.persistent == 1) {
        // At 128 rows 576 / 384 pairs of query tiles (8 and 3 per head, the odd one alone), or
        // 1152 / 576 single tiles: every CTA of a GPU with up to 132 SMs walks several, over
        // heads and batches.
        c.shape = big ? make_shape(2, 72, 8, 1000, 777, k.dqk, k.dv)
                      : make_shape(3, 64, 4, 333, 200, k.dqk, k.dv);
      } else {
        c.shape = big              ? make_shape(1, 4, 2, 1000, 777, k.dqk, k.dv)
                  : k.q_tiles == 2 ? make_shape(2, 3, 1, 333, 200, k.dqk, k.dv)
                                   : make_shape(2, 3, 1, 200, 333, k.dqk, k.dv);
      }
      c.dtype = rng() % 2 ? DType::BF16 : DType::F16;
      c.mods = standard_mods(mods[m]);
      // A scale other than the default (the kernel takes positive ones only; zero and negative
      // scales run elsewhere: "a zero or negative softmax scale" above).
      if (m == 1) c.scale = 0.3f;
      c.config.block_m = k.block_m;
      c.config.block_n = k.block_n;
      c.config.num_stages = k.num_stages;
      if (k.q_tiles != 0) c.config.params["q_tiles"] = k.q_tiles;
      if (k.persistent != 0) c.config.params["persistent"] = k.persistent == 1 ? 1 : 0;
      c.label =
          fmt::format("{}x{} {} stages {} q tiles{} d {}/{} {}", k.block_m, k.block_n, k.num_stages,
                      k.q_tiles, k.persistent == 1 ? " persistent" : "", k.dqk, k.dv, mods[m]);
      bind_standard(c, rng);
      check_case(ctx, c, rng, seed);
    }
  }
}

}  // namespace

// Tile shapes and stages other than the defaults.
TEST_CASE("forward: sm90a_wgmma's non-default tiles and stages match the reference",
          "[gpu][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  check_sm90_configs(*ctx, {{192, 128, 4, 64, 64},
                            {192, 128, 2, 64, 64},
                            {192, 64, 4, 64, 64},
                            {128, 192, 4, 64, 64},
                            {128, 176, 4, 64, 64},
                            {192, 128, 3, 128, 64},
                            {128, 192, 2, 128, 64},
                            {128, 128, 3, 64, 64}});
}

// q_tiles 2: pairs of query tiles per CTA (an odd count of them leaves one CTA a single tile),
// with and without the intra-warpgroup overlap (d_v 256), with three consumers.
TEST_CASE("forward: sm90a_wgmma with two query tiles per CTA matches the reference",
          "[gpu][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  check_sm90_configs(*ctx, {{128, 128, 4, 64, 64, 2},
                            {128, 128, 2, 128, 128, 2},
                            {128, 64, 2, 256, 256, 2},
                            {192, 128, 4, 64, 64, 2}});
}

// persistent: more claims than SMs (each CTA walks several, over heads and batches), d 64 and
// 128, qk != v, two and three consumers; claims of pairs (q_tiles 2) and of single tiles
// (q_tiles 1).
TEST_CASE("forward: sm90a_wgmma's persistent CTAs match the reference", "[gpu][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  check_sm90_configs(*ctx, {{128, 128, 4, 64, 64, 2, 1},
                            {128, 128, 2, 128, 128, 2, 1},
                            {128, 64, 2, 128, 64, 2, 1},
                            {192, 128, 4, 64, 64, 2, 1},
                            {192, 128, 2, 128, 128, 2, 1}});
}

TEST_CASE("forward: sm90a_wgmma's persistent CTAs claiming single tiles match the reference",
          "[gpu][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  check_sm90_configs(*ctx, {{192, 128, 2, 128, 128, 1, 1},
                            {128, 128, 2, 128, 128, 1, 1},
                            {192, 128, 4, 64, 64, 1, 1},
                            {128, 64, 2, 128, 64, 1, 1}});
}

// The persistent CTAs' claims at shapes small enough for compute-sanitizer (racecheck and
// memcheck of the tile slot's hand-over, the claims under a block mask in groups of heads):
// many heads of two query tiles each, so every CTA claims several; the defaults (single tiles
// at d 64 and d 128's 192 rows) and pairs.
TEST_CASE("forward: sm90a_wgmma's persistent claims at small shapes", "[gpu][forward][small]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!sm90a_wgmma_selectable(*ctx)) return;
  test::ForwardFamilyScope family_scope("sm90a_wgmma");
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (int d : {64, 128}) {
    for (int q_tiles : {0, 2}) {
      for (const char* name : {"noop", "causal", "document_causal"}) {
        Case c;
        c.dtype = rng() % 2 ? DType::BF16 : DType::F16;
        c.mods = standard_mods(name);
        c.shape = make_shape(2, 160, 40, 300, 350, d, d);
        if (q_tiles != 0) c.config.params["q_tiles"] = q_tiles;
        c.label = fmt::format("d {} {} {}", d, q_tiles == 2 ? "pairs" : "default", name);
        bind_standard(c, rng);
        check_case(*ctx, c, rng, seed);
      }
    }
  }
}

// Loads at ±(q_idx - kv_idx) + (h, params) are the score_mod's diagonal load (kFjDiagLoad:
// sm90a_wgmma reads a tile's diagonals once per warp and hands each score its value by shuffles):
// a reversed sign into a per-head f16 table, a load reached only under a where(), two sites of
// one table (the first per diagonal, the second per score); ragged lengths (diagonals only in
// part inside the problem), GQA, head dims 64 and 128, and on sm90a_wgmma three consumer
// warpgroups and wide KV tiles. Every family.
TEST_CASE("forward: score_mod loads along the tile's diagonals match the reference",
          "[gpu][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::forward_families(*ctx)));
  test::ForwardFamilyScope family_scope(family);
  INFO("forward family: " << family);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  struct Shape {
    int b, hq, hkv, sq, skv, d;
    int block_m = 0, block_n = 0;  // 0: the default (sm90a_wgmma only otherwise)
  };
  std::vector<Shape> shapes = {{2, 4, 2, 200, 321, 128},
                               {1, 3, 1, 129, 1000, 64},
                               {1, 2, 2, 1000, 77, 64},
                               {1, 2, 1, 256, 256, 128}};
  if (family == "sm90a_wgmma") {
    shapes.push_back({1, 2, 1, 333, 500, 64, 192, 0});
    shapes.push_back({2, 2, 2, 300, 401, 64, 0, 192});
  }
  for (const DiagonalSiteMod& m : diagonal_site_mods(DType::F16)) {
    for (const Shape& sh : shapes) {
      Case c;
      c.mods = parse_mods(m.text);
      c.dtype = rng() % 2 ? DType::BF16 : DType::F16;
      c.shape = make_shape(sh.b, sh.hq, sh.hkv, sh.sq, sh.skv, sh.d, sh.d);
      c.config.block_m = sh.block_m;
      c.config.block_n = sh.block_n;
      c.label = fmt::format("{} (block {}x{})", m.label, sh.block_m, sh.block_n);
      bind_diagonal_site_mod(m, DType::F16, c.shape, rng, c.buffers, c.params);
      bind_standard(c, rng);
      check_case(*ctx, c, rng, seed);
    }
  }
}

// fp32 inputs run on tf32 tensor cores (10-bit mantissa operands, fp32 accumulate); the issue's
// bound for them is ‖out − ref‖ / ‖ref‖ ≤ 1e-3 against the fp64 reference.
TEST_CASE("forward: fp32 inputs on tf32 tensor cores match the fp64 reference",
          "[gpu][forward][tf32]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  constexpr double kTf32Tolerance = 1e-3;
  const std::vector<int> lengths = {17, 128, 129, 1000};
  const std::vector<std::pair<int, int>> dims = {{64, 64}, {128, 128}, {256, 256}, {128, 64}};
  int cases = 0;
  for (const char* mod : {"noop", "causal", "alibi", "softcap"}) {
    for (int i = 0; i < 3; ++i) {
      Case c;
      const int sq = pick(rng, lengths), skv = i == 0 ? sq : pick(rng, lengths);
      const auto [dqk, dv] = dims[(cases++) % dims.size()];
      const int ratio = i == 2 ? 2 : 1;  // GQA 2
      c.shape = make_shape(1, 2 * ratio, 2, sq, skv, dqk, dv);
      c.dtype = DType::F32;
      c.mods = standard_mods(mod);
      c.layout = rng() % 2 ? Layout::SlicedTransposed : Layout::Contiguous;
      c.label = fmt::format("tf32 {} {}", mod,
                            c.layout == Layout::Contiguous ? "contiguous" : "sliced+transposed");
      bind_standard(c, rng);
      INFO(c.label << " Sq=" << sq << " Skv=" << skv << " D=" << dqk << "/" << dv
                   << " gqa=" << ratio);
      // out and lse start as NaN (run_case poisons them): every element must be written.
      const CaseResult r = run_case(*ctx, c, rng);
      const std::string summary =
          fmt::format("{} Sq={} Skv={} D={}/{} gqa={}: out {}; lse {:.3e}", c.label, sq, skv, dqk,
                      dv, ratio, r.out_err.str(), r.lse_max_err);
      INFO(summary);
      REQUIRE(r.ref_finite);
      CHECK(r.out_err.nonfinite == 0);
      CHECK(r.out_err.rel <= kTf32Tolerance);
      CHECK(r.lse_mismatched_inf == 0);
      CHECK(r.lse_max_err <= 5e-3);
      std::printf("  %s\n", summary.c_str());
    }
  }
}

TEST_CASE("forward: random mods", "[gpu][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::forward_families(*ctx)));
  test::ForwardFamilyScope family_scope(family);
  INFO("forward family: " << family);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  RandomExprGen::Options go;
  go.allow_buffers = false;  // random indices would read out of range; params only
  go.allow_special_floats = false;
  go.allow_score = false;
  RandomExprGen gen(seed, go);
  for (int i = 0; i < 8; ++i) {
    // score + f(b, h, q, kv): continuous in the score, so f32-vs-f64 rounding of q·k cannot
    // flip a discontinuity; the mask is any random predicate.
    // Clamped so that a huge bias cannot turn a one-ulp difference in q·k into a visible
    // change of the softmax weights.
    const Expr bias = min(max(gen.expr(ScalarType::F32, 3), Expr(-8.0f)), Expr(8.0f));
    const Expr mask = gen.expr(ScalarType::Bool, 3);
    Case c;
    c.mods = Mods::from([&](Expr s, Expr, Expr, Expr, Expr) { return s + bias; },
                        [&](Expr, Expr, Expr, Expr) { return mask; });
    c.mods.name = fmt::format("random mods {}", i);
    c.label = c.mods.to_text();
    for (const Param& p : c.mods.params) {
      if (p.decl()->default_value) continue;
      c.params.emplace_back(p.name(), p.type() == ScalarType::F32
                                          ? std::uniform_real_distribution<double>(-2, 2)(rng)
                                          : static_cast<double>(1 + rng() % 7));
    }
    c.shape = make_shape(1, 2, 1, 1 + rng() % 200, 1 + rng() % 300, 64, 64);
    c.dtype = DType::F16;
    check_case(*ctx, c, rng, seed);
  }
}

TEST_CASE("forward: fully masked rows give 0 and lse -inf", "[gpu][forward][small]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::forward_families(*ctx)));
  test::ForwardFamilyScope family_scope(family);
  INFO("forward family: " << family);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  // Head dim 64 as well (its own tiles and stage counts in each family).
  for (const int dim : {128, 64}) {
    INFO("head dim " << dim);
    Case c;
    c.label = "rows q % 3 == 1 masked";
    c.mods = parse_mods("mask_mod = q_idx % 3 != 1 && kv_idx <= q_idx");
    c.shape = make_shape(1, 2, 2, 300, 300, dim, dim);
    const CaseResult r = run_case(*ctx, c, rng);
    for (int h = 0; h < 2; ++h) {
      for (int qi = 1; qi < 300; qi += 3) {
        CHECK(std::isinf(r.lse[h * 300 + qi]));
        CHECK(r.lse[h * 300 + qi] < 0);
        for (int d = 0; d < dim; ++d) {
          if (r.out[(h * 300 + qi) * dim + d] != 0.0f) {
            FAIL("row " << qi << " of head " << h
                        << " is not zero: " << r.out[(h * 300 + qi) * dim + d]);
          }
        }
      }
    }
    CHECK(r.out_err.nonfinite == 0);
    CHECK(r.out_err.rel <= tolerance(c.dtype));
  }
}

TEST_CASE("forward: zero-length Q and KV", "[gpu][forward][small]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::forward_families(*ctx)));
  test::ForwardFamilyScope family_scope(family);
  INFO("forward family: " << family);
  std::mt19937_64 rng(fresh_seed());
  for (DType dt : {DType::BF16, DType::F16}) {
    const HostTensor q = random_tensor(rng, dt, {2, 4, 33, 64});
    const HostTensor k0 = random_tensor(rng, dt, {2, 2, 0, 64});
    const DeviceTensor dq = upload(*ctx, q), dk = upload(*ctx, k0);
    // Zero-length KV: out = 0, lse = -inf everywhere.
    AttentionOptions o;
    o.mods = standard_mods("causal");
    o.return_lse = true;
    AttentionResult r = flex_attention(*ctx, dq, dk, dk, o);
    ctx->synchronize();
    for (float x : download(r.out))
      REQUIRE(x == 0.0f);
    for (float x : download(r.lse))
      REQUIRE((std::isinf(x) && x < 0));
    // Zero-length Q: nothing to compute, no error, empty outputs.
    const HostTensor q0 = random_tensor(rng, dt, {2, 4, 0, 64});
    const HostTensor k = random_tensor(rng, dt, {2, 2, 50, 64});
    const DeviceTensor dq0 = upload(*ctx, q0), dk1 = upload(*ctx, k);
    AttentionResult r0 = flex_attention(*ctx, dq0, dk1, dk1, o);
    ctx->synchronize();
    CHECK(r0.out.ref().shape == std::vector<int64_t>{2, 4, 0, 64});
    CHECK(r0.lse.ref().numel() == 0);
  }
}

TEST_CASE("forward: a new param value does not recompile and changes the answer",
          "[gpu][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  Case c;
  c.label = "softcap cap=30";
  c.mods = standard_mods("softcap_causal");
  c.shape = make_shape(1, 2, 2, 200, 200, 64, 64);
  c.params = {{"cap", 30.0}};
  c.scale = 4.0f;  // large scores, so that the cap matters
  check_case(*ctx, c, rng, seed);
  const size_t modules = runtime::ModuleCache::global().num_modules();
  c.label = "softcap cap=2";
  c.params = {{"cap", 2.0}};
  check_case(*ctx, c, rng, seed);
  CHECK(runtime::ModuleCache::global().num_modules() == modules);
}

TEST_CASE("forward: uploaded block masks give the dense-mask result", "[gpu][forward][small]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::forward_families(*ctx)));
  test::ForwardFamilyScope family_scope(family);
  INFO("forward family: " << family);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const int S = 700, window = 150;
  std::vector<int32_t> docs(S);
  for (int i = 0, d = 0; i < S; ++i)
    docs[i] = (i > 0 && rng() % 200 == 0) ? ++d : d;
  struct MaskCase {
    std::string name;
    BlockMask mask;
    Mods mods;  // the dense mask_mod
  };
  std::vector<MaskCase> cases;
  cases.push_back(
      {"causal",
       block_mask_from_predicate([](int, int, int q, int kv) { return q >= kv; }, 1, 1, S, S),
       standard_mods("causal")});
  cases.push_back(
      {"sliding",
       block_mask_from_predicate(
           [&](int, int, int q, int kv) { return q >= kv && q - kv <= window; }, 1, 1, S, S),
       standard_mods("sliding_window")});
  cases.push_back({"document", block_mask_from_document_ids(docs, true), Mods{}});
  for (MaskCase& mc : cases) {
    const DeviceBlockMask dbm = DeviceBlockMask::upload(*ctx, mc.mask);
    Case sparse;
    sparse.label = "block mask " + mc.name;
    sparse.shape = make_shape(2, 4, 2, S, S, 128, 128);
    sparse.mods = mc.mods;
    if (mc.name == "sliding") sparse.params = {{"window", window}};
    if (mc.name == "document") {
      sparse.buffers["doc_ids"] = host_buffer(DType::I32, {S}, docs);
    }
    sparse.block_mask = &dbm;
    std::mt19937_64 rng_a(seed + 1), rng_b(seed + 1);  // the same inputs for both runs
    const CaseResult a = run_case(*ctx, sparse, rng_a);
    Case dense = sparse;
    dense.block_mask = nullptr;
    dense.label = "dense " + mc.name;
    if (mc.name == "document") dense.mods = mc.mask.mods;
    const CaseResult b = run_case(*ctx, dense, rng_b);
    INFO(mc.name << ": sparse vs ref " << a.out_err.str() << "; dense vs ref " << b.out_err.str());
    CHECK(a.out_err.nonfinite == 0);
    CHECK(a.out_err.rel <= tolerance(sparse.dtype));
    const ErrorStats diff = compare(a.out, b.out);
    INFO("sparse vs dense: " << diff.str());
    CHECK(diff.rel <= tolerance(sparse.dtype) / 4);
    CHECK(a.lse_mismatched_inf == 0);
  }
}

// 192-row tiles (three consumer warpgroups, the head-dim-64 default) over block masks of 128-row
// (and 256-row) q blocks: the union schedule (docs/kernels/forward_sm90.md "Union schedule")
// gives each warpgroup its own block's tiles and statuses. Masks where warpgroups of one tile
// differ (causal, a narrow window, documents), per-(b, h) masks with fully masked rows, a mask
// without full blocks, 256 x 256 sparse blocks, Sq != Skv, ragged lengths (the last tile's
// third warpgroup without rows), persistent and one-tile CTAs, block_n 64; and 128-row tiles
// in pairs per CTA (chained query tiles) over the same masks, one with an empty first q block.
TEST_CASE("forward: sm90a_wgmma's 192-row tiles over block masks match the reference",
          "[gpu][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!sm90a_wgmma_selectable(*ctx)) return;
  test::ForwardFamilyScope family_scope("sm90a_wgmma");
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const int S = 700, window = 150;
  std::vector<int32_t> docs(S);
  for (int i = 0, d = 0; i < S; ++i)
    docs[i] = (i > 0 && rng() % 150 == 0) ? ++d : d;
  struct MaskCase {
    std::string name;
    int sq, skv;
    BlockMask mask;
    Mods mods;
  };
  const auto causal = [](int, int, int q, int kv) { return q >= kv; };
  const auto per_head = [](int b, int h, int q, int kv) { return kv + 40 * h <= q + 90 * b; };
  const auto offset = [](int, int, int q, int kv) { return kv <= q + 400; };
  std::vector<MaskCase> cases;
  cases.push_back(
      {"causal", S, S, block_mask_from_predicate(causal, 1, 1, S, S), standard_mods("causal")});
  cases.push_back(
      {"sliding", S, S,
       block_mask_from_predicate(
           [&](int, int, int q, int kv) { return q >= kv && q - kv <= window; }, 1, 1, S, S),
       standard_mods("sliding_window")});
  cases.push_back({"document", S, S, block_mask_from_document_ids(docs, true), Mods{}});
  cases.push_back({"per (b, h)", S, S, block_mask_from_predicate(per_head, 2, 4, S, S),
                   parse_mods("mask_mod = kv_idx + 40 * h <= q_idx + 90 * b")});
  // The first q block without keys (an empty row of the mask), the second partial.
  cases.push_back(
      {"keys 200 behind", S, S,
       block_mask_from_predicate([](int, int, int q, int kv) { return kv + 200 <= q; }, 1, 1, S, S),
       parse_mods("mask_mod = kv_idx + 200 <= q_idx")});
  cases.push_back({"causal, 256 x 256 blocks", S, S,
                   block_mask_from_predicate(causal, 1, 1, S, S, 256, 256),
                   standard_mods("causal")});
  cases.push_back({"offset causal, Sq != Skv", 500, 900,
                   block_mask_from_predicate(offset, 1, 1, 500, 900),
                   parse_mods("mask_mod = kv_idx <= q_idx + 400")});
  {
    // Every visited tile partial (no full_* lists): the mask_mod everywhere.
    const BlockMask full = block_mask_from_predicate(causal, 1, 1, S, S);
    BlockMask partial_only = block_mask_from_tiles(1, 1, S, S, [&](int b, int h, int qb, int kvb) {
      const TileKind t = full.tile(b, h, qb, kvb);
      return t == TileKind::Empty ? TileKind::Empty : TileKind::Partial;
    });
    cases.push_back({"causal, partial tiles only", S, S, partial_only, standard_mods("causal")});
  }
  struct Cfg {
    int block_m, block_n, num_stages, q_tiles, persistent;
  };
  // block_m 0: the default, 192 rows at head dim 64 (checked below through the picked config).
  // 128-row tiles with two query tiles per CTA, persistent or not: chained query tiles
  // (run_chained), whose boundaries meet tiles without KV tiles under the masks with empty rows.
  const std::vector<Cfg> configs = {{0, 0, 0, 0, -1},    {192, 128, 2, 1, -1}, {192, 64, 4, 2, 1},
                                    {192, 128, 4, 2, 0}, {128, 128, 4, 2, 0},  {128, 128, 4, 2, 1}};
  {
    // The default at head dim 64 takes 192-row tiles over the block mask: its workspace holds the
    // union schedule (4 query tiles of 192 rows, 6 KV tiles) beside what the same call without
    // the mask needs.
    const DeviceTensor q = upload(*ctx, random_tensor(rng, DType::BF16, {1, 2, S, 64}));
    const DeviceBlockMask dbm = DeviceBlockMask::upload(*ctx, cases.front().mask);
    AttentionOptions o;
    o.mods = standard_mods("causal");
    const size_t without = flex_attention_workspace_bytes(*ctx, q, q, q, o);
    o.block_mask = &dbm;
    // (A plan's workspace is 256-byte aligned.)
    CHECK(flex_attention_workspace_bytes(*ctx, q, q, q, o) ==
          (without + static_cast<size_t>(fj_forward_sm90_union_bytes(4, 6)) + 255) / 256 * 256);
  }
  for (MaskCase& mc : cases) {
    const DeviceBlockMask dbm = DeviceBlockMask::upload(*ctx, mc.mask);
    for (const Cfg& k : configs) {
      Case c;
      c.label = fmt::format("{} (block_m {} block_n {} stages {} q_tiles {} persistent {})",
                            mc.name, k.block_m, k.block_n, k.num_stages, k.q_tiles, k.persistent);
      c.dtype = rng() % 2 ? DType::BF16 : DType::F16;
      c.shape = make_shape(2, 4, 2, mc.sq, mc.skv, 64, 64);
      c.mods = mc.mods;
      if (mc.name == "sliding") c.params = {{"window", window}};
      if (mc.name == "document") c.buffers["doc_ids"] = host_buffer(DType::I32, {S}, docs);
      c.block_mask = &dbm;
      c.config.block_m = k.block_m;
      c.config.block_n = k.block_n;
      c.config.num_stages = k.num_stages;
      if (k.q_tiles != 0) c.config.params["q_tiles"] = k.q_tiles;
      if (k.persistent != 0) c.config.params["persistent"] = k.persistent == 1 ? 1 : 0;
      check_case(*ctx, c, rng, seed);
    }
  }
}

// The union schedule of 192-row tiles is kept with the block mask (device/MaskScheduleCache.h):
// built by the first call, read by later ones (also a copy of the mask's, and calls on another
// stream), derived again after arrays_changed() once the arrays are rewritten in place (a stale
// schedule would visit the old mask's tiles: a causal result where a window is asked for).
TEST_CASE("forward: a block mask keeps its union schedule for later calls until its arrays change",
          "[gpu][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!sm90a_wgmma_selectable(*ctx)) return;
  test::ForwardFamilyScope family_scope("sm90a_wgmma");
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const int S = 900, window = 200;
  const auto causal = [](int, int, int q, int kv) { return q >= kv; };
  const auto sliding = [&](int, int, int q, int kv) { return q >= kv && q - kv <= window; };
  const BlockMask causal_mask = block_mask_from_predicate(causal, 1, 1, S, S);
  const BlockMask sliding_mask = block_mask_from_predicate(sliding, 1, 1, S, S);
  DeviceBlockMask dbm = DeviceBlockMask::upload(*ctx, causal_mask);
  runtime::MaskScheduleCache* cache = runtime::schedule_cache_of(dbm);
  REQUIRE(cache != nullptr);
  CHECK(cache->ready_entries() == 0);

  Case c;
  c.shape = make_shape(2, 4, 2, S, S, 64, 64);
  c.mods = standard_mods("causal");
  c.block_mask = &dbm;
  c.label = "causal, first call (builds the schedule)";
  check_case(*ctx, c, rng, seed);
  CHECK(cache->ready_entries() == 1);  // the default at head dim 64 is 192 rows
  c.label = "causal, second call (reads it)";
  check_case(*ctx, c, rng, seed);
  const DeviceBlockMask copy = dbm;
  c.block_mask = &copy;
  c.label = "causal, a copy of the mask";
  check_case(*ctx, c, rng, seed);
  CHECK(cache->ready_entries() == 1);
  c.config.block_m = 192;  // another shape of schedule (block_n 64): a second entry
  c.config.block_n = 64;
  c.label = "causal, block_n 64";
  check_case(*ctx, c, rng, seed);
  CHECK(cache->ready_entries() == 2);
  c.config = {};

  // Rewritten in place: the sliding window's arrays (the same shapes) into the causal mask's.
  REQUIRE(sliding_mask.kv_indices.size() * sizeof(int32_t) == dbm.kv_indices.bytes());
  dbm.kv_num_blocks.copy_from_host(sliding_mask.kv_num_blocks.data());
  dbm.kv_indices.copy_from_host(sliding_mask.kv_indices.data());
  dbm.full_kv_num_blocks.copy_from_host(sliding_mask.full_kv_num_blocks.data());
  dbm.full_kv_indices.copy_from_host(sliding_mask.full_kv_indices.data());
  dbm.q_num_blocks.copy_from_host(sliding_mask.q_num_blocks.data());
  dbm.q_indices.copy_from_host(sliding_mask.q_indices.data());
  dbm.full_q_num_blocks.copy_from_host(sliding_mask.full_q_num_blocks.data());
  dbm.full_q_indices.copy_from_host(sliding_mask.full_q_indices.data());
  dbm.arrays_changed();
  CHECK(cache->ready_entries() == 0);
  c.block_mask = &dbm;
  c.mods = standard_mods("sliding_window");
  c.params = {{"window", window}};
  c.label = "sliding window rewritten into the mask";
  check_case(*ctx, c, rng, seed);
  CHECK(cache->ready_entries() == 1);

  // Built on one stream and read at once on another: the second waits for the first's builder.
  const runtime::Driver& drv = runtime::Driver::get();
  CUstream s1 = nullptr, s2 = nullptr;
  REQUIRE(drv.cuStreamCreate_(&s1, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(drv.cuStreamCreate_(&s2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  const DeviceBlockMask fresh = DeviceBlockMask::upload(*ctx, causal_mask);
  const DeviceTensor q = upload(*ctx, random_tensor(rng, DType::BF16, {2, 4, S, 64}));
  const DeviceTensor kv = upload(*ctx, random_tensor(rng, DType::BF16, {2, 2, S, 64}));
  DeviceTensor o1 = DeviceTensor::empty(*ctx, DType::BF16, {2, 4, S, 64});
  DeviceTensor o2 = DeviceTensor::empty(*ctx, DType::BF16, {2, 4, S, 64});
  o2.fill_bytes(0xFF);
  AttentionOptions o;
  o.mods = standard_mods("causal");
  o.block_mask = &fresh;
  o.stream = s1;
  flex_attention_into(*ctx, q, kv, kv, o1, nullptr, o);
  o.stream = s2;
  flex_attention_into(*ctx, q, kv, kv, o2, nullptr, o);
  ctx->synchronize();
  CHECK(runtime::schedule_cache_of(fresh)->ready_entries() == 1);
  const std::vector<float> r1 = download(o1), r2 = download(o2);
  const ErrorStats diff = compare(r2, r1);
  INFO("stream 2 against stream 1: " << diff.str());
  CHECK(diff.nonfinite == 0);
  CHECK(diff.max_abs == 0);
  drv.cuStreamDestroy_(s1);
  drv.cuStreamDestroy_(s2);
}

// Under stream capture (global mode: no allocation may happen on the capturing thread) a call
// whose mask keeps no schedule builds it into its workspace inside the graph, and a call whose
// mask keeps one reads it; both graphs give the eager call's output.
TEST_CASE("forward: 192-row tiles over a block mask in a captured CUDA graph", "[gpu][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!sm90a_wgmma_selectable(*ctx)) return;
  test::ForwardFamilyScope family_scope("sm90a_wgmma");
  std::mt19937_64 rng(fresh_seed());
  const int S = 1000;
  const BlockMask mask =
      block_mask_from_predicate([](int, int, int q, int kv) { return q >= kv; }, 1, 1, S, S);
  const DeviceBlockMask kept = DeviceBlockMask::upload(*ctx, mask);
  const DeviceBlockMask fresh = DeviceBlockMask::upload(*ctx, mask);
  const DeviceTensor q = upload(*ctx, random_tensor(rng, DType::BF16, {2, 4, S, 64}));
  const DeviceTensor kv = upload(*ctx, random_tensor(rng, DType::BF16, {2, 2, S, 64}));
  const runtime::Driver& drv = runtime::Driver::get();
  CUstream s = nullptr;
  REQUIRE(drv.cuStreamCreate_(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  AttentionOptions o;
  o.mods = standard_mods("causal");
  o.stream = s;
  o.block_mask = &kept;
  DeviceTensor eager = DeviceTensor::empty(*ctx, DType::BF16, {2, 4, S, 64});
  flex_attention_into(*ctx, q, kv, kv, eager, nullptr, o);  // compiles, keeps the schedule
  ctx->synchronize();
  REQUIRE(runtime::schedule_cache_of(kept)->ready_entries() == 1);
  const std::vector<float> want = download(eager);
  for (const DeviceBlockMask* m : {&fresh, &kept}) {
    INFO((m == &kept ? "the kept schedule" : "no schedule kept: built in the graph"));
    DeviceTensor got = DeviceTensor::empty(*ctx, DType::BF16, {2, 4, S, 64});
    got.fill_bytes(0xFF);
    o.block_mask = m;
    REQUIRE(drv.cuStreamBeginCapture_(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    std::string error;
    try {
      flex_attention_into(*ctx, q, kv, kv, got, nullptr, o);
    } catch (const std::exception& e) {
      error = e.what();
    }
    CUgraph graph = nullptr;
    const CUresult end = drv.cuStreamEndCapture_(s, &graph);
    REQUIRE(error.empty());
    REQUIRE(end == CUDA_SUCCESS);
    CUgraphExec exec = nullptr;
    REQUIRE(drv.cuGraphInstantiateWithFlags_(&exec, graph, 0) == CUDA_SUCCESS);
    for (int replay = 0; replay < 2; ++replay)
      REQUIRE(drv.cuGraphLaunch_(exec, s) == CUDA_SUCCESS);
    ctx->synchronize();
    CHECK(runtime::schedule_cache_of(fresh)->ready_entries() == 0);
    const ErrorStats diff = compare(download(got), want);
    INFO("graph against eager: " << diff.str());
    CHECK(diff.nonfinite == 0);
    CHECK(diff.max_abs == 0);
    drv.cuGraphExecDestroy_(exec);
    drv.cuGraphDestroy_(graph);
  }
  drv.cuStreamDestroy_(s);
}

TEST_CASE("forward: invalid inputs are precise errors", "[gpu][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  std::mt19937_64 rng(fresh_seed());
  const DeviceTensor q = upload(*ctx, random_tensor(rng, DType::BF16, {1, 2, 64, 64}));
  const DeviceTensor k = upload(*ctx, random_tensor(rng, DType::BF16, {1, 2, 64, 64}));
  // Misaligned: a view starting one element in.
  TensorRef qm = q.ref();
  qm.data = static_cast<char*>(qm.data) + 2;
  qm.shape = {1, 2, 63, 64};
  CHECK_THROWS_WITH(flex_attention(*ctx, qm, k, k),
                    Catch::Contains("16-byte aligned") && Catch::Contains("q"));
  // f32 q with bf16 k / v: one dtype for all three.
  const DeviceTensor qf = upload(*ctx, random_tensor(rng, DType::F32, {1, 2, 64, 64}));
  CHECK_THROWS_WITH(flex_attention(*ctx, qf, k, k), Catch::Contains("share one dtype"));
  // Unbound buffer, unknown param, wrong buffer dtype.
  AttentionOptions o;
  o.mods = standard_mods("alibi");
  CHECK_THROWS_WITH(flex_attention(*ctx, q, k, k, o),
                    Catch::Contains("buffer 'slopes'") && Catch::Contains("not bound"));
  const DeviceTensor wrong = upload(*ctx, random_tensor(rng, DType::F16, {2}));
  o.bindings.buffers = {{"slopes", wrong.ref()}};
  CHECK_THROWS_WITH(flex_attention(*ctx, q, k, k, o),
                    Catch::Contains("f16") && Catch::Contains("slopes"));
  AttentionOptions p;
  p.mods = standard_mods("sliding_window");
  p.bindings.params = {{"window", 2.5}};
  CHECK_THROWS_WITH(flex_attention(*ctx, q, k, k, p),
                    Catch::Contains("window") && Catch::Contains("integer"));
  p.bindings.params = {{"windw", 2}};
  CHECK_THROWS_WITH(flex_attention(*ctx, q, k, k, p), Catch::Contains("windw"));
  // Wrong out shape.
  DeviceTensor out = DeviceTensor::empty(*ctx, DType::BF16, {1, 2, 64, 32});
  CHECK_THROWS_WITH(flex_attention_into(*ctx, q, k, k, out, nullptr),
                    Catch::Contains("out has shape [1, 2, 64, 32]"));
}

TEST_CASE("forward: K/V beyond 2^31 elements", "[gpu][big]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::forward_families(*ctx)));
  test::ForwardFamilyScope family_scope(family);
  INFO("forward family: " << family);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const int64_t skv = (int64_t{1} << 24) + 64, D = 128;  // 2^31 + 8192 elements
  std::vector<uint16_t> bits(static_cast<size_t>(skv * D));
  uint64_t x = seed | 1;
  for (uint16_t& b : bits) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = ir::float_to_bf16_bits(static_cast<float>(static_cast<int64_t>(x % 2001) - 1000) / 1000.0f);
  }
  const DeviceTensor kv = DeviceTensor::from_host(*ctx, DType::BF16, {1, 1, skv, D}, bits.data());
  bits.clear();
  bits.shrink_to_fit();
  const DeviceTensor q = upload(*ctx, random_tensor(rng, DType::BF16, {1, 2, 64, D}));
  AttentionOptions o;
  // Only the last 128 keys (offsets past 2^31 elements) are visible.
  o.mods = parse_mods(fmt::format("mask_mod = kv_idx >= {}", skv - 128));
  o.return_lse = true;
  AttentionResult r = flex_attention(*ctx, q, kv, kv, o);
  DeviceTensor ro = DeviceTensor::empty(*ctx, DType::BF16, r.out.ref().shape);
  DeviceTensor rl = DeviceTensor::empty(*ctx, DType::F32, r.lse.ref().shape);
  test::reference_attention_into(*ctx, q, kv, kv, ro, &rl.ref(), o.mods);
  const ErrorStats e = compare(download(r.out), download(ro));
  const ErrorStats el = compare(download(r.lse), download(rl));
  INFO("out " << e.str() << "; lse " << el.str());
  std::printf("  big K/V: out %s; lse %s\n", e.str().c_str(), el.str().c_str());
  CHECK(e.nonfinite == 0);
  CHECK(e.rel <= 2e-2);  // both outputs rounded to bf16
  CHECK(el.max_abs <= 1e-2);
}

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          fmt::format("flexjit-run-{}-{}", static_cast<long>(::getpid()), name))
      .string();
}

void save(const std::string& path, const HostTensor& t) {
  npy::Array a;
  a.dtype = t.dtype;
  a.shape = t.shape;
  const std::vector<char> b = t.bytes();
  a.bytes.assign(b.begin(), b.end());
  npy::write(path, a);
}

}  // namespace

TEST_CASE("flexjit run: user errors exit 1 with a message", "[cli][run]") {
  std::mt19937_64 rng(fresh_seed());
  const std::string q = temp_path("q.npy"), k3 = temp_path("k3.npy");
  save(q, random_tensor(rng, DType::BF16, {1, 2, 16, 64}));
  save(k3, random_tensor(rng, DType::BF16, {2, 16, 64}));
  std::string out;
  CHECK(run_cli("run --mods causal --device tpu --q " + q + " --k " + q + " --v " + q, &out) == 1);
  CHECK_THAT(out, Catch::Contains("--device 'tpu'"));
  CHECK(run_cli("run --mods causal --k " + q + " --v " + q, &out) == 1);
  CHECK_THAT(out, Catch::Contains("--random"));
  const int rc = run_cli(
      fmt::format("run --mods causal --q {} --k {} --v {} --out {}", q, k3, q, temp_path("o.npy")),
      &out);
  CHECK(rc == 1);
  CHECK_THAT(out, Catch::Contains("has 3 dims"));  // on the GPU, or the CPU backend without one
  std::filesystem::remove(q);
  std::filesystem::remove(k3);
}

TEST_CASE("flexjit run matches the reference on .npy files", "[gpu][cli][run]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const AttentionShape s = make_shape(1, 4, 2, 300, 300, 64, 64);
  const HostTensor q = random_tensor(rng, DType::F16, {1, 4, 300, 64});
  const HostTensor k = random_tensor(rng, DType::F16, {1, 2, 300, 64});
  const HostTensor v = random_tensor(rng, DType::F16, {1, 2, 300, 64});
  std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  npy::Array sl = npy::make_array(DType::F32, {4});
  std::memcpy(sl.bytes.data(), slopes.data(), 16);
  const std::string pq = temp_path("q.npy"), pk = temp_path("k.npy"), pv = temp_path("v.npy"),
                    ps = temp_path("slopes.npy"), po = temp_path("out.npy"),
                    pl = temp_path("lse.npy");
  save(pq, q), save(pk, k), save(pv, v);
  npy::write(ps, sl);
  std::string output;
  const int rc = run_cli(fmt::format("run --score-mod alibi --mask-mod causal --buffer slopes={} "
                                     "--q {} --k {} --v {} --out {} --lse {} --json",
                                     ps, pq, pk, pv, po, pl),
                         &output);
  INFO(output);
  REQUIRE(rc == 0);
  CHECK_THAT(output, Catch::Contains("median_ms"));
  const npy::Array out = npy::read(po), lse = npy::read(pl);
  REQUIRE(out.dtype == DType::F16);
  REQUIRE(out.shape == std::vector<int64_t>{1, 4, 300, 64});
  std::vector<float> got(static_cast<size_t>(out.numel()));
  for (size_t i = 0; i < got.size(); ++i)
    got[i] = ir::f16_bits_to_float(out.as<uint16_t>()[i]);
  ir::EvalEnv env;
  env.buffers["slopes"] = ir::BufferView{slopes.data(), DType::F32, {4}, {}};
  const Mods mods = combine(standard_mods("alibi"), standard_mods("causal"));
  const ReferenceResult ref =
      cpu_reference_attention(mods, s, q.values, k.values, v.values, 0.125f, env);
  const ErrorStats e = compare(got, ref.out);
  INFO(e.str());
  CHECK(e.nonfinite == 0);
  CHECK(e.rel <= tolerance(DType::F16));
  std::vector<float> got_lse(lse.as<float>(), lse.as<float>() + lse.numel());
  CHECK(compare(got_lse, ref.lse).max_abs <= 1e-2);
  for (const auto& p : {pq, pk, pv, ps, po, pl})
    std::filesystem::remove(p);
}

TEST_CASE("the reference kernel compiles through NVRTC for the standard mods",
          "[reference][nvrtc]") {
  test::register_reference_variant();
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  struct Item {
    const char* mods;
    DType dtype;
    int dqk, dv, gqa;
  };
  const Item items[] = {{"noop", DType::F32, 64, 64, 1},
                        {"alibi_causal", DType::BF16, 128, 64, 2},
                        {"t5_bucketed_bias", DType::F16, 256, 256, 4},
                        {"document_causal", DType::BF16, 96, 32, 3}};
  for (const Item& it : items) {
    INFO(it.mods << " " << to_string(it.dtype));
    const kernels::KernelDesc desc =
        test::forward_desc("sm_80", it.dtype, it.dqk, it.dv, it.gqa, "reference");
    CHECK(desc.family_variant() == "forward/reference");
    const BuiltKernel k = builder.build(standard_mods(it.mods), desc);
    CHECK(k.source->kernel_name == "flexjit_reference_forward");
    CHECK_THAT(k.source->source, Catch::Contains("kHeadDimQk = " + std::to_string(it.dqk)));
    REQUIRE(k.compiled.kernel);
    CHECK(!k.compiled.kernel->cubin.empty());
  }
  CHECK_THROWS_WITH(test::forward_desc("sm_80", DType::I32, 64, 64, 1, "reference"),
                    Catch::Contains("f32, f16 or bf16") && Catch::Contains("i32"));
  // Never chosen unless named.
  CHECK(test::forward_desc("sm_80", DType::BF16, 64, 64).variant != "reference");
}

TEST_CASE("FjModParams packing follows the layout and checks bindings", "[modargs]") {
  const Mods mods = parse_mods(
      "buffer bias: f32[H, 32]\nparam cap: f32 = 30.0\nparam window: i32\n"
      "score_mod = cap * tanh(score / cap) + bias[h, 3]\nmask_mod = q_idx - kv_idx <= window");
  alignas(16) static char fake[64];  // never dereferenced: the packer copies pointers only
  TensorRef bias = TensorRef::contiguous(fake, DType::F32, {4, 32}, TensorRef::Device::CUDA, 0);
  bias.strides = {40, 1};  // a padded row: strides are passed through
  ModBindings b;
  b.buffers = {{"bias", bias}};
  b.params = {{"window", 7}};
  const std::vector<uint64_t> words = runtime::pack_mod_params(mods, b, 0);
  const cuda::ModParamLayout layout = cuda::layout_of(mods);
  REQUIRE(words.size() * 8 == static_cast<size_t>(layout.size));
  const auto* bytes = reinterpret_cast<const char*>(words.data());
  for (const cuda::ModParamField& f : layout.fields) {
    INFO(f.name);
    if (f.kind == cuda::ModParamField::BufferPtr) {
      void* p = nullptr;
      std::memcpy(&p, bytes + f.offset, 8);
      CHECK(p == fake);
    } else if (f.kind == cuda::ModParamField::BufferStride) {
      int64_t st = 0;
      std::memcpy(&st, bytes + f.offset, 8);
      CHECK(st == (f.dim == 0 ? 40 : 1));
    } else if (f.kind == cuda::ModParamField::ParamF32) {
      float v = 0;
      std::memcpy(&v, bytes + f.offset, 4);
      CHECK(v == 30.0f);  // the declared default
    } else {
      int32_t v = 0;
      std::memcpy(&v, bytes + f.offset, 4);
      CHECK(v == 7);
    }
  }
  auto fails_with = [&](ModBindings mb, const std::string& text, int device = 0) {
    INFO("expecting: " << text);
    CHECK_THROWS_WITH(runtime::pack_mod_params(mods, mb, device), Catch::Contains(text));
  };
  fails_with({{}, {{"window", 7}}}, "buffer 'bias' (f32[H, 32]) is not bound");
  fails_with({{{"bias", bias}}, {}}, "param 'window' (i32) has no default");
  fails_with({{{"bias", bias}}, {{"window", 1.5}}}, "not an integer");
  fails_with({{{"bias", bias}}, {{"window", 7}, {"windw", 1}}}, "'windw', which the mods");
  fails_with({{{"bias", bias}, {"bias", bias}}, {{"window", 7}}}, "bound twice");
  TensorRef wrong = bias;
  wrong.dtype = DType::F16;
  fails_with({{{"bias", wrong}}, {{"window", 7}}}, "bound to a f16 tensor; expected f32");
  wrong = TensorRef::contiguous(fake, DType::F32, {4, 31}, TensorRef::Device::CUDA, 0);
  fails_with({{{"bias", wrong}}, {{"window", 7}}}, "dim 1 has extent 31; the declaration says 32");
  wrong = TensorRef::contiguous(fake, DType::F32, {128}, TensorRef::Device::CUDA, 0);
  fails_with({{{"bias", wrong}}, {{"window", 7}}}, "tensor of 1 dims; expected 2");
  fails_with(b, "is on cuda:0; the kernel runs on cuda:1", 1);
}
