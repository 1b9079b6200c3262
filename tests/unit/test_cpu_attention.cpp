// The CPU forward (fp32 and the fp64 reference mode) against a naive fp64 reference with
// materialised scores (tests/support/ReferenceAttention, mods through the interpreter).
#include <catch2/catch.hpp>

#include <flexjit/mods.h>

#include "cpu/ForwardKernel.h"
#include "cpu/JitBlockMask.h"
#include "ir/Evaluate.h"
#include "support/HostBindings.h"
#include "support/ReferenceAttention.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

using namespace flexjit;

namespace {

struct Case {
  int B = 1, Hq = 1, Hkv = 1, Sq = 1, Skv = 1, D = 16, Dv = 16;
  bool strided = false;  // inputs are slices of larger tensors with padded strides
  bool block_mask = false;
  bool allow_avx2 = true;
};

// A [B, H, S, D] tensor of random values, optionally a slice (of dims 1 and 2, with padding in
// every stride) of a larger one; `dense` receives the same values contiguously.
struct Input {
  std::vector<float> storage;
  TensorRef view;
  std::vector<float> dense;
};

Input make_input(std::mt19937& rng, int B, int H, int S, int D, bool strided) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Input in;
  const int64_t pd = strided ? D + 3 : D, ps = strided ? S + 2 : S, ph = strided ? H + 1 : H;
  in.storage.assign(static_cast<size_t>(B * ph * ps * pd), std::nanf(""));  // padding is NaN
  in.view.data = in.storage.data();
  in.view.dtype = DType::F32;
  in.view.shape = {B, H, S, D};
  in.view.strides = {ph * ps * pd, ps * pd, pd, 1};
  const int64_t base = strided ? in.view.strides[1] + pd : 0;  // start at [0, 1, 1, 0]
  in.view.data = in.storage.data() + base;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int s = 0; s < S; ++s)
        for (int d = 0; d < D; ++d) {
          const float x = dist(rng);
          in.storage[static_cast<size_t>(base + b * in.view.strides[0] + h * in.view.strides[1] +
                                         s * in.view.strides[2] + d)] = x;
          in.dense.push_back(x);
        }
  return in;
}

// Runs one case in fp32 and fp64 against the reference; returns the number of fully masked rows.
int check_case(const Mods& mods, const ir::EvalEnv& env, const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Input q = make_input(rng, c.B, c.Hq, c.Sq, c.D, c.strided);
  Input k = make_input(rng, c.B, c.Hkv, c.Skv, c.D, c.strided);
  Input v = make_input(rng, c.B, c.Hkv, c.Skv, c.Dv, c.strided);
  test::AttentionShape shape{c.B, c.Hq, c.Hkv, c.Sq, c.Skv, c.D, c.Dv};
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  const test::ReferenceResult ref =
      test::reference_attention(mods, shape, q.dense, k.dense, v.dense, scale, env);

  cpu::CpuForwardOptions opt;
  opt.scale = scale;
  opt.num_threads = 2;
  opt.allow_avx2 = c.allow_avx2;
  const ModBindings bindings = test::host_bindings(mods, env);
  BlockMask bm;
  if (c.block_mask) {
    bm = cpu::cpu_create_block_mask(mods, bindings, 1, c.Hq, c.Sq, c.Skv,
                                    cpu::CpuBlockMaskOptions{32, 64, 2});
    opt.block_mask = &bm;
  }
  std::vector<float> out(ref.out.size(), 123.0f), lse(ref.lse.size(), 123.0f);
  cpu::cpu_attention_forward(mods, bindings, q.view, k.view, v.view, out.data(), lse.data(), opt);
  std::vector<double> out64(ref.out.size(), 123.0), lse64(ref.lse.size(), 123.0);
  cpu::cpu_attention_forward_f64(mods, bindings, q.view, k.view, v.view, out64.data(), lse64.data(),
                                 opt);

  INFO(mods.name << " B=" << c.B << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " Sq=" << c.Sq
                 << " Skv=" << c.Skv << " D=" << c.D << " Dv=" << c.Dv << " strided=" << c.strided
                 << " block_mask=" << c.block_mask);
  REQUIRE(test::relative_error(out, ref.out) <= 1e-5);
  double err64 = 0;
  for (size_t i = 0; i < ref.out.size(); ++i)
    err64 = std::max(err64, std::abs(out64[i] - ref.out[i]));
  REQUIRE(err64 <= 1e-12);
  int masked_rows = 0;
  for (size_t i = 0; i < ref.lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      ++masked_rows;
      REQUIRE(lse[i] == -std::numeric_limits<float>::infinity());
      REQUIRE(lse64[i] == -std::numeric_limits<double>::infinity());
    } else {
      REQUIRE(std::abs(lse[i] - ref.lse[i]) <= 1e-5 * std::max(1.0, std::abs(ref.lse[i])));
      REQUIRE(std::abs(lse64[i] - ref.lse[i]) <= 1e-12 * std::max(1.0, std::abs(ref.lse[i])));
    }
  }
  for (float x : out)
    REQUIRE(std::isfinite(x));
  return masked_rows;
}

