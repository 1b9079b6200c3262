// flex_attention_backward on the GPU against the CPU backend's fp64 backward of the same inputs
// (q, k, v, dout and the GPU forward's out and lse), on fresh random inputs every run (the seed
// is printed on failure): dQ, dK, dV and the captured float buffers'
// gradients, for the standard mods, GQA, head dims, dtypes, ragged lengths, block masks and
// fully masked rows. Rule: |grad - ref| / |ref| <= 2e-2 bf16, 5e-3 f16, 2e-3 f32 for every
// gradient, and no NaN / Inf where the reference is finite. Skips without a GPU.
#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>
#include <flexjit/paged_kv.h>

#include "cpu/BackwardKernel.h"
#include "gpu/GpuTestUtil.h"
#include "gpu/StandardBindings.h"
#include "runtime/BackwardPlan.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

using namespace flexjit;
using namespace flexjit::test;

namespace {

double grad_tolerance(DType d) {
  switch (d) {
    case DType::BF16:
      return 2e-2;
    case DType::F16:
      return 5e-3;
    default:
      return 2e-3;
  }
}

struct BwdCase {
  std::string label;
  DType dtype = DType::BF16;
  AttentionShape shape;
  Mods mods;
  bool block_mask = false;  // build one from the mods' mask_mod on the device
  BackwardOptions::DqMode dq_mode = BackwardOptions::DqMode::Auto;
  bool deterministic = false;  // BackwardOptions::deterministic
  int runs = 1;                // > 1: run the backward again, every gradient bitwise the same
  std::optional<float> scale;
  std::map<std::string, HostBuffer> buffers;
  std::vector<std::pair<std::string, double>> params;
};

AttentionShape make_shape(int B, int Hq, int Hkv, int Sq, int Skv, int Dqk, int Dv) {
  AttentionShape s;
  s.batch = B, s.heads_q = Hq, s.heads_kv = Hkv, s.seqlen_q = Sq, s.seqlen_kv = Skv;
  s.head_dim_qk = Dqk, s.head_dim_v = Dv;
  return s;
}

TensorRef host_ref(const HostTensor& t) {
  return TensorRef::contiguous(const_cast<float*>(t.values.data()), DType::F32, t.shape);
}

struct GradCheck {
  std::string name;
  ErrorStats err;
  size_t numel = 0;
};

// Runs the forward and the backward on the GPU and the fp64 CPU reference; returns the error of
// every gradient.
std::vector<GradCheck> run_backward_case(Context& ctx, BwdCase& c, std::mt19937_64& rng) {
  const AttentionShape& s = c.shape;
  bind_standard_mods(c.mods, s, rng, c.buffers, c.params);
  const HostTensor q = random_tensor(rng, c.dtype, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_qk});
  const HostTensor k =
      random_tensor(rng, c.dtype, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_qk});
  const HostTensor v =
      random_tensor(rng, c.dtype, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_v});
  const HostTensor dout =
      random_tensor(rng, c.dtype, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v});

  std::vector<DeviceTensor> keep;
  ModBindings dev_bindings, host_bindings;
  for (auto& [name, hb] : c.buffers) {
    keep.push_back(DeviceTensor::from_host(ctx, hb.dtype, hb.shape, hb.bytes.data()));
    dev_bindings.buffers.emplace_back(name, keep.back().ref());
    host_bindings.buffers.emplace_back(name,
                                       TensorRef::contiguous(hb.bytes.data(), hb.dtype, hb.shape));
  }
  dev_bindings.params = c.params;
  host_bindings.params = c.params;

  const DeviceTensor dq_in = upload(ctx, q), dk_in = upload(ctx, k), dv_in = upload(ctx, v);
  const DeviceTensor ddout = upload(ctx, dout);
  std::optional<DeviceBlockMask> mask;
  if (c.block_mask) {
    const Mods mask_mods = mask_only(c.mods);
    ModBindings mask_bindings;
    for (const auto& [name, t] : dev_bindings.buffers) {
      for (const Buffer& b : mask_mods.buffers)
        if (b.name() == name) mask_bindings.buffers.emplace_back(name, t);
    }
    for (const auto& [name, x] : dev_bindings.params) {
      for (const Param& p : mask_mods.params)
        if (p.name() == name) mask_bindings.params.emplace_back(name, x);
    }
    mask.emplace(
        create_block_mask(ctx, mask_mods, s.batch, 1, s.seqlen_q, s.seqlen_kv, 128, mask_bindings));
  }
  AttentionOptions o;
  o.mods = c.mods;
  o.bindings = dev_bindings;
  o.scale = c.scale;
  o.return_lse = true;
  o.block_mask = mask ? &*mask : nullptr;
  AttentionResult fwd = flex_attention(ctx, dq_in, dk_in, dv_in, o);
  BackwardOptions bo;
  bo.dq_mode = c.dq_mode;
  bo.deterministic = c.deterministic;
  BackwardResult g =
      flex_attention_backward(ctx, dq_in, dk_in, dv_in, fwd.out, fwd.lse, ddout, o, bo);
  ctx.synchronize();
  // Bitwise repeatability: every gradient of every later run equals the first run's, bit for
  // bit (compared as bytes: a NaN would equal itself).
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (int run = 1; run < c.runs; ++run) {
    BackwardResult again =
        flex_attention_backward(ctx, dq_in, dk_in, dv_in, fwd.out, fwd.lse, ddout, o, bo);
    ctx.synchronize();
    INFO("run " << run + 1 << " of " << c.runs);
    CHECK(same_bits(download(again.dq), download(g.dq)));
    CHECK(same_bits(download(again.dk), download(g.dk)));
    CHECK(same_bits(download(again.dv), download(g.dv)));
    REQUIRE(again.buffer_grads.size() == g.buffer_grads.size());
    for (size_t i = 0; i < g.buffer_grads.size(); ++i) {
      INFO("d" << g.buffer_grads[i].first);
      CHECK(same_bits(download(again.buffer_grads[i].second), download(g.buffer_grads[i].second)));
    }
  }

  // The reference: the CPU backward in fp64 on the same inputs as the GPU's backward (its
  // forward's out, rounded to the dtype, and lse), so both differentiate the same function.
  std::vector<double> out64, lse64;
  for (float x : download(fwd.out))
    out64.push_back(x);
  for (float x : download(fwd.lse))
    lse64.push_back(x);
  cpu::CpuBackwardOptions cbo;
  if (c.scale) cbo.scale = *c.scale;
  cpu::CpuGradients<double> ref =
      cpu::cpu_attention_backward_f64(c.mods, host_bindings, host_ref(q), host_ref(k), host_ref(v),
                                      out64.data(), lse64.data(), host_ref(dout), cbo);
  std::vector<GradCheck> checks;
  checks.push_back({"dq", compare(download(g.dq), ref.dq), ref.dq.size()});
  checks.push_back({"dk", compare(download(g.dk), ref.dk), ref.dk.size()});
  checks.push_back({"dv", compare(download(g.dv), ref.dv), ref.dv.size()});
  for (auto& [name, t] : g.buffer_grads) {
    auto it = ref.buffers.find(name);
    REQUIRE(it != ref.buffers.end());
    checks.push_back({"d" + name, compare(download(t), it->second), it->second.size()});
  }
  return checks;
}

