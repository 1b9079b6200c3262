// MaskAnalysis: verdicts checked against brute-force evaluation at every point of the tile.
// Sound always (Full / Empty only when every point agrees); exact for the standard affine masks.
#include <flexjit/dsl.h>

#include "ir/Evaluate.h"
#include "ir/IR.h"
#include "passes/Interval.h"
#include "passes/MaskAnalysis.h"
#include "support/PassesEnv.h"
#include "support/RandomExpr.h"

#include <catch2/catch.hpp>

#include <limits>
#include <random>

using namespace flexjit;
using passes::analyze_tile;
using passes::TileBounds;
using passes::TileVerdict;

namespace {

struct BruteForce {
  int64_t true_points = 0, false_points = 0;
  TileVerdict truth() const {
    if (false_points == 0) return TileVerdict::Full;
    if (true_points == 0) return TileVerdict::Empty;
    return TileVerdict::Unknown;
  }
};

// Evaluates `mask` at every point of `tile` (points whose evaluation fails are skipped).
BruteForce brute_force(const Expr& mask, const TileBounds& tile, ir::EvalEnv env) {
  ir::Evaluator ev(mask);
  BruteForce r;
  for (int64_t b = tile.b.lo; b <= tile.b.hi; ++b) {
    for (int64_t h = tile.h.lo; h <= tile.h.hi; ++h) {
      for (int64_t q = tile.q_idx.lo; q <= tile.q_idx.hi; ++q) {
        for (int64_t kv = tile.kv_idx.lo; kv <= tile.kv_idx.hi; ++kv) {
          env.b = static_cast<int32_t>(b);
          env.h = static_cast<int32_t>(h);
          env.q_idx = static_cast<int32_t>(q);
          env.kv_idx = static_cast<int32_t>(kv);
          try {
            (ev.run(env).as_bool() ? r.true_points : r.false_points)++;
          } catch (const RuntimeError&) {
          }
        }
      }
    }
  }
  return r;
}

struct Tally {
  int tiles = 0, exact = 0, full = 0, empty = 0;
};

// Random block tiles over a 1024 x 1024 score matrix (aligned and unaligned, 1 to 64 wide).
Tally check_standard_mask(const Expr& mask, const ir::EvalEnv& env,
                          const std::unordered_map<std::string, double>& params, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tally t;
  const int sizes[] = {1, 2, 16, 32, 64, 13, 50};
  for (int i = 0; i < 300; ++i) {
    int mq = sizes[rng() % std::size(sizes)], mk = sizes[rng() % std::size(sizes)];
    bool aligned = rng() % 2;
    int q0 = static_cast<int>(rng() % 1024), k0 = static_cast<int>(rng() % 1024);
    if (aligned) {
      q0 -= q0 % mq;
      k0 -= k0 % mk;
    }
    if (rng() % 4 == 0) k0 = q0;  // diagonal tiles are the interesting ones
    TileBounds tile;
    tile.b = {0, 1};
    tile.h = {2, 2};
    tile.q_idx = {q0, q0 + mq - 1};
    tile.kv_idx = {k0, k0 + mk - 1};
    tile.params = params;
    TileVerdict v = analyze_tile(mask, tile);
    BruteForce bf = brute_force(mask, tile, env);
    INFO("mask " << mask.str() << " tile q[" << tile.q_idx.lo << ", " << tile.q_idx.hi << "] kv["
                 << tile.kv_idx.lo << ", " << tile.kv_idx.hi << "]: verdict "
                 << passes::to_string(v) << ", brute force " << bf.true_points << " true / "
                 << bf.false_points << " false");
    if (v == TileVerdict::Full) REQUIRE(bf.false_points == 0);
    if (v == TileVerdict::Empty) REQUIRE(bf.true_points == 0);
    ++t.tiles;
    t.exact += v == bf.truth();
    t.full += bf.truth() == TileVerdict::Full;
    t.empty += bf.truth() == TileVerdict::Empty;
  }
  return t;
}

}  // namespace

TEST_CASE("mask analysis is exact on causal, sliding window, prefix-LM and chunked masks",
          "[passes]") {
  Param window("window", ScalarType::I32, 100.0);
  Param prefix("prefix", ScalarType::I32, 200.0);
  Expr q = q_idx(), kv = kv_idx();
  std::unordered_map<std::string, double> params{{"window", 100.0}, {"prefix", 200.0}};
  ir::EvalEnv env;
  env.params = params;
  struct Named {
    const char* name;
    Expr mask;
  };
  const Named masks[] = {
      {"causal", q >= kv},
      {"sliding_window", q >= kv && q - kv <= window},
      {"prefix_lm", kv <= prefix || q >= kv},
      {"chunked", q / 64 == kv / 64},
      {"causal_offset", q + 100 >= kv},
  };
  for (size_t i = 0; i < std::size(masks); ++i) {
    Tally t = check_standard_mask(masks[i].mask, env, params, 1000 + i);
    INFO(masks[i].name << ": " << t.exact << " of " << t.tiles << " tiles exact (" << t.full
                       << " full, " << t.empty << " empty)");
    CHECK(t.exact == t.tiles);
    CHECK(t.full > 0);
    CHECK(t.empty > 0);
  }
}

