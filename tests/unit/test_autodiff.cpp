// Autodiff: one golden per derivative rule in check(input, expected) style, the standard mods'
// gradients, and finite-difference agreement (through the reference interpreter) for random
// score_mods, both for d/d score and for d/d buffer elements.
#include <flexjit/dsl.h>
#include <flexjit/mods.h>

#include "ir/Evaluate.h"
#include "ir/IR.h"
#include "ir/Visitor.h"
#include "passes/Autodiff.h"
#include "passes/Simplify.h"
#include "support/PassesEnv.h"
#include "support/RandomExpr.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <numbers>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>
#include <unordered_map>

using namespace flexjit;
using passes::BufferGrad;

namespace {

const float kLn2 = std::numbers::ln2_v<float>;

// d_score(input) must equal `expected` after both are simplified.
void check(const Expr& input, const Expr& expected) {
  Expr got = passes::d_score(input);
  Expr want = passes::simplify(expected);
  INFO("input:    " << input.str() << "\ngot:      " << got.str() << "\nexpected: " << want.str());
  CHECK(ir::equal(got, want));
}

void check_equal(const Expr& got, const Expr& expected) {
  Expr want = passes::simplify(expected);
  INFO("got:      " << got.str() << "\nexpected: " << want.str());
  CHECK(ir::equal(got, want));
}

std::string describe(const std::vector<BufferGrad>& grads) {
  std::ostringstream os;
  for (const BufferGrad& g : grads) {
    os << g.buffer->name << "[";
    for (size_t i = 0; i < g.indices.size(); ++i)
      os << (i ? ", " : "") << g.indices[i].str();
    os << "]: " << g.derivative.str() << " if " << g.reached.str() << "\n";
  }
  return os.str();
}

float eval_f32(const Expr& e, const ir::EvalEnv& env) {
  ir::Value v = ir::evaluate(e, env);
  REQUIRE(v.type == ScalarType::F32);
  return v.f;
}

// Sub-expressions whose value changes where the score_mod is not smooth (or where it switches
// branch): if any of them differs between the points of a finite difference, the difference
// measures a jump, not a derivative.
std::vector<Expr> kinks(const Expr& f) {
  std::vector<Expr> out;
  ir::for_each_node(f, [&](const Expr& e) {
    const bool float_args = !e->args.empty() && e->args[0].type() == ScalarType::F32;
    switch (e->op) {
      case ir::Op::Select:
        out.push_back(e->args[0]);
        break;
      case ir::Op::Min:
      case ir::Op::Max:
      case ir::Op::Abs:
      case ir::Op::Pow:
        if (!float_args) break;
        if (e->op == ir::Op::Abs || e->op == ir::Op::Pow) {
          out.push_back(ir::make_binary(ir::Op::GT, e->args[0], ir::make_float(0.0)));
        } else {
          out.push_back(ir::make_binary(ir::Op::LT, e->args[0], e->args[1]));
          out.push_back(ir::make_binary(ir::Op::GT, e->args[0], e->args[1]));
        }
        break;
      case ir::Op::Floor:
      case ir::Op::Ceil:
        out.push_back(e);
        break;
      case ir::Op::Mod:
        if (float_args)
          out.push_back(
              ir::make_unary(ir::Op::Floor, ir::make_binary(ir::Op::Div, e->args[0], e->args[1])));
        break;
      case ir::Op::Cast:
        if (float_args) out.push_back(e);  // int(x)
        break;
      default:
        if (ir::is_comparison(e->op) && float_args) out.push_back(e);
    }
  });
  return out;
}

// A kink's value at one point; nullopt when evaluating it alone fails (a load the forward skips).
std::optional<ir::Value> try_eval(const Expr& e, const ir::EvalEnv& env) {
  try {
    return ir::evaluate(e, env);
  } catch (const RuntimeError&) {
    return std::nullopt;
  }
}

// The central finite difference of f in one variable (set by `set`) at x0, or nullopt where it
// does not measure a derivative: non-finite values, a branch switch or kink within the step, or
// disagreement between steps h and h/2 (not smooth at this scale). `scale` receives max |f|.
std::optional<double> finite_difference(const Expr& f, const std::vector<Expr>& ks,
                                        ir::EvalEnv& env, const std::function<void(float)>& set,
                                        float x0, double* scale) {
  const double h = 1e-2 * std::max(1.0, std::abs(static_cast<double>(x0)));
  const float xs[5] = {static_cast<float>(x0 - h), static_cast<float>(x0 - h / 2), x0,
                       static_cast<float>(x0 + h / 2), static_cast<float>(x0 + h)};
  double fs[5];
  std::vector<std::optional<ir::Value>> sig0;
  *scale = 0.0;
  for (int i = 0; i < 5; ++i) {
    set(xs[i]);
    std::optional<ir::Value> v = try_eval(f, env);
    if (!v || !std::isfinite(v->f)) return std::nullopt;
    fs[i] = v->f;
    *scale = std::max(*scale, std::abs(fs[i]));
    for (size_t k = 0; k < ks.size(); ++k) {
      std::optional<ir::Value> kv = try_eval(ks[k], env);
      if (i == 0) {
        sig0.push_back(kv);
        continue;
      }
      if (kv.has_value() != sig0[k].has_value()) return std::nullopt;
      if (kv && !ir::identical(*kv, *sig0[k])) return std::nullopt;
    }
  }
  set(x0);
  const double fd_h = (fs[4] - fs[0]) / (static_cast<double>(xs[4]) - xs[0]);
  const double fd_h2 = (fs[3] - fs[1]) / (static_cast<double>(xs[3]) - xs[1]);
  const double rounding = 8 * 6e-8 * *scale / h;
  // Uninformative where f's rounding swamps the difference (f = 1e9 + score).
  if (rounding > 1e-2 * std::max(1.0, std::abs(fd_h2))) return std::nullopt;
  if (std::abs(fd_h - fd_h2) > 1e-2 * std::max(1.0, std::abs(fd_h2)) + rounding)
    return std::nullopt;
  return fd_h2;
}

// |got - fd| within f32 tolerances: 2e-2 relative plus the rounding of f in the difference.
bool close_to_fd(double got, double fd, double scale, float x0) {
  const double h = 1e-2 * std::max(1.0, std::abs(static_cast<double>(x0)));
  return std::abs(got - fd) <=
         2e-2 * std::max({1.0, std::abs(got), std::abs(fd)}) + 16 * 6e-8 * scale / h;
}

Expr p_f() {
  return Param("p", ScalarType::F32, 1.5);
}

}  // namespace

