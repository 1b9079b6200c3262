// The CPU backward (cpu/BackwardKernel.h) against central finite differences of the CPU fp64
// forward: loss = sum(out * dout) (+ sum(lse * dlse) when the test gives a dlse) for random dout
// and dlse, so d loss / d x is what the backward gives.
#include <catch2/catch.hpp>

#include <flexjit/mods.h>

#include "cpu/BackwardKernel.h"
#include "cpu/ForwardKernel.h"
#include "ir/Evaluate.h"
#include "support/HostBindings.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace flexjit;

namespace {

struct Problem {
  Mods mods;
  int B = 1, Hq = 2, Hkv = 1, Sq = 9, Skv = 9, D = 8, Dv = 8;
  std::vector<float> q, k, v, dout;
  std::vector<float> dlse;  // empty: the loss does not use the lse
  std::vector<float> slopes, bias, t5;
  std::vector<int32_t> doc;
  ir::EvalEnv env;  // the buffers and params, as the interpreter reads them
  ModBindings bindings() const { return test::host_bindings(mods, env); }

  TensorRef tq() const {
    return TensorRef::contiguous(const_cast<float*>(q.data()), DType::F32, {B, Hq, Sq, D});
  }
  TensorRef tk() const {
    return TensorRef::contiguous(const_cast<float*>(k.data()), DType::F32, {B, Hkv, Skv, D});
  }
  TensorRef tv() const {
    return TensorRef::contiguous(const_cast<float*>(v.data()), DType::F32, {B, Hkv, Skv, Dv});
  }
  TensorRef tdo() const {
    return TensorRef::contiguous(const_cast<float*>(dout.data()), DType::F32, {B, Hq, Sq, Dv});
  }

  void bind() {
    env = {};
    const int max_s = std::max(Sq, Skv);
    env.buffers["slopes"] = ir::BufferView{slopes.data(), DType::F32, {Hq}, {}};
    env.buffers["bias"] = ir::BufferView{bias.data(), DType::F32, {2 * max_s}, {}};
    env.buffers["doc_id"] = ir::BufferView{doc.data(), DType::I32, {max_s}, {}};
    env.params["offset"] = max_s;
    env.params["cap"] = 2.0;
    if (mods.name == "t5_bucketed_bias") {
      env.buffers["bias"] = ir::BufferView{t5.data(), DType::F32, {Hq, 32}, {}};
    }
  }

  double loss() const {
    std::vector<double> out(static_cast<size_t>(B * Hq * Sq * Dv)),
        lse(static_cast<size_t>(B * Hq * Sq));
    cpu::cpu_attention_forward_f64(mods, bindings(), tq(), tk(), tv(), out.data(), lse.data());
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i)
      l += out[i] * dout[i];
    for (size_t i = 0; i < dlse.size(); ++i)
      l += lse[i] * dlse[i];
    return l;
  }
};

Problem make_problem(const std::string& mods, int B, int Hq, int Hkv, int Sq, int Skv, int D,
                     uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  Problem p;
  p.mods = mods.find('=') != std::string::npos ? parse_mods(mods) : standard_mods(mods);
  if (mods.find('=') == std::string::npos) p.mods.name = mods;
  p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.Sq = Sq, p.Skv = Skv, p.D = D, p.Dv = D;
  auto fill = [&](std::vector<float>& x, size_t n, float sd) {
    x.resize(n);
    for (auto& e : x)
      e = sd * n01(rng);
  };
  fill(p.q, static_cast<size_t>(B * Hq * Sq * D), 1.0f);
  fill(p.k, static_cast<size_t>(B * Hkv * Skv * D), 1.0f);
  fill(p.v, static_cast<size_t>(B * Hkv * Skv * D), 1.0f);
  fill(p.dout, static_cast<size_t>(B * Hq * Sq * D), 1.0f);
  fill(p.slopes, static_cast<size_t>(Hq), 0.3f);
  const int max_s = std::max(Sq, Skv);
  fill(p.bias, static_cast<size_t>(2 * max_s), 1.0f);
  fill(p.t5, static_cast<size_t>(Hq * 32), 1.0f);
  p.doc.resize(static_cast<size_t>(max_s));
  for (int i = 0; i < max_s; ++i)
    p.doc[i] = i / 5;
  p.bind();
  return p;
}

struct Grads {
  cpu::CpuGradients<double> g64;
  cpu::CpuGradients<float> g32;
};

