#include <flexjit/mods.h>

#include "ir/IR.h"
#include "ir/Printer.h"
#include "support/RandomExpr.h"

#include <catch2/catch.hpp>

using namespace flexjit;

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
  }
}