void check_backward_case(Context& ctx, BwdCase c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const AttentionShape& s = c.shape;
  const std::string head =
      fmt::format("{} {} B={} Hq={} Hkv={} Sq={} Skv={} D={}/{}{}{}{} (seed {})", c.label,
                  to_string(c.dtype), s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_kv,
                  s.head_dim_qk, s.head_dim_v, c.block_mask ? " block mask" : "",
                  c.dq_mode == BackwardOptions::DqMode::Atomic ? " dQ atomic" : "",
                  c.deterministic ? fmt::format(" deterministic x{}", c.runs) : "", seed);
  INFO(head);
  const std::vector<GradCheck> checks = run_backward_case(ctx, c, rng);
  std::string line = head + ":";
  for (const GradCheck& gc : checks) {
    INFO(gc.name << ": " << gc.err.str());
    CHECK(gc.err.nonfinite == 0);
    // |grad - ref| / |ref|, with |ref| floored at an RMS of 0.01 per element: where the exact
    // gradient nearly cancels (one query and one key: dS = P (dP - delta) = 0 up to the forward's
    // rounding of out), the relative error of what is left says nothing.
    const double floor = 1e-2 * std::sqrt(static_cast<double>(gc.numel));
    const double err_norm = gc.err.ref_norm > 0 ? gc.err.rel * gc.err.ref_norm : gc.err.rel;
    const double rel = err_norm / std::max(gc.err.ref_norm, floor);
    CHECK(rel <= grad_tolerance(c.dtype));
    line += fmt::format(" {} rel {:.2e} max {:.2e};", gc.name, gc.err.rel, gc.err.max_abs);
  }
  std::printf("  %s\n", line.c_str());
}