TEST_CASE("autodiff: one rule per node kind", "[autodiff]") {
  Expr s = score();
  Expr p = p_f();
  Expr q = q_idx(), kv = kv_idx();
  check(s, Expr(1.0f));
  check(s + p, Expr(1.0f));
  check(p + s, Expr(1.0f));
  check(p - s, Expr(-1.0f));
  check(s * p, p);
  check(p * s, p);
  check(s * s, s + s);
  check(s / p, 1.0f / p);
  check(p / s, -((p / s) / s));
  check(-s, Expr(-1.0f));
  check(abs(s), where(s > 0.0f, 1.0f, where(s < 0.0f, -1.0f, 0.0f)));
  check(exp(s), exp(s));
  check(exp2(s), exp2(s) * kLn2);
  check(log(s), 1.0f / s);
  check(log2(s), 1.0f / (s * kLn2));
  check(tanh(s), 1.0f - tanh(s) * tanh(s));
  check(sigmoid(s), sigmoid(s) * (1.0f - sigmoid(s)));
  check(sqrt(s), 1.0f / (2.0f * sqrt(s)));
  check(rsqrt(s), -0.5f * (rsqrt(s) / s));
  check(pow(s, p), p * pow(s, p - 1.0f));
  check(pow(p, s), where(p > 0.0f, log(p) * pow(p, s), 0.0f));
  check(min(s, p), where(s <= p, 1.0f, 0.0f));
  check(min(p, s), where(p <= s, 0.0f, 1.0f));
  check(max(s, p), where(s >= p, 1.0f, 0.0f));
  check(max(p, s), where(p >= s, 0.0f, 1.0f));
  check(where(q > kv, s, p), where(q > kv, 1.0f, 0.0f));
  check(where(s > p, p, s), where(s > p, 0.0f, 1.0f));  // the condition gets no gradient
  check(floor(s), Expr(0.0f));
  check(ceil(s) + s, Expr(1.0f));
  check(s % p, Expr(1.0f));
  check(p % s, -floor(p / s));
  check(s * to_float(q - kv), to_float(q - kv));
  check(to_float(to_int(s)), Expr(0.0f));                 // no gradient through an int
  check(to_float(s > 0.0f) + s, Expr(1.0f));              // nor through a bool
  check(to_float(h_idx()), Expr(0.0f));                   // score unused
  CHECK(ir::equal(passes::d_score(Expr()), Expr(1.0f)));  // undefined score_mod = identity
}