TEST_CASE("mask analysis with an unknown parameter stays sound", "[passes]") {
  Param window("window", ScalarType::I32, 100.0);
  Expr mask = q_idx() >= kv_idx() && q_idx() - kv_idx() <= window;
  ir::EvalEnv env;
  for (double w : {0.0, 7.0, 100.0, 5000.0}) {
    env.params["window"] = w;
    Tally t = check_standard_mask(mask, env, {}, 7);  // window not known to the analysis
    // Without the window, only the causal half decides: every tile above the diagonal is Empty.
    CHECK(t.tiles == 300);
  }
  TileBounds tile;
  tile.q_idx = {0, 63};
  tile.kv_idx = {64, 127};
  CHECK(analyze_tile(mask, tile) == TileVerdict::Empty);
  tile.kv_idx = {0, 63};
  CHECK(analyze_tile(mask, tile) == TileVerdict::Unknown);
}

TEST_CASE("mask analysis: dilated and document masks are sound", "[passes]") {
  Expr q = q_idx(), kv = kv_idx();
  Buffer doc("doc", DType::I32, {"S"});
  std::vector<int32_t> doc_ids(1200);
  std::mt19937_64 rng(3);
  for (size_t i = 0, id = 0; i < doc_ids.size(); ++i) {
    if (rng() % 100 == 0) ++id;
    doc_ids[i] = static_cast<int32_t>(id);
  }
  ir::EvalEnv env;
  env.buffers["doc"] = ir::BufferView{doc_ids.data(), DType::I32, {1200}, {}};
  Tally dilated = check_standard_mask((q - kv) % 4 == 0, env, {}, 11);
  Tally document = check_standard_mask(doc[q] == doc[kv] && q >= kv, env, {}, 12);
  CHECK(dilated.exact > 0);
  CHECK(document.tiles == 300);
  // A load is unknown: the document part never decides a tile, the causal part may.
  TileBounds tile;
  tile.q_idx = {0, 0};
  tile.kv_idx = {0, 0};
  CHECK(analyze_tile(doc[q] == doc[kv], tile) == TileVerdict::Unknown);
  tile.kv_idx = {10, 20};
  CHECK(analyze_tile(doc[q] == doc[kv] && q >= kv, tile) == TileVerdict::Empty);
  // The dilated mask on one point and on a 2-wide diagonal.
  tile.q_idx = {8, 8};
  tile.kv_idx = {4, 4};
  CHECK(analyze_tile((q - kv) % 4 == 0, tile) == TileVerdict::Full);
  tile.kv_idx = {4, 5};
  CHECK(analyze_tile((q - kv) % 4 == 0, tile) == TileVerdict::Unknown);
  CHECK(analyze_tile(Expr(), tile) == TileVerdict::Full);  // no mask: attend everywhere
}

TEST_CASE("interval arithmetic follows floor division, modulo and wrapping", "[passes]") {
  passes::LeafBounds leaves;
  leaves.q_idx = {-7, 9};
  leaves.kv_idx = {2, 3};
  auto check_range = [&](const Expr& e, int64_t lo, int64_t hi) {
    passes::Interval r = passes::bounds_of(e, leaves);
    INFO(e.str() << " -> " << r.str());
    CHECK(r.lo == lo);
    CHECK(r.hi == hi);
  };
  check_range(q_idx() / kv_idx(), -4, 4);
  check_range(q_idx() % kv_idx(), 0, 2);
  check_range(q_idx() % 16, 0, 15);
  check_range(q_idx() / -2, -5, 3);
  check_range(q_idx() * kv_idx(), -21, 27);
  check_range(abs(q_idx()), 0, 9);
  check_range(q_idx() / (kv_idx() - 2), -7, 9);  // the divisor may be 0: x / 0 == 0
  check_range(q_idx() + 2147483647, std::numeric_limits<int32_t>::min(),
              std::numeric_limits<int32_t>::max());  // may wrap
  check_range(to_int(to_float(kv_idx()) * 2.5f), 5, 7);
}

TEST_CASE("mask analysis is sound on random boolean expressions (brute force)",
          "[passes][property]") {
  int verdicts = 0, tiles = 0;
  for (uint64_t seed = 1; seed <= 2500; ++seed) {
    test::RandomExprGen::Options opt;
    opt.allow_score = false;
    test::RandomExprGen gen(seed, opt);
    test::PassesEnv envs(gen, seed);
    Expr mask = gen.expr(ScalarType::Bool, 1 + static_cast<int>(seed % 5));
    ir::EvalEnv env = envs.next();
    std::mt19937_64 rng(seed);
    TileBounds tile;
    for (passes::IntRange* r : {&tile.b, &tile.h, &tile.q_idx, &tile.kv_idx}) {
      int64_t base = static_cast<int64_t>(rng() % 20) - 4;
      if (rng() % 8 == 0) base = std::numeric_limits<int32_t>::max() - 2;
      if (rng() % 8 == 0) base = std::numeric_limits<int32_t>::min();
      r->lo = static_cast<int32_t>(base);
      r->hi = static_cast<int32_t>(base + static_cast<int64_t>(rng() % 3));
    }
    if (rng() % 2) tile.params = env.params;  // else: the parameters are unknown
    TileVerdict v = analyze_tile(mask, tile);
    BruteForce bf = brute_force(mask, tile, env);
    if (bf.true_points + bf.false_points == 0) continue;
    ++tiles;
    INFO("seed " << seed << ": " << mask.str() << "\nverdict " << passes::to_string(v) << ", "
                 << bf.true_points << " true / " << bf.false_points << " false");
    if (v == TileVerdict::Full) REQUIRE(bf.false_points == 0);
    if (v == TileVerdict::Empty) REQUIRE(bf.true_points == 0);
    verdicts += v != TileVerdict::Unknown;
  }
  INFO(verdicts << " verdicts in " << tiles << " tiles");
  CHECK(verdicts > tiles / 5);  // the property is not vacuous
}
