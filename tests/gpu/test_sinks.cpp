// Attention sinks (the sink_mod) on the GPU ([gpu][sinks]): the forward on sm80_mma and
// sm90a_wgmma, the backward (dQ, dK, dV and the sinks' gradient; fp32 atomics and the
// deterministic mode), split-KV decoding on contiguous and paged caches, fully masked rows
// (out 0, lse = sink), per-head and per-row sinks. References: the CPU backend's fp64 mode
// (checked in tests/unit/test_sinks.cpp against an explicit softmax with the sink as an extra
// column) on the same dtype-rounded inputs.
#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/mods.h>
#include <flexjit/paged_kv.h>

#include "cpu/BackwardKernel.h"
#include "cpu/ForwardKernel.h"
#include "gpu/GpuTestUtil.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

using namespace flexjit;
using namespace flexjit::test;

namespace {

constexpr int kB = 2, kHq = 4, kHkv = 2;

struct Case {
  std::string label, mods;
  int sq = 200, skv = 321, dim = 128;
  int masked_rows = 0;  // rows q_idx < masked_rows have every key masked
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"per-head sinks", "buffer sinks: f32[H]\nsink_mod = sinks[h]"},
      {"causal, per-head sinks",
       "buffer sinks: f32[H]\nmask_mod = q_idx >= kv_idx\nsink_mod = sinks[h]"},
      {"per-row sinks",
       "buffer sinks: f32[H]\nmask_mod = q_idx >= kv_idx\n"
       "sink_mod = sinks[h] + 0.25 * float(q_idx % 5) - 0.5"},
      {"fully masked rows",
       "buffer sinks: f32[H]\nmask_mod = q_idx >= 37 && kv_idx <= q_idx\nsink_mod = sinks[h]", 200,
       321, 128, 37},
  };
  return c;
}

struct Inputs {
  Mods mods;
  HostTensor q, k, v, dout;
  std::vector<float> sinks;
  float scale = 0;
  DeviceTensor dq, dk, dv, dsinks;

  TensorRef host(const HostTensor& t) const {
    return TensorRef::contiguous(const_cast<float*>(t.values.data()), DType::F32, t.shape);
  }
  ModBindings host_bindings() const {
    ModBindings b;
    b.buffers = {{"sinks", TensorRef::contiguous(const_cast<float*>(sinks.data()), DType::F32,
                                                 {static_cast<int64_t>(sinks.size())})}};
    return b;
  }
};

Inputs make_inputs(Context& ctx, const Case& c, DType dtype, std::mt19937_64& rng) {
  Inputs in;
  in.mods = parse_mods(c.mods, c.label);
  in.q = random_tensor(rng, dtype, {kB, kHq, c.sq, c.dim});
  in.k = random_tensor(rng, dtype, {kB, kHkv, c.skv, c.dim});
  in.v = random_tensor(rng, dtype, {kB, kHkv, c.skv, c.dim});
  in.dout = random_tensor(rng, dtype, {kB, kHq, c.sq, c.dim});
  std::uniform_real_distribution<float> u(-2.0f, 3.0f);  // around the rows' LSEs
  in.sinks.resize(kHq);
  for (float& s : in.sinks)
    s = u(rng);
  in.scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
  in.dq = upload(ctx, in.q);
  in.dk = upload(ctx, in.k);
  in.dv = upload(ctx, in.v);
  in.dsinks = DeviceTensor::from_host(ctx, DType::F32, {kHq}, in.sinks.data());
  return in;
}

AttentionOptions gpu_options(const Inputs& in, const std::string& variant) {
  AttentionOptions o;
  o.mods = in.mods;
  o.bindings.buffers = {{"sinks", in.dsinks.ref()}};
  o.scale = in.scale;
  o.return_lse = true;
  o.variant = variant;
  return o;
}

struct Reference {
  std::vector<double> out, lse;
};

Reference reference_forward(const Inputs& in) {
  Reference r;
  const size_t rows = static_cast<size_t>(in.q.shape[0] * in.q.shape[1] * in.q.shape[2]);
  r.out.resize(rows * static_cast<size_t>(in.v.shape[3]));
  r.lse.resize(rows);
  cpu::CpuForwardOptions o;
  o.scale = in.scale;
  cpu::cpu_attention_forward_f64(in.mods, in.host_bindings(), in.host(in.q), in.host(in.k),
                                 in.host(in.v), r.out.data(), r.lse.data(), o);
  return r;
}

double lse_max_err(const std::vector<float>& lse, const std::vector<double>& ref) {
  double m = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    m = std::max(m, std::abs(lse[i] - ref[i]) / std::max(1.0, std::abs(ref[i])));
  return m;
}

