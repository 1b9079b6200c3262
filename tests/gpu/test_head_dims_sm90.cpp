// Head dims below the Hopper kernels' tile dims (issue 28): forward/sm90a_wgmma (tiles 64 / 128 /
// 192 / 256) and the sm90a_wgmma backward (tiles 64 / 128) on head dims that are multiples of 8
// but not of 64, qk = v and qk != v, against the fp64 CPU reference on fresh random inputs
// (the seed is printed on failure): out and lse of the forward, dq / dk / dv (and the alibi
// slopes' gradient) of the backward. Lengths that no tile divides (boundaries in both
// dimensions), GQA, noop, causal and alibi (a captured buffer). Each case also checks the plan's
// variants: sm90a_wgmma where the head dims fit its tiles, sm80_mma for the backward past 128.
// Skips without a GPU, and where the sm_90a variants are not selectable (not an sm_90a device).
// Small shapes: the file's GPU time is the kernels' compiles (one forward per head-dim case and
// mods, one backward per case).
#include <flexjit/attention.h>
#include <flexjit/backward.h>

#include "cpu/BackwardKernel.h"
#include "gpu/BackwardCheck.h"
#include "gpu/ForwardCheck.h"
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
#include <map>

using namespace flexjit;
using namespace flexjit::test;

namespace {

// A head-dim case and its mods: the forward runs each, the backward the last (whose forward
// kernel the forward test compiled). Each mod on several tile dims; both noop and causal on the
// issue's benchmark dims (96, 192 / 128). Compiling the kernels is most of the file's time.
struct HeadDimCase {
  int dqk, dv;
  std::vector<std::string> mods;
};

// qk = v inside every tile (64, 128, 192, 256), then the qk != v pairs of real models
// (DeepSeek-V3's 192 / 128 prefill, 96 / 64, 128 / 64).
const std::vector<HeadDimCase> kCases = {
    {32, 32, {"causal"}},         {48, 48, {"alibi"}},   {80, 80, {"causal"}},
    {96, 96, {"noop", "causal"}}, {112, 112, {"alibi"}}, {160, 160, {"causal"}},
    {192, 192, {"noop"}},         {256, 256, {"alibi"}}, {192, 128, {"noop", "causal"}},
    {96, 64, {"alibi"}},          {128, 64, {"causal"}}};

AttentionShape shape_of(const HeadDimCase& c, int i) {
  AttentionShape s;
  // Alternately MHA with B = 2 and GQA 2:1 with B = 1; 300 queries, 300 or 333 keys: no tile
  // (64 / 128 / 192 rows) divides them.
  s.batch = i % 2 == 0 ? 2 : 1;
  s.heads_q = 4;
  s.heads_kv = i % 2 == 0 ? 4 : 2;
  s.seqlen_q = 300;
  s.seqlen_kv = i % 3 == 0 ? 333 : 300;
  s.head_dim_qk = c.dqk;
  s.head_dim_v = c.dv;
  return s;
}

std::string shape_str(const AttentionShape& s) {
  return fmt::format("B={} Hq={} Hkv={} Sq={} Skv={} D={}/{}", s.batch, s.heads_q, s.heads_kv,
                     s.seqlen_q, s.seqlen_kv, s.head_dim_qk, s.head_dim_v);
}

struct Inputs {
  HostTensor q, k, v;
  DeviceTensor dq, dk, dv;
  std::map<std::string, HostBuffer> buffers;
  std::vector<std::pair<std::string, double>> params;
  std::vector<DeviceTensor> keep;
  ModBindings dev, host;
  ir::EvalEnv env;
};

void make_inputs(Context& ctx, const Mods& mods, const AttentionShape& s, std::mt19937_64& rng,
                 Inputs& in) {
  bind_standard_mods(mods, s, rng, in.buffers, in.params);
  in.q = random_tensor(rng, DType::BF16, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_qk});
  in.k = random_tensor(rng, DType::BF16, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_qk});
  in.v = random_tensor(rng, DType::BF16, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_v});
  in.dq = upload(ctx, in.q);
  in.dk = upload(ctx, in.k);
  in.dv = upload(ctx, in.v);
  for (auto& [name, hb] : in.buffers) {
    in.keep.push_back(DeviceTensor::from_host(ctx, hb.dtype, hb.shape, hb.bytes.data()));
    in.dev.buffers.emplace_back(name, in.keep.back().ref());
    in.host.buffers.emplace_back(name, TensorRef::contiguous(hb.bytes.data(), hb.dtype, hb.shape));
    in.env.buffers[name] = ir::BufferView{hb.bytes.data(), hb.dtype, hb.shape, {}};
  }
  in.dev.params = in.host.params = in.params;
  for (auto& [n, x] : in.params)
    in.env.params[n] = x;
}

}  // namespace

