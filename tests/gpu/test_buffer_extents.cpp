// On the GPU, a captured buffer shorter than the call needs is a RuntimeError before any launch
// (issue 34, "Silent wrong answers"): flex_attention, create_block_mask, the backward and the
// split-KV decode all check a bound buffer's named dims (B, H / Hq, Hkv, S, Sq, Skv) against the
// shapes the host knows. The CPU side: tests/unit/test_buffer_extents.cpp.
#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/device_tensor.h>
#include <flexjit/error.h>
#include <flexjit/paged_kv.h>

#include "gpu/GpuTestUtil.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

using namespace flexjit;

TEST_CASE("GPU: a captured buffer shorter than the call needs is an error before any launch",
          "[gpu][forward][buffers][errors]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const int64_t H = 8, S = 64, D = 64;
  const DeviceTensor q = DeviceTensor::empty(*ctx, DType::BF16, {1, H, S, D});
  std::vector<float> slopes(H);
  for (int64_t i = 0; i < H; ++i)
    slopes[static_cast<size_t>(i)] = std::exp2(-8.0f * static_cast<float>(i + 1) / H);
  const DeviceTensor four = DeviceTensor::from_host(*ctx, DType::F32, {4}, slopes.data());
  const DeviceTensor eight = DeviceTensor::from_host(*ctx, DType::F32, {H}, slopes.data());
  AttentionOptions o;
  o.mods = standard_mods("alibi_causal");
  o.bindings.buffers = {{"slopes", four.ref()}};
  const std::string slopes_error =
      "buffer 'slopes' (declared f32[H]): dim 0 (H) has 4 entries, but this call has 8 query "
      "heads (h < 8)";
  CHECK_THROWS_AS(flex_attention(*ctx, q, q, q, o), RuntimeError);
  CHECK_THROWS_WITH(flex_attention(*ctx, q, q, q, o), Catch::Contains(slopes_error));
  // The decode path (a KV cache: lengths on the device, heads known on the host).
  std::vector<int32_t> lens = {static_cast<int32_t>(S)};
  const DeviceTensor seq_lens = DeviceTensor::from_host(*ctx, DType::I32, {1}, lens.data());
  const DeviceTensor q1 = DeviceTensor::empty(*ctx, DType::BF16, {1, H, 1, D});
  KvCache cache;
  cache.seq_lens = seq_lens.ref();
  AttentionOptions dec = o;
  dec.kv_cache = &cache;
  CHECK_THROWS_WITH(flex_attention(*ctx, q1, q, q, dec), Catch::Contains(slopes_error));
  // The backward.
  o.bindings.buffers = {{"slopes", eight.ref()}};
  AttentionOptions fwd = o;
  fwd.return_lse = true;
  const AttentionResult r = flex_attention(*ctx, q, q, q, fwd);
  o.bindings.buffers = {{"slopes", four.ref()}};
  CHECK_THROWS_WITH(flex_attention_backward(*ctx, q, q, q, r.out, r.lse, r.out, o),
                    Catch::Contains(slopes_error));

  // A document-id buffer of 10 entries for S = 64: create_block_mask and flex_attention alike.
  std::vector<int32_t> doc(S);
  for (int64_t i = 0; i < S; ++i)
    doc[static_cast<size_t>(i)] = static_cast<int32_t>(i / 16);
  const DeviceTensor ten = DeviceTensor::from_host(*ctx, DType::I32, {10}, doc.data());
  ModBindings bad;
  bad.buffers = {{"doc_id", ten.ref()}};
  const std::string doc_error =
      "buffer 'doc_id' (declared i32[S]): dim 0 (S) has 10 entries, but this call has Sq = 64 "
      "and Skv = 64";
  CHECK_THROWS_WITH(create_block_mask(*ctx, standard_mods("document_causal"), 1, 1, S, S, 128, bad),
                    Catch::Contains(doc_error));
  AttentionOptions d;
  d.mods = standard_mods("document_causal");
  d.bindings = bad;
  CHECK_THROWS_WITH(flex_attention(*ctx, q, q, q, d), Catch::Contains(doc_error));
  // Long enough: runs.
  const DeviceTensor full = DeviceTensor::from_host(*ctx, DType::I32, {S}, doc.data());
  d.bindings.buffers = {{"doc_id", full.ref()}};
  CHECK_NOTHROW(flex_attention(*ctx, q, q, q, d));
  ctx->synchronize();
}