// The suite's longest cases run once per backward family (and dtype) as test cases of their own,
// so that scripts/gpu_suite.sh's parallel shards share them out. Runs `body` with `family`
// steered (BackwardFamilyScope); nothing where the GPU lacks the family.
template <typename Body>
void on_backward_family(Context& ctx, const std::string& family, Body body) {
  const std::vector<std::string> families = test::backward_families(ctx);
  if (std::find(families.begin(), families.end(), family) == families.end()) return;
  test::BackwardFamilyScope family_scope(family);
  INFO("backward family: " << family);
  body(family);
}

void every_standard_mod(Context& ctx, const std::string& family) {
  const uint64_t seed = fresh_seed();
  for (const std::string& name : standard_mod_names()) {
    for (bool block_mask : {false, true}) {
      BwdCase c;
      c.mods = standard_mods(name);
      if (block_mask && !c.mods.mask_mod.defined()) continue;
      c.label = fmt::format("{} [{}]", name, family);
      c.block_mask = block_mask;
      // Both ways of computing dQ: the second pass without a block mask, atomics from the dK/dV
      // kernel with one.
      c.dq_mode =
          block_mask ? BackwardOptions::DqMode::Atomic : BackwardOptions::DqMode::SecondPass;
      c.shape = make_shape(2, 4, 2, 200, 321, 128, 128);
      check_backward_case(ctx, c, seed + (block_mask ? 1 : 0));
      if (!c.mods.mask_mod.defined()) {
        // A mod without a mask_mod runs no block mask, so the case above took the second pass:
        // dQ from the dK/dV kernel too, at these lengths (not multiples of the tiles) the
        // configuration whose sm_90a kernel ptxas had serialized (noop, alibi, sinks at d 128
        // until 2026-11-28).
        c.dq_mode = BackwardOptions::DqMode::Atomic;
        c.label = fmt::format("{} [{}] dq atomic", name, family);
        check_backward_case(ctx, c, seed + 2);
      }
    }
  }
}

}  // namespace

TEST_CASE("backward: every standard mod matches the fp64 CPU backward (sm80_mma)",
          "[gpu][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  on_backward_family(*ctx, "sm80_mma", [&](const std::string& f) { every_standard_mod(*ctx, f); });
}

TEST_CASE("backward: every standard mod matches the fp64 CPU backward (sm90a_wgmma)",
          "[gpu][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  on_backward_family(*ctx, "sm90a_wgmma",
                     [&](const std::string& f) { every_standard_mod(*ctx, f); });
}

namespace {

// GQA ratios, head dims and lengths in one dtype: each shape with one of three mods in turn (a
// buffer gradient with one address per head, a non-linear score_mod without buffers, a buffer
// gradient per element), alternating block masks and both ways of computing dQ.
void gqa_head_dims_lengths(Context& ctx, const std::string& family, DType dt) {
  const uint64_t seed = fresh_seed();
  struct Shape {
    int hq, hkv, sq, skv, dqk, dv;
  };
  const std::vector<Shape> shapes = {{1, 1, 1, 1, 64, 64},       {2, 1, 17, 17, 64, 64},
                                     {3, 1, 127, 129, 128, 128}, {4, 2, 128, 128, 128, 64},
                                     {8, 1, 129, 1000, 64, 128}, {6, 2, 100, 300, 256, 256},
                                     {2, 2, 64, 64, 256, 128}};
  const char* mods[] = {"alibi_causal", "softcap", "relative_bias_causal"};
  // Each dtype starts the rotation elsewhere, so every dtype meets every (shape, mod, dQ way).
  int i = dt == DType::BF16 ? 0 : dt == DType::F16 ? 14 : 28;
  for (const Shape& sh : shapes) {
    for (const char* mod : {mods[i % 3], mods[(i + 1) % 3]}) {
      BwdCase c;
      c.dtype = dt;
      c.mods = standard_mods(mod);
      c.label = fmt::format("{} {} [{}]", mod, to_string(dt), family);
      c.shape = make_shape(1, sh.hq, sh.hkv, sh.sq, sh.skv, sh.dqk, sh.dv);
      c.block_mask = (i % 2) == 1 && c.mods.mask_mod.defined();
      // Every third case atomics, the next the second pass, the third the variant's default.
      if (i % 3 == 1) c.dq_mode = BackwardOptions::DqMode::Atomic;
      if (i % 3 == 2) c.dq_mode = BackwardOptions::DqMode::SecondPass;
      check_backward_case(ctx, c, seed + static_cast<uint64_t>(i++));
    }
  }
}

}  // namespace

