#include "cpu/InterpretedBlockMask.h"

#include <flexjit/error.h>

#include "binding/ModArgs.h"
#include "cpu/TileHints.h"
#include "ir/Evaluate.h"

#include <fmt/format.h>

#include <algorithm>

namespace flexjit::cpu {

BlockMask build_block_mask_interpreted(const Mods& mods, int batch, int heads, int seqlen_q,
                                       int seqlen_kv, int block_size, const ModBindings& bindings) {
  if (!mods.mask_mod.defined()) {
    throw CompileError("a block mask needs a mask_mod; these mods have none");
  }
  mods.check();
  check_tile_grid(batch, heads, seqlen_q, seqlen_kv, block_size);  // kMaxHostTiles
  const Mods mask = mask_only(mods);
  const runtime::CallExtents extents{batch, heads, -1, seqlen_q, seqlen_kv};
  const runtime::BoundModArgs bound =
      runtime::bind_mod_args(mask, bindings, TensorRef::Device::CPU, 0, &mods, &extents);
  std::unordered_map<std::string, double> params;
  for (size_t i = 0; i < mask.params.size(); ++i)
    params[mask.params[i].name()] = bound.params[i];
  const int nq = ceil_div(seqlen_q, block_size), nkv = ceil_div(seqlen_kv, block_size);
  const TileHints hints = analyze_tiles(mask, batch, heads, seqlen_q, seqlen_kv, block_size, params,
                                        default_analysis_budget(nq, nkv));

  // Evaluate the undecided tiles of every (b, h): stop at the first position that disagrees
  // with the tile's first one; out-of-range positions are masked.
  ir::Evaluator eval(mask.mask_mod);
  ir::EvalEnv env = runtime::eval_env_of(mask, bound);
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
