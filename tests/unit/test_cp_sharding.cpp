// Context parallelism's sharding core (src/cp; docs/context_parallel.md), no GPU: the zigzag and
// contiguous layouts, the mods shifted to global positions (and what the passes still see in
// them), the pair plans and schedules, and the host lse merge.
#include <flexjit/context_parallel.h>
#include <flexjit/dsl.h>
#include <flexjit/error.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>

#include "cp/CallChecks.h"
#include "cp/GlobalPositions.h"
#include "cp/LseMerge.h"
#include "cp/NcclLibrary.h"
#include "cp/PairPlan.h"
#include "cp/Schedule.h"
#include "cp/Sharding.h"
#include "ir/Evaluate.h"
#include "ir/Visitor.h"
#include "passes/LinearForm.h"
#include "passes/MaskAnalysis.h"
#include "passes/PositionDifference.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

using namespace flexjit;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The global positions of every row of every rank, in rank order.
std::vector<int64_t> positions_in_rank_order(const cp::Sharding& sh) {
  std::vector<int64_t> out;
  for (int r = 0; r < sh.ranks(); ++r)
    for (int64_t i = 0; i < sh.local_length(); ++i)
      out.push_back(sh.global_position(r, i));
  return out;
}

}  // namespace

TEST_CASE("zigzag sharding: rank r holds chunks r and 2N-1-r; every position once", "[cp]") {
  const cp::Sharding sh(CpLayout::Zigzag, 16, 2);
  CHECK(sh.num_chunks() == 4);
  CHECK(sh.chunk_length() == 4);
  CHECK(sh.local_length() == 8);
  const auto r0 = sh.chunks_of(0), r1 = sh.chunks_of(1);
  REQUIRE(r0.size() == 2);
  CHECK(r0[0].start == 0);
  CHECK(r0[1].start == 12);
  CHECK(r1[0].start == 4);
  CHECK(r1[1].start == 8);
  CHECK(sh.global_position(0, 5) == 13);
  CHECK(sh.global_position(1, 4) == 8);
  CHECK(sh.owner_of(3) == 0);
  CHECK(sh.local_row_of(3) == 4);
  CHECK(sh.owner_of(2) == 1);
  CHECK(sh.str() ==
        "zigzag: S = 16 over 2 ranks, 4 chunks of 4; rank 0 holds [0, 4) [12, 16), rank 1 holds "
        "[4, 8) [8, 12)");
  for (int n : {1, 2, 3, 4}) {
    for (CpLayout layout : {CpLayout::Zigzag, CpLayout::Contiguous}) {
      const cp::Sharding s(layout, 24 * n, n);
      std::vector<int64_t> pos = positions_in_rank_order(s);
      const std::set<int64_t> unique(pos.begin(), pos.end());
      CHECK(unique.size() == static_cast<size_t>(24 * n));
      CHECK(*unique.begin() == 0);
      CHECK(*unique.rbegin() == 24 * n - 1);
      // owner_of / local_row_of invert chunks_of.
      for (int64_t c = 0; c < s.num_chunks(); ++c) {
        const int owner = s.owner_of(c);
        CHECK(s.global_position(owner, s.local_row_of(c)) == s.chunk(c).start);
      }
    }
  }
  const cp::Sharding contiguous(CpLayout::Contiguous, 12, 3);
  CHECK(contiguous.chunks_of(2).size() == 1);
  CHECK(contiguous.global_position(2, 1) == 9);
}

TEST_CASE("a sequence that does not divide into the chunks is refused with the fix", "[cp]") {
  CHECK_THROWS_WITH(cp::Sharding(CpLayout::Zigzag, 1000, 3),
                    Catch::Contains("seqlen 1000 is not a multiple of the 6 chunks of a zigzag "
                                    "sharding over 3 ranks; pad the sequence to a multiple of 6"));
  CHECK_THROWS_WITH(cp::Sharding(CpLayout::Contiguous, 10, 4),
                    Catch::Contains("seqlen 10 is not a multiple of the 4 chunks"));
  CHECK_THROWS_WITH(cp::Sharding(CpLayout::Zigzag, 16, 0), Catch::Contains("0 ranks"));
  CHECK(parse_cp_layout("zigzag") == CpLayout::Zigzag);
  CHECK(parse_cp_strategy("allgather") == CpStrategy::AllGather);
  CHECK(parse_cp_strategy("ring") == CpStrategy::Ring);
  CHECK_FALSE(parse_cp_strategy("tree"));
}