TEST_CASE("backward: GQA ratios, head dims and lengths, bf16", "[gpu][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  for (const char* family : {"sm80_mma", "sm90a_wgmma"}) {
    on_backward_family(*ctx, family,
                       [&](const std::string& f) { gqa_head_dims_lengths(*ctx, f, DType::BF16); });
  }
}

TEST_CASE("backward: GQA ratios, head dims and lengths, f16", "[gpu][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  for (const char* family : {"sm80_mma", "sm90a_wgmma"}) {
    on_backward_family(*ctx, family,
                       [&](const std::string& f) { gqa_head_dims_lengths(*ctx, f, DType::F16); });
  }
}

TEST_CASE("backward: GQA ratios, head dims and lengths, f32", "[gpu][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  for (const char* family : {"sm80_mma", "sm90a_wgmma"}) {
    on_backward_family(*ctx, family,
                       [&](const std::string& f) { gqa_head_dims_lengths(*ctx, f, DType::F32); });
  }
}

TEST_CASE("backward: a longer sequence and a custom scale", "[gpu][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::backward_families(*ctx)));
  test::BackwardFamilyScope family_scope(family);
  INFO("backward family: " << family);
  const uint64_t seed = fresh_seed();
  BwdCase c;
  c.mods = standard_mods("causal");
  c.label = "causal [" + family + "]";
  c.shape = make_shape(1, 2, 1, 1024, 1024, 128, 128);
  c.block_mask = true;
  c.scale = 0.05f;
  check_backward_case(*ctx, c, seed);
}

TEST_CASE("backward: fully masked rows give zero gradients, never NaN", "[gpu][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::backward_families(*ctx)));
  test::BackwardFamilyScope family_scope(family);
  INFO("backward family: " << family);
  const uint64_t seed = fresh_seed();
  // kv_idx <= q_idx - 8: the first 8 query rows see nothing.
  BwdCase c;
  c.mods = Mods::from_mask([](Expr, Expr, Expr q, Expr kv) { return kv + 8 <= q; });
  c.mods.name = "shifted_causal";
  c.label = "shifted causal [" + family + "]";
  c.shape = make_shape(1, 2, 2, 70, 70, 64, 64);
  check_backward_case(*ctx, c, seed);
}

TEST_CASE("backward: dlse = 0 gives the gradients without dlse", "[gpu][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::backward_families(*ctx)));
  test::BackwardFamilyScope family_scope(family);
  INFO("backward family: " << family);
  std::mt19937_64 rng(fresh_seed());
  const int64_t B = 1, H = 2, S = 96, D = 64;
  const HostTensor q = random_tensor(rng, DType::BF16, {B, H, S, D});
  const HostTensor dout = random_tensor(rng, DType::BF16, {B, H, S, D});
  const DeviceTensor dq = upload(*ctx, q), ddout = upload(*ctx, dout);
  std::vector<float> zeros(static_cast<size_t>(B * H * S), 0.0f), ones(zeros.size(), 1.0f);
  const DeviceTensor z = DeviceTensor::from_host(*ctx, DType::F32, {B, H, S}, zeros.data());
  const DeviceTensor one = DeviceTensor::from_host(*ctx, DType::F32, {B, H, S}, ones.data());
  AttentionOptions o;
  o.mods = standard_mods("causal");
  o.return_lse = true;
  AttentionResult f = flex_attention(*ctx, dq, dq, dq, o);
  BackwardResult a = flex_attention_backward(*ctx, dq, dq, dq, f.out, f.lse, ddout, o);
  BackwardResult b =
      flex_attention_backward(*ctx, dq, dq, dq, f.out, f.lse, ddout, o, {.dlse = &z.ref()});
  // A dlse of ones adds P (the gradient of sum(lse) with respect to the scores) to dS': dQ
  // changes, dV = P^T dO does not.
  BackwardResult c =
      flex_attention_backward(*ctx, dq, dq, dq, f.out, f.lse, ddout, o, {.dlse = &one.ref()});
  ctx->synchronize();
  CHECK(download(a.dq) == download(b.dq));
  CHECK(download(a.dk) == download(b.dk));
  CHECK(download(a.dv) == download(b.dv));
  CHECK(download(a.dq) != download(c.dq));
  CHECK(download(a.dv) == download(c.dv));  // dV = P^T dO does not see the lse gradient
}