// Rows q_idx < masked: out exactly 0 and lse exactly the head's sink.
void check_masked_rows(const Case& c, const Inputs& in, const std::vector<float>& out,
                       const std::vector<float>& lse) {
  for (int b = 0; b < kB; ++b) {
    for (int h = 0; h < kHq; ++h) {
      for (int i = 0; i < c.masked_rows; ++i) {
        const size_t row = static_cast<size_t>((b * kHq + h) * c.sq + i);
        INFO("b " << b << " h " << h << " row " << i);
        REQUIRE(lse[row] == in.sinks[h]);
        for (int d = 0; d < c.dim; ++d)
          REQUIRE(out[row * c.dim + d] == 0.0f);
      }
    }
  }
}

std::vector<std::string> variants(Context& ctx) {
  std::vector<std::string> v = {"sm80_mma"};
  if (ctx.arch() == "sm_90a") v.push_back("sm90a_wgmma");
  return v;
}

}  // namespace

TEST_CASE("sinks: forward on sm80_mma and sm90a_wgmma matches the fp64 reference",
          "[gpu][sinks][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (const std::string& variant : variants(*ctx)) {
    for (const Case& c : cases()) {
      // f16 once per variant (a kernel compile per case and dtype: the file stays under a minute).
      for (DType dtype : {DType::BF16, DType::F16}) {
        if (dtype == DType::F16 && &c != &cases().front()) continue;
        INFO(variant << " " << c.label << " " << to_string(dtype) << " seed " << seed);
        const Inputs in = make_inputs(*ctx, c, dtype, rng);
        const AttentionResult r =
            flex_attention(*ctx, in.dq, in.dk, in.dv, gpu_options(in, variant));
        const std::vector<float> out = download(r.out), lse = download(r.lse);
        const Reference ref = reference_forward(in);
        const ErrorStats e = compare(out, ref.out);
        INFO("out " << e.str());
        CHECK(e.nonfinite == 0);
        CHECK(e.rel <= tolerance(dtype));
        CHECK(lse_max_err(lse, ref.lse) <= 1e-3);
        check_masked_rows(c, in, out, lse);
      }
    }
  }
}

TEST_CASE("sinks: the sink changes the output (a -inf sink is no sink)", "[gpu][sinks][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  std::mt19937_64 rng(fresh_seed());
  const Case& c = cases()[1];
  Inputs in = make_inputs(*ctx, c, DType::BF16, rng);
  const std::vector<float> with =
      download(flex_attention(*ctx, in.dq, in.dk, in.dv, gpu_options(in, "")).out);
  const std::vector<float> minus_inf(kHq, -std::numeric_limits<float>::infinity());
  in.dsinks.copy_from_host(minus_inf.data());
  AttentionOptions plain = gpu_options(in, "");
  const AttentionResult r = flex_attention(*ctx, in.dq, in.dk, in.dv, plain);
  plain.mods = standard_mods("causal");
  plain.bindings = {};
  const AttentionResult base = flex_attention(*ctx, in.dq, in.dk, in.dv, plain);
  // The same softmax: equal up to the rounding of the LSE's last step.
  CHECK(compare(download(r.out), download(base.out)).rel <= 1e-6);
  CHECK(compare(download(r.lse), download(base.lse)).max_abs <= 1e-5);
  CHECK(compare(with, download(base.out)).rel > 1e-2);
}

TEST_CASE("sinks: backward gives dQ, dK, dV and the sinks' gradient (atomic and deterministic)",
          "[gpu][sinks][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (const std::string& variant : variants(*ctx)) {
    for (const Case& c : {cases()[2], cases()[3]}) {  // per-row sinks; fully masked rows
      for (bool deterministic : {false, true}) {
        if (deterministic && variant != "sm80_mma") continue;  // sm80_mma's mode
        const DType dtype = DType::BF16;
        INFO(variant << " " << c.label << (deterministic ? " deterministic" : " atomic") << " seed "
                     << seed);
        Inputs in = make_inputs(*ctx, c, dtype, rng);
        AttentionOptions o = gpu_options(in, "");
        const AttentionResult fwd = flex_attention(*ctx, in.dq, in.dk, in.dv, o);
        const DeviceTensor ddo = upload(*ctx, in.dout);
        BackwardOptions bo;
        bo.deterministic = deterministic;
        AttentionOptions bopt = o;
        bopt.variant = "";
        test::BackwardFamilyScope scope(variant == "sm80_mma" ? "sm80_mma" : "sm90a_wgmma");
        const BackwardResult g =
            flex_attention_backward(*ctx, in.dq, in.dk, in.dv, fwd.out, fwd.lse, ddo, bopt, bo);
        REQUIRE(g.buffer_grads.size() == 1);
        REQUIRE(g.buffer_grads[0].first == "sinks");
        const std::vector<float> dsinks = download(g.buffer_grads[0].second);

        // The fp64 reference backward at the GPU forward's out and lse, so that both
        // differentiate the same function at the same point (as tests/gpu/BackwardCheck.h
        // does): the sink's gradient, -sum_i p_sink,i delta_i, follows delta = rowsum(dO *
        // out) and so out's bf16 rounding, which the fp64 forward's out does not have (against
        // it, sm80_mma deterministic measured 2.1e-2 once on an H100, at the 2e-2 rule).
        std::vector<double> out64, lse64;
        for (float x : download(fwd.out))
          out64.push_back(x);
        for (float x : download(fwd.lse))
          lse64.push_back(x);
        cpu::CpuBackwardOptions cbo;
        cbo.scale = in.scale;
        const cpu::CpuGradients<double> rg = cpu::cpu_attention_backward_f64(
            in.mods, in.host_bindings(), in.host(in.q), in.host(in.k), in.host(in.v), out64.data(),
            lse64.data(), in.host(in.dout), cbo);
        for (auto [name, got, want] :
             {std::tuple{"dq", download(g.dq), &rg.dq}, std::tuple{"dk", download(g.dk), &rg.dk},
              std::tuple{"dv", download(g.dv), &rg.dv}}) {
          const ErrorStats e = compare(got, *want);
          INFO(name << " " << e.str());
          CHECK(e.nonfinite == 0);
          CHECK(e.rel <= 2 * tolerance(dtype));
        }
        const ErrorStats es = compare(dsinks, rg.buffers.at("sinks"));
        INFO("dsinks " << es.str());
        CHECK(es.nonfinite == 0);
        CHECK(es.rel <= 2 * tolerance(dtype));
        if (deterministic) {  // bitwise the same on a second run
          const BackwardResult again =
              flex_attention_backward(*ctx, in.dq, in.dk, in.dv, fwd.out, fwd.lse, ddo, bopt, bo);
          CHECK(download(again.buffer_grads[0].second) == dsinks);
        }
      }
    }
  }
}