// Bindings for the standard mods used here, sized for sequences up to `max_s` and `heads`.
struct StandardBindings {
  std::vector<float> slopes, bias;
  std::vector<int32_t> doc;
  ir::EvalEnv env;
  StandardBindings(int heads, int max_s) {
    for (int h = 0; h < heads; ++h)
      slopes.push_back(std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(heads)));
    for (int i = 0; i < 2 * max_s; ++i)
      bias.push_back(std::sin(0.1f * static_cast<float>(i)));
    for (int i = 0; i < max_s; ++i)
      doc.push_back(i / 37);
    env.buffers["slopes"] = ir::BufferView{slopes.data(), DType::F32, {heads}, {}};
    env.buffers["bias"] = ir::BufferView{bias.data(), DType::F32, {2 * max_s}, {}};
    env.buffers["doc_id"] = ir::BufferView{doc.data(), DType::I32, {max_s}, {}};
    env.params["offset"] = max_s;
    env.params["cap"] = 5.0;
    env.params["window"] = 20;
  }
};

}  // namespace

TEST_CASE("CPU forward matches the fp64 reference across mods, shapes, GQA and strides", "[cpu]") {
  const char* names[] = {"noop",     "causal",         "alibi",         "softcap",
                         "document", "sliding_window", "relative_bias", "softcap_causal"};
  StandardBindings sb(6, 300);
  uint32_t seed = 1;
  int cases = 0;
  for (const char* name : names) {
    Mods mods = standard_mods(name);
    for (int len : {1, 17, 127, 128, 129, 300}) {
      Case c;
      c.Sq = len;
      c.Skv = (len * 7) % 301 + 1;  // a different kv length
      if (std::string(name) == "causal" || std::string(name) == "document") c.Skv = len;
      c.Hkv = 2;
      c.Hq = 2 * (1 + static_cast<int>(seed % 3));  // GQA ratios 1, 2, 3
      c.D = (seed % 2) ? 16 : 64;
      c.Dv = (seed % 4 == 1) ? 32 : c.D;
      c.B = len <= 17 ? 2 : 1;
      c.strided = seed % 2 == 0;
      c.block_mask = seed % 3 == 0;
      check_case(mods, sb.env, c, seed++);
      ++cases;
    }
  }
  REQUIRE(cases == 48);
}

TEST_CASE("the baseline (non-AVX2) fp32 kernels match the reference too", "[cpu]") {
  StandardBindings sb(4, 300);
  for (const char* name : {"causal", "alibi", "softcap"}) {
    Case c{2, 4, 2, 129, 300, 64, 48, true, true};
    c.allow_avx2 = false;
    check_case(standard_mods(name), sb.env, c, 91);
  }
}

TEST_CASE("CPU forward with a block mask equals the forward without one", "[cpu]") {
  StandardBindings sb(4, 300);
  for (const char* name : {"causal", "sliding_window", "document", "alibi"}) {
    Case c{1, 4, 2, 300, 300, 64, 64, true, true};
    check_case(standard_mods(name), sb.env, c, 77);
  }
}

TEST_CASE("fully masked rows give out 0 and lse -inf, never NaN", "[cpu]") {
  StandardBindings sb(2, 300);
  // q_idx < 5 masks everything for the first five rows; the rest attend causally.
  Mods mods = parse_mods("mask_mod = q_idx >= 5 && kv_idx <= q_idx");
  mods.name = "first rows masked";
  for (bool bmask : {false, true}) {
    Case c{1, 2, 1, 129, 129, 16, 16, false, bmask};
    REQUIRE(check_case(mods, sb.env, c, 3) == 2 * 5);
  }
  Mods none = parse_mods("mask_mod = false");
  none.name = "all masked";
  Case c{2, 2, 2, 17, 33, 16, 16, true, false};
  REQUIRE(check_case(none, sb.env, c, 4) == 2 * 2 * 17);
}