TEST_CASE("backward: bad inputs are precise errors before any launch", "[gpu][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  std::mt19937_64 rng(fresh_seed());
  const HostTensor q = random_tensor(rng, DType::BF16, {1, 2, 64, 64});
  const DeviceTensor t = upload(*ctx, q);
  AttentionOptions o;
  o.return_lse = true;
  AttentionResult f = flex_attention(*ctx, t, t, t, o);
  const DeviceTensor wrong_dtype = DeviceTensor::empty(*ctx, DType::F16, {1, 2, 64, 64});
  const DeviceTensor wrong_shape = DeviceTensor::empty(*ctx, DType::BF16, {1, 2, 63, 64});
  const DeviceTensor lse_bad = DeviceTensor::empty(*ctx, DType::F32, {1, 2, 65});
  CHECK_THROWS_WITH(flex_attention_backward(*ctx, t, t, t, f.out, f.lse, wrong_dtype, o),
                    Catch::Contains("dout has dtype f16; expected bf16"));
  CHECK_THROWS_WITH(flex_attention_backward(*ctx, t, t, t, f.out, f.lse, wrong_shape, o),
                    Catch::Contains("dout has shape [1, 2, 63, 64]; expected [B, Hq, Sq, Dv]"));
  CHECK_THROWS_WITH(flex_attention_backward(*ctx, t, t, t, f.out, lse_bad, f.out, o),
                    Catch::Contains("lse has shape [1, 2, 65]; expected [B, Hq, Sq]"));
  // Deterministic gradients with dQ by atomics: refused, naming both options.
  BackwardOptions det_atomic;
  det_atomic.deterministic = true;
  det_atomic.dq_mode = BackwardOptions::DqMode::Atomic;
  CHECK_THROWS_WITH(
      flex_attention_backward(*ctx, t, t, t, f.out, f.lse, f.out, o, det_atomic),
      Catch::Contains("deterministic = true and dq_mode = Atomic exclude each other"));
  CHECK_THROWS_AS(flex_attention_backward_workspace_bytes(*ctx, t, t, t, o, det_atomic),
                  RuntimeError);
  // A gradient asked for an integer buffer.
  AttentionOptions od;
  od.mods = standard_mods("document");
  std::vector<int32_t> docs(64, 0);
  const DeviceTensor doc = DeviceTensor::from_host(*ctx, DType::I32, {64}, docs.data());
  od.bindings.buffers = {{"doc_id", doc.ref()}};
  DeviceTensor dq = DeviceTensor::empty(*ctx, DType::BF16, {1, 2, 64, 64});
  DeviceTensor dg = DeviceTensor::empty(*ctx, DType::F32, {64});
  BackwardOutputs outs{dq.ref(), dq.ref(), dq.ref(), {{"doc_id", dg.ref()}}};
  CHECK_THROWS_WITH(
      flex_attention_backward_into(*ctx, t, t, t, f.out, f.lse, f.out, outs, od),
      Catch::Contains("a gradient is given for buffer 'doc_id', an integer or bool buffer"));
  // A KV cache (ragged lengths here): the backward would differentiate every key of K / V.
  std::vector<int32_t> lens = {40};
  const DeviceTensor len_t = DeviceTensor::from_host(*ctx, DType::I32, {1}, lens.data());
  KvCache cache;
  cache.seq_lens = len_t.ref();
  AttentionOptions ok = o;
  ok.kv_cache = &cache;
  CHECK_THROWS_WITH(flex_attention_backward(*ctx, t, t, t, f.out, f.lse, f.out, ok),
                    Catch::Contains("flex_attention_backward does not take a KV cache"));
  CHECK_THROWS_AS(flex_attention_backward_workspace_bytes(*ctx, t, t, t, ok), UnsupportedError);
}

namespace {

// A 2-D bias over (q_idx, kv_idx): one gradient address per element, none shared between the
// heads' and batches' (the partial slices of every (b, kv head) hold the whole bias).
Mods bias2d_mods() {
  Mods m = parse_mods("buffer bias2d: f32[Q, K]\nscore_mod = score + bias2d[q_idx, kv_idx]");
  m.name = "bias2d";
  return m;
}

void add_bias2d(BwdCase& c, std::mt19937_64& rng) {
  std::normal_distribution<float> n;
  std::vector<float> v(static_cast<size_t>(c.shape.seqlen_q * c.shape.seqlen_kv));
  for (float& x : v)
    x = 0.5f * n(rng);
  c.buffers["bias2d"] = host_buffer(DType::F32, {c.shape.seqlen_q, c.shape.seqlen_kv}, v);
}

}  // namespace

