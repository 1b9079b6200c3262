// The public CPU API (include/flexjit/cpu.h) and `flexjit run --device cpu` (no GPU needed).
#include <catch2/catch.hpp>

#include <flexjit/cpu.h>
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "device/Device.h"
#include "support/CliPath.h"

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

using namespace flexjit;
using flexjit::test::run_cli;

TEST_CASE("flex_attention_cpu: fp32 agrees with the fp64 mode; bad tensors throw", "[cpu][api]") {
  const int64_t B = 2, Hq = 4, Hkv = 2, S = 77, D = 32;
  std::mt19937 rng(5);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> q(B * Hq * S * D), k(B * Hkv * S * D), v(B * Hkv * S * D), slopes(Hq);
  for (auto* x : {&q, &k, &v, &slopes})
    for (float& e : *x)
      e = n01(rng);
  AttentionOptions o;
  o.mods = standard_mods("alibi_causal");
  o.bindings.buffers = {{"slopes", TensorRef::contiguous(slopes.data(), DType::F32, {Hq})}};
  const TensorRef tq = TensorRef::contiguous(q.data(), DType::F32, {B, Hq, S, D});
  const TensorRef tk = TensorRef::contiguous(k.data(), DType::F32, {B, Hkv, S, D});
  const TensorRef tv = TensorRef::contiguous(v.data(), DType::F32, {B, Hkv, S, D});
  const CpuAttentionResult r = flex_attention_cpu(tq, tk, tv, o);
  const CpuAttentionResult ref = flex_attention_cpu(tq, tk, tv, o, {0, true});
  REQUIRE(r.shape == std::vector<int64_t>{B, Hq, S, D});
  double err = 0, mx = 0;
  for (size_t i = 0; i < r.out.size(); ++i) {
    err = std::max(err, double(std::abs(r.out[i] - ref.out[i])));
    mx = std::max(mx, double(std::abs(ref.out[i])));
  }
  CHECK(mx > 0.1);
  CHECK(err <= 1e-5 * mx);
  // Causal: row 0 attends key 0 only, so out[0, h, 0] == v[0, h / 2, 0].
  for (int64_t d = 0; d < D; ++d)
    CHECK(r.out[d] == Approx(v[d]).epsilon(1e-5));

  // flex_attention_into with CPU tensors takes the same path (no GPU involved).
  std::vector<float> out2(r.out.size());
  flex_attention_cpu_into(tq, tk, tv, TensorRef::contiguous(out2.data(), DType::F32, r.shape),
                          nullptr, o);
  CHECK(out2 == r.out);

  TensorRef on_gpu = tq;
  on_gpu.device = TensorRef::Device::CUDA;
  CHECK_THROWS_AS(flex_attention_cpu(on_gpu, on_gpu, on_gpu, o), RuntimeError);
  std::vector<float> small(4);
  CHECK_THROWS_WITH(
      flex_attention_cpu_into(tq, tk, tv, TensorRef::contiguous(small.data(), DType::F32, {4}),
                              nullptr, o),
      Catch::Contains("out is"));
  AttentionOptions unbound;
  unbound.mods = standard_mods("alibi");
  CHECK_THROWS_WITH(flex_attention_cpu(tq, tk, tv, unbound), Catch::Contains("slopes"));
}

TEST_CASE("flexjit run --device cpu runs and checks a real attention", "[cpu][cli][run]") {
  std::string out;
  REQUIRE(run_cli("run --device cpu --mods alibi_causal --random 1,2,96,16 --check --repeat 1",
                  &out) == 0);
  INFO(out);
  CHECK_THAT(out, Catch::Contains("alibi_causal on cpu"));
  CHECK_THAT(out, Catch::Contains("out [1, 2, 96, 16]"));
  const size_t at = out.find("fp64 CPU reference: ");
  REQUIRE(at != std::string::npos);
  const double rel = std::stod(out.substr(at + 20));
  CHECK(rel >= 0.0);
  CHECK(rel < 1e-5);
  std::string why;
  if (!runtime::cuda_available(&why)) {
    REQUIRE(run_cli("run --mods causal --random 1,1,8,8 --repeat 0", &out) == 0);
    CHECK_THAT(out, Catch::Contains("no GPU (") && Catch::Contains("running on the CPU backend"));
    CHECK(run_cli("run --device cuda --mods causal --random 1,1,8,8", &out) == 1);
    CHECK_THAT(out, Catch::Contains("needs a CUDA GPU"));
  }
  CHECK(run_cli("run --device cpu --mods causal --random 1,2,8", &out) == 1);
  CHECK_THAT(out, Catch::Contains("B,H,S,D"));
}
