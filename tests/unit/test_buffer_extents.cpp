// Captured buffers shorter than the call needs are errors before anything runs (issue 34,
// "Silent wrong answers"): on the CPU backend, its block masks and through the CLI. The GPU side
// (flex_attention, create_block_mask, the backward, decoding) goes through the same
// runtime::bind_mod_args check before any launch: tests/gpu/test_buffers.cpp.
#include <catch2/catch.hpp>

#include <flexjit/cpu.h>
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "cpu/BackwardKernel.h"
#include "cpu/JitBlockMask.h"
#include "support/CacheTest.h"
#include "support/CliPath.h"
#include "util/Npy.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace flexjit;

namespace {

struct Qkv {
  std::vector<float> q, k, v;
  TensorRef tq, tk, tv;
  Qkv(int64_t B, int64_t H, int64_t S, int64_t D) {
    std::mt19937 rng(11);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (auto* x : {&q, &k, &v}) {
      x->resize(static_cast<size_t>(B * H * S * D));
      for (float& e : *x)
        e = n01(rng);
    }
    tq = TensorRef::contiguous(q.data(), DType::F32, {B, H, S, D});
    tk = TensorRef::contiguous(k.data(), DType::F32, {B, H, S, D});
    tv = TensorRef::contiguous(v.data(), DType::F32, {B, H, S, D});
  }
};

}  // namespace

TEST_CASE("a captured buffer shorter than the call's heads or sequence is an error on the CPU",
          "[cpu][buffers][errors]") {
  const int64_t H = 8, S = 64, D = 16;
  const Qkv x(1, H, S, D);
  std::vector<float> slopes(16);
  for (size_t i = 0; i < slopes.size(); ++i)
    slopes[i] = std::exp2(-8.0f * static_cast<float>(i + 1) / H);
  AttentionOptions o;
  o.mods = standard_mods("alibi_causal");
  // 1 or 4 slopes for 8 heads used to run with the loads clamped: wrong by up to 3.9.
  for (int64_t n : {1, 4, 7}) {
    INFO(n << " slopes");
    o.bindings.buffers = {{"slopes", TensorRef::contiguous(slopes.data(), DType::F32, {n})}};
    CHECK_THROWS_AS(flex_attention_cpu(x.tq, x.tk, x.tv, o), RuntimeError);
    CHECK_THROWS_WITH(flex_attention_cpu(x.tq, x.tk, x.tv, o),
                      "buffer 'slopes' (declared f32[H]): dim 0 (H) has " + std::to_string(n) +
                          " entries, but this call has 8 query heads (h < 8); the mods would "
                          "read past its end");
  }
  // Exactly 8, or more than needed: runs.
  for (int64_t n : {8, 16}) {
    o.bindings.buffers = {{"slopes", TensorRef::contiguous(slopes.data(), DType::F32, {n})}};
    CHECK(flex_attention_cpu(x.tq, x.tk, x.tv, o).out.size() == static_cast<size_t>(H * S * D));
  }

  // A document-id buffer of 10 entries for S = 64: flex_attention_cpu and the block mask builder
  // refuse it alike (only the block mask builder did).
  std::vector<int32_t> doc(64);
  for (size_t i = 0; i < doc.size(); ++i)
    doc[i] = static_cast<int32_t>(i / 16);
  AttentionOptions d;
  d.mods = standard_mods("document_causal");
  d.bindings.buffers = {{"doc_id", TensorRef::contiguous(doc.data(), DType::I32, {10})}};
  const std::string doc_error =
      "buffer 'doc_id' (declared i32[S]): dim 0 (S) has 10 entries, but this call has Sq = 64 "
      "and Skv = 64 (S covers q_idx and kv_idx)";
  CHECK_THROWS_WITH(flex_attention_cpu(x.tq, x.tk, x.tv, d), Catch::StartsWith(doc_error));
  CHECK_THROWS_WITH(cpu::cpu_create_block_mask(d.mods, d.bindings, 1, 1, S, S),
                    Catch::StartsWith(doc_error));
  d.bindings.buffers = {{"doc_id", TensorRef::contiguous(doc.data(), DType::I32, {64})}};
  CHECK(flex_attention_cpu(x.tq, x.tk, x.tv, d).out.size() == static_cast<size_t>(H * S * D));

  // The backward checks the same way.
  const CpuAttentionResult fwd = flex_attention_cpu(x.tq, x.tk, x.tv, o);
  o.bindings.buffers = {{"slopes", TensorRef::contiguous(slopes.data(), DType::F32, {4})}};
  const TensorRef dout =
      TensorRef::contiguous(const_cast<float*>(fwd.out.data()), DType::F32, {1, H, S, D});
  CHECK_THROWS_WITH(cpu::cpu_attention_backward(o.mods, o.bindings, x.tq, x.tk, x.tv,
                                                fwd.out.data(), fwd.lse.data(), dout),
                    Catch::Contains("buffer 'slopes' (declared f32[H]): dim 0 (H) has 4 entries"));

  // Dims with other names (R: an offset decides the range) and numbers are not the call's.
  AttentionOptions r;
  r.mods = parse_mods("buffer t: f32[N]\nscore_mod = score + t[0]");
  std::vector<float> one(1, 0.5f);
  r.bindings.buffers = {{"t", TensorRef::contiguous(one.data(), DType::F32, {1})}};
  CHECK_NOTHROW(flex_attention_cpu(x.tq, x.tk, x.tv, r));
}

TEST_CASE("flexjit run --device cpu refuses a --buffer shorter than the call needs",
          "[cli][cpu][buffers][errors]") {
  test::TempDir dir;
  const std::string slopes = (dir.path() / "s4.npy").string();
  npy::Array a = npy::make_array(DType::F32, {4});
  for (int i = 0; i < 4; ++i)
    a.as<float>()[i] = std::exp2(-1.0f * static_cast<float>(i + 1));
  npy::write(slopes, a);
  std::string output;
  const int code = test::run_cli(
      "run --device cpu --mods alibi --random 1,8,64,16 --buffer slopes=" + slopes, &output);
  INFO(output);
  CHECK(code == 1);
  CHECK_THAT(output, Catch::Contains("buffer 'slopes' (declared f32[H]): dim 0 (H) has 4 entries, "
                                     "but this call has 8 query heads (h < 8)"));
}