TEST_CASE("backward: buffer gradients summed along the tile's diagonals", "[gpu][backward]") {
  // Loads at indices that are functions of q_idx - kv_idx (and h, params) are the sm_90a dK/dV
  // kernel's diagonal site (FjDiagGrad): a reversed sign with a per-head table and a derivative
  // of 2, a site reached only under a where() (contributions 0 elsewhere), two sites of one
  // buffer (the first summed along diagonals, the second added per element), and a nonlinear
  // function of the difference (|q - kv| mod 7: 7 addresses per head); non-divisible lengths,
  // GQA, a block mask, head dims 64 and 128. Both families: sm80_mma adds every site per element.
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::backward_families(*ctx)));
  test::BackwardFamilyScope family_scope(family);
  INFO("backward family: " << family);
  const uint64_t seed = fresh_seed();
  struct Shape {
    int b, hq, hkv, sq, skv, d;
  };
  const Shape shapes[] = {{2, 4, 2, 200, 321, 128}, {1, 3, 1, 129, 1000, 64}};
  int i = 0;
  for (const DiagonalSiteMod& m : diagonal_site_mods(DType::F32)) {
    for (const Shape& sh : shapes) {
      BwdCase c;
      c.mods = parse_mods(m.text);
      c.label = fmt::format("{} [{}]", m.label, family);
      c.shape = make_shape(sh.b, sh.hq, sh.hkv, sh.sq, sh.skv, sh.d, sh.d);
      c.block_mask = c.mods.mask_mod.defined() && sh.d == 128;
      c.dq_mode = BackwardOptions::DqMode::SecondPass;
      std::mt19937_64 brng(seed + 100 + static_cast<uint64_t>(i));
      bind_diagonal_site_mod(m, DType::F32, c.shape, brng, c.buffers, c.params);
      check_backward_case(*ctx, c, seed + static_cast<uint64_t>(i++));
    }
  }
}

namespace {

// The plan flex_attention_backward would run for case `c` (its buffers bound), as text.
std::string planned_backward(Context& ctx, BwdCase& c, const BackwardOptions& bo = {}) {
  const AttentionShape& s = c.shape;
  std::mt19937_64 rng(1);
  bind_standard_mods(c.mods, s, rng, c.buffers, c.params);
  const DeviceTensor q =
      DeviceTensor::empty(ctx, c.dtype, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_qk});
  const DeviceTensor k =
      DeviceTensor::empty(ctx, c.dtype, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_qk});
  const DeviceTensor v =
      DeviceTensor::empty(ctx, c.dtype, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_v});
  std::vector<DeviceTensor> keep;
  AttentionOptions o;
  o.mods = c.mods;
  o.return_lse = true;
  for (auto& [name, hb] : c.buffers) {
    keep.push_back(DeviceTensor::from_host(ctx, hb.dtype, hb.shape, hb.bytes.data()));
    o.bindings.buffers.emplace_back(name, keep.back().ref());
  }
  o.bindings.params = c.params;
  return runtime::describe_backward_plan(ctx, q, k, v, o, bo);
}

// A float table of `shape` with N(0, 0.5) entries.
HostBuffer random_table(std::mt19937_64& rng, std::vector<int64_t> shape) {
  std::normal_distribution<float> n;
  int64_t count = 1;
  for (int64_t e : shape)
    count *= e;
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v)
    x = 0.5f * n(rng);
  return host_buffer(DType::F32, std::move(shape), v);
}

}  // namespace

