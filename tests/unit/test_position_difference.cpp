// passes::depends_only_on_position_difference: expressions that read q_idx and kv_idx only
// through q_idx - kv_idx. Checked by hand on the standard mods' index expressions (T5's bucket,
// relative_bias's index) and negatives, and on random expressions against evaluation: whenever
// it says yes, e(q, kv) == e(q - kv, 0) (in wrapping i32 arithmetic).
#include <flexjit/dsl.h>
#include <flexjit/mods.h>

#include "ir/Evaluate.h"
#include "ir/IR.h"
#include "ir/Printer.h"
#include "ir/Visitor.h"
#include "passes/LinearForm.h"
#include "passes/PositionDifference.h"
#include "support/PassesEnv.h"
#include "support/RandomExpr.h"

#include <catch2/catch.hpp>

#include <random>

using namespace flexjit;
using passes::depends_only_on_position_difference;

namespace {

// The indices of the score_mod's first load of `buffer`.
std::vector<Expr> load_indices(const Mods& mods, const std::string& buffer) {
  std::vector<Expr> indices;
  ir::for_each_node(mods.score_mod, [&](const Expr& n) {
    if (indices.empty() && n->op == ir::Op::Load && n->buffer->name == buffer) indices = n->args;
  });
  REQUIRE_FALSE(indices.empty());
  return indices;
}

// e(q, kv) == e(q - kv, 0) at `at` (nothing to compare when e(q, kv) throws: an out-of-bounds
// load; e(q - kv, 0) then reads the same indices, so it must not throw where e(q, kv) did not).
void check_at(const Expr& e, ir::EvalEnv at) {
  ir::Value v0;
  try {
    v0 = ir::evaluate(e, at);
  } catch (const std::exception&) {
    return;
  }
  at.q_idx =
      static_cast<int32_t>(static_cast<uint32_t>(at.q_idx) - static_cast<uint32_t>(at.kv_idx));
  at.kv_idx = 0;
  ir::Value v1;
  REQUIRE_NOTHROW(v1 = ir::evaluate(e, at));
  CHECK(ir::identical(v0, v1));
}

}  // namespace

TEST_CASE("position difference: the standard mods' diagonal indices and negatives",
          "[passes][linear]") {
  const Expr q = q_idx(), kv = kv_idx(), hh = h_idx();
  const Expr off = Param("offset", ScalarType::I32).expr();

  // T5's bucket (abs, log, floor, min, where of kv_idx - q_idx) and relative_bias's index.
  const std::vector<Expr> t5 = load_indices(standard_mods("t5_bucketed_bias"), "bias");
  REQUIRE(t5.size() == 2);
  CHECK(depends_only_on_position_difference(t5[0]));  // h
  CHECK(depends_only_on_position_difference(t5[1]));  // the bucket
  const std::vector<Expr> rel = load_indices(standard_mods("relative_bias"), "bias");
  for (const Expr& e : rel)
    CHECK(depends_only_on_position_difference(e));

  for (const Expr& e :
       {q - kv + off, kv - q, abs(q - kv) % 7, min(abs(kv - q), Expr(15)) + hh * 32,
        where(q - kv > 0, Expr(16), Expr(0)) + abs(q - kv), to_int(floor(log(to_float(kv - q)))),
        (q - kv) * (q - kv), q - q, Expr(3), hh + off}) {
    INFO(ir::to_text(e));
    CHECK(depends_only_on_position_difference(e));
  }
  for (const Expr& e : {q, kv, q * kv, q + kv, where(q > 5, q - kv, Expr(0)), where(q > kv, q, kv),
                        abs(q) - abs(kv), (q - kv) * 2 + kv, min(q, kv), 2 * q - kv}) {
    INFO(ir::to_text(e));
    CHECK_FALSE(depends_only_on_position_difference(e));
  }
  // Loads of integer tables at the difference are functions of it; at q_idx alone not.
  const Buffer ids("ids", DType::I32, {"S"});
  CHECK(depends_only_on_position_difference(Expr(ids[abs(q - kv)]) * 2));
  CHECK_FALSE(depends_only_on_position_difference(Expr(ids[q]) - kv));
}

TEST_CASE("position difference agrees with evaluation on random expressions", "[passes][linear]") {
  test::RandomExprGen gen(20261126);
  test::PassesEnv env(gen, 13);
  int said_yes = 0, reading = 0;
  auto check = [&](const Expr& e) {
    if (!depends_only_on_position_difference(e)) return false;
    ++said_yes;
    reading += passes::reads_positions(e) ? 1 : 0;
    INFO(ir::to_text(e));
    for (int k = 0; k < 4; ++k)
      check_at(e, env.next());
    return true;
  };
  // Raw random expressions: mostly constants in the positions, some nonlinear in q - kv.
  for (int i = 0; i < 4000; ++i)
    check(gen.expr(ScalarType::I32, 1 + i % 5));
  // Random expressions with q_idx and kv_idx replaced by linear forms in their difference:
  // every one is a function of it, and the pass must say so.
  const Expr q = q_idx(), kv = kv_idx();
  const Expr p = Param("p", ScalarType::I32, 3).expr();
  int built = 0;
  for (int i = 0; i < 2000; ++i) {
    const Expr e = gen.expr(ScalarType::I32, 1 + i % 5);
    const Expr d = ir::substitute_vars(
        e, {{ir::VarKind::QIdx, q - kv + p}, {ir::VarKind::KvIdx, (kv - q) * 3 + h_idx()}});
    INFO(ir::to_text(d));
    CHECK(check(d));
    built += passes::reads_positions(d) ? 1 : 0;
  }
  CHECK(reading > 300);  // nontrivial cases, not just expressions free of the positions
  CHECK(built > 300);
  CHECK(said_yes > 2000);
}
