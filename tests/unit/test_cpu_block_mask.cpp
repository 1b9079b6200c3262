// CPU block masks (JIT'ed tile classification, cpu/JitBlockMask.h) against brute-force
// interpretation of the mask_mod at every point and against the interpreted builder.
#include <catch2/catch.hpp>

#include <flexjit/mods.h>

#include "cpu/InterpretedBlockMask.h"
#include "cpu/JitBlockMask.h"
#include "ir/Evaluate.h"
#include "support/BlockMaskCompare.h"
#include "support/HostBindings.h"
#include "support/PassesEnv.h"
#include "support/RandomExpr.h"

#include <algorithm>
#include <vector>

using namespace flexjit;

namespace {

// The classification of every tile by the interpreter: 0 empty, 1 partial, 2 full (positions
// past the end are masked: a cut tile is not full).
std::vector<int> brute_force(const Mods& mods, ir::EvalEnv env, const BlockMask& m) {
  std::vector<int> cls;
  std::optional<ir::Evaluator> ev;
  if (mods.mask_mod.defined()) ev.emplace(mods.mask_mod);
  for (int64_t b = 0; b < m.batch; ++b) {
    for (int64_t h = 0; h < m.heads; ++h) {
      for (int64_t qb = 0; qb < m.num_q_blocks; ++qb) {
        for (int64_t kb = 0; kb < m.num_kv_blocks; ++kb) {
          const bool whole =
              (qb + 1) * m.q_block_size <= m.seqlen_q && (kb + 1) * m.kv_block_size <= m.seqlen_kv;
          bool any = false, all = whole;
          for (int64_t q = qb * m.q_block_size;
               q < std::min<int64_t>(m.seqlen_q, (qb + 1) * m.q_block_size); ++q) {
            for (int64_t kv = kb * m.kv_block_size;
                 kv < std::min<int64_t>(m.seqlen_kv, (kb + 1) * m.kv_block_size); ++kv) {
              env.b = static_cast<int32_t>(b);
              env.h = static_cast<int32_t>(h);
              env.q_idx = static_cast<int32_t>(q);
              env.kv_idx = static_cast<int32_t>(kv);
              const bool keep = !ev || ev->run(env).as_bool();
              any |= keep;
              all &= keep;
            }
          }
          cls.push_back(!any ? 0 : all ? 2 : 1);
        }
      }
    }
  }
  return cls;
}

// The classification the block mask encodes, in the same order.
std::vector<int> decode(const BlockMask& m) {
  std::vector<int> cls;
  for (int64_t row = 0; row < m.batch * m.heads * m.num_q_blocks; ++row) {
    std::vector<int> r(static_cast<size_t>(m.num_kv_blocks), 0);
    for (int32_t i = 0; i < m.kv_num_blocks[static_cast<size_t>(row)]; ++i)
      r[static_cast<size_t>(m.kv_indices[static_cast<size_t>(row * m.num_kv_blocks + i)])] = 1;
    for (int32_t i = 0; i < m.full_kv_num_blocks[static_cast<size_t>(row)]; ++i)
      r[static_cast<size_t>(m.full_kv_indices[static_cast<size_t>(row * m.num_kv_blocks + i)])] = 2;
    cls.insert(cls.end(), r.begin(), r.end());
  }
  return cls;
}

}  // namespace