TEST_CASE(
    "head dims on sm_90a: the forward in tiles of 64 / 128 / 192 / 256 matches the fp64 "
    "reference",
    "[gpu][head_dims]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!sm90a_wgmma_selectable(*ctx)) return;
  ForwardFamilyScope family_scope("sm90a_wgmma");
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < kCases.size(); ++i) {
    for (const std::string& mods_name : kCases[i].mods) {
      const AttentionShape s = shape_of(kCases[i], static_cast<int>(i));
      const std::string label = fmt::format("{} {} (seed {})", mods_name, shape_str(s), seed);
      INFO(label);
      const Mods mods = standard_mods(mods_name);
      Inputs in;
      make_inputs(*ctx, mods, s, rng, in);
      AttentionOptions o;
      o.mods = mods;
      o.bindings = in.dev;
      // The plan: forward/sm90a_wgmma for every head dim up to 256.
      const std::string plan =
          runtime::describe_forward_plan(*ctx, in.dq.ref(), in.dk.ref(), in.dv.ref(), o);
      CHECK_THAT(step_line(plan, "forward"), Catch::Contains("forward/sm90a_wgmma"));
      DeviceTensor out =
          DeviceTensor::empty(*ctx, DType::BF16, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v});
      DeviceTensor lse = DeviceTensor::empty(*ctx, DType::F32, {s.batch, s.heads_q, s.seqlen_q});
      out.fill_bytes(0xFF);  // NaN: an element the kernel does not write fails
      lse.fill_bytes(0xFF);
      flex_attention_into(*ctx, in.dq.ref(), in.dk.ref(), in.dv.ref(), out, &lse.ref(), o);
      ctx->synchronize();
      // The default scale is 1 / sqrt(head_dim_qk), the real one.
      const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim_qk)));
      const ReferenceResult ref =
          cpu_reference_attention(mods, s, in.q.values, in.k.values, in.v.values, scale, in.env);
      check_forward_f64(download(out), download(lse), ref, label);
    }
  }
}

TEST_CASE("head dims on sm_90a: the backward in tiles of 64 / 128 matches the fp64 reference",
          "[gpu][head_dims]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!sm90a_wgmma_selectable(*ctx)) return;
  BackwardFamilyScope family_scope("sm90a_wgmma");
  ForwardFamilyScope forward_scope("sm90a_wgmma");
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < kCases.size(); ++i) {
    const std::string mods_name = kCases[i].mods.back();
    AttentionShape s = shape_of(kCases[i], static_cast<int>(i));
    s.batch = 1;  // the fp64 backward on the CPU is the slow part
    const std::string label = fmt::format("{} {} (seed {})", mods_name, shape_str(s), seed);
    INFO(label);
    const Mods mods = standard_mods(mods_name);
    Inputs in;
    make_inputs(*ctx, mods, s, rng, in);
    const HostTensor dout =
        random_tensor(rng, DType::BF16, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v});
    const DeviceTensor ddout = upload(*ctx, dout);
    AttentionOptions o;
    o.mods = mods;
    o.bindings = in.dev;
    o.return_lse = true;
    // dK/dV and dQ on sm90a_wgmma up to head dim 128 (its tiles), on sm80_mma past it.
    const bool sm90 = std::max(s.head_dim_qk, s.head_dim_v) <= 128;
    const std::string plan =
        runtime::describe_backward_plan(*ctx, in.dq.ref(), in.dk.ref(), in.dv.ref(), o);
    const std::string want = sm90 ? "sm90a_wgmma" : "sm80_mma";
    CHECK_THAT(step_line(plan, "backward_dkdv"), Catch::Contains("backward_dkdv/" + want));
    if (sm90) CHECK_THAT(step_line(plan, "backward_dq"), Catch::Contains("backward_dq/"));
    AttentionResult fwd = flex_attention(*ctx, in.dq, in.dk, in.dv, o);
    BackwardResult g =
        flex_attention_backward(*ctx, in.dq, in.dk, in.dv, fwd.out, fwd.lse, ddout, o);
    ctx->synchronize();
    check_backward_f64(mods, in.host, in.q, in.k, in.v, dout, fwd, g, label);  // bf16: 2e-2
  }
}