TEST_CASE("with_global_positions: the shifted mods at local positions are the mods at global ones",
          "[cp]") {
  for (const char* name : {"causal", "sliding_window", "document_causal", "alibi_causal",
                           "relative_bias_causal", "prefix_lm", "chunked_local"}) {
    INFO(name);
    const Mods mods = standard_mods(name);
    const Mods shifted = cp::with_global_positions(mods);
    // The user's params first, then the offsets the mods read.
    REQUIRE(shifted.params.size() >= mods.params.size());
    for (size_t i = 0; i < mods.params.size(); ++i)
      CHECK(shifted.params[i].name() == mods.params[i].name());
    CHECK(shifted.params.back().name().rfind("cp_", 0) == 0);
    // The text form parses back to equal mods (the kernel cache keys on it).
    CHECK(equal(parse_mods(shifted.to_text()), shifted));
    CHECK_FALSE(equal(shifted, mods));
  }
  // A mod that never reads kv_idx gets no cp_kv_offset to bind.
  const Mods q_only = parse_mods("mask_mod = q_idx >= 3");
  const Mods shifted = cp::with_global_positions(q_only);
  REQUIRE(shifted.params.size() == 1);
  CHECK(shifted.params[0].name() == "cp_q_offset");
  const ModBindings b = cp::with_offsets({}, shifted, 40, 8);
  REQUIRE(b.params.size() == 1);
  CHECK(b.params[0] == std::pair<std::string, double>{"cp_q_offset", 40.0});
  // The reserved names.
  CHECK_THROWS_WITH(
      cp::with_global_positions(parse_mods("param cp_q_offset: i32 = 0\nmask_mod = q_idx >= "
                                           "kv_idx + cp_q_offset")),
      Catch::Contains("reserves the names cp_q_offset and cp_kv_offset"));
}

TEST_CASE("the shifted mask evaluates at global positions", "[cp]") {
  // sliding_window at local (q, kv) with offsets (q0, k0) == at global (q0 + q, k0 + kv).
  const Mods mods = standard_mods("sliding_window");
  const Mods shifted = cp::with_global_positions(mods);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> pos(0, 4000), local(0, 255);
  for (int i = 0; i < 200; ++i) {
    const int q0 = pos(rng), k0 = pos(rng), q = local(rng), kv = local(rng);
    ir::EvalEnv global, at;
    global.q_idx = q0 + q, global.kv_idx = k0 + kv;
    global.params = {{"window", 100.0}};
    at.q_idx = q, at.kv_idx = kv;
    at.params = {{"window", 100.0}, {"cp_q_offset", double(q0)}, {"cp_kv_offset", double(k0)}};
    CHECK(ir::evaluate(shifted.mask_mod, at).as_bool() ==
          ir::evaluate(mods.mask_mod, global).as_bool());
  }
}

TEST_CASE(
    "the passes still see causal and window shapes, linear forms and diagonals after the "
    "shift",
    "[cp]") {
  const Mods causal = cp::with_global_positions(standard_mods("causal"));
  const Mods window = cp::with_global_positions(standard_mods("sliding_window"));
  auto verdict = [](const Mods& m, int q0, int k0, int n, double w) {
    passes::TileBounds t;
    t.b = {0, 0}, t.h = {0, 7};
    t.q_idx = {0, n - 1}, t.kv_idx = {0, n - 1};
    t.params = {{"cp_q_offset", double(q0)}, {"cp_kv_offset", double(k0)}, {"window", w}};
    return passes::analyze_tile(m.mask_mod, t);
  };
  // Causal: a key chunk after the query chunk is empty, one before it full, the diagonal neither.
  CHECK(verdict(causal, 0, 1024, 1024, 0) == passes::TileVerdict::Empty);
  CHECK(verdict(causal, 3072, 1024, 1024, 0) == passes::TileVerdict::Full);
  CHECK(verdict(causal, 2048, 2048, 1024, 0) == passes::TileVerdict::Unknown);
  // Window 100: a chunk more than 100 positions back is empty.
  CHECK(verdict(window, 3072, 1024, 1024, 100) == passes::TileVerdict::Empty);
  CHECK(verdict(window, 3072, 2048, 1024, 100) == passes::TileVerdict::Unknown);
  CHECK(verdict(window, 3072, 2048, 1024, 5000) == passes::TileVerdict::Full);
  // Without the offsets' values nothing is proven.
  passes::TileBounds open;
  open.q_idx = {0, 1023}, open.kv_idx = {0, 1023};
  CHECK(passes::analyze_tile(causal.mask_mod, open) == passes::TileVerdict::Unknown);

  // ALiBi's (kv_idx + k0) - (q_idx + q0) is still linear in the positions, coefficients
  // (-1, 1), and a relative bias still depends only on q_idx - kv_idx.
  const Mods alibi = cp::with_global_positions(standard_mods("alibi"));
  bool found = false;
  ir::for_each_node(alibi.score_mod, [&](const Expr& n) {
    if (n->op != ir::Op::Sub || n->type != ScalarType::I32 || found) return;
    const auto lf = passes::qkv_linear_form(n);
    REQUIRE(lf);
    CHECK(lf->q == -1);
    CHECK(lf->kv == 1);
    found = true;
  });
  CHECK(found);
  CHECK(passes::depends_only_on_position_difference(alibi.score_mod));
  const Mods rel = cp::with_global_positions(standard_mods("relative_bias"));
  CHECK(passes::depends_only_on_position_difference(rel.score_mod));
  const Mods t5 = cp::with_global_positions(standard_mods("t5_bucketed_bias"));
  CHECK(passes::depends_only_on_position_difference(t5.score_mod));
}

