// The forward's out through views (forward/sm90a_wgmma's epilogue; docs/kernels/forward_sm90.md
// "O through TMA stores"): the 16-bit kernels write O by TMA stores through a tensor map of out.
// Each case writes into a view of a larger poisoned buffer (rows of the head dim plus padding,
// heads interleaved with unused ones) and checks the view against the fp64 CPU reference and
// every element outside the view untouched: a store past the sequence, past the head dim or into
// another head shows. Lengths no tile divides, head dims 128, 96 (a tile wider than the head dim)
// and 64 (with a document mask: the Q buffer released right after the stores), persistent CTAs,
// one query tile per CTA, and two per CTA through one Q buffer (whose O goes out from registers).
// Fresh random inputs (the seed is printed on failure); skips without a GPU, and where
// forward/sm90a_wgmma is not selectable.
#include <flexjit/attention.h>

#include "gpu/GpuTestUtil.h"
#include "gpu/StandardBindings.h"
#include "runtime/ForwardPlan.h"
#include "support/CpuReference.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

using namespace flexjit;
using namespace flexjit::test;

namespace {

// How out lies in its storage: [B, S, Hb, Dp] with the view's heads at 1 .. H of Hb = H + 2 and
// Dp = D + pad columns (strides of 16-byte multiples, as the variant asks), or plain
// [B, H, S, D].
struct OutView {
  const char* label;
  bool interleaved;
  int pad;
};

struct OutCase {
  int d;
  int sq, skv;
  const char* mods;
  BlockConfig config;
};

}  // namespace

TEST_CASE("forward: out through strided views matches the reference and nothing outside changes",
          "[gpu][forward][out_views]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!sm90a_wgmma_selectable(*ctx)) return;
  ForwardFamilyScope family_scope("sm90a_wgmma");
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  BlockConfig one_tile, two_tiles;
  one_tile.params["persistent"] = 0;
  two_tiles.block_m = 128;
  two_tiles.params["persistent"] = 0;
  two_tiles.params["q_tiles"] = 2;
  const std::vector<OutCase> cases = {
      {128, 300, 333, "causal", {}},          // the default: persistent 192-row tiles
      {96, 517, 300, "alibi", {}},            // a tile wider than the head dim
      {64, 400, 450, "document_causal", {}},  // d 64, a column load: release after the stores
      {128, 333, 200, "noop", one_tile},      // one query tile per CTA
      {128, 600, 600, "document_causal", two_tiles},  // two query tiles per CTA, one Q buffer
  };
  const std::vector<OutView> views = {{"contiguous", false, 0},
                                      {"interleaved heads, padded rows", true, 8},
                                      {"interleaved heads, rows padded by 64", true, 64}};
  for (const OutCase& oc : cases) {
    for (const OutView& ov : views) {
      AttentionShape s;
      s.batch = 2, s.heads_q = 4, s.heads_kv = 2, s.seqlen_q = oc.sq, s.seqlen_kv = oc.skv;
      s.head_dim_qk = s.head_dim_v = oc.d;
      const std::string label = fmt::format("{} d {} Sq={} Skv={}, out {} (seed {})", oc.mods, oc.d,
                                            oc.sq, oc.skv, ov.label, seed);
      INFO(label);
      const Mods mods = standard_mods(oc.mods);
      std::map<std::string, HostBuffer> buffers;
      std::vector<std::pair<std::string, double>> params;
      bind_standard_mods(mods, s, rng, buffers, params);
      std::vector<DeviceTensor> keep;
      ModBindings bindings;
      ir::EvalEnv env;
      for (auto& [name, hb] : buffers) {
        keep.push_back(DeviceTensor::from_host(*ctx, hb.dtype, hb.shape, hb.bytes.data()));
        bindings.buffers.emplace_back(name, keep.back().ref());
        env.buffers[name] = ir::BufferView{hb.bytes.data(), hb.dtype, hb.shape, {}};
      }
      bindings.params = params;
      for (auto& [n, x] : params)
        env.params[n] = x;
      const HostTensor q = random_tensor(rng, DType::BF16, {2, 4, oc.sq, oc.d});
      const HostTensor k = random_tensor(rng, DType::BF16, {2, 2, oc.skv, oc.d});
      const HostTensor v = random_tensor(rng, DType::BF16, {2, 2, oc.skv, oc.d});
      const DeviceTensor dq = upload(*ctx, q), dk = upload(*ctx, k), dv = upload(*ctx, v);

      // The storage, poisoned (0xFFFF: a bf16 NaN), and the view of out in it.
      const int64_t hb = ov.interleaved ? 6 : 4, dp = oc.d + ov.pad;
      const std::vector<int64_t> storage_shape = ov.interleaved
                                                     ? std::vector<int64_t>{2, oc.sq, hb, dp}
                                                     : std::vector<int64_t>{2, 4, oc.sq, oc.d};
      DeviceTensor storage = DeviceTensor::empty(*ctx, DType::BF16, storage_shape);
      storage.fill_bytes(0xFF);
      TensorRef out = storage.ref();
      if (ov.interleaved) {
        out.data = static_cast<char*>(out.data) + dp * 2;  // head 1 of the storage
        out.shape = {2, 4, oc.sq, oc.d};
        out.strides = {oc.sq * hb * dp, dp, hb * dp, 1};
      }
      AttentionOptions o;
      o.mods = mods;
      o.bindings = bindings;
      o.config = oc.config;
      CHECK_THAT(step_line(runtime::describe_forward_plan(*ctx, dq.ref(), dk.ref(), dv.ref(), o),
                           "forward"),
                 Catch::Contains("forward/sm90a_wgmma"));
      DeviceTensor lse = DeviceTensor::empty(*ctx, DType::F32, {2, 4, oc.sq});
      flex_attention_into(*ctx, dq.ref(), dk.ref(), dv.ref(), out, &lse.ref(), o);
      ctx->synchronize();

      // The view against the reference; every other element of the storage still the poison.
      std::vector<uint16_t> bits(static_cast<size_t>(storage.ref().numel()));
      storage.copy_to_host(bits.data());
      std::vector<float> got;
      got.reserve(static_cast<size_t>(2 * 4 * oc.sq * oc.d));
      int64_t outside_written = 0;
      std::vector<char> in_view(bits.size(), 0);
      const int64_t base = ov.interleaved ? dp : 0;
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t h = 0; h < 4; ++h)
          for (int64_t r = 0; r < oc.sq; ++r)
            for (int64_t x = 0; x < oc.d; ++x) {
              const int64_t i =
                  base + b * out.strides[0] + h * out.strides[1] + r * out.strides[2] + x;
              in_view[static_cast<size_t>(i)] = 1;
              const uint32_t f = static_cast<uint32_t>(bits[static_cast<size_t>(i)]) << 16;
              float val;
              std::memcpy(&val, &f, sizeof val);
              got.push_back(val);
            }
      for (size_t i = 0; i < bits.size(); ++i)
        if (!in_view[i] && bits[i] != 0xFFFF) ++outside_written;
      const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(oc.d)));
      const ReferenceResult ref =
          cpu_reference_attention(mods, s, q.values, k.values, v.values, scale, env);
      const ErrorStats err = compare(got, ref.out);
      INFO("out " << err.str() << "; " << outside_written << " elements written outside the view");
      CHECK(err.nonfinite == 0);
      CHECK(err.rel <= tolerance(DType::BF16));
      CHECK(outside_written == 0);
      std::printf("  %s: out %s\n", label.c_str(), err.str().c_str());
    }
  }
}
