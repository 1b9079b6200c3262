// Printing and parsing are inverses: parse(print(e)) is ir::equal to e and hashes equal, for
// thousands of random expressions and mods (tests/support/RandomExpr.h).
#include <flexjit/mods.h>

#include "ir/IR.h"
#include "ir/Operators.h"
#include "ir/Printer.h"
#include "ir/Visitor.h"
#include "support/RandomExpr.h"

#include <catch2/catch.hpp>

#include <limits>
#include <set>

using namespace flexjit;

namespace {

// Wraps an expression of any type into an f32 score_mod, so that it can go through the parser:
// the wrapper is the outermost node and the expression its first argument.
Expr as_score_mod(const Expr& e) {
  switch (e.type()) {
    case ScalarType::F32:
      return ir::build_unary(ir::Op::Neg, e);
    case ScalarType::I32:
      return ir::build_cast(ScalarType::F32, e);
    case ScalarType::Bool:
      return ir::build_select(e, ir::make_float(1.0), ir::make_float(0.0));
  }
  return {};
}

// Mods holding `e` with the declarations the generator used for it.
Mods mods_for(const Expr& e, const test::RandomExprGen& gen) {
  Mods m;
  m.score_mod = as_score_mod(e);
  m.buffers = gen.buffers();
  m.params = gen.params();
  return m;
}

}  // namespace

TEST_CASE("random expressions are well typed and deterministic per seed", "[dsl][random]") {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    test::RandomExprGen a(seed), b(seed);
    for (ScalarType t : {ScalarType::F32, ScalarType::I32, ScalarType::Bool}) {
      Expr x = a.expr(t, 5);
      Expr y = b.expr(t, 5);
      REQUIRE(x.type() == t);
      REQUIRE(ir::equal(x, y));
    }
    Mods m = a.mods();
    REQUIRE_NOTHROW(m.check());
    CHECK(m.buffers.size() == a.buffers().size());
    if (m.mask_mod.defined()) {
      bool uses_score = false;
      ir::for_each_node(m.mask_mod, [&](const Expr& n) {
        uses_score = uses_score || (n->op == ir::Op::Var && n->var == ir::VarKind::Score);
      });
      CHECK_FALSE(uses_score);
    }
  }
}

TEST_CASE("the generator covers every node kind, dtype and rank", "[dsl][random]") {
  test::RandomExprGen gen(7);
  std::set<ir::Op> ops;
  std::set<DType> dtypes;
  std::set<int> ranks;
  for (int i = 0; i < 400; ++i) {
    for (ScalarType t : {ScalarType::F32, ScalarType::I32, ScalarType::Bool}) {
      ir::for_each_node(gen.expr(t, 6), [&](const Expr& n) {
        ops.insert(n->op);
        if (n->op == ir::Op::Load) {
          dtypes.insert(n->buffer->dtype);
          ranks.insert(n->buffer->rank());
        }
      });
    }
  }
  CHECK(ops.size() == static_cast<size_t>(ir::Op::Or) + 1);  // Or is the last Op
  CHECK(dtypes.size() == 5);
  CHECK(ranks == std::set<int>{1, 2, 3, 4});
  CHECK(gen.buffers().size() == gen.buffer_pool().size());
  CHECK(gen.params().size() == gen.param_pool().size());
}

TEST_CASE("parse(print(e)) == e for random expressions", "[dsl][roundtrip]") {
  int checked = 0;
  for (uint64_t seed = 1; seed <= 1500; ++seed) {
    test::RandomExprGen gen(seed);
    for (ScalarType t : {ScalarType::F32, ScalarType::I32, ScalarType::Bool}) {
      gen.clear_used();
      Expr e = gen.expr(t, 1 + static_cast<int>(seed % 7));
      Mods m = mods_for(e, gen);
      std::string text = m.to_text();
      INFO("seed " << seed << "\n" << text);
      Mods back;
      REQUIRE_NOTHROW(back = parse_mods(text));
      REQUIRE(back.score_mod.defined());
      Expr parsed = back.score_mod->args[0];
      REQUIRE(ir::equal(parsed, e));
      REQUIRE(ir::hash(parsed) == ir::hash(e));
      REQUIRE(ir::to_text(parsed) == ir::to_text(e));
      REQUIRE(equal(back, m));
      ++checked;
    }
  }
  CHECK(checked == 4500);
}

TEST_CASE("parse_mods(m.to_text()) == m for random mods", "[dsl][roundtrip]") {
  for (uint64_t seed = 1; seed <= 1500; ++seed) {
    test::RandomExprGen gen(seed * 7919);
    Mods m = gen.mods(1 + static_cast<int>(seed % 6));
    std::string text = m.to_text();
    INFO("seed " << seed << "\n" << text);
    Mods back = parse_mods(text, "random.fx");
    REQUIRE(equal(back, m));
    REQUIRE(back.hash() == m.hash());
    REQUIRE(back.to_text() == text);
    // Default values are not compared by equal(); they must survive the trip too.
    for (size_t i = 0; i < m.params.size(); ++i) {
      REQUIRE(back.params[i].decl()->default_value == m.params[i].decl()->default_value);
    }
  }
}

TEST_CASE("literals at the edges round-trip", "[dsl][roundtrip]") {
  const double kFloats[] = {0.0,
                            -0.0,
                            0.1,
                            -2.5e-8,
                            1e-45,
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            16777217.0,
                            3.14159265358979,
                            std::numeric_limits<double>::infinity(),
                            -std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN()};
  for (double v : kFloats) {
    Expr lit = ir::make_float(v);
    for (Expr e : {lit, ir::build_unary(ir::Op::Neg, lit), score() - lit, lit * score()}) {
      Mods m;
      m.score_mod = e;
      INFO(m.to_text());
      Mods back = parse_mods(m.to_text());
      CHECK(ir::equal(back.score_mod, e));
      CHECK(ir::hash(back.score_mod) == ir::hash(e));
    }
  }
  const int64_t kInts[] = {0, 1, -1, 2147483647, -2147483647, -2147483648LL};
  for (int64_t v : kInts) {
    Expr lit = ir::make_int(v);
    for (Expr e : {lit, ir::build_unary(ir::Op::Neg, lit), q_idx() - lit, lit % kv_idx()}) {
      Mods m;
      m.score_mod = ir::build_cast(ScalarType::F32, e);
      INFO(m.to_text());
      Mods back = parse_mods(m.to_text());
      CHECK(ir::equal(back.score_mod, m.score_mod));
    }
  }
}