TEST_CASE("autodiff: a shared sub-expression sums its users' adjoints", "[autodiff]") {
  Expr s = score();
  Expr e = exp(s);
  check(e * e, (exp(s) + exp(s)) * exp(s));
  // Structurally equal but separately built sub-expressions are one node after CSE.
  check(tanh(s) + tanh(s), 2.0f * (1.0f - tanh(s) * tanh(s)));
  ir::EvalEnv env;
  env.score = 0.3f;
  CHECK(eval_f32(passes::d_score(e * e), env) == Approx(2.0 * std::exp(0.6)).epsilon(1e-6));
}

TEST_CASE("autodiff: buffer gradients per load site", "[autodiff]") {
  Expr s = score();
  Buffer bias("bias", DType::F32, {"S"});
  Buffer halves("halves", DType::F16, {"H"});
  Buffer doc("doc", DType::I32, {"S"});
  Buffer flags("flags", DType::Bool, {"S"});
  Param p("p", ScalarType::F32, 2.0);

  SECTION("int and bool buffers, params and scores get none") {
    Expr f = s * p + to_float(doc[q_idx()]) + where(flags[kv_idx()], 1.0f, 0.0f);
    INFO(describe(passes::buffer_grads(f)));
    CHECK(passes::buffer_grads(f).empty());
  }
  SECTION("equal load sites merge, distinct ones stay apart, in order of first use") {
    Expr f = bias[q_idx()] * s + bias[kv_idx()] + bias[q_idx()] + halves[h_idx()] * 3.0f;
    std::vector<BufferGrad> g = passes::buffer_grads(f);
    INFO(describe(g));
    REQUIRE(g.size() == 3);
    CHECK(g[0].buffer->name == "bias");
    check_equal(g[0].indices[0], q_idx());
    check_equal(g[0].derivative, s + 1.0f);
    check_equal(g[1].indices[0], kv_idx());
    check_equal(g[1].derivative, Expr(1.0f));
    CHECK(g[2].buffer->name == "halves");
    check_equal(g[2].derivative, Expr(3.0f));
    for (const BufferGrad& b : g)
      check_equal(b.reached, Expr(true));
  }
  SECTION("a load in an unselected branch is not reached and its derivative reads nothing") {
    // bias has 4 entries; at q_idx = 10 the forward skips bias[q_idx], so must the backward.
    Expr f = where(q_idx() < 4, exp(bias[q_idx()]) * s, s);
    float data[4] = {0.5f, 1.0f, -1.0f, 2.0f};
    ir::EvalEnv env;
    env.buffers["bias"] = ir::BufferView{data, DType::F32, {4}, {}};
    env.score = 1.5f;
    passes::ScoreModGrads grads = passes::differentiate(f);
    REQUIRE(grads.buffers.size() == 1);
    env.q_idx = 10;
    CHECK(eval_f32(grads.d_score, env) == 1.0f);
    CHECK_FALSE(ir::evaluate(grads.buffers[0].reached, env).as_bool());
    CHECK(eval_f32(grads.buffers[0].derivative, env) == 0.0f);
    env.q_idx = 1;
    CHECK(ir::evaluate(grads.buffers[0].reached, env).as_bool());
    CHECK(eval_f32(grads.d_score, env) == std::exp(1.0f));
    CHECK(eval_f32(grads.buffers[0].derivative, env) == Approx(std::exp(1.0) * 1.5));
  }
}