namespace {

TensorRef host4(const void* data, DType dt, int64_t b, int64_t h, int64_t s, int64_t d) {
  return TensorRef::contiguous(const_cast<void*>(data), dt, {b, h, s, d});
}

}  // namespace

TEST_CASE("zero-length queries or keys compute nothing", "[cpu]") {
  const ModBindings none;
  Mods mods = standard_mods("causal");
  std::vector<float> q(2 * 4 * 16, 1.0f), kv(2 * 4 * 16, 1.0f);
  auto qt = host4(q.data(), DType::F32, 1, 2, 4, 16);
  auto empty = host4(nullptr, DType::F32, 1, 2, 0, 16);
  std::vector<float> out(2 * 4 * 16, 5.0f), lse(2 * 4, 5.0f);
  cpu::cpu_attention_forward(mods, none, qt, empty, empty, out.data(), lse.data());
  for (float x : out)
    REQUIRE(x == 0.0f);
  for (float x : lse)
    REQUIRE(x == -std::numeric_limits<float>::infinity());
  std::vector<float> untouched = {9.0f};
  auto kt = host4(kv.data(), DType::F32, 1, 2, 4, 16);
  cpu::cpu_attention_forward(mods, none, empty, kt, kt, untouched.data(), untouched.data());
  REQUIRE(untouched[0] == 9.0f);
}

TEST_CASE("CPU forward reads bf16 and f16 inputs", "[cpu]") {
  StandardBindings sb(2, 64);
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int S = 40, D = 16;
  for (DType dt : {DType::BF16, DType::F16}) {
    std::vector<uint16_t> bits[3];
    std::vector<float> widened[3];
    for (int t = 0; t < 3; ++t) {
      for (int i = 0; i < 2 * S * D; ++i) {
        const float x = dist(rng);
        const uint16_t b16 =
            dt == DType::BF16 ? ir::float_to_bf16_bits(x) : ir::float_to_f16_bits(x);
        bits[t].push_back(b16);
        widened[t].push_back(dt == DType::BF16 ? ir::bf16_bits_to_float(b16)
                                               : ir::f16_bits_to_float(b16));
      }
    }
    Mods mods = standard_mods("causal");
    test::AttentionShape shape{1, 2, 2, S, S, D, D};
    const float scale = 0.25f;
    auto ref =
        test::reference_attention(mods, shape, widened[0], widened[1], widened[2], scale, sb.env);
    std::vector<float> out(ref.out.size()), lse(ref.lse.size());
    cpu::CpuForwardOptions opt;
    opt.scale = scale;
    cpu::cpu_attention_forward(mods, test::host_bindings(mods, sb.env),
                               host4(bits[0].data(), dt, 1, 2, S, D),
                               host4(bits[1].data(), dt, 1, 2, S, D),
                               host4(bits[2].data(), dt, 1, 2, S, D), out.data(), lse.data(), opt);
    REQUIRE(test::relative_error(out, ref.out) <= 1e-5);
  }
}