TEST_CASE("backward: small buffer gradients through a private shared-memory copy per CTA",
          "[gpu][backward][bufgrad_smem]") {
  // Tables of at most 4096 floats whose gradients land on few addresses (docs/backward.md "Small
  // buffer gradients in shared memory"): each dK/dV CTA adds into its own copy in shared memory
  // and flushes it with one atomic per element. T5's bucket table (the diagonal site on sm_90a,
  // per element on sm80_mma), per-head tables indexed by kv_idx and by q_idx with a derivative
  // that is not constant, a 4096-float table (the private copy, except on sm90a_wgmma at d = 128,
  // whose tiles leave no 16 KiB: it keeps the global atomics there) and a relative-bias table of
  // 8192 floats (the global path everywhere). Each against the fp64 CPU backward, both dQ
  // strategies, and the plan's dK/dV description says which path it took (flag bufgrad_smem).
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::backward_families(*ctx)));
  test::BackwardFamilyScope family_scope(family);
  INFO("backward family: " << family);
  const uint64_t seed = fresh_seed();
  struct Table {
    const char* label;
    const char* text;  // empty: the standard t5_bucketed_bias (bias[H, 32])
    int64_t width;     // the table's second extent ([Hq, width])
    int64_t smem;      // the flag's value (the copy's floats); 0: global atomics
  };
  const Table tables[] = {
      {"t5 buckets", "", 32, 128},
      {"per-head table by kv_idx",
       "buffer tab: f32[H, 8]\nscore_mod = score + tab[h, kv_idx % 8]\nmask_mod = q_idx >= kv_idx",
       8, 32},
      {"per-head scale by q_idx",
       "buffer tab: f32[H, 16]\nscore_mod = score * tab[h, (q_idx / 16) % 16]", 16, 64},
      {"4096-float table",
       "buffer tab: f32[H, 1024]\nscore_mod = score + tab[h, (q_idx + 3 * kv_idx) % 1024]", 1024,
       4096},
      {"relative table past shared memory",
       "buffer tab: f32[H, 2048]\nscore_mod = score + tab[h, q_idx - kv_idx + 1000]", 2048, 0},
  };
  struct Shape {
    int b, hq, hkv, sq, skv, d;
  };
  const Shape shapes[] = {{2, 4, 2, 200, 321, 128}, {1, 4, 1, 129, 1000, 64}};
  int i = 0;
  for (const Table& t : tables) {
    for (const Shape& sh : shapes) {
      BwdCase c;
      c.mods = std::string(t.text).empty() ? standard_mods("t5_bucketed_bias") : parse_mods(t.text);
      c.label = fmt::format("{} [{}]", t.label, family);
      c.shape = make_shape(sh.b, sh.hq, sh.hkv, sh.sq, sh.skv, sh.d, sh.d);
      // The variant's default dQ at d = 128 (on sm90a_wgmma: added by the dK/dV kernel, whose
      // staging leaves the least shared memory), the second pass at d = 64.
      c.dq_mode = sh.d == 128 ? BackwardOptions::DqMode::Auto : BackwardOptions::DqMode::SecondPass;
      std::mt19937_64 brng(seed + 100 + static_cast<uint64_t>(i));
      if (!std::string(t.text).empty()) c.buffers["tab"] = random_table(brng, {sh.hq, t.width});
      BackwardOptions bo;
      bo.dq_mode = c.dq_mode;
      const std::string plan = planned_backward(*ctx, c, bo);
      INFO(plan);
      // sm90a_wgmma at d = 128 adding dQ itself: 198,696 bytes of dynamic shared memory and up
      // to 27,840 of diagonal tables leave less than 16 KiB of the 227 KiB.
      const bool no_room = family == "sm90a_wgmma" && sh.d == 128 && t.smem == 4096;
      const int64_t want = no_room ? 0 : t.smem;
      if (want > 0) {
        CHECK_THAT(plan, Catch::Contains(fmt::format("bufgrad_smem={} ", want)));
      } else {
        CHECK_THAT(plan, !Catch::Contains("bufgrad_smem"));
      }
      check_backward_case(*ctx, c, seed + static_cast<uint64_t>(i++));
    }
  }
  // Deterministic gradients keep their ordered slices (no private copy): bitwise the same on
  // every run, and the fp64 rule.
  if (family == "sm80_mma") {
    BwdCase c;
    c.mods = standard_mods("t5_bucketed_bias");
    c.label = "t5 buckets [deterministic]";
    c.shape = make_shape(2, 4, 2, 200, 321, 128, 128);
    c.deterministic = true;
    c.runs = 3;
    BackwardOptions det;
    det.deterministic = true;
    const std::string plan = planned_backward(*ctx, c, det);
    INFO(plan);
    CHECK_THAT(plan, Catch::Contains("deterministic=1") && !Catch::Contains("bufgrad_smem"));
    check_backward_case(*ctx, c, seed + static_cast<uint64_t>(i++));
  }
}

