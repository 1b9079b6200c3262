// The CPU check of context parallelism (flex_attention_cp_cpu; docs/context_parallel.md): every
// rank's calls, offsets and lse merges on the CPU backend against the unsharded attention, for
// causal, document, sliding-window and ALiBi mods at N = 2, 3, 4, both strategies and both
// layouts; and `flexjit run --device cpu --cp-shards N --check`.
#include <flexjit/context_parallel.h>
#include <flexjit/cpu.h>
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "cpu/BackwardKernel.h"
#include "support/CliPath.h"
#include "util/Npy.h"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

using namespace flexjit;
using flexjit::test::run_cli;

namespace {

struct Problem {
  int64_t B = 1, Hq = 4, Hkv = 2, S = 0, D = 32;
  std::vector<float> q, k, v, slopes;
  std::vector<int32_t> doc_id;

  explicit Problem(int64_t seqlen, uint32_t seed) : S(seqlen) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    q.resize(B * Hq * S * D), k.resize(B * Hkv * S * D), v.resize(B * Hkv * S * D);
    for (auto* x : {&q, &k, &v})
      for (float& e : *x)
        e = n01(rng);
    for (int64_t h = 0; h < Hq; ++h)
      slopes.push_back(std::exp2(-8.0f * float(h + 1) / float(Hq)));
    // Documents of uneven lengths whose boundaries fall inside chunks.
    int32_t doc = 0;
    for (int64_t i = 0; i < S; ++i) {
      if (i == S / 5 || i == S / 2 || i == S - 7) ++doc;
      doc_id.push_back(doc);
    }
  }
  TensorRef tq() { return TensorRef::contiguous(q.data(), DType::F32, {B, Hq, S, D}); }
  TensorRef tk() { return TensorRef::contiguous(k.data(), DType::F32, {B, Hkv, S, D}); }
  TensorRef tv() { return TensorRef::contiguous(v.data(), DType::F32, {B, Hkv, S, D}); }

  AttentionOptions options(const std::string& mods_name) {
    AttentionOptions o;
    o.mods = standard_mods(mods_name);
    for (const Buffer& b : o.mods.buffers) {
      if (b.name() == "slopes") {
        o.bindings.buffers.emplace_back("slopes",
                                        TensorRef::contiguous(slopes.data(), DType::F32, {Hq}));
      } else if (b.name() == "doc_id") {
        o.bindings.buffers.emplace_back("doc_id",
                                        TensorRef::contiguous(doc_id.data(), DType::I32, {S}));
      }
    }
    if (mods_name == "sliding_window") o.bindings.params = {{"window", double(S / 7)}};
    return o;
  }
};

// max |a - b| / max(1, |b|) over the elements (f32 rounding of the merges); -inf must meet -inf.
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    m = std::max(m, double(std::abs(a[i] - b[i])) / std::max(1.0, double(std::abs(b[i]))));
  }
  return m;
}

}  // namespace

TEST_CASE("flex_attention_cp_cpu equals the unsharded attention, rank by rank", "[cp][cpu]") {
  const char* mods_name =
      GENERATE("causal", "document_causal", "document", "sliding_window", "alibi", "alibi_causal");
  const int n = GENERATE(2, 3, 4);
  const CpStrategy strategy = GENERATE(CpStrategy::Ring, CpStrategy::AllGather);
  const CpLayout layout = GENERATE(CpLayout::Zigzag, CpLayout::Contiguous);
  INFO(mods_name << ", N = " << n << ", " << to_string(strategy) << ", " << to_string(layout));
  Problem p(48 * n, 11 + n);  // chunks of 24 (zigzag) or 48 (contiguous)
  const AttentionOptions o = p.options(mods_name);
  const CpuAttentionResult whole = flex_attention_cpu(p.tq(), p.tk(), p.tv(), o);
  const CpuContextParallelResult sharded =
      flex_attention_cp_cpu(p.tq(), p.tk(), p.tv(), n, o, {strategy, layout});
  CHECK(sharded.result.shape == whole.shape);
  CHECK(max_diff(sharded.result.out, whole.out) <= 2e-6);
  CHECK(max_diff(sharded.result.lse, whole.lse) <= 2e-6);
  const std::string name = mods_name;
  if (name == "causal" && layout == CpLayout::Zigzag && strategy == CpStrategy::Ring) {
    // 2N + 1 calls per rank, 2N - 1 empty pairs skipped per rank.
    CHECK(sharded.calls == n * (2 * n + 1));
    CHECK(sharded.skipped_pairs == n * (2 * n - 1));
  }
  if (name == "alibi" || name == "document") CHECK(sharded.skipped_pairs == 0);
}