TEST_CASE("autodiff: standard mods", "[autodiff]") {
  SECTION("alibi: d_score = 1, d slopes[h] = kv - q") {
    Mods m = standard_mods("alibi");
    passes::ScoreModGrads g = passes::differentiate(m.score_mod);
    check_equal(g.d_score, Expr(1.0f));
    REQUIRE(g.buffers.size() == 1);
    CHECK(g.buffers[0].buffer->name == "slopes");
    REQUIRE(g.buffers[0].indices.size() == 1);
    check_equal(g.buffers[0].indices[0], h_idx());
    check_equal(g.buffers[0].derivative, to_float(kv_idx() - q_idx()));
    check_equal(g.buffers[0].reached, Expr(true));
  }
  SECTION("softcap: d/ds cap * tanh(s / cap) = 1 - tanh(s / cap)^2") {
    Mods m = standard_mods("softcap");
    Expr cap = m.params.at(0);
    Expr t = tanh(score() / cap);
    Expr d = passes::d_score(m.score_mod);
    check_equal(d, (cap * (1.0f - t * t)) / cap);
    CHECK(passes::buffer_grads(m.score_mod).empty());
    ir::EvalEnv env;
    for (double c : {30.0, 5.0, 1.0}) {
      for (float s : {-100.0f, -7.5f, -1.0f, 0.0f, 0.25f, 3.0f, 42.0f}) {
        env.params["cap"] = c;
        env.score = s;
        const double th = std::tanh(s / c);
        INFO("cap " << c << " score " << s);
        CHECK(eval_f32(d, env) == Approx(1.0 - th * th).epsilon(1e-5).margin(1e-6));
      }
    }
  }
  SECTION("relative_bias: d bias[q - kv + offset] = 1") {
    Mods m = standard_mods("relative_bias");
    passes::ScoreModGrads g = passes::differentiate(m.score_mod);
    check_equal(g.d_score, Expr(1.0f));
    REQUIRE(g.buffers.size() == 1);
    CHECK(g.buffers[0].buffer->name == "bias");
    REQUIRE(g.buffers[0].indices.size() == 1);
    check_equal(g.buffers[0].indices[0], q_idx() - kv_idx() + m.params.at(0));
    check_equal(g.buffers[0].derivative, Expr(1.0f));
    check_equal(g.buffers[0].reached, Expr(true));
  }
  SECTION("t5_bucketed_bias: d bias[h, bucket] = 1 at the forward's bucket") {
    Mods m = standard_mods("t5_bucketed_bias");
    passes::ScoreModGrads g = passes::differentiate(m.score_mod);
    check_equal(g.d_score, Expr(1.0f));
    REQUIRE(g.buffers.size() == 1);
    const BufferGrad& b = g.buffers[0];
    CHECK(b.buffer->name == "bias");
    REQUIRE(b.indices.size() == 2);
    check_equal(b.indices[0], h_idx());
    check_equal(b.derivative, Expr(1.0f));
    check_equal(b.reached, Expr(true));
    // The bucket index is the forward's: the load in the score_mod reads bias[h, bucket].
    const Expr& load = m.score_mod->args[1];
    REQUIRE(load->op == ir::Op::Load);
    CHECK(ir::equal(passes::simplify(b.indices[1]), passes::simplify(load->args[1])));
    ir::EvalEnv env;
    env.h = 3;
    for (auto [q, kv, bucket] : {std::tuple{10, 10, 0},
                                 {10, 13, 19},
                                 {13, 10, 3},
                                 {0, 20, 26},
                                 {0, 100, 31},
                                 {100, 0, 15}}) {
      env.q_idx = q;
      env.kv_idx = kv;
      INFO("q " << q << " kv " << kv);
      CHECK(ir::evaluate(b.indices[1], env).i == bucket);
    }
  }
}

TEST_CASE("autodiff: d_score matches finite differences on random score_mods", "[autodiff]") {
  test::RandomExprGen::Options opts;
  opts.allow_special_floats = false;
  test::RandomExprGen gen(2024, opts);
  test::PassesEnv penv(gen, 77);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> moderate(-3.0f, 3.0f);
  int checked = 0, nonzero = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Expr f = gen.expr(ScalarType::F32, 1 + trial % 5);
    const std::vector<Expr> ks = kinks(f);
    passes::ScoreModGrads grads = passes::differentiate(f);
    for (int pt = 0; pt < 8; ++pt) {
      ir::EvalEnv env = penv.next();
      for (const Param& p : gen.param_pool())
        if (p.type() == ScalarType::F32) env.params[p.name()] = moderate(rng);
      const float x0 = moderate(rng);
      env.score = x0;
      double scale = 0.0;
      std::optional<double> fd = finite_difference(
          f, ks, env, [&](float x) { env.score = x; }, x0, &scale);
      if (!fd) continue;
      std::optional<ir::Value> got = try_eval(grads.d_score, env);
      REQUIRE(got.has_value());              // reached wherever the forward is
      if (!std::isfinite(got->f)) continue;  // e.g. sqrt'(0): the difference cannot tell
      INFO("f = " << f.str() << "\nd_score = " << grads.d_score.str() << "\nscore = " << x0
                  << " got " << got->f << " fd " << *fd);
      CHECK(close_to_fd(got->f, *fd, scale, x0));
      ++checked;
      if (got->f != 0.0f) ++nonzero;
    }
  }
  INFO("checked " << checked << " nonzero " << nonzero);
  CHECK(checked >= 800);
  CHECK(nonzero >= 300);
}