TEST_CASE("CPU forward rejects inconsistent inputs with RuntimeError", "[cpu]") {
  const ModBindings none;
  Mods mods = standard_mods("causal");
  std::vector<float> buf(3 * 4 * 16, 0.0f), out(3 * 4 * 16), lse(3 * 4);
  auto q = host4(buf.data(), DType::F32, 1, 3, 4, 16);
  auto k = host4(buf.data(), DType::F32, 1, 2, 4, 16);
  REQUIRE_THROWS_WITH(cpu::cpu_attention_forward(mods, none, q, k, k, out.data(), lse.data()),
                      Catch::Contains("Hq=3 is not a multiple of Hkv=2"));
  auto k8 = host4(buf.data(), DType::F32, 1, 3, 4, 8);
  REQUIRE_THROWS_WITH(cpu::cpu_attention_forward(mods, none, q, k8, q, out.data(), lse.data()),
                      Catch::Contains("q and k head dims differ: 16 vs 8"));
  auto bad = q;
  bad.strides[3] = 2;
  REQUIRE_THROWS_WITH(cpu::cpu_attention_forward(mods, none, bad, q, q, out.data(), lse.data()),
                      Catch::Contains("last dim of q is not contiguous"));
  auto on_gpu = q;
  on_gpu.device = TensorRef::Device::CUDA;
  REQUIRE_THROWS_WITH(
      cpu::cpu_attention_forward(mods, none, on_gpu, on_gpu, on_gpu, out.data(), lse.data()),
      Catch::Contains("the CPU backend needs CPU tensors"));
  auto huge = host4(buf.data(), DType::F32, 1, 1, int64_t{1} << 31, 16);
  REQUIRE_THROWS_WITH(
      cpu::cpu_attention_forward(mods, none, huge, huge, huge, out.data(), lse.data()),
      Catch::Contains("i32 indices"));
  auto overflow = host4(buf.data(), DType::F32, 11357979, 3528238, 460321, 64);
  REQUIRE_THROWS_WITH(
      cpu::cpu_attention_forward(mods, none, overflow, overflow, overflow, out.data(), lse.data()),
      Catch::Contains("more than 2^63 elements"));
  BlockMask bm = cpu::cpu_create_block_mask(mods, none, 1, 1, 8, 8);
  cpu::CpuForwardOptions opt;
  opt.block_mask = &bm;
  REQUIRE_THROWS_WITH(cpu::cpu_attention_forward(mods, none, q, q, q, out.data(), lse.data(), opt),
                      Catch::Contains("block mask"));
}

TEST_CASE("a NaN or +inf score makes its row NaN, as in PyTorch; masked ones do nothing",
          "[cpu][nan]") {
  // Row 2 meets +inf (exp(100) overflows f32), row 3 a NaN (log(-1)); the others are finite.
  // PyTorch's softmax gives NaN for a row holding +inf or NaN; flexjit used to call such a row
  // fully masked (out 0, lse -inf).
  Mods mods = parse_mods(
      "score_mod = where(q_idx == 2 && kv_idx == 5, exp(100.0), "
      "where(q_idx == 3 && kv_idx == 1, log(-1.0), score))");
  Mods masked = parse_mods(
      "score_mod = where(kv_idx == q_idx + 1, log(-1.0), score)\nmask_mod = kv_idx <= q_idx");
  const int S = 70, D = 16;  // > one kv tile of 64
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> q(S * D), k(S * D), v(S * D);
  for (auto* t : {&q, &k, &v})
    for (float& x : *t)
      x = dist(rng);
  const auto qt = host4(q.data(), DType::F32, 1, 1, S, D);
  const auto kt = host4(k.data(), DType::F32, 1, 1, S, D);
  const auto vt = host4(v.data(), DType::F32, 1, 1, S, D);
  for (bool f64 : {false, true}) {
    std::vector<double> out(S * D), lse(S);
    if (f64) {
      cpu::cpu_attention_forward_f64(mods, {}, qt, kt, vt, out.data(), lse.data());
    } else {
      std::vector<float> o32(S * D), l32(S);
      cpu::cpu_attention_forward(mods, {}, qt, kt, vt, o32.data(), l32.data());
      out.assign(o32.begin(), o32.end());
      lse.assign(l32.begin(), l32.end());
    }
    INFO("fp64 mode: " << f64);
    for (int r = 0; r < S; ++r) {
      const bool nan_row = r == 2 || r == 3;
      CHECK(std::isnan(lse[r]) == nan_row);
      for (int d = 0; d < D; ++d)
        CHECK(std::isnan(out[r * D + d]) == nan_row);
    }
    // A NaN score where the mask_mod masks is dropped before the softmax.
    std::vector<double> mout(S * D), mlse(S);
    if (f64) {
      cpu::cpu_attention_forward_f64(masked, {}, qt, kt, vt, mout.data(), mlse.data());
    } else {
      std::vector<float> o32(S * D), l32(S);
      cpu::cpu_attention_forward(masked, {}, qt, kt, vt, o32.data(), l32.data());
      mout.assign(o32.begin(), o32.end());
      mlse.assign(l32.begin(), l32.end());
    }
    for (double x : mout)
      CHECK(std::isfinite(x));
  }
  // A NaN input element (q row 7) gives a NaN output row too.
  q[7 * D + 3] = std::nanf("");
  std::vector<float> out(S * D), lse(S);
  cpu::cpu_attention_forward(standard_mods("noop"), {}, qt, kt, vt, out.data(), lse.data());
  for (int r = 0; r < S; ++r)
    CHECK(std::isnan(lse[r]) == (r == 7));
}
