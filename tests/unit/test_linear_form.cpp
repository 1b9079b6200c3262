// passes::qkv_linear_form: the linear forms a * q_idx + c * kv_idx + r that the backward sums
// along diagonals. Checked by hand on the shapes mods use and, on random expressions, against
// evaluation: whenever it answers, moving q_idx and kv_idx moves the value by a and c exactly
// (in wrapping i32 arithmetic).
#include <flexjit/dsl.h>

#include "ir/Evaluate.h"
#include "ir/IR.h"
#include "ir/Printer.h"
#include "passes/LinearForm.h"
#include "support/PassesEnv.h"
#include "support/RandomExpr.h"

#include <catch2/catch.hpp>

#include <random>

using namespace flexjit;
using passes::qkv_linear_form;

namespace {

void check_form(const Expr& e, int64_t a, int64_t c) {
  INFO(ir::to_text(e));
  const auto f = qkv_linear_form(e);
  REQUIRE(f.has_value());
  CHECK(f->q == a);
  CHECK(f->kv == c);
}

}  // namespace

TEST_CASE("linear forms in q_idx and kv_idx: the shapes relative positions take",
          "[passes][linear]") {
  const Expr q = q_idx(), kv = kv_idx(), hh = h_idx();
  const Expr off = Param("offset", ScalarType::I32).expr();
  check_form(q - kv + off, 1, -1);
  check_form(kv - q + off, -1, 1);
  check_form(off - (kv - q), 1, -1);
  check_form(-(q - kv), -1, 1);
  check_form(2 * (q - kv) + hh * 7, 2, -2);
  check_form((q - kv) * 3 - off, 3, -3);
  check_form(q + q - kv, 2, -1);
  check_form(q - q + kv, 0, 1);
  check_form(hh + off, 0, 0);  // reads neither position: a constant as far as the tile goes
  check_form(Expr(5), 0, 0);

  // Not linear forms: min / max / abs / select / division / products of positions / params
  // as coefficients / loads at positions / casts from f32.
  const Buffer ids("ids", DType::I32, {"S"});
  for (const Expr& e :
       {min(q - kv, Expr(7)), abs(q - kv), where(q > kv, q - kv, Expr(0)), (q - kv) / 2, q * kv,
        off * (q - kv), Expr(ids[q]) - kv, to_int(to_float(q) * 0.5f), (q - kv) % 64}) {
    INFO(ir::to_text(e));
    CHECK_FALSE(qkv_linear_form(e).has_value());
  }
  // f32 expressions are never index forms.
  CHECK_FALSE(qkv_linear_form(to_float(q - kv)).has_value());
  // Coefficients past the i32 range.
  CHECK_FALSE(qkv_linear_form((q * 65536) * 65536).has_value());
  CHECK(passes::reads_positions(q + 1));
  CHECK_FALSE(passes::reads_positions(hh + off));
}

TEST_CASE("linear forms agree with evaluation on random expressions", "[passes][linear]") {
  test::RandomExprGen gen(20261125);
  test::PassesEnv env(gen, 7);
  std::mt19937_64 rng(11);
  int linear = 0;
  for (int i = 0; i < 4000; ++i) {
    const Expr e = gen.expr(ScalarType::I32, 1 + i % 5);
    const auto f = qkv_linear_form(e);
    if (!f) continue;
    ++linear;
    INFO(ir::to_text(e) << "  q " << f->q << ", kv " << f->kv);
    for (int k = 0; k < 4; ++k) {
      ir::EvalEnv at = env.next();
      ir::Value v0, v1;
      try {
        v0 = ir::evaluate(e, at);
        const int32_t dq = static_cast<int32_t>(rng() % 64) - 32;
        const int32_t dkv = static_cast<int32_t>(rng() % 64) - 32;
        at.q_idx =
            static_cast<int32_t>(static_cast<uint32_t>(at.q_idx) + static_cast<uint32_t>(dq));
        at.kv_idx =
            static_cast<int32_t>(static_cast<uint32_t>(at.kv_idx) + static_cast<uint32_t>(dkv));
        v1 = ir::evaluate(e, at);
        const uint32_t want = static_cast<uint32_t>(v0.i) +
                              static_cast<uint32_t>(f->q) * static_cast<uint32_t>(dq) +
                              static_cast<uint32_t>(f->kv) * static_cast<uint32_t>(dkv);
        CHECK(static_cast<uint32_t>(v1.i) == want);
      } catch (const std::exception&) {
        // An out-of-bounds load in the rest (r): nothing to compare.
      }
    }
  }
  CHECK(linear > 200);  // the generator produces plenty of them (constants included)
}
