// CSE: structurally equal sub-expressions become one node; meaning is unchanged.
#include <flexjit/dsl.h>
#include <flexjit/mods.h>

#include "ir/Evaluate.h"
#include "ir/IR.h"
#include "ir/Visitor.h"
#include "passes/CSE.h"
#include "support/PassesEnv.h"
#include "support/RandomExpr.h"

#include <catch2/catch.hpp>

#include <functional>
#include <unordered_set>

using namespace flexjit;
using passes::cse;

namespace {

size_t distinct_nodes(const Expr& e) {
  size_t n = 0;
  ir::for_each_node(e, [&](const Expr&) { ++n; });
  return n;
}

// Counted independently of the pass: every sub-expression of the tree, compared pairwise.
size_t structurally_distinct(const Expr& e) {
  std::vector<Expr> classes;
  std::function<void(const Expr&)> walk = [&](const Expr& x) {
    bool found = false;
    for (const Expr& c : classes)
      found = found || ir::equal(c, x);
    if (!found) classes.push_back(x);
    for (const auto& a : x->args)
      walk(a);
  };
  walk(e);
  return classes.size();
}

}  // namespace

TEST_CASE("cse shares equal sub-expressions built separately", "[passes]") {
  Buffer bias("bias", DType::F32, {"H", "S"});
  // Two separately built copies of q_idx - kv_idx and of the bias load.
  Expr e = score() + bias[h_idx()][q_idx() - kv_idx()] * to_float(q_idx() - kv_idx()) +
           bias[h_idx()][q_idx() - kv_idx()];
  Expr c = cse(e);
  CHECK(ir::equal(c, e));
  CHECK(distinct_nodes(c) == structurally_distinct(e));
  CHECK(distinct_nodes(c) < distinct_nodes(e));
  // The two loads are now the same node, and so are their index expressions.
  const Expr& outer_load = c->args[1];
  const Expr& inner_load = c->args[0]->args[1]->args[0];
  REQUIRE(outer_load->op == ir::Op::Load);
  REQUIRE(inner_load->op == ir::Op::Load);
  CHECK(outer_load.same_as(inner_load));
  // An already-canonical expression comes back as the same node.
  CHECK(cse(c).same_as(c));
}

TEST_CASE("cse keeps -0.0 and 0.0 apart and merges NaN literals", "[passes]") {
  Expr e = score() * Expr(0.0f) + score() * Expr(-0.0f);
  Expr c = cse(e);
  CHECK_FALSE(c->args[0].same_as(c->args[1]));
  CHECK(c->args[0]->args[0].same_as(c->args[1]->args[0]));  // `score` is shared
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Expr n = cse(min(score(), Expr(nan)) + min(score(), Expr(nan)));
  CHECK(n->args[0].same_as(n->args[1]));
}

TEST_CASE("cse of Mods shares nodes across score_mod and mask_mod", "[passes]") {
  Mods m = Mods::from([](Expr s, Expr, Expr, Expr q, Expr kv) { return s - to_float(abs(q - kv)); },
                      [](Expr, Expr, Expr q, Expr kv) { return abs(q - kv) <= 256; });
  Mods c = cse(m);
  CHECK(equal(c, m));
  const Expr& in_score = c.score_mod->args[1]->args[0];  // abs(q - kv) under float()
  const Expr& in_mask = c.mask_mod->args[0];
  REQUIRE(in_score->op == ir::Op::Abs);
  CHECK(in_score.same_as(in_mask));
}

TEST_CASE("cse: node count equals distinct sub-expressions, meaning unchanged (random)",
          "[passes][property]") {
  int evaluated = 0;
  for (uint64_t seed = 1; seed <= 600; ++seed) {
    // Two generators with one seed build equal expressions from distinct nodes.
    test::RandomExprGen g1(seed), g2(seed);
    ScalarType t = seed % 2 ? ScalarType::F32 : ScalarType::I32;
    int depth = 1 + static_cast<int>(seed % 5);
    Expr a = g1.expr(t, depth), a2 = g2.expr(t, depth), b = g1.expr(t, depth);
    Expr e = where(a == b, a2 + b, a * b);
    Expr c = cse(e);
    INFO("seed " << seed << ": " << e.str());
    REQUIRE(ir::equal(c, e));
    CHECK(distinct_nodes(c) == structurally_distinct(e));
    test::PassesEnv envs(g1, seed);
    ir::Evaluator before(e), after(c);
    for (int k = 0; k < 8; ++k) {
      const ir::EvalEnv& env = envs.next();
      bool threw = false;
      ir::Value want;
      try {
        want = before.run(env);
      } catch (const RuntimeError&) {
        threw = true;
      }
      if (threw) {
        CHECK_THROWS_AS(after.run(env), RuntimeError);
        continue;
      }
      CHECK(ir::identical(after.run(env), want));
      ++evaluated;
    }
  }
  CHECK(evaluated > 2000);
}
