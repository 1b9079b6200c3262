// TypeCheck: node invariants (a broken one is a flexjit bug, reported with the sub-expression)
// and the mod-level rules a user can break (CompileError).
#include <flexjit/dsl.h>
#include <flexjit/mods.h>

#include "ir/IR.h"
#include "passes/CSE.h"
#include "passes/Simplify.h"
#include "passes/TypeCheck.h"
#include "support/RandomExpr.h"

#include <catch2/catch.hpp>

using namespace flexjit;
using passes::type_check;
using passes::verify;

namespace {

// A node built around make_*'s checks, as a buggy pass could.
Expr raw(ir::Op op, ScalarType t, std::vector<Expr> args) {
  auto n = std::make_shared<ir::Node>();
  n->op = op;
  n->type = t;
  n->args = std::move(args);
  return Expr(std::shared_ptr<const ir::Node>(n));
}

}  // namespace

TEST_CASE("verify accepts everything the front ends and passes build", "[passes]") {
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    test::RandomExprGen gen(seed);
    Mods m = gen.mods(5);
    INFO("seed " << seed << "\n" << m.to_text());
    CHECK_NOTHROW(type_check(m));
    CHECK_NOTHROW(type_check(passes::simplify(m)));
    CHECK_NOTHROW(type_check(passes::cse(m)));
  }
}

TEST_CASE("verify reports a broken node with the sub-expression", "[passes]") {
  Expr bad_add = raw(ir::Op::Add, ScalarType::I32, {q_idx(), score()});
  CHECK_THROWS_AS(verify(bad_add), InternalError);
  CHECK_THROWS_WITH(verify(bad_add), Catch::Contains("Add of mismatched types i32 and f32") &&
                                         Catch::Contains("`q_idx + score`"));
  // Deep inside a valid expression.
  Expr outer = ir::make_binary(ir::Op::GE, ir::make_unary(ir::Op::Neg, bad_add), kv_idx());
  CHECK_THROWS_WITH(verify(outer), Catch::Contains("`q_idx + score`"));
  CHECK_THROWS_WITH(verify(raw(ir::Op::LT, ScalarType::I32, {q_idx(), kv_idx()})),
                    Catch::Contains("LT typed i32 (expected bool)"));
  CHECK_THROWS_WITH(verify(raw(ir::Op::Exp, ScalarType::I32, {q_idx()})),
                    Catch::Contains("Exp of i32"));
  CHECK_THROWS_WITH(verify(raw(ir::Op::Select, ScalarType::I32, {q_idx(), q_idx(), kv_idx()})),
                    Catch::Contains("non-bool condition"));
  CHECK_THROWS_WITH(verify(raw(ir::Op::Cast, ScalarType::I32, {q_idx()})),
                    Catch::Contains("cast from i32 to itself"));
  CHECK_THROWS_WITH(verify(raw(ir::Op::Load, ScalarType::F32, {q_idx()})),
                    Catch::Contains("Load without a buffer"));
  CHECK_THROWS_WITH(verify(raw(ir::Op::Neg, ScalarType::I32, {Expr()})),
                    Catch::Contains("Neg node with an undefined argument"));
  // A node whose fields are right but whose cached hash is not (hash 0 from raw()).
  CHECK_THROWS_WITH(verify(raw(ir::Op::Add, ScalarType::I32, {q_idx(), kv_idx()})),
                    Catch::Contains("stale structural hash"));
}

TEST_CASE("type_check: mod-level rules are user errors naming the expression", "[passes]") {
  Mods m;
  m.mask_mod = q_idx() - kv_idx();
  CHECK_THROWS_AS(type_check(m), CompileError);
  CHECK_THROWS_WITH(type_check(m), Catch::Contains("mask_mod must return bool") &&
                                       Catch::Contains("`q_idx - kv_idx` (i32)"));
  m.mask_mod = score() > 0.0f;
  CHECK_THROWS_WITH(type_check(m), Catch::Contains("mask_mod cannot use `score`"));
  m.mask_mod = {};
  m.score_mod = q_idx() >= kv_idx();
  CHECK_THROWS_WITH(type_check(m), Catch::Contains("score_mod must return f32"));

  Buffer bias("bias", DType::F32, {"H"});
  m.score_mod = score() + bias[h_idx()];
  CHECK_THROWS_WITH(type_check(m), Catch::Contains("uses buffer 'bias', which the mods do not"));
  m.buffers = {Buffer("bias", DType::F16, {"H"})};
  CHECK_THROWS_WITH(type_check(m), Catch::Contains("declaration that differs"));
  m.buffers = {bias};
  CHECK_NOTHROW(type_check(m));
  m.params = {Param("bias", ScalarType::F32)};
  CHECK_THROWS_WITH(type_check(m), Catch::Contains("'bias' is declared more than once"));
  m.params = {Param("window", ScalarType::I32, 2.5)};
  CHECK_THROWS_WITH(type_check(m), Catch::Contains("'window' is i32 but its default 2.5"));
  m.params = {Param("q_idx", ScalarType::I32)};
  CHECK_THROWS_WITH(type_check(m), Catch::Contains("name of a mod argument"));
}
