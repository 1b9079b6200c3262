// flex_attention_backward_prepare, the backward's early start (docs/caching.md "First call"): in
// a fresh Context and kernel cache, the backward's kernels queued before the forward compile
// while it runs; the backward then builds nothing twice and its gradients (and the forward's
// outputs) are bitwise those of the same calls without the early start. What it refuses and
// where it queues nothing. Skips without a GPU.
#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/error.h>
#include <flexjit/paged_kv.h>

#include "gpu/GpuTestUtil.h"
#include "gpu/StandardBindings.h"
#include "jit/Nvrtc.h"
#include "plan/ContextImpl.h"
#include "support/CacheTest.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

using namespace flexjit;
using namespace flexjit::test;

namespace {

struct Run {
  size_t queued = 0;                       // what flex_attention_backward_prepare queued
  uint64_t compiles = 0;                   // NVRTC compiles of the forward and the backward
  std::vector<std::vector<float>> values;  // out, lse, dq, dk, dv, then the buffer gradients
};

// The forward (with lse) and the deterministic backward of `mods` in a fresh Context and kernel
// cache (nothing built), the backward's kernels queued first when `early`.
Run run(const Mods& mods, const ModBindings& bindings, const DeviceTensor& q, const DeviceTensor& k,
        const DeviceTensor& v, const DeviceTensor& dout, bool early) {
  TempDir dir;
  Context ctx(cache_in(dir.path()));
  impl_of(ctx).builder.set_compile_threads(4);
  AttentionOptions o;
  o.mods = mods;
  o.bindings = bindings;
  o.return_lse = true;
  BackwardOptions bo;
  bo.deterministic = true;  // every gradient's bits fixed by the kernels (no atomics' order)
  Run r;
  const uint64_t c0 = jit::nvrtc_compile_count();
  if (early) r.queued = flex_attention_backward_prepare(ctx, q, k, v, o, bo);
  const AttentionResult fwd = flex_attention(ctx, q, k, v, o);
  const BackwardResult g = flex_attention_backward(ctx, q, k, v, fwd.out, fwd.lse, dout, o, bo);
  ctx.synchronize();
  impl_of(ctx).builder.wait_background();
  r.compiles = jit::nvrtc_compile_count() - c0;
  for (const DeviceTensor* t : {&fwd.out, &fwd.lse, &g.dq, &g.dk, &g.dv})
    r.values.push_back(download(*t));
  for (const auto& [name, t] : g.buffer_grads)
    r.values.push_back(download(t));
  return r;
}

}  // namespace

TEST_CASE(
    "the backward's early start: each kernel compiled once, gradients bitwise those without it",
    "[gpu][backward][first_call][prepare]") {
  FJ_REQUIRE_GPU_OR_SKIP(shared);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  AttentionShape s;
  s.batch = 1, s.heads_q = s.heads_kv = 2, s.seqlen_q = s.seqlen_kv = 300;
  s.head_dim_qk = s.head_dim_v = 128;
  const Mods mods = standard_mods("alibi");  // a float buffer (the slopes): its gradient too
  std::map<std::string, HostBuffer> buffers;
  std::vector<std::pair<std::string, double>> params;
  bind_standard_mods(mods, s, rng, buffers, params);
  std::vector<DeviceTensor> keep;
  ModBindings bindings;
  for (auto& [name, hb] : buffers) {
    keep.push_back(DeviceTensor::from_host(*shared, hb.dtype, hb.shape, hb.bytes.data()));
    bindings.buffers.emplace_back(name, keep.back().ref());
  }
  bindings.params = params;
  const std::vector<int64_t> shape = {1, 2, 300, 128};
  const DeviceTensor q = upload(*shared, random_tensor(rng, DType::BF16, shape));
  const DeviceTensor k = upload(*shared, random_tensor(rng, DType::BF16, shape));
  const DeviceTensor v = upload(*shared, random_tensor(rng, DType::BF16, shape));
  const DeviceTensor dout = upload(*shared, random_tensor(rng, DType::BF16, shape));

  const Run early = run(mods, bindings, q, k, v, dout, true);
  const Run late = run(mods, bindings, q, k, v, dout, false);
  CHECK(early.queued == 3);  // preprocess, dK/dV, dQ: all new to the fresh Context
  // The same kernels, each compiled once: the backward waited for the compiles in flight or
  // found them built.
  CHECK(early.compiles == late.compiles);
  REQUIRE(early.values.size() == 6);  // out, lse, dq, dk, dv, the slopes' gradient
  REQUIRE(late.values.size() == early.values.size());
  const char* names[] = {"out", "lse", "dq", "dk", "dv", "slopes gradient"};
  for (size_t i = 0; i < early.values.size(); ++i) {
    INFO(names[i]);
    REQUIRE(early.values[i].size() == late.values[i].size());
    size_t nonfinite = 0, differ = 0;
    for (size_t j = 0; j < early.values[i].size(); ++j) {
      nonfinite += std::isfinite(early.values[i][j]) ? 0 : 1;
      differ += early.values[i][j] == late.values[i][j] ? 0 : 1;
    }
    CHECK(nonfinite == 0);
    CHECK(differ == 0);
  }
}

TEST_CASE("flex_attention_backward_prepare: what it refuses, where it queues nothing",
          "[gpu][backward][prepare]") {
  FJ_REQUIRE_GPU_OR_SKIP(shared);
  std::mt19937_64 rng(fresh_seed());
  const std::vector<int64_t> shape = {1, 2, 128, 64};
  const DeviceTensor q = upload(*shared, random_tensor(rng, DType::BF16, shape));
  AttentionOptions o;
  o.mods = standard_mods("causal");
  {
    // What the backward refuses, before anything is queued: a KV cache.
    KvCache cache;
    AttentionOptions with_cache = o;
    with_cache.kv_cache = &cache;
    CHECK_THROWS_AS(flex_attention_backward_prepare(*shared, q, q, q, with_cache),
                    UnsupportedError);
  }
  {
    // Caching disabled: every compile is its call's own.
    ContextOptions off;
    off.disable_cache = true;
    Context uncached(off);
    impl_of(uncached).builder.set_compile_threads(4);
    CHECK(flex_attention_backward_prepare(uncached, q, q, q, o) == 0);
  }
  {
    // One compile thread (FLEXJIT_COMPILE_THREADS=1): no background compile.
    TempDir dir;
    Context one(cache_in(dir.path()));
    impl_of(one).builder.set_compile_threads(1);
    CHECK(flex_attention_backward_prepare(one, q, q, q, o) == 0);
  }
  {
    // An empty call launches no kernel; asking twice queues once.
    TempDir dir;
    Context ctx(cache_in(dir.path()));
    impl_of(ctx).builder.set_compile_threads(4);
    const DeviceTensor empty = DeviceTensor::empty(ctx, DType::BF16, {1, 2, 0, 64});
    CHECK(flex_attention_backward_prepare(ctx, empty, empty, empty, o) == 0);
    CHECK(flex_attention_backward_prepare(ctx, q, q, q, o) == 3);
    CHECK(flex_attention_backward_prepare(ctx, q, q, q, o) == 0);
    impl_of(ctx).builder.wait_background();
    CHECK(flex_attention_backward_prepare(ctx, q, q, q, o) == 0);  // built: in the memo
  }
}
