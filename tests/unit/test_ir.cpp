#include <flexjit/dsl.h>
#include <flexjit/mods.h>

#include "ir/IR.h"
#include "ir/Printer.h"

#include <catch2/catch.hpp>

using namespace flexjit;

TEST_CASE("structurally equal expressions built separately hash equal", "[ir]") {
  Buffer slopes("slopes", DType::F32, {"H"});
  Expr a = score() + slopes[h_idx()] * (kv_idx() - q_idx());
  Expr b = score() + slopes[h_idx()] * (kv_idx() - q_idx());
  CHECK_FALSE(a.same_as(b));
  CHECK(ir::equal(a, b));
  CHECK(ir::hash(a) == ir::hash(b));
  Expr c = score() + slopes[h_idx()] * (q_idx() - kv_idx());
  CHECK_FALSE(ir::equal(a, c));
  CHECK(ir::hash(a) != ir::hash(c));
}

TEST_CASE("i32 operands promote to f32 through an explicit cast", "[ir]") {
  Expr e = score() + (kv_idx() - q_idx());
  REQUIRE(e.type() == ScalarType::F32);
  CHECK(e.str() == "score + float(kv_idx - q_idx)");
}

TEST_CASE("type errors name the offending sub-expression", "[ir][errors]") {
  CHECK_THROWS_WITH(q_idx() + (q_idx() >= kv_idx()), Catch::Contains("`q_idx >= kv_idx` (bool)"));
  Buffer bias("bias", DType::F32, {"H", "S"});
  CHECK_THROWS_WITH(Expr(bias[h_idx()][score()]), Catch::Contains("must be i32"));
  CHECK_THROWS_WITH(Expr(bias[h_idx()]), Catch::Contains("has 2 dims but is indexed with 1"));
}