TEST_CASE("backward: deterministic buffer gradients are bitwise the same on every run",
          "[gpu][backward][determ]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  // ALiBi (one address per head), the relative-bias table (addresses shared along diagonals,
  // within and across warps and CTAs) and a 2-D bias (shared across heads and batches); GQA 1
  // and 4; ragged lengths, both head dims of the defaults tables, with and without a block mask.
  // Each case: 3 runs on the same fresh random inputs, bitwise the same, and the fp64 rule.
  int i = 0;
  for (const char* mod : {"alibi_causal", "relative_bias_causal", "bias2d"}) {
    for (int gqa : {1, 4}) {
      for (bool block_mask : {false, true}) {
        BwdCase c;
        c.mods = std::string(mod) == "bias2d" ? bias2d_mods() : standard_mods(mod);
        if (block_mask && !c.mods.mask_mod.defined()) continue;
        c.label = mod;
        c.dtype = i % 3 == 2 ? DType::F16 : DType::BF16;
        const int d = i % 2 == 0 ? 128 : 64;
        c.shape = make_shape(2, 4, 4 / gqa, 200, 321, d, d);
        c.block_mask = block_mask;
        c.deterministic = true;
        c.runs = 3;
        std::mt19937_64 rng(seed + 100 + static_cast<uint64_t>(i));
        if (std::string(mod) == "bias2d") add_bias2d(c, rng);
        check_backward_case(*ctx, c, seed + static_cast<uint64_t>(i++));
      }
    }
  }
  // Head dim 256: two warps share each 16 kv rows (only one adds and flushes into the slice).
  for (const char* mod : {"alibi_causal", "relative_bias_causal"}) {
    BwdCase c;
    c.mods = standard_mods(mod);
    c.label = mod;
    c.shape = make_shape(1, 4, 2, 150, 230, 256, 256);
    c.deterministic = true;
    c.runs = 3;
    check_backward_case(*ctx, c, seed + static_cast<uint64_t>(i++));
  }
}

TEST_CASE("backward: deterministic mode on a small problem (compute-sanitizer's case)",
          "[gpu][backward][determ][small]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  int i = 0;
  for (const char* mod : {"alibi_causal", "relative_bias", "bias2d"}) {
    BwdCase c;
    c.mods = std::string(mod) == "bias2d" ? bias2d_mods() : standard_mods(mod);
    c.label = mod;
    c.shape = make_shape(1, 4, 1, 70, 100, 64, 64);
    c.deterministic = true;
    c.runs = 2;
    std::mt19937_64 rng(seed + 100 + static_cast<uint64_t>(i));
    if (std::string(mod) == "bias2d") add_bias2d(c, rng);
    check_backward_case(*ctx, c, seed + static_cast<uint64_t>(i++));
  }
}

TEST_CASE("backward: the deterministic workspace holds the partial slices",
          "[gpu][backward][determ]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  std::mt19937_64 rng(fresh_seed());
  const int64_t B = 2, Hq = 8, Hkv = 2, S = 300, D = 64;
  const HostTensor q = random_tensor(rng, DType::BF16, {B, Hq, S, D});
  const HostTensor kv = random_tensor(rng, DType::BF16, {B, Hkv, S, D});
  const DeviceTensor tq = upload(*ctx, q), tkv = upload(*ctx, kv);
  std::vector<float> table(2 * S);
  const DeviceTensor bias = DeviceTensor::from_host(*ctx, DType::F32, {2 * S}, table.data());
  AttentionOptions o;
  o.mods = standard_mods("relative_bias");
  o.bindings.buffers = {{"bias", bias.ref()}};
  o.bindings.params = {{"offset", static_cast<double>(S)}};
  const size_t pass = flex_attention_backward_workspace_bytes(
      *ctx, tq, tkv, tkv, o, {.dq_mode = BackwardOptions::DqMode::SecondPass});
  const size_t dflt = flex_attention_backward_workspace_bytes(*ctx, tq, tkv, tkv, o);
  const size_t det =
      flex_attention_backward_workspace_bytes(*ctx, tq, tkv, tkv, o, {.deterministic = true});
  // lse2 and delta: two floats per padded q row, round_up(300, 128) = 384 rows per (b, q head).
  CHECK(pass == 8 * B * Hq * 384);
  // A default dK/dV kernel that adds dQ itself (sm90a_wgmma's) adds the f32 accumulator.
  const std::string plan = runtime::describe_backward_plan(*ctx, tq, tkv, tkv, o);
  INFO(plan);
  const bool adds_dq = plan.find("backward_dq/atomic_convert") != std::string::npos;
  if (ctx->arch() == "sm_90a") CHECK(adds_dq);
  CHECK(dflt == pass + (adds_dq ? 4 * B * Hq * 384 * D : 0));
  // Deterministic (dQ by the second pass): one slice of the 600-entry table per 16 kv rows, per
  // (b, kv head).
  CHECK(det == pass + 4 * B * Hkv * (384 / 16) * 600);
}
