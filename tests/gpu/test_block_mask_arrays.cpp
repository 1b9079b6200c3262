// DeviceBlockMask::from_arrays on a GPU: a mask over borrowed device arrays (what
// flexjit._block_mask_from_arrays makes of PyTorch tensors) runs the forward and the backward
// exactly as the mask it was taken from, computes absent transposed arrays, keeps the arrays'
// owner alive, keeps its own schedules (re-derived after arrays_changed) and refuses bad arrays.
// Fresh random inputs each run (the seed is printed on failure); skipped without a GPU.
#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/block_mask.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>

#include "device/MaskScheduleCache.h"
#include "gpu/GpuTestUtil.h"
#include "ir/Evaluate.h"
#include "support/BlockMaskCompare.h"
#include "support/CpuReference.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

using namespace flexjit;
using test::download;
using test::fresh_seed;

namespace {

// Views of `mask`'s kv_* and full_kv_* arrays (q_* left for from_arrays to compute), borrowed
// with an owner that keeps `mask` alive and counts its release.
DeviceBlockMaskArrays borrow_kv_arrays(const std::shared_ptr<DeviceBlockMask>& mask,
                                       const std::shared_ptr<int>& released) {
  std::shared_ptr<void> owner(new std::shared_ptr<DeviceBlockMask>(mask), [released](void* p) {
    delete static_cast<std::shared_ptr<DeviceBlockMask>*>(p);
    ++*released;
  });
  DeviceBlockMaskArrays a;
  a.kv_num_blocks = DeviceTensor::borrow(mask->kv_num_blocks.ref(), owner);
  a.kv_indices = DeviceTensor::borrow(mask->kv_indices.ref(), owner);
  a.full_kv_num_blocks = DeviceTensor::borrow(mask->full_kv_num_blocks.ref(), owner);
  a.full_kv_indices = DeviceTensor::borrow(mask->full_kv_indices.ref(), owner);
  return a;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("from_arrays over a created mask's borrowed arrays runs as the created mask",
          "[gpu][block_mask][from_arrays]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const int B = 2, H = 4, S = 1000, D = 64;
  Mods mods = standard_mods("sliding_window");
  ModBindings window{{}, {{"window", 300}}};
  auto created = std::make_shared<DeviceBlockMask>(
      create_block_mask(*ctx, mods, B, 1, S, S, kDefaultSparseBlockSize, window));
  auto released = std::make_shared<int>(0);
  DeviceBlockMask borrowed =
      DeviceBlockMask::from_arrays(*ctx, created->meta(), borrow_kv_arrays(created, released));

  // The borrowed kv_* are the created mask's memory; q_* and full_q_* were computed.
  CHECK(borrowed.kv_indices.ref().data == created->kv_indices.ref().data);
  CHECK(borrowed.full_kv_indices.ref().data == created->full_kv_indices.ref().data);
  REQUIRE(borrowed.q_indices.defined());
  REQUIRE(borrowed.full_q_indices.defined());
  CHECK(borrowed.q_indices.ref().data != created->q_indices.ref().data);
  const BlockMask host = borrowed.to_host();
  host.validate();
  test::require_same(host, created->to_host());
  CHECK(runtime::schedule_cache_of(borrowed) != nullptr);  // its own, as a created mask's

  const test::HostTensor q = test::random_tensor(rng, DType::BF16, {B, H, S, D});
  const test::HostTensor k = test::random_tensor(rng, DType::BF16, {B, H, S, D});
  const test::HostTensor v = test::random_tensor(rng, DType::BF16, {B, H, S, D});
  const test::HostTensor dout = test::random_tensor(rng, DType::BF16, {B, H, S, D});
  const DeviceTensor dq_in = test::upload(*ctx, q), dk_in = test::upload(*ctx, k),
                     dv_in = test::upload(*ctx, v), ddout = test::upload(*ctx, dout);
  AttentionOptions o;
  o.bindings = window;
  o.return_lse = true;
  o.block_mask = created.get();
  const AttentionResult want = flex_attention(*ctx, dq_in, dk_in, dv_in, o);
  o.block_mask = &borrowed;
  const AttentionResult got = flex_attention(*ctx, dq_in, dk_in, dv_in, o);
  ctx->synchronize();
  // The same tiles and the same kernel: the same bits.
  CHECK(same_bits(download(got.out), download(want.out)));
  CHECK(same_bits(download(got.lse), download(want.lse)));
  // And right: against the fp64 CPU reference of the mask_mod the mask was built from.
  ir::EvalEnv env;
  env.params["window"] = 300;
  const test::ReferenceResult ref = test::cpu_reference_attention(
      mods, {B, H, H, S, S, D, D}, q.values, k.values, v.values, 1.0f / 8.0f, env);
  const double rel = test::relative_error(download(got.out), ref.out);
  INFO("relative error " << rel);
  CHECK(rel <= test::tolerance(DType::BF16));

  // The backward walks the computed q_* / full_q_*: deterministic, so bitwise the created mask's.
  BackwardOptions bo;
  bo.deterministic = true;
  o.block_mask = created.get();
  const BackwardResult gw =
      flex_attention_backward(*ctx, dq_in, dk_in, dv_in, want.out, want.lse, ddout, o, bo);
  o.block_mask = &borrowed;
  const BackwardResult gg =
      flex_attention_backward(*ctx, dq_in, dk_in, dv_in, got.out, got.lse, ddout, o, bo);
  ctx->synchronize();
  CHECK(same_bits(download(gg.dq), download(gw.dq)));
  CHECK(same_bits(download(gg.dk), download(gw.dk)));
  CHECK(same_bits(download(gg.dv), download(gw.dv)));

  // The owner lives as long as the borrowed mask (and its copies), not longer.
  created.reset();
  DeviceBlockMask copy = borrowed;
  borrowed = DeviceBlockMask();
  CHECK(*released == 0);
  o.block_mask = &copy;
  const AttentionResult again = flex_attention(*ctx, dq_in, dk_in, dv_in, o);
  ctx->synchronize();
  CHECK(same_bits(download(again.out), download(want.out)));
  copy = DeviceBlockMask();
  CHECK(*released == 1);
}

TEST_CASE("from_arrays re-derives a borrowed mask's schedules after arrays_changed",
          "[gpu][block_mask][from_arrays]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const int S = 900, D = 64, window = 200;
  const BlockMask causal =
      block_mask_from_predicate([](int, int, int q, int kv) { return q >= kv; }, 1, 1, S, S);
  const BlockMask sliding = block_mask_from_predicate(
      [&](int, int, int q, int kv) { return q >= kv && q - kv <= window; }, 1, 1, S, S);
  // Arrays of the test's own (a framework's tensors in Python), holding the causal mask.
  const std::vector<int64_t> rows = {1, 1, causal.num_q_blocks};
  const std::vector<int64_t> tiles = {1, 1, causal.num_q_blocks, causal.num_kv_blocks};
  DeviceBlockMaskArrays a;
  a.kv_num_blocks = DeviceTensor::from_host(*ctx, DType::I32, rows, causal.kv_num_blocks.data());
  a.kv_indices = DeviceTensor::from_host(*ctx, DType::I32, tiles, causal.kv_indices.data());
  a.full_kv_num_blocks =
      DeviceTensor::from_host(*ctx, DType::I32, rows, causal.full_kv_num_blocks.data());
  a.full_kv_indices =
      DeviceTensor::from_host(*ctx, DType::I32, tiles, causal.full_kv_indices.data());
  a.q_num_blocks = DeviceTensor::from_host(*ctx, DType::I32, rows, causal.q_num_blocks.data());
  a.q_indices = DeviceTensor::from_host(*ctx, DType::I32, tiles, causal.q_indices.data());
  a.full_q_num_blocks =
      DeviceTensor::from_host(*ctx, DType::I32, rows, causal.full_q_num_blocks.data());
  a.full_q_indices = DeviceTensor::from_host(*ctx, DType::I32, tiles, causal.full_q_indices.data());
  DeviceBlockMaskArrays mine = a;  // the same memory, written below
  const DeviceBlockMask borrowed = DeviceBlockMask::from_arrays(*ctx, causal, a, /*validate=*/true);
  CHECK(borrowed.q_indices.ref().data == mine.q_indices.ref().data);  // given: not recomputed

  // On sm_90a the forward's 192-row tiles read a schedule the mask keeps (MaskScheduleCache):
  // the case a stale schedule would break. Elsewhere the test checks the results alone.
  const std::vector<std::string> families = test::forward_families(*ctx);
  const bool keeps_schedules =
      std::find(families.begin(), families.end(), "sm90a_wgmma") != families.end();
  std::optional<test::ForwardFamilyScope> scope;
  if (keeps_schedules) scope.emplace("sm90a_wgmma");
  runtime::MaskScheduleCache* cache = runtime::schedule_cache_of(borrowed);
  REQUIRE(cache != nullptr);

  const test::HostTensor q = test::random_tensor(rng, DType::BF16, {1, 4, S, D});
  const DeviceTensor dq = test::upload(*ctx, q);
  const auto run = [&](const Mods& mods, const DeviceBlockMask& mask) {
    AttentionOptions o;
    o.mods = mods;
    if (!mods.params.empty()) o.bindings.params = {{"window", window}};  // sliding_window's
    o.block_mask = &mask;
    const AttentionResult r = flex_attention(*ctx, dq, dq, dq, o);
    ctx->synchronize();
    return download(r.out);
  };
  const Mods causal_mods = standard_mods("causal"), sliding_mods = standard_mods("sliding_window");
  CHECK(same_bits(run(causal_mods, borrowed),
                  run(causal_mods, DeviceBlockMask::upload(*ctx, causal))));
  if (keeps_schedules) CHECK(cache->ready_entries() == 1);  // the default at d 64: 192 rows
  // Rewritten in place (the sliding window's arrays have the same shapes), then announced.
  mine.kv_num_blocks.copy_from_host(sliding.kv_num_blocks.data());
  mine.kv_indices.copy_from_host(sliding.kv_indices.data());
  mine.full_kv_num_blocks.copy_from_host(sliding.full_kv_num_blocks.data());
  mine.full_kv_indices.copy_from_host(sliding.full_kv_indices.data());
  mine.q_num_blocks.copy_from_host(sliding.q_num_blocks.data());
  mine.q_indices.copy_from_host(sliding.q_indices.data());
  mine.full_q_num_blocks.copy_from_host(sliding.full_q_num_blocks.data());
  mine.full_q_indices.copy_from_host(sliding.full_q_indices.data());
  borrowed.arrays_changed();
  CHECK(cache->ready_entries() == 0);
  const std::vector<float> want = run(sliding_mods, DeviceBlockMask::upload(*ctx, sliding));
  CHECK(same_bits(run(sliding_mods, borrowed), want));
  ir::EvalEnv env;
  env.params["window"] = window;
  const test::ReferenceResult ref = test::cpu_reference_attention(
      sliding_mods, {1, 4, 4, S, S, D, D}, q.values, q.values, q.values, 1.0f / 8.0f, env);
  CHECK(test::relative_error(want, ref.out) <= test::tolerance(DType::BF16));
}

TEST_CASE("from_arrays refuses arrays of another shape, device or meta, and bad contents",
          "[gpu][block_mask][from_arrays]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const BlockMask causal = block_mask_from_predicate(
      [](int, int, int q, int kv) { return q >= kv; }, 1, 2, 512, 512, 128, 128);
  const auto arrays_of = [&](const BlockMask& m) {
    const int64_t H = m.heads, nq = m.num_q_blocks, nk = m.num_kv_blocks;
    DeviceBlockMaskArrays a;
    a.kv_num_blocks = DeviceTensor::from_host(*ctx, DType::I32, {1, H, nq}, m.kv_num_blocks.data());
    a.kv_indices = DeviceTensor::from_host(*ctx, DType::I32, {1, H, nq, nk}, m.kv_indices.data());
    return a;
  };
  SECTION("a meta of other heads") {
    BlockMask meta = causal;
    meta.heads = 1;
    CHECK_THROWS_WITH(DeviceBlockMask::from_arrays(*ctx, meta, arrays_of(causal)),
                      "kv_num_blocks has shape [1, 2, 4] but the meta's batch and heads (Bm, Hm) "
                      "are 1, 1");
  }
  SECTION("a meta of other lengths") {
    BlockMask meta = causal;
    meta.seqlen_kv = 1024;
    CHECK_THROWS_WITH(DeviceBlockMask::from_arrays(*ctx, meta, arrays_of(causal)),
                      Catch::StartsWith("kv_indices has shape [1, 2, 4, 4]; expected [Bm, Hm, 4, "
                                        "8]"));
  }
  SECTION("kv_indices out of range: computing q_* refuses it, validate names it too") {
    BlockMask bad = causal;
    bad.kv_indices[1 * 4 * 4 + 3 * 4 + 0] = 4;  // head 1, the last q tile's partial tile
    CHECK_THROWS_WITH(DeviceBlockMask::from_arrays(*ctx, causal, arrays_of(bad)),
                      "kv_indices[0, 1, 3, 0] = 4 is out of range [0, 4)");
    // With q_* given nothing reads kv_* unless asked to validate.
    DeviceBlockMaskArrays given = arrays_of(bad);
    given.q_num_blocks =
        DeviceTensor::from_host(*ctx, DType::I32, {1, 2, 4}, causal.q_num_blocks.data());
    given.q_indices =
        DeviceTensor::from_host(*ctx, DType::I32, {1, 2, 4, 4}, causal.q_indices.data());
    CHECK_NOTHROW(DeviceBlockMask::from_arrays(*ctx, causal, given));  // contents unchecked
    CHECK_THROWS_WITH(DeviceBlockMask::from_arrays(*ctx, causal, given, /*validate=*/true),
                      "kv_indices[0, 1, 3, 0] = 4 is out of range [0, 4)");
  }
}
