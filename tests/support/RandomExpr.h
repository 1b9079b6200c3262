// A seeded generator of random, well-typed mod-language expressions for property tests
// (parser round trip, simplifier and CSE equivalence, codegen agreement).
//
//   flexjit::test::RandomExprGen gen(/*seed=*/42);
//   Expr e = gen.expr(ScalarType::F32, /*depth=*/5);
//   for (const Buffer& b : gen.buffers()) ...   // the buffers e (and earlier exprs) load from
//   Mods m = gen.mods();                        // a random score_mod and/or mask_mod
//
// Expressions are built only through the typed builders (src/ir/Operators.h), so they are
// exactly what a front end produces: i32 operands are promoted with explicit casts, and every
// node kind appears (all unary and binary ops, casts, selects, params, and loads from buffers of
// rank 1 to 4 and every dtype). The same seed and the same sequence of calls give the same
// expressions on every platform (std::mt19937_64 with hand-written distributions).
#pragma once

#include <flexjit/dsl.h>
#include <flexjit/mods.h>

#include <cstdint>
#include <random>
#include <vector>

namespace flexjit::test {

class RandomExprGen {
 public:
  struct Options {
    bool allow_score = true;           // may expr() use the `score` leaf (never in mods().mask_mod)
    bool allow_special_floats = true;  // inf, -inf, nan, -0.0 and denormal literals
    bool allow_buffers = true;         // loads from captured buffers
    bool allow_params = true;          // runtime parameters
  };

  explicit RandomExprGen(uint64_t seed);
  RandomExprGen(uint64_t seed, Options options);

  // A random expression of type `type` whose tree is at most `depth` levels deep (a leaf has
  // depth 0; casts the builders insert for promotion are not counted).
  Expr expr(ScalarType type, int depth);

  // A random Mods: a score_mod (f32, may use score), a mask_mod (bool, never uses score), or
  // both, with the buffers and params they use (in order of first use, some params with default
  // values). Clears and then refills buffers()/params().
  Mods mods(int depth = 4);

  // The buffers / params used by the expressions generated since construction or the last
  // clear_used() / mods(), in order of first use.
  const std::vector<Buffer>& buffers() const { return buffers_; }
  const std::vector<Param>& params() const { return params_; }
  void clear_used();

  // Every buffer / param the generator may draw from (stable across seeds).
  const std::vector<Buffer>& buffer_pool() const { return buffer_pool_; }
  const std::vector<Param>& param_pool() const { return param_pool_; }

  std::mt19937_64& rng() { return rng_; }
  Options& options() { return options_; }

 private:
  int uniform(int n);  // in [0, n)
  bool chance(int percent);
  Expr leaf(ScalarType type);
  Expr literal(ScalarType type);
  Expr load(ScalarType type, int depth);
  Expr unary(ScalarType type, int depth);
  Expr binary(ScalarType type, int depth);
  Expr select(ScalarType type, int depth);
  Expr cast(ScalarType type, int depth);
  Expr numeric(int depth);  // an i32 or f32 operand
  void use(const Buffer& b);
  void use(const Param& p);

  std::mt19937_64 rng_;
  Options options_;
  bool in_mask_ = false;
  std::vector<Buffer> buffer_pool_;
  std::vector<Param> param_pool_;
  std::vector<Buffer> buffers_;
  std::vector<Param> params_;
};

}  // namespace flexjit::test