Grads backward(const Problem& p) {
  Grads r;
  cpu::CpuBackwardOptions o;
  o.dlse = p.dlse.empty() ? nullptr : p.dlse.data();
  const size_t rows = static_cast<size_t>(p.B * p.Hq * p.Sq);
  std::vector<double> out64(rows * p.Dv), lse64(rows);
  cpu::cpu_attention_forward_f64(p.mods, p.bindings(), p.tq(), p.tk(), p.tv(), out64.data(),
                                 lse64.data());
  r.g64 = cpu::cpu_attention_backward_f64(p.mods, p.bindings(), p.tq(), p.tk(), p.tv(),
                                          out64.data(), lse64.data(), p.tdo(), o);
  std::vector<float> out32(rows * p.Dv), lse32(rows);
  cpu::cpu_attention_forward(p.mods, p.bindings(), p.tq(), p.tk(), p.tv(), out32.data(),
                             lse32.data());
  r.g32 = cpu::cpu_attention_backward(p.mods, p.bindings(), p.tq(), p.tk(), p.tv(), out32.data(),
                                      lse32.data(), p.tdo(), o);
  return r;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x)
    m = std::max(m, std::abs(e));
  return m;
}

// Central difference of the loss in x[i] (a float input: the step actually taken is measured).
double fd(Problem& p, std::vector<float>& x, size_t i) {
  const float x0 = x[i];
  const float h = 4e-3f * std::max(1.0f, std::abs(x0));
  x[i] = x0 + h;
  const double hi = static_cast<double>(x[i]);
  const double lp = p.loss();
  x[i] = x0 - h;
  const double lo = static_cast<double>(x[i]);
  const double lm = p.loss();
  x[i] = x0;
  return (lp - lm) / (hi - lo);
}

// Checks `analytic` against finite differences at up to `samples` entries of x (every entry
// when x is small), and the fp32 gradient against the fp64 one.
void check_grad(Problem& p, const char* what, std::vector<float>& x,
                const std::vector<double>& analytic, const std::vector<float>& g32, int samples,
                std::mt19937& rng) {
  INFO(what);
  REQUIRE(analytic.size() == x.size());
  REQUIRE(g32.size() == x.size());
  if (x.empty()) return;
  const double scale = std::max(1.0, max_abs(analytic));
  std::vector<size_t> idx;
  if (static_cast<int>(x.size()) <= samples) {
    for (size_t i = 0; i < x.size(); ++i)
      idx.push_back(i);
  } else {
    std::uniform_int_distribution<size_t> pick(0, x.size() - 1);
    for (int s = 0; s < samples; ++s)
      idx.push_back(pick(rng));
  }
  for (size_t i : idx) {
    INFO("entry " << i);
    const double numeric = fd(p, x, i);
    CHECK(std::isfinite(analytic[i]));
    CHECK(std::abs(numeric - analytic[i]) <= 2e-3 * scale);
  }
  for (size_t i = 0; i < x.size(); ++i) {
    INFO("fp32 entry " << i);
    CHECK(std::abs(static_cast<double>(g32[i]) - analytic[i]) <= 1e-4 * scale);
  }
}

void check_all(Problem& p, uint32_t seed, int samples = 12) {
  std::mt19937 rng(seed);
  Grads g = backward(p);
  check_grad(p, "dq", p.q, g.g64.dq, g.g32.dq, samples, rng);
  check_grad(p, "dk", p.k, g.g64.dk, g.g32.dk, samples, rng);
  check_grad(p, "dv", p.v, g.g64.dv, g.g32.dv, samples, rng);
  for (const auto& [name, grad] : g.g64.buffers) {
    INFO("buffer " << name);
    std::vector<float>* data = nullptr;
    if (name == "slopes") data = &p.slopes;
    if (name == "bias") data = p.mods.name == "t5_bucketed_bias" ? &p.t5 : &p.bias;
    REQUIRE(data != nullptr);
    check_grad(p, name.c_str(), *data, grad, g.g32.buffers.at(name), samples, rng);
  }
}

}  // namespace

