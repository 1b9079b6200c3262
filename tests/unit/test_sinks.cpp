// Attention sinks (the sink_mod) without a GPU: the language (parse, print, errors), Mods
// (C++ construction, hash, equal, combine, mask_only), the CUDA hooks and the cache keys, and the
// CPU backend's forward / backward against an explicit fp64 reference that appends the sink as
// an extra column with no value.
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "codegen/cuda/ModCodegen.h"
#include "cpu/BackwardKernel.h"
#include "cpu/ForwardKernel.h"
#include "ir/Evaluate.h"
#include "kernels/Registry.h"
#include "kernels/backward/Backward.h"
#include "kernels/decode/Decode.h"
#include "support/HostBindings.h"
#include "support/KernelDescs.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace flexjit;
using Catch::Matchers::Contains;

namespace {

constexpr const char* kHeadSinks = "buffer sinks: f32[H]\nsink_mod = sinks[h]\n";

std::string error_of(const std::string& text) {
  try {
    parse_mods(text, "t.fx");
  } catch (const CompileError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("sink_mod: parsed, printed and round-tripped", "[sinks][dsl]") {
  const Mods m = parse_mods(std::string(kHeadSinks) + "mask_mod = q_idx >= kv_idx");
  REQUIRE(m.sink_mod.defined());
  CHECK(m.sink_mod.type() == ScalarType::F32);
  REQUIRE(m.buffers.size() == 1);
  CHECK(m.buffers[0].name() == "sinks");
  CHECK_THAT(m.to_text(), Contains("sink_mod = sinks[h]"));
  const Mods again = parse_mods(m.to_text());
  CHECK(equal(m, again));
  CHECK(m.hash() == again.hash());
  CHECK(again.to_text() == m.to_text());
  // A sink alone is a complete mods file; a per-row sink may read q_idx, params and lets.
  CHECK_NOTHROW(parse_mods(kHeadSinks));
  const Mods row = parse_mods(
      "buffer sinks: f32[H]\nparam scale: f32 = 0.5\nlet base = sinks[h]\n"
      "sink_mod = base - scale * float(q_idx % 4)");
  CHECK(equal(row, parse_mods(row.to_text())));
  // The standard files.
  for (const char* name : {"sinks", "sinks_sliding_window"}) {
    INFO(name);
    const Mods s = standard_mods(name);
    CHECK(s.sink_mod.defined());
    CHECK(equal(s, parse_mods(s.to_text())));
  }
}

TEST_CASE("sink_mod: errors name the rule and the place", "[sinks][dsl][errors]") {
  CHECK_THAT(error_of("sink_mod = score"),
             Contains("t.fx:1:12: error: sink_mod cannot use `score`: it receives only b, h and "
                      "q_idx"));
  CHECK_THAT(error_of("sink_mod = float(kv_idx)"),
             Contains("t.fx:1:18: error: sink_mod cannot use `kv_idx`"));
  CHECK_THAT(error_of("let d = q_idx - kv_idx\nsink_mod = float(d)"),
             Contains("sink_mod cannot use `kv_idx`, which 'd' (line 1) uses"));
  CHECK_THAT(error_of("sink_mod = h"), Contains("t.fx:1:12: error: sink_mod must return f32"));
  CHECK_THAT(error_of("sink_mod = h"), Contains("(use float(x))"));
  CHECK_THAT(error_of("sink_mod = 1.0\nsink_mod = 2.0"),
             Contains("sink_mod is already defined on line 1"));
  CHECK_THAT(error_of("let sink_mod = 1.0"), Contains("error:"));
  // C++ front end: Mods::check() says the same.
  CHECK_THROWS_WITH(Mods::from({}, {}, [](Expr, Expr, Expr) { return to_float(kv_idx()); }),
                    Contains("sink_mod cannot use `kv_idx`"));
  CHECK_THROWS_WITH(Mods::from({}, {}, [](Expr, Expr h, Expr) { return h; }),
                    Contains("sink_mod must return f32"));
}

TEST_CASE("sink_mod: C++ construction, hash, equal, combine and mask_only", "[sinks][dsl]") {
  Buffer sinks("sinks", DType::F32, {"H"});
  const Mods cpp = Mods::from(
      {}, [](Expr, Expr, Expr q, Expr kv) { return q >= kv; },
      [&](Expr, Expr h, Expr) { return sinks[h]; });
  const Mods text = parse_mods(std::string(kHeadSinks) + "mask_mod = q_idx >= kv_idx");
  CHECK(equal(cpp, text));
  CHECK(cpp.hash() == text.hash());
  // with_sink_mod adds the sink and its buffer to existing mods.
  const Mods causal = standard_mods("causal");
  const Mods with = causal.with_sink_mod([&](Expr, Expr h, Expr) { return sinks[h]; });
  CHECK(equal(with, text));
  // Mods that differ only in the sink_mod differ in hash and equality.
  const Mods other = parse_mods("buffer sinks: f32[H]\nsink_mod = sinks[h] * 2.0\n");
  const Mods head = parse_mods(kHeadSinks);
  CHECK_FALSE(equal(head, other));
  CHECK(head.hash() != other.hash());
  const Mods no_sink = parse_mods("buffer sinks: f32[H]\nscore_mod = score + sinks[h]");
  CHECK(no_sink.hash() !=
        parse_mods(std::string(kHeadSinks) + "score_mod = score + sinks[h]").hash());
  // combine keeps one sink_mod and refuses two.
  const Mods combined = combine(causal, head);
  CHECK(combined.sink_mod.defined());
  CHECK(equal(combined, text));
  CHECK_THROWS_WITH(combine(head, other), Contains("both define a sink_mod"));
  // A block mask is built from the mask_mod alone.
  const Mods mask = mask_only(text);
  CHECK_FALSE(mask.sink_mod.defined());
  CHECK(mask.buffers.empty());
}

TEST_CASE("sink_mod: the CUDA hooks", "[sinks][codegen]") {
  const Mods head = parse_mods(kHeadSinks);
  const std::string fwd = cuda::generate_mod_functions(head);
  CHECK_THAT(fwd, Contains("static constexpr bool kFjHasSinkMod = true;"));
  CHECK_THAT(fwd, Contains("float fj_sink_mod(const FjModParams& mp, int b, int h, int q_idx)"));
  const std::string none = cuda::generate_mod_functions(standard_mods("causal"));
  CHECK_THAT(none, Contains("static constexpr bool kFjHasSinkMod = false;"));
  CHECK_THAT(none, Contains("return __int_as_float((int)0xff800000u);"));  // -inf: no sink

  const std::string atomic = cuda::generate_mod_grad_functions(head);
  CHECK_THAT(atomic, Contains("static constexpr bool kFjHasSinkGrads = true;"));
  CHECK_THAT(atomic, Contains("void fj_sink_mod_grad(const FjModParams& mp, const FjGradParams& "
                              "gp, int b, int h, int q_idx, float g)"));
  CHECK_THAT(atomic, Contains("fj_grad_add(gp.grad_sinks + ("));
  const std::string ordered = cuda::generate_mod_grad_functions(head, cuda::MathFunctions::Exact,
                                                                cuda::GradAccumulation::Ordered);
  CHECK_THAT(ordered, Contains("fj_grad_add_ordered(gp.grad_sinks + ("));
  CHECK(cuda::has_sink_grads(head));
  CHECK_FALSE(cuda::has_sink_grads(parse_mods("param s: f32 = 1.0\nsink_mod = s")));
  CHECK_FALSE(cuda::has_sink_grads(standard_mods("alibi")));
}

TEST_CASE("sink_mod: kernels' sources and cache keys change with it", "[sinks][codegen]") {
  const Mods a = parse_mods(kHeadSinks);
  const Mods b = parse_mods("buffer sinks: f32[H]\nsink_mod = sinks[h] + 1.0\n");
  const Mods none = parse_mods("buffer sinks: f32[H]\nmask_mod = true\n");
  for (const char* arch : {"sm_80", "sm_90a"}) {
    INFO(arch);
    const kernels::KernelDesc fwd = test::forward_desc(arch, DType::BF16, 128, 128);
    const auto sa = emit_source(a, fwd), sb = emit_source(b, fwd), sn = emit_source(none, fwd);
    CHECK(sa.source_key != sb.source_key);
    CHECK(sa.source_key != sn.source_key);
    const kernels::KernelDesc dkdv = kernels::Registry::global().complete(
        kernels::backward_problem(kernels::Family::BackwardDkDv, cuda::Arch::parse(arch),
                                  DType::BF16, 128, 128, 1, true),
        {}, {});
    CHECK(emit_source(a, dkdv).source_key != emit_source(b, dkdv).source_key);
  }
}

TEST_CASE("sink_mod: NVRTC compiles the forward, backward and decode kernels with a sink",
          "[sinks][nvrtc]") {
  const Mods m = standard_mods("sinks_sliding_window");
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  for (const char* arch_name : {"sm_80", "sm_90a"}) {
    INFO(arch_name);
    const cuda::Arch arch = cuda::Arch::parse(arch_name);
    std::vector<kernels::KernelDesc> descs = {
        test::forward_desc(arch_name, DType::BF16, 128, 128),
        test::forward_desc(arch_name, DType::F16, 64, 64, 1, "sm80_mma"),
        kernels::Registry::global().complete(
            kernels::decode_split_problem(arch, DType::BF16, 128, 128, 4, 64, 0, true), {}, {}),
        kernels::Registry::global().complete(
            kernels::decode_combine_problem(arch, DType::BF16, 128), {}, {}),
    };
    for (bool det : {false, true}) {
      for (kernels::Family f : {kernels::Family::BackwardPreprocess, kernels::Family::BackwardDkDv,
                                kernels::Family::BackwardDq}) {
        descs.push_back(kernels::Registry::global().complete(
            kernels::backward_problem(f, arch, DType::BF16, 128, 128, 1, true, det), {}, {}));
      }
    }
    for (const kernels::KernelDesc& d : descs) {
      INFO(d.str());
      const BuiltKernel k = builder.build(m, d);
      CHECK(k.compiled.kernel->usage.registers > 0);
      if (d.family == kernels::Family::BackwardDkDv) {
        CHECK_THAT(k.source->source, Contains("flexjit_bwd_sink_grad"));
        CHECK_THAT(k.source->source, Contains("fj_sink_mod_grad(mods, grads, b, h, q, g)"));
      }
    }
  }
}

// ---- the CPU backend against an explicit reference -------------------------------------------

namespace {

struct SinkProblem {
  int B = 2, Hq = 4, Hkv = 2, Sq = 11, Skv = 13, D = 8;
  double scale = 0.35;
  Mods mods;
  std::vector<float> q, k, v, dout, sinks;
  ir::EvalEnv env;

  ModBindings bindings() const { return test::host_bindings(mods, env); }
  TensorRef t(const std::vector<float>& x, int h, int s) const {
    return TensorRef::contiguous(const_cast<float*>(x.data()), DType::F32, {B, h, s, D});
  }
  void bind() { env.buffers["sinks"] = ir::BufferView{sinks.data(), DType::F32, {Hq}, {}}; }
};

SinkProblem make_sink_problem(const std::string& mods, uint32_t seed) {
  SinkProblem p;
  p.mods = parse_mods(mods);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& x, size_t n, float sd) {
    x.resize(n);
    for (float& e : x)
      e = sd * n01(rng);
  };
  fill(p.q, static_cast<size_t>(p.B * p.Hq * p.Sq * p.D), 1.0f);
  fill(p.k, static_cast<size_t>(p.B * p.Hkv * p.Skv * p.D), 1.0f);
  fill(p.v, static_cast<size_t>(p.B * p.Hkv * p.Skv * p.D), 1.0f);
  fill(p.dout, static_cast<size_t>(p.B * p.Hq * p.Sq * p.D), 1.0f);
  fill(p.sinks, static_cast<size_t>(p.Hq), 1.5f);
  p.bind();
  return p;
}

// The reference: per row the scores (scale q.k, mask_mod applied via the interpreter) with the
// sink appended as one more column whose value row is zero; softmax in fp64.
struct Ref {
  std::vector<double> out, lse, dq, dk, dv, dsinks;
};

Ref reference(const SinkProblem& p) {
  Ref r;
  const int rows = p.B * p.Hq * p.Sq, group = p.Hq / p.Hkv;
  r.out.assign(static_cast<size_t>(rows * p.D), 0.0);
  r.lse.assign(static_cast<size_t>(rows), 0.0);
  r.dq.assign(r.out.size(), 0.0);
  r.dk.assign(static_cast<size_t>(p.B * p.Hkv * p.Skv * p.D), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  r.dsinks.assign(static_cast<size_t>(p.Hq), 0.0);
  ir::EvalEnv env = p.env;
  for (int b = 0; b < p.B; ++b) {
    for (int h = 0; h < p.Hq; ++h) {
      const int hk = h / group;
      for (int i = 0; i < p.Sq; ++i) {
        const size_t row = static_cast<size_t>((b * p.Hq + h) * p.Sq + i);
        env.b = b, env.h = h, env.q_idx = i;
        std::vector<double> s(static_cast<size_t>(p.Skv + 1));
        for (int j = 0; j < p.Skv; ++j) {
          env.kv_idx = j;
          double dot = 0;
          for (int d = 0; d < p.D; ++d)
            dot += double(p.q[row * p.D + d]) * p.k[((b * p.Hkv + hk) * p.Skv + j) * p.D + d];
          env.score = static_cast<float>(dot * p.scale);
          const ir::ModsValue mv = ir::evaluate_mods(p.mods, env);
          s[j] = mv.keep ? dot * p.scale : -std::numeric_limits<double>::infinity();
        }
        s[p.Skv] = ir::evaluate(p.mods.sink_mod, env).f;  // the extra column
        const double m = *std::max_element(s.begin(), s.end());
        double z = 0;
        for (double x : s)
          z += std::exp(x - m);
        r.lse[row] = m + std::log(z);
        std::vector<double> pr(s.size()), dp(s.size(), 0.0);
        for (size_t j = 0; j < s.size(); ++j)
          pr[j] = std::exp(s[j] - r.lse[row]);
        double delta = 0;
        for (int j = 0; j < p.Skv; ++j) {
          const float* vj = &p.v[((b * p.Hkv + hk) * p.Skv + j) * p.D];
          for (int d = 0; d < p.D; ++d) {
            r.out[row * p.D + d] += pr[j] * vj[d];
            dp[j] += double(p.dout[row * p.D + d]) * vj[d];
          }
          delta += pr[j] * dp[j];
        }
        // The sink column's value row is zero: dP = 0 there, so d sink = p_sink (0 - delta).
        r.dsinks[static_cast<size_t>(h)] += -pr[p.Skv] * delta;
        for (int j = 0; j < p.Skv; ++j) {
          const double ds = pr[j] * (dp[j] - delta) * p.scale;
          const size_t kv = static_cast<size_t>((b * p.Hkv + hk) * p.Skv + j);
          for (int d = 0; d < p.D; ++d) {
            r.dq[row * p.D + d] += ds * p.k[kv * p.D + d];
            r.dk[kv * p.D + d] += ds * p.q[row * p.D + d];
            r.dv[kv * p.D + d] += pr[j] * p.dout[row * p.D + d];
          }
        }
      }
    }
  }
  return r;
}

template <typename A, typename B>
double max_abs_diff(const std::vector<A>& a, const std::vector<B>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

}  // namespace

TEST_CASE("CPU backend: forward and backward with sinks match the extra-column reference",
          "[sinks][cpu]") {
  // Per-head sinks, under a causal mask, a sliding window that masks whole rows, and a per-row
  // sink that depends on q_idx.
  const std::vector<std::string> cases = {
      "buffer sinks: f32[H]\nsink_mod = sinks[h]",
      "buffer sinks: f32[H]\nmask_mod = q_idx >= kv_idx\nsink_mod = sinks[h]",
      "buffer sinks: f32[H]\nmask_mod = kv_idx >= q_idx + 6 && kv_idx < q_idx + 9\n"
      "sink_mod = sinks[h]",
      "buffer sinks: f32[H]\nmask_mod = q_idx >= kv_idx\n"
      "sink_mod = sinks[h] * float(q_idx % 3) - 0.5",
  };
  uint32_t seed = std::random_device{}();
  for (const std::string& text : cases) {
    INFO(text << "\nseed " << seed);
    const SinkProblem p = make_sink_problem(text, seed++);
    const Ref r = reference(p);
    const size_t rows = static_cast<size_t>(p.B * p.Hq * p.Sq);
    cpu::CpuForwardOptions fo;
    fo.scale = p.scale;
    std::vector<double> out64(rows * p.D), lse64(rows);
    cpu::cpu_attention_forward_f64(p.mods, p.bindings(), p.t(p.q, p.Hq, p.Sq),
                                   p.t(p.k, p.Hkv, p.Skv), p.t(p.v, p.Hkv, p.Skv), out64.data(),
                                   lse64.data(), fo);
    CHECK(max_abs_diff(out64, r.out) < 1e-6);
    CHECK(max_abs_diff(lse64, r.lse) < 1e-6);
    std::vector<float> out32(rows * p.D), lse32(rows);
    cpu::cpu_attention_forward(p.mods, p.bindings(), p.t(p.q, p.Hq, p.Sq), p.t(p.k, p.Hkv, p.Skv),
                               p.t(p.v, p.Hkv, p.Skv), out32.data(), lse32.data(), fo);
    CHECK(max_abs_diff(out32, r.out) < 2e-5);
    CHECK(max_abs_diff(lse32, r.lse) < 2e-5);

    cpu::CpuBackwardOptions bo;
    bo.scale = p.scale;
    const auto g = cpu::cpu_attention_backward_f64(
        p.mods, p.bindings(), p.t(p.q, p.Hq, p.Sq), p.t(p.k, p.Hkv, p.Skv), p.t(p.v, p.Hkv, p.Skv),
        out64.data(), lse64.data(), p.t(p.dout, p.Hq, p.Sq), bo);
    CHECK(max_abs_diff(g.dq, r.dq) < 1e-6);
    CHECK(max_abs_diff(g.dk, r.dk) < 1e-6);
    CHECK(max_abs_diff(g.dv, r.dv) < 1e-6);
    if (text.find("q_idx % 3") == std::string::npos) {
      CHECK(max_abs_diff(g.buffers.at("sinks"), r.dsinks) < 1e-6);
    }
    const auto g32 = cpu::cpu_attention_backward(
        p.mods, p.bindings(), p.t(p.q, p.Hq, p.Sq), p.t(p.k, p.Hkv, p.Skv), p.t(p.v, p.Hkv, p.Skv),
        out32.data(), lse32.data(), p.t(p.dout, p.Hq, p.Sq), bo);
    CHECK(max_abs_diff(g32.buffers.at("sinks"), g.buffers.at("sinks")) < 1e-4);
    CHECK(max_abs_diff(g32.dq, g.dq) < 1e-4);

    // The sinks' gradient by central differences of the fp64 forward's loss sum(out * dout).
    auto loss = [&](const std::vector<float>& sinks) {
      SinkProblem q = p;
      q.sinks = sinks;
      q.bind();
      std::vector<double> o(rows * q.D), l(rows);
      cpu::cpu_attention_forward_f64(q.mods, q.bindings(), q.t(q.q, q.Hq, q.Sq),
                                     q.t(q.k, q.Hkv, q.Skv), q.t(q.v, q.Hkv, q.Skv), o.data(),
                                     l.data(), fo);
      double s = 0;
      for (size_t i = 0; i < o.size(); ++i)
        s += o[i] * q.dout[i];
      return s;
    };
    for (int h = 0; h < p.Hq; ++h) {
      const float eps = 1e-2f;
      std::vector<float> up = p.sinks, down = p.sinks;
      up[h] += eps;
      down[h] -= eps;
      const double fd = (loss(up) - loss(down)) / (double(up[h]) - double(down[h]));
      CHECK(std::abs(fd - g.buffers.at("sinks")[h]) < 1e-3 * (1 + std::abs(fd)));
    }
  }
}

TEST_CASE("CPU backend: a fully masked row gets out 0 and lse = sink; its sink gets dlse",
          "[sinks][cpu]") {
  SinkProblem p =
      make_sink_problem("buffer sinks: f32[H]\nmask_mod = q_idx >= 4\nsink_mod = sinks[h]", 7);
  const size_t rows = static_cast<size_t>(p.B * p.Hq * p.Sq);
  std::vector<double> out(rows * p.D), lse(rows);
  cpu::CpuForwardOptions fo;
  fo.scale = p.scale;
  cpu::cpu_attention_forward_f64(p.mods, p.bindings(), p.t(p.q, p.Hq, p.Sq), p.t(p.k, p.Hkv, p.Skv),
                                 p.t(p.v, p.Hkv, p.Skv), out.data(), lse.data(), fo);
  const Ref r = reference(p);
  CHECK(max_abs_diff(out, r.out) < 1e-6);
  for (int b = 0; b < p.B; ++b) {
    for (int h = 0; h < p.Hq; ++h) {
      for (int i = 0; i < 4; ++i) {
        const size_t row = static_cast<size_t>((b * p.Hq + h) * p.Sq + i);
        CHECK(lse[row] == Approx(p.sinks[h]));
        for (int d = 0; d < p.D; ++d)
          CHECK(out[row * p.D + d] == 0.0);
      }
    }
  }
  // With a loss on the lse alone, each fully masked row sends its dlse into its head's sink.
  std::vector<float> dlse(rows, 0.0f), zero(rows * p.D, 0.0f);
  for (int b = 0; b < p.B; ++b)
    dlse[static_cast<size_t>((b * p.Hq + 1) * p.Sq + 2)] = 1.0f;  // head 1, row 2: masked
  cpu::CpuBackwardOptions bo;
  bo.scale = p.scale;
  bo.dlse = dlse.data();
  const auto g = cpu::cpu_attention_backward_f64(p.mods, p.bindings(), p.t(p.q, p.Hq, p.Sq),
                                                 p.t(p.k, p.Hkv, p.Skv), p.t(p.v, p.Hkv, p.Skv),
                                                 out.data(), lse.data(), p.t(zero, p.Hq, p.Sq), bo);
  const std::vector<double> want = {0.0, double(p.B), 0.0, 0.0};
  CHECK(max_abs_diff(g.buffers.at("sinks"), want) < 1e-12);
}
