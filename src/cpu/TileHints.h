// Host interval analysis over a grid of tiles (passes/MaskAnalysis.h): which (q tile, kv tile)
// pairs a mask_mod provably keeps entirely or not at all, decided region by region. The GPU's
// create_block_mask (runtime/CreateBlockMask.cpp) skips the tiles it proves; the interpreted
// builder (cpu/InterpretedBlockMask.h) evaluates only the others.
#pragma once

#include <flexjit/block_mask.h>
#include <flexjit/mods.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace flexjit::cpu {

// ceil(a / b) for a >= 0, b >= 1, without overflow.
int ceil_div(int a, int b);

// The most tiles (batch x heads x q tiles x kv tiles) a block mask built on the host may have:
// 2^26, a 1M x 1M mask in tiles of 128 (its index arrays and their transposes take 1 GiB).
inline constexpr int64_t kMaxHostTiles = int64_t{1} << 26;

// RuntimeError unless every size is positive and the grid has at most `max_tiles` tiles.
void check_tile_grid(int batch, int heads, int seqlen_q, int seqlen_kv, int block_size,
                     int64_t max_tiles = kMaxHostTiles);

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

}  // namespace flexjit::cpu
