// Block masks built on the host from a mask_mod: interval analysis decides whole regions of
// tiles at once (passes/MaskAnalysis.h), and the interpreter (ir/Evaluate.h) evaluates the
// tiles it cannot decide. `flexjit mask show` uses this without a GPU; create_block_mask uses
// the analysis (analyze_tiles) to skip proven tiles on the device.
#pragma once

#include <flexjit/block_mask.h>
#include <flexjit/mods.h>

#include "ir/Evaluate.h"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace flexjit::cpu {

// A tile class the analysis could not prove (beside TileKind's Empty 0, Partial 1, Full 2).
inline constexpr uint8_t kTileUnknown = 3;

// What the analysis proved for every (q tile, kv tile), the same for every b < batch and
// h < heads.
struct TileHints {
  int num_q_blocks = 0, num_kv_blocks = 0;
  std::vector<uint8_t> kinds;    // [num_q_blocks * num_kv_blocks]: TileKind or kTileUnknown
  std::vector<int32_t> unknown;  // tile numbers (qb * num_kv_blocks + kvb) of kTileUnknown
  int analyze_calls = 0;         // how many regions were analysed
};

// Decides tiles by analysing regions of tiles, coarse to fine (a region proven empty or full
// decides all its tiles; an undecided one is split in four), until every tile is decided, a
// single undecided tile, or `max_calls` analyses were spent (the rest stays unknown). Positions
// past Sq / Skv are masked, so a cut tile proven full is Partial. `params` are the values the
// mask's parameters take (a parameter absent here takes its declared default; none: unknown).
TileHints analyze_tiles(const Mods& mask, int batch, int heads, int seqlen_q, int seqlen_kv,
                        int block_size, const std::unordered_map<std::string, double>& params,
                        int max_calls);

// The default analysis budget for a grid of tiles: enough for masks whose boundaries are a few
// lines of tiles (causal, sliding window, prefix-LM, chunks) to be decided down to single tiles.
int default_analysis_budget(int num_q_blocks, int num_kv_blocks);

// The block mask of `mods.mask_mod` (CompileError if it has none) over [batch, heads, Sq, Skv]
// with square tiles of `block_size`; `bindings` supplies parameter values and host buffers (its
// b / h / q_idx / kv_idx / score are ignored). Same result as block_mask_from_predicate of the
// interpreted mask_mod. RuntimeError for non-positive sizes or bad bindings.
BlockMask build_block_mask_cpu(const Mods& mods, int batch, int heads, int seqlen_q, int seqlen_kv,
                               int block_size, const ir::EvalEnv& bindings);

}  // namespace flexjit::cpu
