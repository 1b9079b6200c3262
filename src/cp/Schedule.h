// The attention calls one rank of a context-parallel attention makes, in order: what the CPU
// check (runtime/ContextParallelCpu.cpp) runs rank by rank and the GPU path
// (runtime/ContextParallel.cpp) runs on each GPU, so both make the same calls with the same
// offsets and merge the same partial results in the same order.
//
//   all-gather  (Llama 3's CP) every rank gathers the whole K / V, reordered into sequence
//               order; each of its query chunks then makes one call over the span of key
//               positions from the first to the last key chunk the pair plan keeps for it (under
//               a causal mask: from 0 to the chunk's end). No merge: the call's out and lse are
//               the chunk's. A chunk whose every pair is empty makes no call (its rows are fully
//               masked: out 0, lse -inf).
//   ring        step t = 0 .. N-1 holds the K / V shard of rank (r - t) mod N (rank r's own at
//               t = 0; each step passes the shard in hand to rank r + 1 and receives rank r - 1's).
//               Each (query chunk, key chunk of that shard) pair the plan keeps is one call;
//               its (out, lse) is merged into the query chunk's running result (cp/LseMerge.h)
//               in the order of the calls.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/context_parallel.h>
#include <flexjit/mods.h>

#include "cp/PairPlan.h"
#include "cp/Sharding.h"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace flexjit::cp {

using Strategy = CpStrategy;  // the public enum (to_string, parse_cp_strategy)

struct PairCall {
  int step = 0;             // ring: the step (0 .. N-1); all-gather: 0
  int q_chunk = 0;          // which of the rank's query chunks (0 or 1)
  Chunk q;                  // its global positions
  int64_t q_local_row = 0;  // its first row in the rank's shard
  // The key positions of the call: one chunk (ring), a span of the gathered K / V (all-gather).
  Chunk kv;
  int kv_rank = 0;           // ring: whose shard holds them; all-gather: -1 (the gathered K / V)
  int64_t kv_local_row = 0;  // ring: their first row in that shard; all-gather: kv.start
  PairKind kind = PairKind::Partial;
};

struct RankSchedule {
  int rank = 0;
  Strategy strategy = Strategy::Ring;
  std::vector<Chunk> q_chunks;  // the rank's chunks (Sharding::chunks_of)
  std::vector<PairCall> calls;  // in order
  int64_t skipped_pairs = 0;    // pairs the plan left out as empty
};

// The schedule of `rank`: the pairs of `sharding` classified for `shifted` (a
// with_global_positions result) with the call's `params` (known_params) over batch x heads.
RankSchedule schedule_rank(const Sharding& sharding, Strategy strategy, int rank,
                           const Mods& shifted,
                           const std::unordered_map<std::string, double>& params, int64_t batch,
                           int64_t heads);

// One line per call: "step 1: q [3072, 4096) x kv [1024, 2048) of rank 1 (full)".
std::string describe(const RankSchedule& s);

}  // namespace flexjit::cp
