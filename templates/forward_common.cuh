// flexjit forward building blocks shared by the forward templates (forward_sm80.cuh,
// forward_sm90.cuh): the KV tile schedule of a CTA, the score pipeline (scale, score_mod,
// mask_mod, key bound) on C fragments, and the online softmax update.
//
// Both work on the m16n8 accumulator fragment that mma.sync (m16n8k16) and wgmma (m64nNk16:
// warp w of the warpgroup owns rows 16w.., the same per-warp fragment repeated N/8 times) share:
// thread (g = lane / 4, t = lane % 4) holds rows g, g + 8 and keys 2t, 2t + 1 of each n8 tile.
// T gives kMTiles (m16 row blocks per warp), kNTiles (n8 tiles of S), kDTiles (n8 tiles of O)
// and kBlockN.
//
// Spliced after attention_sm80.cuh.
#ifndef FLEXJIT_FORWARD_COMMON_CUH_
#define FLEXJIT_FORWARD_COMMON_CUH_

template <class Cfg>
FJ_DEVICE FjKvSchedule fj_kv_schedule(const FjFwdArgs& args, int b, int h, int m_block) {
  return fj_block_schedule<Cfg::kBlockM, Cfg::kBlockN, Cfg::kHasFullBlocks>(
      args.mask, args.seqlen_kv, b, h, m_block);
}

// Turns raw q·k into log2-domain scores: scale, score_mod, mask_mod (partial tiles) and the
// key bound (ragged last tile). Thread (g, t) holds rows g, g+8 and keys 2t, 2t+1 of each
// fragment: s[mt][nt][hr*2 + c] is (row q_row0 + mt*16 + hr*8, key kv_col0 + nt*8 + c).
template <class Cfg, class T, bool kApplyMask>
FJ_DEVICE void fj_scores(float (&s)[T::kMTiles][T::kNTiles][4], const FjFwdArgs& args,
                         const FjModParams& mods, int b, int h, int q_row0, int n_start,
                         int kv_col0) {
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr bool kCallMods = Cfg::kHasScoreMod || (kApplyMask && Cfg::kHasMaskMod);
  if constexpr (!kCallMods) {
    const float scale_log2 = args.scale * kLog2e;
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[mt][nt][e] *= scale_log2;
  } else {
    const float scale = args.scale;
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        int q_idx = q_row0 + mt * 16 + hr * 8;
        // Mods only ever see in-range indices (their buffer loads stay in bounds); rows past
        // seqlen_q are computed on a clamped index and never written.
        if constexpr (!Cfg::kIsDivisible) q_idx = fj_imin(q_idx, args.seqlen_q - 1);
#pragma unroll
        for (int nt = 0; nt < T::kNTiles; ++nt) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            int kv_idx = kv_col0 + nt * 8 + c;
            if constexpr (!Cfg::kIsDivisible) kv_idx = fj_imin(kv_idx, args.seqlen_kv - 1);
            float x = s[mt][nt][hr * 2 + c];
            if constexpr (Cfg::kHasScoreMod) {
              x = fj_score_mod(mods, x * scale, b, h, q_idx, kv_idx) * kLog2e;
            } else {
              x *= scale * kLog2e;
            }
            if constexpr (kApplyMask && Cfg::kHasMaskMod) {
              if (!fj_mask_mod(mods, b, h, q_idx, kv_idx)) x = fj_neg_inf();
            }
            s[mt][nt][hr * 2 + c] = x;
          }
        }
      }
    }
  }
  if constexpr (!Cfg::kIsDivisible) {
    // Keys past seqlen_kv (zero-filled in shared memory) must not take part.
    if (n_start + T::kBlockN > args.seqlen_kv) {
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (kv_col0 + nt * 8 + (e & 1) >= args.seqlen_kv) s[mt][nt][e] = fj_neg_inf();
    }
  }
}

// The online softmax (log2 domain) of one row half (hr) of m tile mt: folds the tile's scores
// into the running max and (per-thread partial) sum, turns them into P = 2^(s - max) in place,
// and returns the factor by which the output accumulated so far must be rescaled (0 while the
// old max is -inf). A row whose max is still -inf (everything masked so far) uses 0 as its
// reference so that no -inf - -inf = NaN appears.
template <class T>
FJ_DEVICE float fj_softmax_row(float (&s)[T::kMTiles][T::kNTiles][4],
                               float (&row_max)[T::kMTiles][2], float (&row_sum)[T::kMTiles][2],
                               int mt, int hr) {
  float mx = row_max[mt][hr];
#pragma unroll
  for (int nt = 0; nt < T::kNTiles; ++nt)
    mx = fmaxf(mx, fmaxf(s[mt][nt][hr * 2], s[mt][nt][hr * 2 + 1]));
  // The 4 threads of a quad hold the same row.
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float ref = mx == fj_neg_inf() ? 0.0f : mx;
  const float alpha = fj_ex2_approx(row_max[mt][hr] - ref);
  row_max[mt][hr] = mx;
  float sum = 0.0f;
#pragma unroll
  for (int nt = 0; nt < T::kNTiles; ++nt) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float p = fj_ex2_approx(s[mt][nt][hr * 2 + c] - ref);
      s[mt][nt][hr * 2 + c] = p;
      sum += p;
    }
  }
  row_sum[mt][hr] = row_sum[mt][hr] * alpha + sum;
  return alpha;
}

// O *= alpha for row half hr of m tile mt.
template <class T>
FJ_DEVICE void fj_rescale_row(float (&o)[T::kMTiles][T::kDTiles][4], int mt, int hr, float alpha) {
#pragma unroll
  for (int dt = 0; dt < T::kDTiles; ++dt) {
    o[mt][dt][hr * 2] *= alpha;
    o[mt][dt][hr * 2 + 1] *= alpha;
  }
}

// One online-softmax update with the output rescaled at once (the sm80 kernel; the sm90 kernel
// calls fj_softmax_row now and fj_rescale_row once its P V of the previous tile has finished).
template <class T>
FJ_DEVICE void fj_softmax_update(float (&s)[T::kMTiles][T::kNTiles][4],
                                 float (&o)[T::kMTiles][T::kDTiles][4],
                                 float (&row_max)[T::kMTiles][2], float (&row_sum)[T::kMTiles][2]) {
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
      fj_rescale_row<T>(o, mt, hr, fj_softmax_row<T>(s, row_max, row_sum, mt, hr));
  }
}

#endif  // FLEXJIT_FORWARD_COMMON_CUH_