TEST_CASE("sinks: split-KV decoding on contiguous and paged caches", "[gpu][sinks][decode]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int page = 16;
  for (bool paged : {false, true}) {
    for (const Case& base : {cases()[2], cases()[3]}) {  // per-row sinks; fully masked rows
      for (int sq : {1, 4}) {
        Case c = base;
        c.sq = sq;
        c.skv = 300;  // a multiple of nothing in particular; the pages cover 304 keys
        // Fully masked rows: the first two query rows (every row when Sq = 1).
        if (base.masked_rows > 0)
          c.mods = "buffer sinks: f32[H]\nmask_mod = q_idx >= 2\nsink_mod = sinks[h]";
        c.masked_rows = base.masked_rows > 0 ? std::min(2, sq) : 0;
        INFO((paged ? "paged " : "contiguous ") << c.label << " Sq " << sq << " seed " << seed);
        const Inputs in = make_inputs(*ctx, c, DType::BF16, rng);
        std::vector<DeviceTensor> keep;
        KvCache cache;
        const std::vector<int32_t> lens(kB, c.skv);
        keep.push_back(DeviceTensor::from_host(*ctx, DType::I32, {kB}, lens.data()));
        cache.seq_lens = keep.back().ref();
        TensorRef k = in.dk, v = in.dv;
        if (paged) {  // sequence b's page p is pool page p * kB + b (interleaved)
          const int max_pages = (c.skv + page - 1) / page;
          std::vector<int32_t> table(static_cast<size_t>(kB * max_pages));
          for (int b = 0; b < kB; ++b)
            for (int p = 0; p < max_pages; ++p)
              table[static_cast<size_t>(b * max_pages + p)] = p * kB + b;
          for (const HostTensor* src : {&in.k, &in.v}) {
            HostTensor pool;
            pool.dtype = src->dtype;
            pool.shape = {kB * max_pages, page, kHkv, c.dim};
            pool.values.assign(static_cast<size_t>(kB * max_pages * page * kHkv * c.dim), 0.0f);
            for (int b = 0; b < kB; ++b)
              for (int n = 0; n < c.skv; ++n)
                for (int h = 0; h < kHkv; ++h)
                  for (int d = 0; d < c.dim; ++d)
                    pool.values[((static_cast<size_t>(table[b * max_pages + n / page]) * page +
                                  n % page) *
                                     kHkv +
                                 h) *
                                    c.dim +
                                d] =
                        src->values[((static_cast<size_t>(b) * kHkv + h) * c.skv + n) * c.dim + d];
            keep.push_back(upload(*ctx, pool));
            (src == &in.k ? k : v) = keep.back().ref();
          }
          keep.push_back(DeviceTensor::from_host(*ctx, DType::I32, {kB, max_pages}, table.data()));
          cache.page_table = keep.back().ref();
        }
        AttentionOptions o = gpu_options(in, "");
        o.kv_cache = &cache;
        const AttentionResult r = flex_attention(*ctx, in.dq, k, v, o);
        const std::vector<float> out = download(r.out), lse = download(r.lse);
        const Reference ref = reference_forward(in);
        const ErrorStats e = compare(out, ref.out);
        INFO("out " << e.str());
        CHECK(e.nonfinite == 0);
        CHECK(e.rel <= tolerance(DType::BF16));
        CHECK(lse_max_err(lse, ref.lse) <= 1e-3);
        check_masked_rows(c, in, out, lse);
      }
    }
  }
}