TEST_CASE("pair plans: causal zigzag gives every rank the same calls; windows skip far pairs",
          "[cp]") {
  const Mods causal = cp::with_global_positions(standard_mods("causal"));
  for (int n : {2, 3, 4}) {
    INFO("N = " << n);
    const cp::Sharding sh(CpLayout::Zigzag, 2048 * n, n);
    for (int r = 0; r < n; ++r) {
      const cp::RankSchedule ring = cp::schedule_rank(sh, CpStrategy::Ring, r, causal, {}, 1, 16);
      // 2 query chunks x 2N key chunks, of which 2N - 1 are empty: 2N + 1 calls on every rank.
      CHECK(ring.calls.size() == static_cast<size_t>(2 * n + 1));
      CHECK(ring.skipped_pairs == 2 * n - 1);
      // Step 0 is the rank's own shard; the step's shard is rank (r - t) mod N's.
      CHECK(ring.calls.front().step == 0);
      CHECK(ring.calls.front().kv_rank == r);
      for (const cp::PairCall& c : ring.calls) {
        CHECK(c.kv_rank == ((r - c.step) % n + n) % n);
        CHECK(c.kv.start <= c.q.start);
        // Diagonal pairs apply the mask; pairs below the diagonal are full.
        CHECK(c.kind == (c.kv.start == c.q.start ? cp::PairKind::Partial : cp::PairKind::Full));
      }
      const cp::RankSchedule ag =
          cp::schedule_rank(sh, CpStrategy::AllGather, r, causal, {}, 1, 16);
      REQUIRE(ag.calls.size() == 2);
      for (const cp::PairCall& c : ag.calls) {
        CHECK(c.kv.start == 0);
        CHECK(c.kv.end() == c.q.end());
        CHECK(c.kind == cp::PairKind::Partial);
        CHECK(c.kv_rank == -1);
      }
    }
  }
  // Sliding window 100 over chunks of 1024: each query chunk needs itself and the chunk before.
  const Mods window = cp::with_global_positions(standard_mods("sliding_window"));
  const cp::Sharding sh(CpLayout::Zigzag, 8192, 4);
  const cp::RankSchedule ring =
      cp::schedule_rank(sh, CpStrategy::Ring, 1, window, {{"window", 100.0}}, 1, 1);
  CHECK(ring.calls.size() == 4);  // chunks 1 and 6: (1,1), (1,0), (6,6), (6,5)
  const cp::RankSchedule ag =
      cp::schedule_rank(sh, CpStrategy::AllGather, 1, window, {{"window", 100.0}}, 1, 1);
  REQUIRE(ag.calls.size() == 2);
  CHECK(ag.calls[1].kv.start == 5 * 1024);
  CHECK(ag.calls[1].kv.length == 2 * 1024);
  // A document mask reads a buffer: nothing proven, every pair runs.
  const Mods doc = cp::with_global_positions(standard_mods("document"));
  CHECK(cp::schedule_rank(sh, CpStrategy::Ring, 0, doc, {}, 1, 1).calls.size() == 16);
  // No mask: every pair is full.
  const Mods none = cp::with_global_positions(standard_mods("alibi"));
  for (const cp::PairCall& c : cp::schedule_rank(sh, CpStrategy::Ring, 0, none, {}, 1, 1).calls)
    CHECK(c.kind == cp::PairKind::Full);
  CHECK_FALSE(cp::mods_for_pair(causal, cp::PairKind::Full).mask_mod.defined());
  CHECK(cp::mods_for_pair(causal, cp::PairKind::Partial).mask_mod.defined());
  CHECK_THAT(cp::describe(ring), Catch::Contains("step 0: q [1024, 2048) x kv [1024, 2048) of "
                                                 "rank 1 (partial)"));
}