TEST_CASE(
    "flex_attention_cp_backward_cpu equals the unsharded backward, buffer gradients "
    "included",
    "[cp][cpu][backward]") {
  const char* mods_name =
      GENERATE("causal", "document_causal", "sliding_window", "alibi", "relative_bias_causal");
  const int n = GENERATE(2, 3, 4);
  const CpStrategy strategy = GENERATE(CpStrategy::Ring, CpStrategy::AllGather);
  INFO(mods_name << ", N = " << n << ", " << to_string(strategy));
  Problem p(24 * n, 21 + n);
  AttentionOptions o = p.options(mods_name);
  std::vector<float> bias;
  if (std::string(mods_name) == "relative_bias_causal") {
    std::mt19937 rng(4);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    bias.resize(static_cast<size_t>(2 * p.S));
    for (float& x : bias)
      x = n01(rng);
    o.bindings.buffers.emplace_back("bias",
                                    TensorRef::contiguous(bias.data(), DType::F32, {2 * p.S}));
    o.bindings.params = {{"offset", double(p.S)}};
  }
  const CpuAttentionResult fwd = flex_attention_cpu(p.tq(), p.tk(), p.tv(), o);
  std::vector<float> dout(fwd.out.size());
  std::mt19937 rng(9);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (float& x : dout)
    x = n01(rng);
  std::vector<float> out = fwd.out, lse = fwd.lse;
  const TensorRef tout = TensorRef::contiguous(out.data(), DType::F32, fwd.shape);
  const TensorRef tlse =
      TensorRef::contiguous(lse.data(), DType::F32, {fwd.shape[0], fwd.shape[1], fwd.shape[2]});
  const TensorRef tdout = TensorRef::contiguous(dout.data(), DType::F32, fwd.shape);
  const cpu::CpuGradients<float> whole = cpu::cpu_attention_backward(
      o.mods, o.bindings, p.tq(), p.tk(), p.tv(), out.data(), lse.data(), tdout);
  const CpuContextParallelGradients sharded = flex_attention_cp_backward_cpu(
      p.tq(), p.tk(), p.tv(), tout, tlse, tdout, n, o, {strategy, CpLayout::Zigzag});
  CHECK(max_diff(sharded.dq, whole.dq) <= 1e-5);
  CHECK(max_diff(sharded.dk, whole.dk) <= 1e-5);
  CHECK(max_diff(sharded.dv, whole.dv) <= 1e-5);
  CHECK(sharded.buffer_grads.size() == whole.buffers.size());
  for (const auto& [name, grad] : whole.buffers) {
    INFO("buffer " << name);
    REQUIRE(sharded.buffer_grads.count(name) == 1);
    // A buffer's gradient sums dS over every position: f32 sums in another order (per call,
    // then across calls) differ by more than the per-element tolerance, relative to the largest.
    const std::vector<float>& got = sharded.buffer_grads.at(name);
    double err = 0, scale = 1;
    for (size_t i = 0; i < grad.size(); ++i) {
      err = std::max(err, double(std::abs(got[i] - grad[i])));
      scale = std::max(scale, double(std::abs(grad[i])));
    }
    CHECK(err <= 1e-5 * scale * p.S);
  }
  CHECK(sharded.calls > 0);
}

