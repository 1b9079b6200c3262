#include "cpu/HostBlockMask.h"

#include <flexjit/error.h>

#include "passes/MaskAnalysis.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>

namespace flexjit::cpu {

namespace {

void check_sizes(int batch, int heads, int seqlen_q, int seqlen_kv, int block_size) {
  if (batch < 1 || heads < 1 || seqlen_q < 1 || seqlen_kv < 1 || block_size < 1) {
    throw RuntimeError(fmt::format(
        "block mask sizes must be positive: batch {}, heads {}, seqlen_q {}, seqlen_kv {}, "
        "block size {}",
        batch, heads, seqlen_q, seqlen_kv, block_size));
  }
}

int ceil_div(int a, int b) {
  return static_cast<int>((static_cast<int64_t>(a) + b - 1) / b);
}

// Tiles [q0, q1) x [k0, k1) of the grid.
struct Region {
  int q0, q1, k0, k1;
};

}  // namespace

int default_analysis_budget(int num_q_blocks, int num_kv_blocks) {
  return 64 + 16 * (num_q_blocks + num_kv_blocks);
}

TileHints analyze_tiles(const Mods& mask, int batch, int heads, int seqlen_q, int seqlen_kv,
                        int block_size, const std::unordered_map<std::string, double>& params,
                        int max_calls) {
  check_sizes(batch, heads, seqlen_q, seqlen_kv, block_size);
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

BlockMask build_block_mask_cpu(const Mods& mods, int batch, int heads, int seqlen_q, int seqlen_kv,
                               int block_size, const ir::EvalEnv& bindings) {
  if (!mods.mask_mod.defined()) {
    throw CompileError("a block mask needs a mask_mod; these mods have none");
  }
  mods.check();
  check_sizes(batch, heads, seqlen_q, seqlen_kv, block_size);
  const int nq = ceil_div(seqlen_q, block_size), nkv = ceil_div(seqlen_kv, block_size);
  const TileHints hints = analyze_tiles(mods, batch, heads, seqlen_q, seqlen_kv, block_size,
                                        bindings.params, default_analysis_budget(nq, nkv));

  // Evaluate the undecided tiles of every (b, h): stop at the first position that disagrees
  // with the tile's first one; out-of-range positions are masked.
  ir::Evaluator eval(mods.mask_mod);
  ir::EvalEnv env = bindings;
  const size_t tiles = static_cast<size_t>(nq) * nkv;
  std::vector<uint8_t> kinds(static_cast<size_t>(batch) * heads * tiles);
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      uint8_t* bh_kinds = kinds.data() + (static_cast<size_t>(b) * heads + h) * tiles;
      std::copy(hints.kinds.begin(), hints.kinds.end(), bh_kinds);
      env.b = b;
      env.h = h;
      for (int32_t t : hints.unknown) {
        const int qb = t / nkv, kvb = t % nkv;
        const int q0 = qb * block_size, kv0 = kvb * block_size;
        const int q1 = std::min(q0 + block_size, seqlen_q);
        const int kv1 = std::min(kv0 + block_size, seqlen_kv);
        const bool cut = q1 - q0 < block_size || kv1 - kv0 < block_size;
        bool any = false, all = true;
        for (int q = q0; q < q1 && !(any && !all); ++q) {
          env.q_idx = q;
          for (int kv = kv0; kv < kv1; ++kv) {
            env.kv_idx = kv;
            const bool v = eval.run(env).as_bool();
            any = any || v;
            all = all && v;
            if (any && !all) break;
          }
        }
        TileKind k = !any ? TileKind::Empty : (all && !cut ? TileKind::Full : TileKind::Partial);
        bh_kinds[t] = static_cast<uint8_t>(k);
      }
    }
  }
  BlockMask m = block_mask_from_tiles(
      batch, heads, seqlen_q, seqlen_kv,
      [&](int b, int h, int qb, int kvb) {
        return static_cast<TileKind>(kinds[(static_cast<size_t>(b) * heads + h) * tiles +
                                           static_cast<size_t>(qb) * nkv + kvb]);
      },
      block_size, block_size);
  m.mods = mods;
  return m;
}

}  // namespace flexjit::cpu