TEST_CASE("autodiff: buffer gradients match finite differences", "[autodiff]") {
  test::RandomExprGen::Options opts;
  opts.allow_special_floats = false;
  test::RandomExprGen gen(99, opts);
  test::PassesEnv penv(gen, 3);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> moderate(-3.0f, 3.0f);
  // Own, moderate-valued copies of every f32 buffer, so that elements can be perturbed.
  std::unordered_map<std::string, std::vector<float>> storage;
  ir::EvalEnv base = penv.next();
  for (auto& [name, view] : base.buffers) {
    if (view.dtype != DType::F32) continue;
    int64_t n = 1;
    for (int64_t d : view.shape)
      n *= d;
    std::vector<float>& data = storage[name];
    for (int64_t i = 0; i < n; ++i)
      data.push_back(moderate(rng));
    view.data = data.data();
  }
  auto flat_index = [](const ir::BufferView& v, const std::vector<int32_t>& idx) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d)
      off = off * v.shape[d] + idx[d];
    return off;
  };

  int checked = 0;
  auto check_mod = [&](const Expr& f, const ir::EvalEnv& env0) {
    const std::vector<Expr> ks = kinks(f);
    std::vector<BufferGrad> grads = passes::buffer_grads(f);
    for (const BufferGrad& g : grads) {
      if (g.buffer->dtype != DType::F32) continue;
      ir::EvalEnv env = env0;
      if (!try_eval(f, env)) continue;  // the forward itself fails here
      REQUIRE(ir::evaluate(g.reached, env).type == ScalarType::Bool);
      if (!ir::evaluate(g.reached, env).as_bool()) continue;
      std::vector<int32_t> idx;
      for (const Expr& i : g.indices)
        idx.push_back(ir::evaluate(i, env).i);
      // Every site that reads this element at this point contributes (sites may alias).
      double expected = 0.0;
      for (const BufferGrad& o : grads) {
        if (o.buffer->name != g.buffer->name || !ir::evaluate(o.reached, env).as_bool()) continue;
        std::vector<int32_t> oidx;
        for (const Expr& i : o.indices)
          oidx.push_back(ir::evaluate(i, env).i);
        if (oidx == idx) expected += eval_f32(o.derivative, env);
      }
      float& elem = storage.at(g.buffer->name)[flat_index(env.buffers.at(g.buffer->name), idx)];
      const float x0 = elem;
      double scale = 0.0;
      std::optional<double> fd = finite_difference(
          f, ks, env, [&](float x) { elem = x; }, x0, &scale);
      elem = x0;
      if (!fd || !std::isfinite(expected)) continue;
      INFO("f = " << f.str() << "\n"
                  << describe(grads) << "element " << g.buffer->name << " = " << x0 << ": got "
                  << expected << " fd " << *fd);
      CHECK(close_to_fd(expected, *fd, scale, x0));
      ++checked;
    }
  };

  SECTION("standard mods") {
    const int before = checked;
    for (const char* name : {"alibi", "relative_bias", "t5_bucketed_bias"}) {
      Mods m = standard_mods(name);
      std::vector<float> data(64 * 32);
      for (float& x : data)
        x = moderate(rng);
      ir::EvalEnv env;
      const std::string buf = m.buffers.at(0).name();
      const std::vector<int64_t> shape =
          m.buffers.at(0).rank() == 1 ? std::vector<int64_t>{64} : std::vector<int64_t>{8, 32};
      storage[buf] = data;
      env.buffers[buf] = ir::BufferView{storage[buf].data(), DType::F32, shape, {}};
      env.params["offset"] = 32;
      for (int q = 0; q < 16; q += 3) {
        for (int kv = 0; kv < 16; kv += 5) {
          env.h = (q + kv) % 8;
          env.q_idx = q;
          env.kv_idx = kv;
          env.score = moderate(rng);
          check_mod(m.score_mod, env);
        }
      }
      storage.erase(buf);
    }
    CHECK(checked - before >= 3 * 24);
  }
  SECTION("random score_mods") {
    for (int trial = 0; trial < 4000; ++trial) {
      Expr f = gen.expr(ScalarType::F32, 1 + trial % 5);
      for (int pt = 0; pt < 4; ++pt) {
        ir::EvalEnv env = penv.next();
        for (const auto& [name, view] : base.buffers)
          env.buffers[name] = view;
        for (const Param& p : gen.param_pool())
          if (p.type() == ScalarType::F32) env.params[p.name()] = moderate(rng);
        env.score = moderate(rng);
        check_mod(f, env);
      }
    }
    INFO("checked " << checked);
    CHECK(checked >= 200);
  }
}
