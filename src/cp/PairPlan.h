// Which (query chunk, key chunk) pairs of a context-parallel attention need computing.
//
// The mask analysis (passes/MaskAnalysis.h) looks at the whole pair at once: the shifted mods
// (cp/GlobalPositions.h) over the pair's local rows and columns, with the shard offsets and the
// call's parameter values known. Its verdicts:
//   Empty    the mask_mod is false on every (q, kv) of the pair: the pair is skipped (under a
//            causal mask every key chunk after the query chunk; beyond a sliding window every
//            chunk farther than the window);
//   Full     true everywhere: the pair runs without its mask_mod (no block mask, no mask
//            evaluation);
//   Partial  neither, or unknown (a document mask reads a buffer): the pair runs with the
//            mask_mod and a block mask of its own.
// The analysis is sound (Empty and Full are proofs), so skipping a pair never changes a result.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/mods.h>

#include "cp/Sharding.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace flexjit::cp {

enum class PairKind { Empty, Full, Partial };
std::string_view to_string(PairKind k);  // "empty", "full", "partial"

// The parameter values of a call: the bound ones, else each declared default (a parameter
// with neither stays unknown to the analysis).
std::unordered_map<std::string, double> known_params(const Mods& mods, const ModBindings& bindings);

// The kind of the pair (query positions [q.start, q.end()), key positions [kv.start,
// kv.end())) for `shifted` (a with_global_positions result) over batch x heads. `params` are the
// call's values (known_params); the offsets are added here.
PairKind classify_pair(const Mods& shifted, const std::unordered_map<std::string, double>& params,
                       int64_t batch, int64_t heads, const Chunk& q, const Chunk& kv);

// The mods a pair's call runs: `shifted` itself for a Partial pair, without its mask_mod for a
// Full one (its parameters stay declared, so the same bindings apply). Not for Empty pairs.
Mods mods_for_pair(const Mods& shifted, PairKind kind);

}  // namespace flexjit::cp