TEST_CASE("block masks of standard mods equal brute-force classification", "[cpu]") {
  std::vector<int32_t> doc(300);
  for (int i = 0; i < 300; ++i)
    doc[static_cast<size_t>(i)] = i < 70 ? 0 : i < 71 ? 1 : i < 200 ? 2 : 3;
  ir::EvalEnv env;
  env.buffers["doc_id"] = ir::BufferView{doc.data(), DType::I32, {300}, {}};
  env.params["window"] = 50;
  for (const char* name : {"causal", "sliding_window", "document", "document_causal", "noop"}) {
    for (auto [q_len, kv_len, qb, kb] :
         {std::tuple{300, 300, 128, 128}, std::tuple{129, 300, 64, 17}, std::tuple{1, 127, 16, 32},
          std::tuple{300, 129, 17, 128}}) {
      Mods mods = standard_mods(name);
      const ModBindings bindings = test::host_bindings(mods, env);
      BlockMask m = cpu::cpu_create_block_mask(mods, bindings, 1, 2, q_len, kv_len,
                                               cpu::CpuBlockMaskOptions{qb, kb, 2});
      INFO(name << " " << q_len << "x" << kv_len << " blocks " << qb << "x" << kb);
      REQUIRE_NOTHROW(m.validate());
      REQUIRE(m.num_q_blocks == (q_len + qb - 1) / qb);
      REQUIRE(decode(m) == brute_force(mods, env, m));
      // The interpreted builder (square tiles only) gives the same BlockMask, arrays and all.
      if (qb == kb && mods.mask_mod.defined()) {
        test::require_same(
            cpu::build_block_mask_interpreted(mods, 1, 2, q_len, kv_len, qb, bindings), m);
      }
    }
  }
}

TEST_CASE("block masks of random mask_mods equal brute-force classification", "[cpu]") {
  int partial_tiles = 0, full_tiles = 0, empty_tiles = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    test::RandomExprGen::Options opt;
    opt.allow_buffers = false;  // buffer extents (16) would be exceeded at these lengths
    test::RandomExprGen gen(seed, opt);
    Mods mods = gen.mods(4);
    test::PassesEnv envs(gen, seed);
    ir::EvalEnv env = envs.next();
    BlockMask m = cpu::cpu_create_block_mask(mods, test::host_bindings(mods, env), 2, 3, 45, 70,
                                             cpu::CpuBlockMaskOptions{16, 8, 2});
    INFO(mods.to_text());
    const std::vector<int> want = brute_force(mods, env, m);
    REQUIRE(decode(m) == want);
    for (int c : want) {
      partial_tiles += c == 1;
      full_tiles += c == 2;
      empty_tiles += c == 0;
    }
  }
  // The random masks exercise all three classes.
  REQUIRE(partial_tiles > 0);
  REQUIRE(full_tiles > 0);
  REQUIRE(empty_tiles > 0);
}

TEST_CASE("block mask edge cases: zero lengths, no mask_mod, bad sizes", "[cpu]") {
  const ModBindings none;
  BlockMask m = cpu::cpu_create_block_mask(standard_mods("causal"), none, 1, 1, 0, 100);
  REQUIRE(m.num_q_blocks == 0);
  REQUIRE(m.kv_num_blocks.empty());
  m = cpu::cpu_create_block_mask(standard_mods("causal"), none, 1, 1, 100, 0);
  REQUIRE(m.num_kv_blocks == 0);
  REQUIRE(m.kv_num_blocks == std::vector<int32_t>{0});
  m = cpu::cpu_create_block_mask(standard_mods("softcap"), none, 1, 1, 256, 200);  // no mask_mod
  REQUIRE(m.full_kv_num_blocks == std::vector<int32_t>{1, 1});  // the cut kv tile is partial
  REQUIRE(m.kv_num_blocks == std::vector<int32_t>{1, 1});
  REQUIRE_NOTHROW(m.validate());
  REQUIRE_THROWS_AS(cpu::cpu_create_block_mask(standard_mods("causal"), none, 1, 1, -1, 4),
                    RuntimeError);
  REQUIRE_THROWS_AS(cpu::cpu_create_block_mask(standard_mods("causal"), none, 1, 1, 4, 4,
                                               cpu::CpuBlockMaskOptions{0, 128, 0}),
                    RuntimeError);
  // Missing binding for the document mask's buffer.
  REQUIRE_THROWS_WITH(cpu::cpu_create_block_mask(standard_mods("document"), none, 1, 1, 4, 4),
                      Catch::Contains("buffer 'doc_id' (i32[S]) is not bound"));
  // validate() (BlockMask's one validator) catches a corrupted mask.
  m = cpu::cpu_create_block_mask(standard_mods("causal"), none, 1, 1, 300, 300);
  m.kv_indices[0] = 7;
  REQUIRE_THROWS_AS(m.validate(), RuntimeError);
}
