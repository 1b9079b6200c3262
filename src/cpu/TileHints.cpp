#include "cpu/TileHints.h"

#include <flexjit/error.h>

#include "passes/MaskAnalysis.h"
#include "util/CheckedMath.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <limits>

namespace flexjit::cpu {

namespace {

// Tiles [q0, q1) x [k0, k1) of the grid.
struct Region {
  int q0, q1, k0, k1;
};

}  // namespace

int default_analysis_budget(int num_q_blocks, int num_kv_blocks) {
  return 64 + 16 * (num_q_blocks + num_kv_blocks);
}

int ceil_div(int a, int b) {
  return static_cast<int>((static_cast<int64_t>(a) + b - 1) / b);
}

void check_tile_grid(int batch, int heads, int seqlen_q, int seqlen_kv, int block_size,
                     int64_t max_tiles) {
  if (batch < 1 || heads < 1 || seqlen_q < 1 || seqlen_kv < 1 || block_size < 1) {
    throw RuntimeError(fmt::format(
        "block mask sizes must be positive: batch {}, heads {}, seqlen_q {}, seqlen_kv {}, "
        "block size {}",
        batch, heads, seqlen_q, seqlen_kv, block_size));
  }
  const int nq = ceil_div(seqlen_q, block_size), nkv = ceil_div(seqlen_kv, block_size);
  const std::optional<int64_t> tiles = checked_product({batch, heads, nq, nkv});
  if (!tiles || *tiles > max_tiles) {
    throw RuntimeError(fmt::format(
        "a block mask of batch {} x heads {} x {} x {} tiles (lengths {} x {} in tiles of {}) "
        "has more than the {} tiles this builder holds",
        batch, heads, nq, nkv, seqlen_q, seqlen_kv, block_size, max_tiles));
  }
}

TileHints analyze_tiles(const Mods& mask, int batch, int heads, int seqlen_q, int seqlen_kv,
                        int block_size, const std::unordered_map<std::string, double>& params,
                        int max_calls) {
  // Only the sizes: the caller bounds the grid (the GPU builder allows more tiles than the host).
  check_tile_grid(batch, heads, seqlen_q, seqlen_kv, block_size,
                  std::numeric_limits<int64_t>::max());
  TileHints out;
  out.num_q_blocks = ceil_div(seqlen_q, block_size);
  out.num_kv_blocks = ceil_div(seqlen_kv, block_size);
  const int nq = out.num_q_blocks, nkv = out.num_kv_blocks;
  out.kinds.assign(static_cast<size_t>(nq) * nkv, kTileUnknown);

  passes::TileBounds bounds;
  bounds.b = {0, batch - 1};
  bounds.h = {0, heads - 1};
  bounds.params = params;
  for (const Param& p : mask.params) {
    if (!bounds.params.count(p.decl()->name) && p.decl()->default_value) {
      bounds.params[p.decl()->name] = *p.decl()->default_value;
    }
  }
  const bool q_cut = seqlen_q % block_size != 0, kv_cut = seqlen_kv % block_size != 0;

  // A mask the analysis cannot decide anywhere (one that compares buffer loads, say) would
  // spend the whole budget on ever finer regions: give up when the first four levels of the
  // quadtree (85 regions) decided nothing.
  constexpr int kGiveUpCalls = 85;
  int decided = 0;
  std::deque<Region> todo{{0, nq, 0, nkv}};
  while (!todo.empty() && out.analyze_calls < max_calls &&
         !(decided == 0 && out.analyze_calls >= kGiveUpCalls)) {
    const Region r = todo.front();
    todo.pop_front();
    bounds.q_idx = {r.q0 * block_size, std::min(r.q1 * block_size, seqlen_q) - 1};
    bounds.kv_idx = {r.k0 * block_size, std::min(r.k1 * block_size, seqlen_kv) - 1};
    ++out.analyze_calls;
    const passes::TileVerdict v = passes::analyze_tile(mask.mask_mod, bounds);
    if (v == passes::TileVerdict::Unknown) {
      const int qm = r.q1 - r.q0 > 1 ? (r.q0 + r.q1) / 2 : r.q1;
      const int km = r.k1 - r.k0 > 1 ? (r.k0 + r.k1) / 2 : r.k1;
      for (const Region c : {Region{r.q0, qm, r.k0, km}, Region{r.q0, qm, km, r.k1},
                             Region{qm, r.q1, r.k0, km}, Region{qm, r.q1, km, r.k1}}) {
        if (c.q0 < c.q1 && c.k0 < c.k1 &&
            !(c.q0 == r.q0 && c.q1 == r.q1 && c.k0 == r.k0 && c.k1 == r.k1)) {
          todo.push_back(c);
        }
      }
      continue;
    }
    ++decided;
    for (int qb = r.q0; qb < r.q1; ++qb) {
      for (int kvb = r.k0; kvb < r.k1; ++kvb) {
        uint8_t k = static_cast<uint8_t>(TileKind::Empty);
        if (v == passes::TileVerdict::Full) {
          const bool cut = (q_cut && qb == nq - 1) || (kv_cut && kvb == nkv - 1);
          k = static_cast<uint8_t>(cut ? TileKind::Partial : TileKind::Full);
        }
        out.kinds[static_cast<size_t>(qb) * nkv + kvb] = k;
      }
    }
  }
  for (size_t t = 0; t < out.kinds.size(); ++t) {
    if (out.kinds[t] == kTileUnknown) out.unknown.push_back(static_cast<int32_t>(t));
  }
  return out;
}

}  // namespace flexjit::cpu
