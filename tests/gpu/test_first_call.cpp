// A cold first call (issue 33) in a fresh Context and kernel cache: the backward's kernels are
// compiled concurrently (KernelBuilder::build_all), the gradients still match the fp64 CPU
// backward on fresh random inputs, one at a time (FLEXJIT_COMPILE_THREADS=1) gives the same
// kernels, and the second call builds nothing. Skips without a GPU.
#include <flexjit/attention.h>
#include <flexjit/backward.h>

#include "gpu/BackwardCheck.h"
#include "gpu/GpuTestUtil.h"
#include "plan/ContextImpl.h"
#include "support/CacheTest.h"

#include <catch2/catch.hpp>

#include <cstring>

using namespace flexjit;
using namespace flexjit::test;

namespace {

struct FirstCallRun {
  AttentionResult fwd;
  BackwardResult grads;
  BuildTotals after_forward, after_backward, after_second;
};

// The forward (with lse) and the backward of causal attention, bf16, head dim 128, in `ctx`
// (fresh: nothing built yet), then the backward again.
FirstCallRun run_causal(Context& ctx, const DeviceTensor& q, const DeviceTensor& k,
                        const DeviceTensor& v, const DeviceTensor& dout) {
  AttentionOptions o;
  o.mods = standard_mods("causal");
  o.return_lse = true;
  const KernelBuilder& builder = impl_of(ctx).builder;
  FirstCallRun r;
  r.fwd = flex_attention(ctx, q, k, v, o);
  r.after_forward = builder.totals();
  r.grads = flex_attention_backward(ctx, q, k, v, r.fwd.out, r.fwd.lse, dout, o);
  ctx.synchronize();
  r.after_backward = builder.totals();
  flex_attention_backward(ctx, q, k, v, r.fwd.out, r.fwd.lse, dout, o);
  ctx.synchronize();
  r.after_second = builder.totals();
  return r;
}

}  // namespace

TEST_CASE("first call: a cold backward builds its kernels concurrently, gradients exact to fp64",
          "[gpu][backward][first_call]") {
  FJ_REQUIRE_GPU_OR_SKIP(shared);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const int64_t B = 1, H = 2, S = 300, D = 128;
  const HostTensor q = random_tensor(rng, DType::BF16, {B, H, S, D});
  const HostTensor k = random_tensor(rng, DType::BF16, {B, H, S, D});
  const HostTensor v = random_tensor(rng, DType::BF16, {B, H, S, D});
  const HostTensor dout = random_tensor(rng, DType::BF16, {B, H, S, D});
  const DeviceTensor dq = upload(*shared, q), dk = upload(*shared, k), dv = upload(*shared, v);
  const DeviceTensor ddout = upload(*shared, dout);

  TempDir concurrent_dir;
  Context concurrent(cache_in(concurrent_dir.path()));
  impl_of(concurrent).builder.set_compile_threads(4);
  const FirstCallRun a = run_causal(concurrent, dq, dk, dv, ddout);
  // The forward: one kernel and its companion, the union schedule of its 192-row tiles (built
  // beside it, not a batch of build_all). The backward: preprocess, dK/dV and dQ, new to this
  // Context, built at once.
  CHECK(a.after_forward.kernels == 2);
  CHECK(a.after_forward.concurrent_batches == 0);
  CHECK(a.after_backward.kernels == 5);
  CHECK(a.after_backward.concurrent_batches == 1);
  // The second backward: every kernel from the memo.
  CHECK(a.after_second.kernels == a.after_backward.kernels);
  CHECK(a.after_second.concurrent_batches == a.after_backward.concurrent_batches);

  ModBindings none;
  check_backward_f64(standard_mods("causal"), none, q, k, v, dout, a.fwd, a.grads,
                     "causal bf16 B=1 H=2 S=300 D=128, cold concurrent build");

  // One kernel at a time, in another fresh cache: the same kernels, so the same dK and dV bit
  // for bit (dQ is summed by bulk reductions or atomics in a varying order).
  TempDir serial_dir;
  Context serial(cache_in(serial_dir.path()));
  impl_of(serial).builder.set_compile_threads(1);
  const FirstCallRun b = run_causal(serial, dq, dk, dv, ddout);
  CHECK(b.after_backward.kernels == 5);
  CHECK(b.after_backward.concurrent_batches == 0);
  auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  CHECK(same_bits(download(a.fwd.out), download(b.fwd.out)));
  CHECK(same_bits(download(a.grads.dk), download(b.grads.dk)));
  CHECK(same_bits(download(a.grads.dv), download(b.grads.dv)));
}