TEST_CASE("flex_attention_cp_cpu: fully masked rows stay out 0, lse -inf", "[cp][cpu]") {
  // Rows 0..9 see no key; the merge keeps them empty on every rank.
  Problem p(96, 3);
  AttentionOptions o;
  o.mods = parse_mods("mask_mod = q_idx >= 10 && kv_idx <= q_idx");
  const CpuAttentionResult whole = flex_attention_cpu(p.tq(), p.tk(), p.tv(), o);
  for (CpStrategy s : {CpStrategy::Ring, CpStrategy::AllGather}) {
    const CpuContextParallelResult r =
        flex_attention_cp_cpu(p.tq(), p.tk(), p.tv(), 2, o, {s, CpLayout::Zigzag});
    CHECK(max_diff(r.result.out, whole.out) <= 2e-6);
    CHECK(max_diff(r.result.lse, whole.lse) <= 2e-6);
    CHECK(std::isinf(r.result.lse[0]));
    CHECK(r.result.out[0] == 0.0f);
  }
}

TEST_CASE("flex_attention_cp_cpu refuses what it cannot shard, naming it", "[cp][cpu]") {
  Problem p(96, 5);
  AttentionOptions o;
  o.mods = standard_mods("causal");
  CHECK_THROWS_WITH(flex_attention_cp_cpu(p.tq(), p.tk(), p.tv(), 5, o),
                    Catch::Contains("seqlen 96 is not a multiple of the 10 chunks"));
  const TensorRef short_k =
      TensorRef::contiguous(p.k.data(), DType::F32, {p.B, p.Hkv, p.S / 2, p.D});
  const TensorRef short_v =
      TensorRef::contiguous(p.v.data(), DType::F32, {p.B, p.Hkv, p.S / 2, p.D});
  CHECK_THROWS_WITH(flex_attention_cp_cpu(p.tq(), short_k, short_v, 2, o),
                    Catch::Contains("Sq (96) must equal Skv (48)"));
}

TEST_CASE("flexjit run --device cpu --cp-shards N --check", "[cp][cpu][cli]") {
  std::string out;
  CHECK(run_cli("run --device cpu --mods alibi_causal --random 1,4,192,32 --cp-shards 3 "
                "--cp-strategy ring --check --repeat 0",
                &out) == 0);
  CHECK_THAT(out, Catch::Contains("context parallelism: 3 shards (zigzag, ring)"));
  CHECK_THAT(out, Catch::Contains("sharded vs unsharded: max |out diff|"));
  CHECK(run_cli("run --device cpu --mods document_causal --random 1,4,128,32 --cp-shards 4 "
                "--cp-strategy allgather --check --repeat 0",
                &out) == 0);
  CHECK_THAT(out, Catch::Contains("context parallelism: 4 shards (zigzag, allgather)"));
  // The backward shard by shard, against the unsharded CPU backward.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("flexjit_cp_cli_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  npy::Array dout = npy::make_array(DType::F32, {1, 4, 96, 32});
  std::mt19937 rng(2);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (int64_t i = 0; i < dout.numel(); ++i) {
    const float x = n01(rng);
    std::memcpy(dout.bytes.data() + 4 * i, &x, 4);
  }
  npy::write((dir / "dout.npy").string(), dout);
  CHECK(run_cli("run --device cpu --mods alibi_causal --random 1,4,96,32 --cp-shards 2 "
                "--cp-strategy allgather --check --repeat 0 --dout " +
                    (dir / "dout.npy").string() + " --dq " + (dir / "dq.npy").string(),
                &out) == 0);
  CHECK_THAT(out, Catch::Contains("context-parallel backward:") &&
                      Catch::Contains("sharded vs unsharded backward") &&
                      Catch::Contains("slopes"));
  CHECK(std::filesystem::exists(dir / "dq.npy"));
  std::filesystem::remove_all(dir);
  CHECK(run_cli("run --device cpu --mods causal --random 1,4,100,32 --cp-shards 3", &out) != 0);
  CHECK_THAT(out, Catch::Contains("seqlen 100 is not a multiple of the 6 chunks"));
  CHECK(run_cli("run --device cpu --mods causal --random 1,4,96,32 --cp-shards 2 --cp-strategy "
                "tree",
                &out) != 0);
  CHECK_THAT(out, Catch::Contains("--cp-strategy 'tree': use ring or allgather"));
}