TEST_CASE("merge_partial: two halves merge into the whole; empty rows stay empty", "[cp]") {
  // Row scores over 6 keys, split 3 + 3; out is the softmax-weighted mean of per-key values.
  const std::vector<float> s = {0.5f, -1.0f, 2.0f, 0.1f, 3.0f, -0.5f};
  const std::vector<float> val = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  auto part = [&](size_t lo, size_t hi, float& out, float& lse) {
    double z = 0, acc = 0;
    for (size_t i = lo; i < hi; ++i)
      z += std::exp(double(s[i])), acc += std::exp(double(s[i])) * val[i];
    out = float(acc / z);
    lse = float(std::log(z));
  };
  float whole_out, whole_lse, a_out, a_lse, b_out, b_lse;
  part(0, 6, whole_out, whole_lse);
  part(0, 3, a_out, a_lse);
  part(3, 6, b_out, b_lse);
  float acc[2] = {0.0f, 0.0f}, acc_lse[2] = {kNegInf, kNegInf};
  // Row 0 takes both halves; row 1 sees only masked partials (lse -inf).
  const float parts_a[2] = {a_out, 0.0f}, lses_a[2] = {a_lse, kNegInf};
  const float parts_b[2] = {b_out, 0.0f}, lses_b[2] = {b_lse, kNegInf};
  cp::merge_partial(acc, acc_lse, parts_a, lses_a, 2, 1);
  cp::merge_partial(acc, acc_lse, parts_b, lses_b, 2, 1);
  CHECK(acc[0] == Approx(whole_out).epsilon(1e-6));
  CHECK(acc_lse[0] == Approx(whole_lse).epsilon(1e-6));
  CHECK(acc[1] == 0.0f);
  CHECK(acc_lse[1] == kNegInf);
  // A NaN lse poisons its row.
  const float nan_lse[1] = {std::numeric_limits<float>::quiet_NaN()};
  float one[1] = {1.0f}, one_lse[1] = {0.0f};
  cp::merge_partial(one, one_lse, parts_a, nan_lse, 1, 1);
  CHECK(std::isnan(one[0]));
  CHECK(std::isnan(one_lse[0]));
}

TEST_CASE("context-parallel calls refuse a block mask, a KV cache and sinks", "[cp]") {
  AttentionOptions o;
  o.mods = standard_mods("sinks");
  CHECK_THROWS_WITH(cp::check_cp_options(o),
                    Catch::Contains("does not support attention sinks yet"));
  o.mods = standard_mods("causal");
  CHECK_NOTHROW(cp::check_cp_options(o));
}

TEST_CASE("NCCL is looked up without linking it; a missing library names every place tried",
          "[cp]") {
  const cp::Nccl& nccl = cp::Nccl::get();
  std::string reason;
  const bool ok = nccl_available(&reason);
  CHECK(ok == nccl.available());
  if (ok) {
    CHECK(nccl.version() >= 20700);
    CHECK_FALSE(nccl.loaded_from().empty());
  } else {
    CHECK_THAT(reason, Catch::Contains("FLEXJIT_NCCL_LIBRARY") &&
                           Catch::Contains("libnccl.so.2 through the loader"));
    CHECK_THROWS_WITH(nccl.require(),
                      Catch::Contains("NCCL unavailable") && Catch::Contains("nvidia-nccl-cu13"));
  }
}

TEST_CASE("the cp_merge kernels compile with NVRTC for every dtype on sm_80 and sm_90a",
          "[cp][nvrtc]") {
  for (const char* arch : {"sm_80", "sm_90a"}) {
    for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
      for (int dv : {64, 128, 80}) {
        INFO(arch << " " << to_string(dtype) << " dv " << dv);
        KernelQuery q;
        q.family = "cp_merge";
        q.arch = arch;
        q.dtype = dtype;
        q.head_dim_qk = dv;
        const KernelBinary bin = compile_kernel(Mods{}, q);
        CHECK_FALSE(bin.cubin.empty());
        CHECK(bin.source.kernel_name == "flexjit_cp_merge");
        CHECK_THAT(bin.source.source, Catch::Contains("flexjit_cp_finalize"));
        CHECK_THAT(bin.source.description, Catch::StartsWith("cp_merge/warp_per_row"));
      }
    }
  }
  KernelQuery bad;
  bad.family = "cp_merge";
  bad.arch = "sm_80";
  bad.dtype = DType::I32;
  CHECK_THROWS_WITH(emit_kernel(Mods{}, bad), Catch::Contains("bf16, f16 or f32, not i32"));
}