TEST_CASE("CPU backward matches finite differences of the fp64 forward", "[cpu][backward]") {
  const std::vector<std::string> mods = {
      "noop",         "causal",           "alibi",          "softcap", "relative_bias",
      "alibi_causal", "t5_bucketed_bias", "document_causal"};
  uint32_t seed = 1;
  for (const auto& name : mods) {
    for (auto [B, Sq, Skv, D] :
         std::vector<std::array<int, 4>>{{1, 1, 1, 8}, {2, 13, 17, 8}, {1, 40, 23, 16}}) {
      INFO(name << " B=" << B << " Sq=" << Sq << " Skv=" << Skv << " D=" << D);
      Problem p = make_problem(name, B, 2, 1, Sq, Skv, D, seed++);
      check_all(p, seed);
    }
  }
}

TEST_CASE("CPU backward: a loss that uses the lse (dlse)", "[cpu][backward]") {
  uint32_t seed = 500;
  for (const std::string name : {"noop", "alibi_causal", "softcap", "relative_bias"}) {
    INFO(name);
    Problem p = make_problem(name, 2, 2, 1, 11, 14, 8, seed++);
    std::mt19937 rng(seed);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    p.dlse.resize(static_cast<size_t>(p.B * p.Hq * p.Sq));
    for (auto& e : p.dlse)
      e = n01(rng);
    check_all(p, seed);
  }
}

TEST_CASE("CPU backward gives float buffers gradients and integer buffers none",
          "[cpu][backward]") {
  Problem p = make_problem("alibi", 1, 2, 1, 11, 11, 8, 7);
  Grads g = backward(p);
  REQUIRE(g.g64.buffers.count("slopes") == 1);
  CHECK(max_abs(g.g64.buffers.at("slopes")) > 0);
  Problem d = make_problem("document", 1, 2, 2, 11, 11, 8, 8);
  CHECK(backward(d).g64.buffers.empty());
}

TEST_CASE("CPU backward: fully masked rows have zero gradients", "[cpu][backward]") {
  // Rows 0..2 attend nothing; rows >= 3 attend causally.
  Problem p = make_problem("mask_mod = q_idx >= 3 && kv_idx <= q_idx", 1, 2, 1, 10, 10, 8, 11);
  Grads g = backward(p);
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 3; ++i) {
      for (int d = 0; d < 8; ++d) {
        CHECK(g.g64.dq[(h * 10 + i) * 8 + d] == 0.0);
        CHECK(g.g32.dq[(h * 10 + i) * 8 + d] == 0.0f);
      }
    }
  }
  for (float x : g.g32.dk)
    CHECK(std::isfinite(x));
  check_all(p, 12);
  // Everything masked: all gradients are zero.
  Problem none = make_problem("mask_mod = kv_idx < 0", 1, 2, 1, 6, 6, 8, 13);
  Grads z = backward(none);
  CHECK(max_abs(z.g64.dq) == 0.0);
  CHECK(max_abs(z.g64.dk) == 0.0);
  CHECK(max_abs(z.g64.dv) == 0.0);
}

TEST_CASE("CPU backward: zero lengths", "[cpu][backward]") {
  for (auto [Sq, Skv] : std::vector<std::pair<int, int>>{{0, 5}, {5, 0}, {0, 0}}) {
    INFO("Sq=" << Sq << " Skv=" << Skv);
    Problem p = make_problem("alibi_causal", 2, 2, 1, Sq, Skv, 8, 21);
    Grads g = backward(p);
    CHECK(g.g64.dq.size() == static_cast<size_t>(2 * 2 * Sq * 8));
    CHECK(g.g64.dk.size() == static_cast<size_t>(2 * 1 * Skv * 8));
    CHECK(max_abs(g.g64.dq) == 0.0);
    CHECK(max_abs(g.g64.dk) == 0.0);
    CHECK(max_abs(g.g64.dv) == 0.0);
    CHECK(max_abs(g.g64.buffers.at("slopes")) == 0.0);
  }
}

TEST_CASE("CPU backward rejects a dout of the wrong shape", "[cpu][backward]") {
  Problem p = make_problem("causal", 1, 2, 1, 4, 4, 8, 31);
  std::vector<double> out(2 * 4 * 8), lse(2 * 4);
  auto bad = TensorRef::contiguous(p.dout.data(), DType::F32, {1, 2, 3, 8});
  CHECK_THROWS_WITH(cpu::cpu_attention_backward_f64(p.mods, p.bindings(), p.tq(), p.tk(), p.tv(),
                                                    out.data(), lse.data(), bad),
                    Catch::Contains("dout is [1, 2, 3, 8]"));
}
