// flexjit forward attention kernel for sm_90a (Hopper): TMA loads, wgmma, warp specialization.
//
// Spliced last, after flexjit_abi.h, prelude.cuh, the generated FjConfig, mods and wgmma
// wrappers, mma_sm80.cuh (16-bit packing), attention_sm80.cuh (the block schedule),
// forward_common.cuh (scores, online softmax) and wgmma_sm90.cuh. docs/kernels/forward_sm90.md
// describes the design.
//
// One CTA computes kBlockM = 64 * kConsumers query rows of one (batch, query head) with
// kConsumers + 1 warpgroups:
//   warpgroup 0, the producer (registers lowered to kProducerRegs): one thread walks the KV
//     schedule (block mask: partial tiles, then full ones) and issues the TMA loads of Q once and
//     of K and V per tile into a kNumStages-deep ring of shared-memory stages; per stage a
//     "K full" and a "V full" mbarrier (transaction counted) and a "KV empty" mbarrier that the
//     consumers release;
//   warpgroups 1..kConsumers, the consumers (registers raised to kConsumerRegs): warpgroup c owns
//     query rows [64c, 64c + 64) and per tile computes S = Q K^T (wgmma, both operands in shared
//     memory, K-major), the scores (scale, score_mod, mask_mod on partial tiles, bounds) on the
//     accumulator fragment, the online softmax, and O += P V (wgmma, P from registers, V
//     MN-major); then releases the stage.
// Scheduling (FlashAttention-3's): within a warpgroup, S of tile i and P V of tile i - 1 are
// issued together, so the softmax of tile i runs while the tensor cores multiply P V (O is
// rescaled once that finishes); between the two consumer warpgroups, named barriers hand the
// right to issue wgmma back and forth (ping-pong), so one warpgroup's softmax overlaps the
// other's GEMMs. Every consumer walks the same tile list (the CTA's one query block), which
// keeps the turns of the two warpgroups paired.
// The wgmma accumulator of m64nN gives warp w of a warpgroup rows 16w.. with the m16n8 fragment
// of mma.sync repeated N / 8 times, so forward_common.cuh's fj_scores / fj_softmax_update run on
// it unchanged (kMTiles = 1), and the C fragments of S are the A fragments of P V.
// Head dims: kHeadDimQK / kHeadDimV (kDimQK / kDimV here) are tile dims, multiples of 64 that
// the layouts below are built for; the problem's own dims kRealDimQK / kRealDimV (multiples of
// 8, at most 56 below the tile) are what the TMA tensor maps span, so the loads zero-fill the
// columns past them (device/TensorMap.cpp), Q K^T issues only the k16 steps that hold real
// columns, and the epilogue stores only the real columns of O (docs/kernels/forward_sm90.md
// "Head dims").
// Shared memory (dynamic, aligned here to 1024 bytes; fj_forward_sm90_smem_bytes):
//   Q tile kBlockM x max(kHeadDimQK, kHeadDimV) (reused for the O tile), kNumStages K tiles
//   (kBlockN x kHeadDimQK), kNumStages V tiles (kBlockN x kHeadDimV), and the mbarriers. The
//   tile indices are not passed through shared memory: every consumer reads them from the block
//   mask itself, one tile ahead.
// On a KV cache (chunked prefill: the host defines FJ_FWD_KV_CACHE and FjConfig::kPageSize, and
// the kernel takes a fourth parameter, FjKvCacheArgs) sequence b's keys end at seq_lens[b] and,
// with kPageSize > 0, K / V are page pools read through the page table (FjSm90KvCache): the
// whole producer warpgroup loads, TMA boxes where a page holds whole tiles (coordinates from the
// table) and cp.async gathers for smaller pages and for a tile that the sequence's end cuts
// (docs/kernels/forward_sm90.md "KV caches"). Without FJ_FWD_KV_CACHE nothing changes.
#ifndef FLEXJIT_FORWARD_SM90_CUH_
#define FLEXJIT_FORWARD_SM90_CUH_

#if defined(FJ_FWD_KV_CACHE)
constexpr bool kFjKvCache = true;
constexpr int kFjKvPageSize = FjConfig::kPageSize;  // 0: contiguous K / V with ragged lengths
#else
constexpr bool kFjKvCache = false;
constexpr int kFjKvPageSize = 0;
#endif

// An e4m3 KV cache (FJ_FWD_KV_FP8, with FJ_FWD_KV_CACHE; FjFwdKvFp8Args; docs/kernels/
// forward_sm90.md "e4m3 KV caches"): every KV tile goes through the loaders, which copy its e4m3
// bytes into a staging tile (cp.async) and write them converted to Element (bf16 / f16, q's type;
// exact) into the stage's 128-byte swizzled layout, so that the mainloop is the bf16 / f16 one.
// k_scale folds into the score scale, v_scale into the epilogue's normalization.
#if defined(FJ_FWD_KV_FP8)
static_assert(kFjKvCache, "flexjit forward_sm90: FJ_FWD_KV_FP8 comes with FJ_FWD_KV_CACHE");
constexpr bool kFjKvFp8 = true;
#else
constexpr bool kFjKvFp8 = false;
#endif

// e4m3 q, k, v (FJ_FWD_FP8, FjFp8Args; docs/kernels/forward_sm90.md "FP8"): FjConfig::Element is
// the output's bf16. Q and K tiles hold 1-byte elements, so a 128-byte swizzle row holds 128 of
// them: the layouts below are those of a 16-bit tile half as wide (kQKUnits), whose k16 steps of
// 32 bytes are wgmma's e4m3 k32 steps. V is read as V^T (flexjit_forward_fp8_vt writes it first:
// templates/forward_fp8_vt.cuh, the forward's companion): P V's B operand must be K-major for
// e4m3. P is converted to e4m3 in the registers of S.
#if defined(FJ_FWD_FP8)
constexpr bool kFjFp8 = true;
#else
constexpr bool kFjFp8 = false;
#endif

// V^T's key order: fj_fp8_vt_key (flexjit_abi.h).

#if defined(FJ_FWD_FP8)
// A tensor's descale factor for head h (stride 0: one for the tensor; null: 1).
FJ_DEVICE float fj_fp8_descale(const float* f, int stride, int h) {
  return f == nullptr ? 1.0f : __ldg(f + stride * h);
}

#endif

template <class Cfg>
struct FjSm90Traits {
  using Element = typename Cfg::Element;
  using Mma = FjMma<Element>;
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr int kNumStages = Cfg::kNumStages;
  static constexpr int kDimQK = Cfg::kHeadDimQK;
  static constexpr int kDimV = Cfg::kHeadDimV;
  static constexpr int kRealQK = Cfg::kRealDimQK;  // the problem's head dims (<= the tiles)
  static constexpr int kRealV = Cfg::kRealDimV;
  // k16 steps of Q K^T with real columns (e4m3: k32 steps; 32 bytes of a row each way).
  static constexpr int kStepsQK = kFjFp8 ? (kRealQK + 31) / 32 : (kRealQK + 15) / 16;
  static constexpr int kConsumers = kBlockM / 64;
  static constexpr int kThreads = (kConsumers + 1) * 128;
  static constexpr int kMTiles = 1;            // one m16 row block per warp
  static constexpr int kNTiles = kBlockN / 8;  // n8 fragments of S
  static constexpr int kDTiles = kDimV / 8;    // n8 fragments of O
  static constexpr int kElemBytes = 2;
  // e4m3 inputs (kFjFp8): 1-byte q, k, v; kElemBytes stays O's. A Q / K row is kQKUnits 16-bit
  // units (64 a 128-byte chunk); P V takes kPSteps k16 (e4m3: k32) steps of kBlockN keys.
  static constexpr bool kFp8 = kFjFp8;
  static constexpr int kInBytes = kFp8 ? 1 : kElemBytes;
  static constexpr int kQKUnits = kDimQK * kInBytes / 2;
  static constexpr int kPSteps = kBlockN / (kFp8 ? 32 : 16);
  static constexpr int kDimQO = kDimQK > kDimV ? kDimQK : kDimV;
  // e4m3: the Q tile, or the bf16 O tile that the epilogue stages in it, whichever is larger.
  static constexpr int kQBytes =
      kFp8 ? kBlockM * (kDimQK > 2 * kDimV ? kDimQK : 2 * kDimV) : kBlockM * kDimQO * kElemBytes;
  static constexpr int kQLoadBytes = kBlockM * kDimQK * kInBytes;
  static constexpr int kKBytes = kBlockN * kDimQK * kInBytes;
  static constexpr int kVBytes = kBlockN * kDimV * kInBytes;  // e4m3: V^T, kDimV x kBlockN
  // Query tiles per CTA (FjConfig::kQTiles): 1, or 2 (m blocks N - 1 - j and j of CTA j); with
  // kPersistent, claims of kQTiles tiles over every head, as many as the CTA's share
  // (FjWorkItems).
  static constexpr int kQTiles = Cfg::kQTiles;
  static constexpr bool kPersistent = Cfg::kPersistent != 0;
  static constexpr bool kMultiItem = kQTiles == 2 || kPersistent;
  // Q tile buffers (FjConfig::kQBufs, from the host: 2 for persistent CTAs, and with kQTiles 2
  // where shared memory holds a second). With 2, query tile k + 1's Q is loaded while tile k
  // runs, and each tile's O goes out through its own Q buffer; with 1 and several tiles, the next
  // Q is loaded once the last S = Q K^T is done and O is stored from the registers.
  static constexpr int kQBufs = Cfg::kQBufs;
  static constexpr int kOffK = kQBufs * kQBytes;
  static constexpr int kOffV = kOffK + kNumStages * kKBytes;
  static constexpr int kOffBar = kOffV + kNumStages * kVBytes;
  static constexpr int kOffSlot = kOffBar + (8 * (2 * kQBufs + 3 * kNumStages) + 15) / 16 * 16;
  static constexpr int kOffEnd = kOffSlot + 16 * kQBufs;
  // An e4m3 KV cache (kFjKvFp8): the loaders' staging tile (fj_forward_sm90_kv_fp8_staging_bytes)
  // at kOffEnd, after the rest; the host adds its bytes to fj_forward_sm90_smem_bytes.
  // Register split (65536 per SM, one CTA): the producer keeps few, the consumers take the rest
  // (FlashAttention-3's 24 / 240 with two consumer warpgroups, 32 / 160 with three).
  // A persistent producer also carries its tile (40 / 232: at 24 it spilled).
  // The CTA's 168 x 384 registers at launch are what the split redistributes: 128 (168 - P) =
  // 128 (C - 168) x kConsumers.
  // On a KV cache every thread of the producer warpgroup loads (kLoaders; cp.async gathers need
  // the threads, FjSm90KvCache) and carries its own copy of the tile loop (40 / 232 as well;
  // with three consumers 32 / 160, which the loaders fit once a union schedule's entries were
  // read without FjKvSchedule::tile's division: fj_union_entry).
  static constexpr int kLoaders = kFjKvCache ? 128 : 1;
  static constexpr int kProducerRegs = kConsumers == 2 ? (kPersistent || kFjKvCache ? 40 : 24) : 32;
  static constexpr int kConsumerRegs =
      kConsumers == 2 ? (kPersistent || kFjKvCache ? 232 : 240) : 160;

  static_assert(sizeof(Element) == 2, "flexjit forward_sm90: bf16 or f16 elements");
  static_assert(kConsumers == 2 || kConsumers == 3, "flexjit forward_sm90: kBlockM is 128 or 192");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 256,
                "flexjit forward_sm90: kBlockN must be a multiple of 16 up to 256");
  static_assert(kDimQK % 64 == 0 && kDimV % 64 == 0 && kDimV <= 256,
                "flexjit forward_sm90: tile head dims must be multiples of 64 (v at most 256)");
  static_assert(kFp8 || (kRealQK % 8 == 0 && kRealV % 8 == 0 && kRealQK > kDimQK - 64 &&
                         kRealQK <= kDimQK && kRealV > kDimV - 64 && kRealV <= kDimV),
                "flexjit forward_sm90: head dims are multiples of 8 in their tile's last 64 "
                "columns");
  static_assert(!kFp8 || (kRealQK % 16 == 0 && kRealV % 16 == 0 && kRealQK > kDimQK - 128 &&
                          kRealQK <= kDimQK && kRealV > kDimV - 128 && kRealV <= kDimV &&
                          kDimQK % 128 == 0 && kDimV % 128 == 0),
                "flexjit forward_sm90: e4m3 head dims are multiples of 16 in their tile's last 128 "
                "columns (tiles of 128-byte rows)");
  static_assert(!kFp8 || (kBlockN == 128 && kQTiles == 1 && !kFjKvCache),
                "flexjit forward_sm90: e4m3 runs 128 x 128 or 192 x 128 tiles, single query tiles "
                "(ForwardSm90Wgmma::validate)");
  static_assert(kNumStages >= 1 && kNumStages <= 4, "flexjit forward_sm90: 1..4 stages");
  static_assert(kQTiles == 1 || kQTiles == 2, "flexjit forward_sm90: 1 or 2 query tiles per CTA");
  static_assert(kQBufs == 1 || (kQBufs == 2 && kMultiItem),
                "flexjit forward_sm90: a second Q buffer only where a CTA computes several tiles");
  static_assert(!kPersistent || kQBufs == 2,
                "flexjit forward_sm90: persistent CTAs use 2 Q buffers");
  static_assert(kOffEnd + 1024 ==
                    (kFp8 ? fj_forward_sm90_fp8_smem_bytes(kBlockM, kBlockN, kDimQK, kDimV,
                                                           kNumStages, kQBufs)
                          : fj_forward_sm90_smem_bytes(kBlockM, kBlockN, kDimQK, kDimV, kElemBytes,
                                                       kNumStages, kQBufs)),
                "flexjit forward_sm90: shared-memory layout and fj_forward_sm90_smem_bytes "
                "disagree");
  static_assert(fj_sm90_reg_split_fits(kProducerRegs, kConsumerRegs, kConsumers),
                "flexjit forward_sm90: register split exceeds the CTA's launch allocation");
  static_assert(!kFjKvCache || (!kPersistent && kQTiles == 1),
                "flexjit forward_sm90: a KV cache runs one query tile per CTA "
                "(ForwardSm90Wgmma::validate)");
  static_assert(!kFjKvFp8 ||
                    (!kFp8 && (kBlockN * kDimQK / 16) % 128 == 0 &&
                     (kBlockN * kDimV / 16) % 128 == 0 && kRealQK % 16 == 0 && kRealV % 16 == 0),
                "flexjit forward_sm90: an e4m3 KV cache takes bf16 / f16 q, head dims multiples "
                "of 16 and KV tiles whose 16-byte units split over the 128 loaders "
                "(ForwardSm90Wgmma::validate)");
};

// The scores of a tile for fj_sm90_softmax (the log2-domain factor left out: the softmax folds
// it into its FFMA). kRaw (no mod to call on this tile and a scale > 0): the raw q·k, no
// per-score work, the softmax multiplies by scale · log2(e); otherwise score_mod(q·k · scale)
// (or q·k · scale), the mask_mod on partial tiles, and the softmax multiplies by log2(e). Keys
// past kv_len (seqlen_kv, or on a KV cache the sequence's length) become -inf either way. Same
// indices as fj_scores (forward_common.cuh).
// kDl: the score_mod's diagonal load (kFjDiagLoad) comes from the warp's loads in `dl`.
// kKvEdge (without `divisible`): the tile may reach past kv_len, so the score_mod's kv_idx is
// clamped and the keys past it masked; false for a tile the caller knows to lie below kv_len.
// `scale`: the score's (args.scale; e4m3 with persistent CTAs, times the tile's head's q and k
// descales).
template <class Cfg, class T, bool kApplyMask, bool kRaw, bool kDl,
          bool kKvEdge = !Cfg::kIsDivisible>
FJ_DEVICE void fj_sm90_scores(float (&s)[1][T::kNTiles][4], const FjFwdArgs& args,
                              const FjModParams& mods, float scale, int b, int h, int q_row0,
                              int n_start, int kv_len, int kv_col0,
                              const FjDiagLoads<T::kNTiles>& dl, int lane) {
  if constexpr (!kRaw) {
    // Mods only ever see in-range indices (their buffer loads stay in bounds); rows past
    // seqlen_q are computed on a clamped index and never written.
    auto row_index = [&](int hr) {
      const int q_idx = fj_here(q_row0) + hr * 8;
      return Cfg::kIsDivisible ? q_idx : fj_imin(q_idx, args.seqlen_q - 1);
    };
    auto element = [&](int hr, int q_idx, int nt, int c, float dl_value) {
      int kv_idx = kv_col0 + nt * 8 + c;
      if constexpr (kKvEdge) kv_idx = fj_imin(kv_idx, kv_len - 1);
      float x = s[0][nt][hr * 2 + c] * scale;
      if constexpr (kDl) {
        x = fj_score_mod(mods, x, b, h, q_idx, kv_idx, dl_value);
      } else if constexpr (Cfg::kHasScoreMod) {
        x = fj_score_mod(mods, x, b, h, q_idx, kv_idx);
      }
      if constexpr (kApplyMask && Cfg::kHasMaskMod) {
        if (!fj_mask_mod(mods, b, h, q_idx, kv_idx)) x = fj_neg_inf();
      }
      s[0][nt][hr * 2 + c] = x;
    };
    if constexpr (kDl && T::kConsumers == 2) {
      // Elements (hr 0, nt m, c) and (hr 1, nt m + 1, c) lie on the same diagonals: one
      // shuffled value (j = 8 m + c) serves both (34 shuffles, some doubled, instead of 64 per
      // 16 x 128 fragment). Not with three consumer warpgroups: at 160 registers per thread,
      // keeping both rows' elements of a diagonal in flight spills.
      const int q_idx0 = row_index(0), q_idx1 = row_index(1);
#pragma unroll
      for (int m = -1; m < T::kNTiles; ++m) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float dl_value = dl.shuffled(8 * m + c, lane);
          if (m >= 0) element(0, q_idx0, m, c, dl_value);
          if (m + 1 < T::kNTiles) element(1, q_idx1, m + 1, c, dl_value);
        }
      }
    } else {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int q_idx = row_index(hr);
#pragma unroll
        for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c)
            element(hr, q_idx, nt, c, kDl ? dl.shuffled(8 * (nt - hr) + c, lane) : 0.0f);
      }
    }
  }
  if constexpr (kKvEdge) {
    // Keys past kv_len (zero-filled in shared memory) must not take part.
    if (n_start + T::kBlockN > kv_len) {
#pragma unroll
      for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (kv_col0 + nt * 8 + (e & 1) >= kv_len) s[0][nt][e] = fj_neg_inf();
    }
  }
}

// The mask_mod on a tile's scores (after fj_sm90_scores without it): -inf where it is false.
// Same indices as fj_sm90_scores.
// With a column load (kFjColLoad: the mask_mod reads a buffer at indices of kv_idx alone, a
// document id), the warp reads each of its columns once: lane 4r + j loads quad column j's
// n8 fragments nt = r, r + 8, ... (both of its keys) and each lane takes its column's value
// from that lane by a shuffle, fragment r's pair before the first eight n8 fragments and
// r + 8's before the next eight (all four at once, 192-row document_causal spilled a softmax
// sum in its loop: 16 B, now 8). Loaded per element, the 32 ids of a thread's 128 keys were in
// flight at once and spilled document's softmax sums (32 B at 192 rows;
// docs/kernels/forward_sm90.md, "The mask_mod's column load").
template <class Cfg, class T>
FJ_DEVICE void fj_sm90_mask(float (&s)[1][T::kNTiles][4], const FjFwdArgs& args,
                            const FjModParams& mods, int b, int h, int q_row0, int kv_len,
                            int kv_col0) {
  if constexpr (kFjColLoad) {
    const int lane = fj_tid_here() % 32;
    const int r = lane >> 2;
    int q_idx[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      q_idx[hr] = fj_here(q_row0) + hr * 8;
      if constexpr (!Cfg::kIsDivisible) q_idx[hr] = fj_imin(q_idx[hr], args.seqlen_q - 1);
    }
    FjColLoad v[2];  // the lane's keys of the n8 fragments nt = r + 8j, j = nt / 8
#pragma unroll
    for (int nt = 0; nt < T::kNTiles; ++nt) {
      if (nt % 8 == 0) {
        const int j = nt / 8;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          v[c] = FjColLoad(0);
          if (T::kNTiles % 8 == 0 || r + 8 * j < T::kNTiles) {
            int kv_idx = kv_col0 + (r + 8 * j) * 8 + c;
            if constexpr (!Cfg::kIsDivisible) kv_idx = fj_imin(kv_idx, kv_len - 1);
            v[c] = fj_col_load_at(mods, b, h, kv_idx);
          }
        }
      }
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const FjColLoad cl = __shfl_sync(0xffffffffu, v[c], (nt % 8) * 4 + (lane & 3));
        int kv_idx = kv_col0 + nt * 8 + c;
        if constexpr (!Cfg::kIsDivisible) kv_idx = fj_imin(kv_idx, kv_len - 1);
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
          if (!fj_mask_mod(mods, b, h, q_idx[hr], kv_idx, cl)) s[0][nt][hr * 2 + c] = fj_neg_inf();
      }
    }
    return;
  }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    int q_idx = fj_here(q_row0) + hr * 8;
    if constexpr (!Cfg::kIsDivisible) q_idx = fj_imin(q_idx, args.seqlen_q - 1);
#pragma unroll
    for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        int kv_idx = kv_col0 + nt * 8 + c;
        if constexpr (!Cfg::kIsDivisible) kv_idx = fj_imin(kv_idx, kv_len - 1);
        if (!fj_mask_mod(mods, b, h, q_idx, kv_idx)) s[0][nt][hr * 2 + c] = fj_neg_inf();
      }
  }
}

// How far (log2 units) a tile's row max may pass the running max before the softmax moves its
// reference: the P of a score above the reference is at most 2^kFjMaxSlack = 256 (bf16 and f16
// hold it with their usual relative precision; the fp32 row sums cannot overflow at any length
// a 32-bit index reaches, nor O while |V| < 2^88: 2^8 x 2^31 keys x 2^88 < 2^128), and most
// tiles after a row's first keep alpha = 1, so O's rescale (d_v / 4 multiplies per thread and
// tile) and alpha's ex2 are skipped.
constexpr float kFjMaxSlack = 8.0f;

// The online softmax of a tile with its log2-domain factor c (> 0) folded into the exponent
// (FlashAttention-3's): the max is taken on the scores as fj_sm90_scores leaves them and each
// P = 2^(x·c − max·c) is one FFMA and one ex2, where fj_scores + fj_softmax_row spend a
// multiply (or two), a subtract and an ex2 per score: 64 fewer instructions per warp and
// 64x128 tile, ~12 % of the consumers' issue slots at head dim 64. Folds the tile into the
// running max (log2 domain, as fj_softmax_row keeps it) and per-thread sum, turns S into P in
// place, and leaves the factors by which O must be rescaled in alpha.
template <class T>
FJ_DEVICE void fj_sm90_softmax(float (&s)[1][T::kNTiles][4], float (&row_max)[1][2],
                               float (&row_sum)[1][2], float (&alpha)[2], float c) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float mx = fj_neg_inf();
#pragma unroll
    for (int nt = 0; nt < T::kNTiles; ++nt)
      mx = fmaxf(mx, fmaxf(s[0][nt][hr * 2], s[0][nt][hr * 2 + 1]));
    // The 4 threads of a quad hold the same row.
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mx *= c;  // c > 0: -inf stays -inf
    // The reference moves only when the tile's max passes it by more than kFjMaxSlack
    // (FlashAttention-4's conditional rescaling): otherwise alpha is 1 and the caller skips
    // O's rescale. A row whose max is -inf (everything masked so far) keeps -inf (-inf + slack
    // is -inf, so its first finite max moves it) and uses 0 as its reference.
    if (mx > row_max[0][hr] + kFjMaxSlack) {
      alpha[hr] = fj_ex2_approx(row_max[0][hr] - mx);  // 0 from -inf
      row_max[0][hr] = mx;
    } else {
      alpha[hr] = 1.0f;
    }
    const float ref = row_max[0][hr] == fj_neg_inf() ? 0.0f : row_max[0][hr];
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < T::kNTiles; ++nt) {
#pragma unroll
      for (int e = hr * 2; e < hr * 2 + 2; ++e) {
        const float p = fj_ex2_approx(fmaf(s[0][nt][e], c, -ref));
        s[0][nt][e] = p;
        sum += p;
      }
    }
    row_sum[0][hr] = row_sum[0][hr] * alpha[hr] + sum;
  }
}

// Whether the kernel reads a block mask as a union schedule (FjUnionScheduleArgs, flexjit_abi.h;
// written first by flexjit_forward_union_schedule, templates/forward_schedule.cuh): with three
// consumer warpgroups and a mask_mod (ForwardSm90Wgmma::resolve_config takes no 192-row tiles
// with a block mask otherwise). Its loop is the overlapped one at d_v 64, the serial one at d_v
// 128 and for e4m3 (FjSm90Consumer::kOverlap).
template <class T, class Cfg>
constexpr bool kFjUnionSchedule = T::kConsumers == 3 && T::kDimV <= 128 && Cfg::kHasMaskMod;

// Three consumers with a score_mod that reads kv_idx (FJ_FWD_SCORE_READS_KV,
// ForwardSm90Wgmma::generate); FjSm90Consumer::kScoreCopies says what the serial loop makes of it.
#if defined(FJ_FWD_SCORE_READS_KV)
constexpr bool kFjScoreReadsKv = true;
#else
constexpr bool kFjScoreReadsKv = false;
#endif

// The union schedule's row header of query tile m_block (FjUnionScheduleArgs, flexjit_abi.h).
FJ_DEVICE const int* fj_union_row(const FjBlockMaskArgs& bm, int b, int h, int m_block) {
  return bm.kv_num_blocks + (fj_i64)b * bm.num_stride_b + (fj_i64)h * bm.num_stride_h +
         (fj_i64)m_block * kFjUnionRowInts;
}

// The union schedule's entries of query tile (b, h, m_block) as partial tiles of a schedule
// (tile(i) is entry i; without a block mask, tile i), `n` of them.
FJ_DEVICE FjKvSchedule fj_union_entries(const FjBlockMaskArgs& bm, int b, int h, int m_block,
                                        int n) {
  FjKvSchedule s;
  s.partial_idx = bm.kv_num_blocks == nullptr
                      ? nullptr
                      : bm.kv_indices + (fj_i64)b * bm.idx_stride_b + (fj_i64)h * bm.idx_stride_h +
                            (fj_i64)m_block * bm.idx_stride_m;
  s.full_idx = nullptr;
  s.num_partial = s.num_total = n;
  s.tiles_per_block = 1;
  return s;
}

// Entry i of a union schedule (fj_union_entries): the entry itself, or without a block mask tile
// i. FjKvSchedule::tile's general form (list[j / tiles_per_block] ...) kept a division by one on a
// KV cache, whose loaders' 32 registers it spilled (16 B of stack, 40 B stored).
FJ_DEVICE int fj_union_entry(const FjKvSchedule& s, int i) {
  return s.partial_idx == nullptr ? i : s.partial_idx[i];
}

// The schedule's entry that a 128-row query tile visits i-th: its full tiles first, the last one
// listed first (next to a causal mask's diagonal), then the partial ones (the mask_mod's work, a
// causal mask's diagonal tile). The first tile's scores and softmax run alone, before any P V
// they could overlap; a partial tile visited last runs its mask under the P V of the tile before
// (docs/kernels/forward_sm90.md "Causal at d 128"). The nearest keys first set each row's max
// early where a score_mod favours them (ALiBi), so the conditional rescale still skips. Without a
// block mask every tile is partial and the order is the schedule's. e4m3 q, k, v (kFjFp8) keep the
// schedule's order, partial tiles first: full tiles first measured 5 % slower on causal there
// (H100, ncu: 551 against 524 us; docs/kernels/forward_sm90.md "FP8").
FJ_DEVICE int fj_sm90_visit(const FjKvSchedule& s, int i) {
  if constexpr (kFjFp8) return i;
  const int num_full = s.num_total - s.num_partial;
  return i < num_full ? s.num_total - 1 - i : i - num_full;
}

// The KV tiles of query tile (b, h, m_block) over kv_len keys (seqlen_kv, or on a KV cache the
// sequence's length): with three consumer warpgroups and a block mask, the union schedule's
// entries (each a tile with status bits above it, as partial tiles); otherwise the block mask's
// schedule (fj_block_schedule). On a KV cache a sequence without keys has no tiles, even where a
// block mask lists some (its rows get out 0, lse -inf).
template <class T, class Cfg>
FJ_DEVICE FjKvSchedule fj_sm90_schedule(const FjFwdArgs& args, int kv_len, int b, int h,
                                        int m_block) {
  if constexpr (kFjUnionSchedule<T, Cfg>) {
    const FjBlockMaskArgs& bm = args.mask;
    if (bm.kv_num_blocks != nullptr) {
      // On a KV cache a sequence without keys has none (mainloop_union empties the runs too).
      const int n = fj_union_row(bm, b, h, m_block)[0];
      return fj_union_entries(bm, b, h, m_block, kFjKvCache && kv_len == 0 ? 0 : n);
    }
  }
  FjKvSchedule sched = fj_block_schedule<T::kBlockM, T::kBlockN, Cfg::kHasFullBlocks>(
      args.mask, kv_len, b, h, m_block);
  if constexpr (kFjKvCache) {
    if (kv_len == 0) sched.num_partial = sched.num_total = 0;
  }
  return sched;
}

// The query tiles (b, h, m block) a CTA computes, in order. N = ceil(seqlen_q / kBlockM) tiles
// per head.
//   kQTiles 1: m block N - 1 - blockIdx.x of head (blockIdx.z, blockIdx.y), the heaviest first.
//   kQTiles 2: m blocks N - 1 - j and j (j = blockIdx.x), whose causal KV ranges add up to the
//     same number of tiles for every CTA.
//   kPersistent (grid (G, 1, 1), G at most the SM count): claims over every head, handed out in
//     order. With kQTiles 2 a claim is a pair of kQTiles 2 (pair p of head bh = b * Hq + h is
//     number bh * P + p, P = ceil(N / 2)); with kQTiles 1 one tile (m block N - 1 - i of head bh
//     is number bh * N + i: the non-persistent grid's order, the heaviest first). CTA j starts
//     with claim j, and each CTA's producer takes the next unclaimed one from the work counter
//     (atomicAdd on args.sched_counter, zeroed before the launch) once its tile's loads are
//     issued. So the CTAs running at once work on neighbouring tiles of a few heads (their K / V
//     stay in L2), a CTA that drew light tiles (a sparse mask's) takes more of them, and no CTA
//     ends and starts between query tiles: the producer loads the next tile's Q and K / V while
//     the consumers finish the last one (kQBufs). The producer passes each tile to the
//     consumers through its Q buffer's tile slot, copied from a global slot of the workspace by
//     the async proxy and counted by the Q-full barrier with the Q tile (-1: no tiles left).
template <class T>
struct FjWorkItems {
  int pair;  // without kPersistent: 0 until the CTA's tiles are done
  int half;  // 0: the pair's first (heavier) tile comes next, 1: its second
  FJ_DEVICE FjWorkItems() : pair(0), half(0) {}
  FJ_DEVICE static int num_m(const FjFwdArgs& args) {
    return (args.seqlen_q + T::kBlockM - 1) / T::kBlockM;
  }
  // kPersistent: the claims over every head (pairs with kQTiles 2, else tiles).
  FJ_DEVICE static int num_claims(const FjFwdArgs& args) {
    return args.batch * args.heads_q * (T::kQTiles == 2 ? (num_m(args) + 1) / 2 : num_m(args));
  }
  // The producer's tile `code` (claim * 2 + half; half 0 with kQTiles 1) as b, h, m_block.
  // kQTiles 1 under a block mask (query tiles of unequal work): the heads in groups whose K / V
  // fit 16 MiB of L2, a group's m blocks heaviest first and its heads inner, so that the last
  // claims are the lightest tiles of the last group (head by head, the last heads' heaviest
  // tiles started late and the SMs idled behind them: causal 568 -> 538 us, document+causal 264
  // -> 249 under ncu at 192 rows). Without one every tile is alike: head by head.
  FJ_DEVICE static void decode(const FjFwdArgs& args, int code, int& b, int& h, int& m_block) {
    const int n = num_m(args);
    int bh;
    if constexpr (T::kQTiles == 1) {
      const int heads = args.batch * args.heads_q, claim = code >> 1;
      int group = 1;
      if (args.mask.kv_num_blocks != nullptr) {
        const long long kv_head_bytes =
            (long long)args.seqlen_kv * (T::kRealQK + T::kRealV) * T::kInBytes;
        group = (int)min((long long)heads,
                         max(1ll, (16ll << 20) / kv_head_bytes) * FjConfig::kGqaRatio);
      }
      const int first = claim / (group * n) * group;
      const int size = min(group, heads - first), r = claim - first * n;
      bh = first + r % size;
      m_block = n - 1 - r / size;
    } else {
      const int per_head = (n + 1) / 2, claim = code >> 1;
      bh = claim / per_head;
      const int p = claim - bh * per_head;
      m_block = (code & 1) ? p : n - 1 - p;
    }
    b = bh / args.heads_q;
    h = bh - b * args.heads_q;
  }
  // A tile as the producer hands it to the consumers in the slot: (b * Hq + h) * N + m_block.
  FJ_DEVICE static int slot_tile(const FjFwdArgs& args, int b, int h, int m_block) {
    return (b * args.heads_q + h) * num_m(args) + m_block;
  }
  FJ_DEVICE static void from_slot(const FjFwdArgs& args, int tile, int& b, int& h, int& m_block) {
    const int n = num_m(args), bh = tile / n;
    m_block = tile - bh * n;
    b = bh / args.heads_q;
    h = bh - b * args.heads_q;
  }
  // The tile after `code` in its claim, or -1 when the claim has no second (kQTiles 1, the
  // middle tile of an odd N, or the second already).
  FJ_DEVICE static int second(const FjFwdArgs& args, int code) {
    if constexpr (T::kQTiles == 1) return -1;
    const int n = num_m(args);
    return (code & 1) == 0 && 2 * ((code >> 1) % ((n + 1) / 2)) + 1 != n ? code + 1 : -1;
  }
  // Without kPersistent: the next query tile into b, h, m_block; false when there is none left.
  FJ_DEVICE bool next(const FjFwdArgs& args, int& b, int& h, int& m_block) {
    if (pair != 0) return false;
    const int n = num_m(args);
    b = blockIdx.z;
    h = blockIdx.y;
    const int j = blockIdx.x;
    if (T::kQTiles == 1 || half == 0) {
      m_block = n - 1 - j;
      if (T::kQTiles == 1 || n - 1 - j <= j) pair = 1;  // no second tile
      half = 1;
    } else {
      m_block = j;
      pair = 1;
    }
    return true;
  }
};

// ---- flexjit_forward's components ------------------------------------------------------------
// The kernel is split by role, as FlashAttention-3 and CUTLASS split theirs: FjSm90Smem (the
// shared-memory tiles and mbarriers), the tile scheduler's two sides FjSm90ProducerTiles and
// FjSm90ConsumerTiles (over FjWorkItems), FjSm90Producer (the TMA loads) and FjSm90Consumer
// (the wgmma mainloop, the scores and online softmax of a tile, the epilogue). Their members are
// FJ_DEVICE (inlined) and take what they share explicitly, in the order the single function they
// were split from did it: the kernel compiles to that function's registers, spills, stack and
// instruction counts, and mostly to its SASS (docs/kernels/forward_sm90.md "Code structure").

// The CTA's shared memory, as addresses in the shared window: the Q buffers, the K / V ring, the
// mbarriers and the tile slots (FjSm90Traits' offsets).
template <class T>
struct FjSm90Smem {
  // Named barriers: 1..kConsumers the epilogue's, kConsumers + 1.. the turns' (FjTurns), then per
  // Q buffer the persistent tile slot's handshake.
  static constexpr int kSlotBar = 1 + 2 * T::kConsumers;
  static_assert(kSlotBar + T::kQBufs <= 16, "flexjit forward_sm90: named barrier ids 1..15");
  fj_u32 sq;  // Q buffer u at sq + u * kQBytes (its O tile too)
  fj_u32 sk;  // K stage s at sk + s * kKBytes
  fj_u32 sv;  // V stage s at sv + s * kVBytes
  // Per Q buffer u: Q full at bar_q + 8u, Q empty (every consumer warp is done with it) at
  // bar_qe + 8u; per stage s: K full at bar_k + 8s, V full at bar_v + 8s, KV empty at bar_e + 8s;
  // then per Q buffer the tile slot (kPersistent: its tile, FjWorkItems::slot_tile's form).
  fj_u32 bar_q, bar_qe, bar_k, bar_v, bar_e;
  fj_u32 tile_slot;

  // `raw`: the dynamic shared memory. The 128-byte swizzle repeats every 1024 bytes: tiles start
  // on such a boundary.
  FJ_DEVICE explicit FjSm90Smem(fj_u32 raw)
      : sq((raw + 1023u) & ~1023u),
        sk(sq + T::kOffK),
        sv(sq + T::kOffV),
        bar_q(sq + T::kOffBar),
        bar_qe(bar_q + 8 * T::kQBufs),
        bar_k(bar_qe + 8 * T::kQBufs),
        bar_v(bar_k + 8 * T::kNumStages),
        bar_e(bar_v + 8 * T::kNumStages),
        tile_slot(sq + T::kOffSlot) {}

  // The Q buffer of a CTA's item-th query tile, and how many tiles used it before.
  FJ_DEVICE static int q_buf(int item) { return T::kQBufs == 2 ? (item & 1) : 0; }
  FJ_DEVICE static int q_uses(int item) { return T::kQBufs == 2 ? item / 2 : item; }

  // By one thread, before the CTA's first __syncthreads.
  FJ_DEVICE void init_barriers() const {
#pragma unroll
    for (int u = 0; u < T::kQBufs; ++u) {
      fj_mbar_init(bar_q + 8 * u, 1);
      fj_mbar_init(bar_qe + 8 * u, 4 * T::kConsumers);  // lane 0 of every consumer warp
    }
#pragma unroll
    for (int s = 0; s < T::kNumStages; ++s) {
      fj_mbar_init(bar_k + 8 * s, T::kLoaders);  // TMA: one thread for all; cp.async: each
      fj_mbar_init(bar_v + 8 * s, T::kLoaders);
      fj_mbar_init(bar_e + 8 * s, 4 * T::kConsumers);  // lane 0 of every consumer warp
    }
    fj_mbar_init_fence();
  }
};

// A KV cache (kFjKvCache; FjKvCacheArgs, flexjit_abi.h): each sequence's length, and where its
// keys lie. Key n of sequence b is row n of K / V [B, Hkv, Skv, D] (contiguous, ragged lengths)
// or slot n % kPage of pool page page_table[b][n / kPage] (pools [num_pages, kPage, Hkv, D], any
// strides; the host's tensor maps view them as {D, kPage, Hkv, num_pages}). A KV tile reaches
// shared memory one of three ways, the same for K and V:
//   TMA (one thread): a tile whose keys all lie below the length, where one box holds it
//     (contiguous, or pages of a multiple of kBlockN keys: the box's coordinates are
//     (n % kPage, h, page)); and a tile wholly past the length (a block mask may list one), whose
//     box is pointed past the tensor's extent so that TMA writes zeros and reads nothing.
//   TMA per page (lane p of loader warp 0 for page p): pages of 8 .. kBlockN / 2 keys that the
//     tile spans whole (kBoxPerPage), boxes (0, h, page_table[b][n / kPage + p]).
//   Gather (every loader thread, cp.async): pages of 1 .. 4 keys and pages that the tile neither
//     spans whole nor fits in (one table entry per row), and the tile that the length cuts: its
//     rows past the length are zero-filled, not read (the cache may hold anything there, NaN
//     included, and 0 * NaN in P V is NaN).
// The consumers know which way a tile came (gathered()): cp.async writes through the generic
// proxy, so they fence (fence.proxy.async) after the wait and before wgmma reads the stage.

template <class T, class Cfg>
struct FjSm90KvCache {
  static constexpr int kPage = kFjKvPageSize;
  // Pages of 8 or more keys that a tile spans whole (kBlockN a multiple of kPage): one TMA box
  // per page and 64 columns, each issued by its own lane of loader warp 0 (the host's map boxes
  // are min(kPage, kBlockN) rows). A box lands at row p * kPage of the stage, a multiple of the
  // 128-byte swizzle's 8-row (1024-byte) atom, so it writes the layout one tile-sized box would.
  static constexpr bool kBoxPerPage = kPage >= 8 && kPage < T::kBlockN && T::kBlockN % kPage == 0;
  static constexpr int kPagesPerTile = kBoxPerPage ? T::kBlockN / kPage : 1;
  static_assert(kPagesPerTile <= 32, "flexjit forward_sm90: one lane of a warp per page box");
  // Pages of 1, 2 or 4 keys, and pages that a tile neither spans whole nor fits in (a 176-key
  // tile over 32-key pages): every tile gathered.
  // An e4m3 cache (kFjKvFp8): every tile, converted by the loaders (stage_e4m3, convert_e4m3).
  static constexpr bool kGatherAll =
      kFjKvFp8 || (kPage > 0 && kPage % T::kBlockN != 0 && !kBoxPerPage);
  static_assert(kPage == 0 || (kPage & (kPage - 1)) == 0,
                "flexjit forward_sm90: pages of a power of two keys");
  // 16-byte units per 128-byte row of a 64-column chunk: a loader copies unit ltid % 8 of rows
  // ltid / 8 + 16 i (kLoaders is 1 without a KV cache, where nothing is gathered).
  static constexpr int kRowsPerPass = T::kLoaders >= 8 ? T::kLoaders / 8 : 1;
  static constexpr int kPasses = T::kBlockN / kRowsPerPass;
  static_assert(!kFjKvCache || T::kBlockN % kRowsPerPass == 0,
                "flexjit forward_sm90: KV tile rows must split over the loaders");

  const FjKvCacheArgs& kv;

  // The keys of sequence b: seq_lens[b] clamped to the capacity (as forward_sm80.cuh reads it).
  FJ_DEVICE int length(const FjFwdArgs& args, int b) const {
    if (kv.seq_lens == nullptr) return args.seqlen_kv;
    return fj_imax(0, fj_imin(kv.seq_lens[b], args.seqlen_kv));
  }

  // Whether the tile of keys [n_start, n_start + kBlockN) is gathered (else TMA loads it).
  FJ_DEVICE static bool gathered(int n_start, int len) {
    return kGatherAll || (n_start < len && n_start + T::kBlockN > len);
  }

  // Sequence b's page table row (paged).
  FJ_DEVICE const int* table_row(int b) const {
    return kv.page_table + (fj_i64)b * kv.page_table_stride_b;
  }

  // Pools: page p of the tile of keys [n_start, ...) of sequence b, a tile not wholly past the
  // length (its page table entry; box() takes no page for one that is).
  FJ_DEVICE int page(int b, int n_start, int p) const { return table_row(b)[n_start / kPage + p]; }

  // The TMA box of a tile that is not gathered: (row, batch or page) coordinates of the K / V
  // tensor maps; on pools `pg` is the tile's page (page(), or 0 for a tile past the length). Past
  // the length: one row past the extent, so the box reads as zeros. kBoxPerPage's boxes start at
  // row 0 of each page (row kPage past the length).
  FJ_DEVICE void box(const FjFwdArgs& args, int b, int n_start, int len, int pg, int& row,
                     int& bp) const {
    const bool past = n_start >= len;
    if constexpr (kPage == 0) {
      row = past ? args.seqlen_kv : n_start;
      bp = b;
    } else {
      row = past ? kPage : kBoxPerPage ? 0 : n_start % kPage;
      bp = pg;  // 0 past the length (FjSm90Producer::tma_page)
    }
  }

  // kBoxPerPage: page p's rows of a tile of kDim columns, one box per 64 columns, at row p * kPage
  // of each 64-column chunk (chunk c at c * kBlockN * 128, as fj_tma_load_tile lays a tile).
  template <int kDim>
  FJ_DEVICE static void load_page(fj_u32 dst, const FjTmaDesc* map, int p, int row, int h, int page,
                                  fj_u32 bar) {
#pragma unroll
    for (int c = 0; c < kDim / 64; ++c)
      fj_tma_load_4d(dst + c * T::kBlockN * 128 + p * kPage * 128, map, c * 64, row, h, page, bar);
  }

  // One loader's share of a gathered tile of kDim columns (kReal of them real) of K or V into
  // the swizzled stage at `dst` (the layout TMA writes: chunk c of 64 columns at c * kBlockN *
  // 128, unit u of row r at unit u ^ (r % 8)); then its arrival on `bar` once the copies have
  // landed. `head`: the kv head's origin (batch b's, or page 0's), strides in elements. Rows past
  // the length and columns past kReal are zero-filled and read nothing (not even the table).
  // The table entries are read again for V (L1 hits) rather than kept: eight 64-bit offsets per
  // loader would not fit its 40 registers.
  template <int kDim, int kReal>
  FJ_DEVICE void gather(fj_u32 dst, const char* head, fj_i64 page_stride, fj_i64 row_stride, int b,
                        int n_start, int len, int ltid, fj_u32 bar) const {
    const int u = ltid % 8;
    constexpr int kGroup = T::kConsumers == 2 ? 4 : 2;
    if constexpr (kPage >= 2 && kDim <= 128 && kPasses % kGroup == 0) {
      // Pages of 2 keys or more: the table entries of a group of rows read before the group's
      // copies, so that the reads are in flight together (each cp.async is an asm statement with a
      // memory clobber: no later load rises above it, and read between the copies, a row's copies
      // waited for its own entry). Four rows with two consumer warpgroups (40-register loaders),
      // two with three (32; four spilled 4-8 B). 2048 queries x 8192 keys in 2- / 4-key pages ran
      // 5-11 % faster (docs/kernels/forward_sm90.md "KV caches"). One-key pages keep the loop
      // below (groups of four with three consumers, spilling, were 22 % slower there; its SASS
      // already had most entry reads ahead), as do d 256 (four rows spilled 4-8 B), tiles of rows
      // no group divides (176 keys) and the ragged layout (no table); their SASS is as it was. (All
      // eight rows of a 128-key tile spilled the loaders' registers with one-key pages.) The
      // copies repeat the loop's below on purpose: one helper for both changed this branch's
      // SASS (+8 instructions at 2- / 4- / 16-key pages, other schedules) from the measured one.
#pragma unroll 1
      for (int i0 = 0; i0 < kPasses; i0 += kGroup) {
        fj_i64 off[kGroup];
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
          const int n = n_start + ltid / 8 + (i0 + k) * kRowsPerPass;
          off[k] = n < len ? (fj_i64)table_row(b)[n / kPage] * page_stride +
                                 (fj_i64)(n % kPage) * row_stride
                           : 0;
        }
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
          const int r = ltid / 8 + (i0 + k) * kRowsPerPass;
          const int n = n_start + r;
#pragma unroll
          for (int c = 0; c < kDim / 64; ++c) {
            const int col = c * 64 + u * 8;
            const bool valid = n < len && col < kReal;
            const char* src = valid ? head + 2 * (off[k] + col) : head;
            fj_cp_async_16(fj_sw128_unit<T::kBlockN>(dst, r, c * 8 + u), src, valid);
          }
        }
      }
    } else {
      // Four rows' table reads in flight at a time (two with 256 columns, four copies a row):
      // all eight rows of a 128-key tile spilled the loaders' 40 registers with one-key pages,
      // four rows 40-80 B at d 256.
#pragma unroll(kDim > 128 ? 2 : 4)
      for (int i = 0; i < kPasses; ++i) {
        const int r = ltid / 8 + i * kRowsPerPass;
        const int n = n_start + r;
        fj_i64 off = 0;
        if (n < len) {
          if constexpr (kPage == 0) {
            off = (fj_i64)n * row_stride;
          } else {
            off = (fj_i64)table_row(b)[n / kPage] * page_stride + (fj_i64)(n % kPage) * row_stride;
          }
        }
#pragma unroll
        for (int c = 0; c < kDim / 64; ++c) {
          const int col = c * 64 + u * 8;
          const bool valid = n < len && col < kReal;
          // A zero-filled unit reads nothing; its address is the head's origin, which exists.
          const char* src = valid ? head + 2 * (off + col) : head;
          fj_cp_async_16(fj_sw128_unit<T::kBlockN>(dst, r, c * 8 + u), src, valid);
        }
      }
    }
    fj_cp_async_mbar_arrive(bar);
  }

#if defined(FJ_FWD_KV_FP8)
  // An e4m3 cache: 16-byte units of e4m3 (16 columns) per row of a kDim-column tile; loader ltid
  // takes units ltid + 128 j (row (ltid + 128 j) / units8(kDim)), the same ones in stage_e4m3 and
  // convert_e4m3, so that each reads back only its own copies (no barrier on the staging tile).
  FJ_HOST_DEVICE static constexpr int units8(int dim) {
    return dim / 16;
  }
  FJ_HOST_DEVICE static constexpr int per8(int dim) {
    return T::kBlockN * units8(dim) / 128;
  }

  // One loader's cp.async copies of a KV tile of kDim columns (kReal real) as e4m3 bytes into the
  // staging tile `staging` (rows of kDim bytes, unswizzled: a warp's units are 512 consecutive
  // bytes). Rows past the length and columns past kReal are zero-filled and read nothing (not
  // even the table). `head`: the kv head's origin (batch b's, or page 0's), strides in bytes.
  // Pools: the table entries of a group of kGroup units are read before the group's copies. Each
  // copy's asm (its memory clobber) keeps a later load after it, so a lookup per copy waited for
  // its load before every copy (as decoding's did: docs/kernels/decode.md "Design notes").
  // Groups of 4 units keep the loaders within their 32 registers at 192-row tiles (all 8 of a d
  // 128 tile spilled 208 B); where one group would be the whole tile (d 64, or 64-key tiles)
  // groups of 2 or 4 spilled 28-32 B, so those keep a lookup per copy, unrolled as before.
  template <int kDim, int kReal>
  FJ_DEVICE void stage_e4m3(fj_u32 staging, const unsigned char* head, fj_i64 page_stride,
                            fj_i64 row_stride, int b, int n_start, int len, int ltid) const {
    constexpr int kGroup = kPage > 0 && kDim > 64 && per8(kDim) >= 8 && per8(kDim) % 4 == 0 ? 4 : 1;
    if constexpr (kGroup == 1) {
#pragma unroll(kDim > 64 ? 4 : 2)
      for (int j = 0; j < per8(kDim); ++j) {
        const int idx = ltid + 128 * j;
        const int r = idx / units8(kDim), u = idx % units8(kDim);
        const int n = n_start + r;
        const bool valid = n < len && u * 16 < kReal;
        fj_i64 off = 0;
        if (valid) {
          if constexpr (kPage == 0) {
            off = (fj_i64)n * row_stride;
          } else {
            off = (fj_i64)table_row(b)[n / kPage] * page_stride + (fj_i64)(n % kPage) * row_stride;
          }
        }
        // A zero-filled unit reads nothing; its address is the head's origin, which exists.
        fj_cp_async_16(staging + r * kDim + u * 16, valid ? head + off + u * 16 : head, valid);
      }
    } else {
#pragma unroll 1
      for (int j0 = 0; j0 < per8(kDim); j0 += kGroup) {
        int page[kGroup];
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
          const int idx = ltid + 128 * (j0 + k);
          const int n = n_start + idx / units8(kDim);
          page[k] = n < len && idx % units8(kDim) * 16 < kReal ? table_row(b)[n / kPage] : 0;
        }
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
          const int idx = ltid + 128 * (j0 + k);
          const int r = idx / units8(kDim), u = idx % units8(kDim);
          const int n = n_start + r;
          const bool valid = n < len && u * 16 < kReal;
          fj_i64 off = 0;
          if (valid) off = (fj_i64)page[k] * page_stride + (fj_i64)(n % kPage) * row_stride;
          fj_cp_async_16(staging + r * kDim + u * 16, valid ? head + off + u * 16 : head, valid);
        }
      }
    }
  }

  // After this loader's copies landed (cp.async.wait_group): its units of the staging tile
  // converted to Element (fj_e4m3x4: exact) into the swizzled stage at `dst` (e4m3 unit u of
  // row r is 2-byte units 2u, 2u + 1 of that row, the layout TMA writes), then a proxy fence
  // (the consumers' wgmma reads the stage through the async proxy) and its arrival on `bar`.
  template <int kDim>
  FJ_DEVICE void convert_e4m3(fj_u32 dst, fj_u32 staging, int ltid, fj_u32 bar) const {
#pragma unroll 2
    for (int j = 0; j < per8(kDim); ++j) {
      const int idx = ltid + 128 * j;
      const int r = idx / units8(kDim), u = idx % units8(kDim);
      fj_u32 x[4];
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                   : "r"(staging + r * kDim + u * 16)
                   : "memory");
      // The unit's halves (8 e4m3 each) become 2-byte units 2u and 2u + 1; a thread with bit 2
      // of u set stores its second half first. The eight threads of a quarter-warp store one
      // row's units u = 0..7 (d 128; d 256: 0..7 or 8..15) into two 64-column chunks, whose
      // swizzled units share banks: so the first store's units are even in one chunk and odd in
      // the other (distinct banks), not even in both (a 2-way conflict on every store).
      const bool swap = ((u >> 2) & 1) != 0;
      const fj_u32 w[4] = {swap ? x[2] : x[0], swap ? x[3] : x[1], swap ? x[0] : x[2],
                           swap ? x[1] : x[3]};
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        fj_u32 y[4];
        fj_e4m3x4<typename T::Element>(w[2 * k], y[0], y[1]);
        fj_e4m3x4<typename T::Element>(w[2 * k + 1], y[2], y[3]);
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                         fj_sw128_unit<T::kBlockN>(dst, r, 2 * u + (k ^ (swap ? 1 : 0)))),
                     "r"(y[0]), "r"(y[1]), "r"(y[2]), "r"(y[3])
                     : "memory");
      }
    }
    fj_fence_proxy_async();
    fj_mbar_arrive(bar);
  }
#endif
};

// The tile scheduler's producer side: the CTA's query tiles in order (FjWorkItems); with
// kPersistent, the next claim once a tile's loads are issued and each tile's hand-over to
// the consumers through its Q buffer's tile slot.
template <class T, class Cfg>
struct FjSm90ProducerTiles {
  const FjFwdArgs& args;
  FjSm90Smem<T> sm;
  FjWorkItems<T> items;  // without kPersistent
  int code;              // kPersistent: the tile (claim * 2 + half)

  FJ_DEVICE FjSm90ProducerTiles(const FjFwdArgs& a, const FjSm90Smem<T>& s)
      : args(a), sm(s), items(), code(2 * (int)blockIdx.x) {}

  // The tile of Q buffer u to the consumers, with the Q-full arrival (and `q_bytes` of Q still
  // to land): written to this CTA's global slot and copied into the shared one by the async
  // proxy, so that it lands with Q and on the same barrier (a generic shared-memory store
  // ordered only by the mbarrier is a race to compute-sanitizer's racecheck).
  FJ_DEVICE void send(int u, int uses, int value, int q_bytes, const int (&runs)[3]) const {
    // The consumers have read this slot's previous tile (their arrival on its named barrier
    // follows the read): a handshake compute-sanitizer's racecheck can follow, where the
    // Q-empty mbarrier alone (which orders it too) is not. The producer warp's other lanes
    // have exited, so its one thread's bar.sync counts as the warp's 32 (synccheck: clean).
    if (uses > 0) fj_bar_sync(FjSm90Smem<T>::kSlotBar + u, 32 + 128 * T::kConsumers);
    int* const slot = args.sched_counter + 4 * (1 + (int)blockIdx.x * T::kQBufs + u);
    volatile int* const v = slot;
    v[0] = value;
    v[1] = runs[0];
    v[2] = runs[1];
    v[3] = runs[2];
    fj_fence_proxy_async_global();
    fj_mbar_arrive_expect_tx(sm.bar_q + 8 * u, q_bytes + 16);
    fj_bulk_load<16>(sm.tile_slot + 16 * u, slot, sm.bar_q + 8 * u);
  }

  // kPersistent: whether the claims are all taken (the CTA's tiles are done).
  FJ_DEVICE bool exhausted() const { return (code >> 1) >= FjWorkItems<T>::num_claims(args); }

  // kPersistent, once exhausted: the end of the tiles to the consumers, as the item-th tile (Q
  // buffer u).
  FJ_DEVICE void finish(int item, int u) const {
    // No tiles left: the consumers wake on the Q-full barrier and read -1.
    if (sm.q_uses(item) > 0) fj_mbar_wait(sm.bar_qe + 8 * u, (sm.q_uses(item) - 1) & 1);
    const int none[3] = {0, 0, 0};
    send(u, sm.q_uses(item), -1, 0, none);
    // The consumers' arrival after their last read of the other buffer's slot: taken here, so
    // that no named-barrier arrival is pending when the CTA exits.
    if (item > 0) fj_bar_sync(FjSm90Smem<T>::kSlotBar + (u ^ 1), 32 + 128 * T::kConsumers);
  }

  // kPersistent: the current tile into b, h, m_block.
  FJ_DEVICE void take(int& b, int& h, int& m_block) const {
    FjWorkItems<T>::decode(args, code, b, h, m_block);
  }

  // The union schedule's runs, which go to the consumers with the tile (begin | end << 16 per
  // warpgroup; kPersistent): read here, ahead of need, not by the consumers at the tile's start.
  FJ_DEVICE void union_runs(const FjKvSchedule& sched, int b, int h, int m_block,
                            int (&runs)[3]) const {
    if constexpr (kFjUnionSchedule<T, Cfg> && T::kPersistent) {
      if (args.mask.kv_num_blocks != nullptr) {
        const int* row = fj_union_row(args.mask, b, h, m_block);
#pragma unroll
        for (int c = 0; c < 3; ++c)
          runs[c] = row[1 + 2 * c] | row[2 + 2 * c] << 16;
      } else {
#pragma unroll
        for (int c = 0; c < 3; ++c)
          runs[c] = sched.num_total << 16;
      }
    }
  }

  // After a query tile's loads (kPersistent): the claim's second tile, else the next claim,
  // taken now: the consumers are a pipeline's depth behind, and the atomic's latency passes
  // under their last KV tiles. Claimed at the tile's start instead (a tile ahead), the last
  // claims waited behind whole tiles while other CTAs ran out of work: SMs idle for 17 % of
  // document+causal's time at 192 rows (ncu, sm__cycles_active against the duration).
  FJ_DEVICE void advance() {
    if constexpr (T::kPersistent) {
      const int second = FjWorkItems<T>::second(args, code);
      code = second >= 0 ? second : 2 * ((int)gridDim.x + atomicAdd(args.sched_counter, 1));
    }
  }
};

// The producer: one thread of warpgroup 0 (on a KV cache, all kLoaders = 128 of them: cp.async
// gathers need the threads) walks the CTA's query tiles and each one's KV schedule and issues the
// loads of Q (one thread, TMA) and of the K / V ring's stages.
template <class T, class Cfg>
struct FjSm90Producer {
  const FjFwdArgs& args;
  const FjFwdTmaMaps& maps;
  FjSm90Smem<T> sm;
  FjSm90KvCache<T, Cfg> cache;  // kFjKvCache
  int ltid;                     // this loader (0 .. kLoaders - 1)
  int g;                        // KV tiles loaded so far, over every query tile: the ring position

  FJ_DEVICE FjSm90Producer(const FjFwdArgs& a, const FjFwdTmaMaps& m, const FjSm90Smem<T>& s,
                           const FjKvCacheArgs& kv, int loader)
      : args(a), maps(m), sm(s), cache{kv}, ltid(loader), g(0) {}

  // The thread that issues the TMA loads (every loader on a KV cache runs the loop).
  FJ_DEVICE bool lead() const { return T::kLoaders == 1 || ltid == 0; }

  // Q of the item-th query tile into buffer u, once the tile that used it before is done with it
  // (with kPersistent, the tile and its union runs go along in the slot).
  FJ_DEVICE void load_q(const FjSm90ProducerTiles<T, Cfg>& tiles, int item, int u,
                        const int (&runs)[3], int b, int h, int m_block) const {
    if (!lead()) return;
    if (sm.q_uses(item) > 0) fj_mbar_wait(sm.bar_qe + 8 * u, (sm.q_uses(item) - 1) & 1);
    if constexpr (T::kPersistent) {
      tiles.send(u, sm.q_uses(item), FjWorkItems<T>::slot_tile(args, b, h, m_block), T::kQLoadBytes,
                 runs);
    } else {
      fj_mbar_arrive_expect_tx(sm.bar_q + 8 * u, T::kQLoadBytes);
    }
    fj_tma_load_tile<T::kQKUnits, T::kBlockM>(sm.sq + u * T::kQBytes, &maps.q, m_block * T::kBlockM,
                                              h, b, sm.bar_q + 8 * u);
  }

  // On page pools, the page this loader's TMA box of KV tile `tile` reads (lane p's page p of it
  // with kBoxPerPage, else loader 0's one box; 0 where it issues none, the tile is gathered or
  // lies past the length). Read before the wait for the tile's stage, so that the page table's
  // latency passes under that wait (read after it, each tile's boxes waited for a table read
  // first). One register across the wait: the row as well spilled relative_bias_causal's
  // loaders at 192 rows (20 B).
  FJ_DEVICE int tma_page(int tile, int kv_len, int b) const {
    if constexpr (kFjKvCache && !kFjKvFp8 && kFjKvPageSize > 0) {
      const int n_start = tile * T::kBlockN;
      if (cache.gathered(n_start, kv_len) || n_start >= kv_len) return 0;
      if constexpr (FjSm90KvCache<T, Cfg>::kBoxPerPage) {
        if (ltid < FjSm90KvCache<T, Cfg>::kPagesPerTile) return cache.page(b, n_start, ltid);
      } else if (ltid == 0) {
        return cache.page(b, n_start, 0);
      }
    }
    return 0;
  }

  // K and V of KV tile `tile` (of sequence b, kv_len keys) into ring stage `stage`; on page pools
  // with the page of this loader's TMA box (tma_page).
  FJ_DEVICE void load_kv(int stage, int tile, int kv_len, int b, int h_kv, int page) const {
    const int n_start = tile * T::kBlockN;
    const fj_u32 bar_k = sm.bar_k + 8 * stage, bar_v = sm.bar_v + 8 * stage;
    if constexpr (kFjKvFp8) {
#if defined(FJ_FWD_KV_FP8)
      // An e4m3 cache: the tile's copies were issued one tile ahead (stage_kv); once they have
      // landed, every loader converts its units into the stage and arrives on K full, V full.
      fj_cp_async_wait<0>();
      const fj_u32 staging = sm.sq + T::kOffEnd;
      cache.template convert_e4m3<T::kDimQK>(sm.sk + stage * T::kKBytes, staging, ltid, bar_k);
      cache.template convert_e4m3<T::kDimV>(sm.sv + stage * T::kVBytes,
                                            staging + T::kBlockN * T::kDimQK, ltid, bar_v);
#endif
    } else if constexpr (kFjKvCache) {
      if (cache.gathered(n_start, kv_len)) {
        // Every loader copies its rows (FjSm90KvCache::gather); pools: page_table picks the page.
        const fj_i64 kv_b = cache.kPage > 0 ? 0 : b;  // contiguous: batch b; pools: page 0
        const char* k_head = static_cast<const char*>(args.k) +
                             2 * (kv_b * args.k_stride_b + (fj_i64)h_kv * args.k_stride_h);
        const char* v_head = static_cast<const char*>(args.v) +
                             2 * (kv_b * args.v_stride_b + (fj_i64)h_kv * args.v_stride_h);
        cache.template gather<T::kDimQK, T::kRealQK>(sm.sk + stage * T::kKBytes, k_head,
                                                     args.k_stride_b, args.k_stride_s, b, n_start,
                                                     kv_len, ltid, bar_k);
        cache.template gather<T::kDimV, T::kRealV>(sm.sv + stage * T::kVBytes, v_head,
                                                   args.v_stride_b, args.v_stride_s, b, n_start,
                                                   kv_len, ltid, bar_v);
        return;
      }
      // One box per 64 columns (a page holds the tile, or a contiguous sequence does), issued by
      // loader 0. Every loader still arrives (lane 0 for its warp, after the warp's wait for the
      // stage): a loader that only waited could fall two phases behind the stage's barriers
      // while the others run on, and then miss the phase its next gather waits for.
      __syncwarp();
      if constexpr (FjSm90KvCache<T, Cfg>::kBoxPerPage) {
        // Lane p of loader warp 0 loads page p of the tile, after lane 0's expect_tx.
        if (ltid == 0) {
          fj_mbar_arrive_expect_tx(bar_k, T::kKBytes);
          fj_mbar_arrive_expect_tx(bar_v, T::kVBytes);
        }
        __syncwarp();
        if (ltid < FjSm90KvCache<T, Cfg>::kPagesPerTile) {
          int row, bp;
          cache.box(args, b, n_start, kv_len, page, row, bp);
          cache.template load_page<T::kDimQK>(sm.sk + stage * T::kKBytes, &maps.k, ltid, row, h_kv,
                                              bp, bar_k);
          cache.template load_page<T::kDimV>(sm.sv + stage * T::kVBytes, &maps.v, ltid, row, h_kv,
                                             bp, bar_v);
        }
      } else if (ltid == 0) {
        int row, bp;
        cache.box(args, b, n_start, kv_len, page, row, bp);
        fj_mbar_arrive_expect_tx(bar_k, T::kKBytes);
        fj_tma_load_tile<T::kDimQK, T::kBlockN>(sm.sk + stage * T::kKBytes, &maps.k, row, h_kv, bp,
                                                bar_k);
        fj_mbar_arrive_expect_tx(bar_v, T::kVBytes);
        fj_tma_load_tile<T::kDimV, T::kBlockN>(sm.sv + stage * T::kVBytes, &maps.v, row, h_kv, bp,
                                               bar_v);
      }
      if (ltid % 32 == 0) {
        fj_mbar_arrive_count(bar_k, ltid == 0 ? 31 : 32);
        fj_mbar_arrive_count(bar_v, ltid == 0 ? 31 : 32);
      }
    } else {
      // A tile past the end of a ragged sparse block reads as zeros (TMA fills what lies
      // outside the tensor and still counts the whole box) and the consumers mask it.
      fj_mbar_arrive_expect_tx(bar_k, T::kKBytes);
      fj_tma_load_tile<T::kQKUnits, T::kBlockN>(sm.sk + stage * T::kKBytes, &maps.k, n_start, h_kv,
                                                b, bar_k);
      fj_mbar_arrive_expect_tx(bar_v, T::kVBytes);
      if constexpr (T::kFp8) {
        // V^T (rows: the v tile's dims; 128 keys = 64 units a box, at unit n_start / 2): the
        // K-major B operand of P V, chunk c of 128 keys at c * kDimV * 128.
#pragma unroll
        for (int c = 0; c < T::kBlockN / 128; ++c)
          fj_tma_load_4d(sm.sv + stage * T::kVBytes + c * T::kDimV * 128, &maps.v,
                         n_start / 2 + c * 64, 0, h_kv, b, bar_v);
      } else {
        fj_tma_load_tile<T::kDimV, T::kBlockN>(sm.sv + stage * T::kVBytes, &maps.v, n_start, h_kv,
                                               b, bar_v);
      }
    }
  }

#if defined(FJ_FWD_KV_FP8)
  // An e4m3 cache: this loader's cp.async copies of KV tile `tile`'s e4m3 K and V into the
  // staging tile, one commit group (load_kv converts them when the tile's stage is free).
  FJ_DEVICE void stage_kv(int tile, int kv_len, int b, int h_kv) const {
    const int n_start = tile * T::kBlockN;
    const fj_i64 kv_b = cache.kPage > 0 ? 0 : b;  // contiguous: batch b; pools: page 0
    const unsigned char* k_head = static_cast<const unsigned char*>(args.k) +
                                  kv_b * args.k_stride_b + (fj_i64)h_kv * args.k_stride_h;
    const unsigned char* v_head = static_cast<const unsigned char*>(args.v) +
                                  kv_b * args.v_stride_b + (fj_i64)h_kv * args.v_stride_h;
    const fj_u32 staging = sm.sq + T::kOffEnd;
    cache.template stage_e4m3<T::kDimQK, T::kRealQK>(staging, k_head, args.k_stride_b,
                                                     args.k_stride_s, b, n_start, kv_len, ltid);
    cache.template stage_e4m3<T::kDimV, T::kRealV>(staging + T::kBlockN * T::kDimQK, v_head,
                                                   args.v_stride_b, args.v_stride_s, b, n_start,
                                                   kv_len, ltid);
    fj_cp_async_commit();
  }
#endif

  // The loads of the item-th query tile (b, h, m_block; Q buffer u): Q and its KV schedule's
  // K / V tiles.
  FJ_DEVICE void load_tile(const FjSm90ProducerTiles<T, Cfg>& tiles, int item, int u, int b, int h,
                           int m_block) {
    const int h_kv = h / Cfg::kGqaRatio;
    const int kv_len = kFjKvCache ? cache.length(args, b) : args.seqlen_kv;
    const FjKvSchedule sched = fj_sm90_schedule<T, Cfg>(args, kv_len, b, h, m_block);
    int runs[3] = {0, 0, 0};
    tiles.union_runs(sched, b, h, m_block, runs);
    // Q into its buffer once the tile that used it before is done with it: with two buffers,
    // tile item - 2 after its epilogue (long before); with one, the previous tile after its
    // last S = Q K^T, so that Q arrives while the consumers finish that tile's P V and
    // epilogue. Then the first K / V tile goes first (its stage frees before that last S).
    const bool q_first = T::kQBufs == 2 || item == 0 || sched.num_total == 0;
    if (q_first) load_q(tiles, item, u, runs, b, h, m_block);
    // Three warpgroups: the union schedule's order; else full tiles first (fj_sm90_visit).
    auto entry = [&](int i) {
      return kFjUnionSchedule<T, Cfg> ? fj_union_entry(sched, i)
                                      : sched.tile(fj_sm90_visit(sched, i));
    };
    // An entry's tile (a union schedule's entries carry status bits above it).
    auto tile_of = [](int e) { return kFjUnionSchedule<T, Cfg> ? e & kFjUnionTileMask : e; };
    int next_tile = sched.num_total > 0 ? entry(0) : 0;
#if defined(FJ_FWD_KV_FP8)
    // An e4m3 cache: the copies run one tile ahead of the conversion (the staging tile holds one).
    if (sched.num_total > 0) stage_kv(tile_of(next_tile), kv_len, b, h_kv);
#endif
    for (int i = 0; i < sched.num_total; ++i, ++g) {
      // Three warpgroups: a block mask comes as a union schedule (status bits above the tile).
      const int tile = tile_of(next_tile);
      if (i + 1 < sched.num_total) next_tile = entry(i + 1);
      const int stage = g % T::kNumStages;
      const int page = tma_page(tile, kv_len, b);
      if (g >= T::kNumStages) fj_mbar_wait(sm.bar_e + 8 * stage, ((g / T::kNumStages) & 1) ^ 1);
      load_kv(stage, tile, kv_len, b, h_kv, page);
#if defined(FJ_FWD_KV_FP8)
      if (i + 1 < sched.num_total) stage_kv(tile_of(next_tile), kv_len, b, h_kv);
#endif
      if (!q_first && i == 0) load_q(tiles, item, u, runs, b, h, m_block);
    }
  }

  // By one thread (the warpgroup's others return at once); on a KV cache by every loader.
  FJ_DEVICE void run() {
    if (lead()) {
      fj_tma_prefetch_desc(&maps.q);
      if (!FjSm90KvCache<T, Cfg>::kGatherAll) {
        fj_tma_prefetch_desc(&maps.k);
        fj_tma_prefetch_desc(&maps.v);
      }
    }
    FjSm90ProducerTiles<T, Cfg> tiles(args, sm);
    int b, h, m_block;
    for (int item = 0;; ++item) {
      if constexpr (T::kPersistent) {
        const int u = sm.q_buf(item);  // its Q buffer
        if (tiles.exhausted()) {
          tiles.finish(item, u);
          break;
        }
        tiles.take(b, h, m_block);
        load_tile(tiles, item, u, b, h, m_block);
      } else {
        if (!tiles.items.next(args, b, h, m_block)) break;
        load_tile(tiles, item, sm.q_buf(item), b, h, m_block);
      }
      tiles.advance();
    }
  }
};

// The tile scheduler's consumer side: the CTA's query tiles in the producer's order (with
// kPersistent, from the Q buffer's tile slot) and each one's KV schedule.
template <class T, class Cfg>
struct FjSm90ConsumerTiles {
  static constexpr bool kUnion = kFjUnionSchedule<T, Cfg>;
  const FjFwdArgs& args;
  FjSm90Smem<T> sm;
  FjWorkItems<T> items;  // without kPersistent

  FJ_DEVICE FjSm90ConsumerTiles(const FjFwdArgs& a, const FjSm90Smem<T>& s)
      : args(a), sm(s), items() {}

  // kPersistent: the tile the producer sent with the q_item-th query tile's Q (in buffer u),
  // FjWorkItems::slot_tile's form, or -1 when none is left.
  FJ_DEVICE int wait_slot(int q_item, int u) const {
    fj_mbar_wait(sm.bar_q + 8 * u, sm.q_uses(q_item) & 1);
    return fj_warp_uniform(fj_lds_b32(sm.tile_slot + 16 * u));
  }

  // kPersistent: tile `code` of buffer u into b, h, m_block, its union runs (kUnion) from the
  // slot into `runs`; then the slot goes back to the producer. (`runs` is the caller's array: a
  // member array, written in a loop, kept this struct out of registers until the loop was
  // unrolled, and the kernel compiled differently.)
  FJ_DEVICE void take(int u, int code, int& b, int& h, int& m_block, int (&runs)[3]) const {
    if constexpr (kUnion) {
#pragma unroll
      for (int c = 0; c < 3; ++c)
        runs[c] = fj_warp_uniform(fj_lds_b32(sm.tile_slot + 16 * u + 4 + 4 * c));
    }
    // The slot's next tile is an async-proxy write (the bulk copy): order this generic read
    // before it, then let the producer send it (FjSm90ProducerTiles::send's named barrier).
    fj_fence_proxy_async();
    fj_bar_arrive(FjSm90Smem<T>::kSlotBar + u, 32 + 128 * T::kConsumers);
    FjWorkItems<T>::from_slot(args, code, b, h, m_block);
  }

  // The KV tiles of query tile (b, h, m_block) over kv_len keys (fj_sm90_schedule; kUnion and
  // kPersistent: the entries up to the end of the last of the `runs`).
  FJ_DEVICE FjKvSchedule schedule(int b, int h, int m_block, int kv_len,
                                  const int (&runs)[3]) const {
    FjKvSchedule sched;
    if constexpr (kUnion && T::kPersistent) {
      // The entry count from the slot (the last run's end; warp-uniform already), not a load at
      // the tile's start.
      const int n = max(runs[0] >> 16, max(runs[1] >> 16, runs[2] >> 16));
      sched = fj_union_entries(args.mask, b, h, m_block, n);
    } else {
      sched = fj_sm90_schedule<T, Cfg>(args, kv_len, b, h, m_block);
      if constexpr (kUnion) {
        // Counts loaded from a block mask, made known to be warp-uniform (the loops below stay
        // on the uniform datapath); tile indices likewise where they are used, not where loaded
        // (one tile ahead).
        sched.num_partial = fj_warp_uniform(sched.num_partial);
        sched.num_total = fj_warp_uniform(sched.num_total);
      }
    }
    return sched;
  }
};

// A query tile as a consumer thread computes it.
struct FjSm90QTile {
  int b, h, m_block;
  int u;           // its Q buffer
  int m_start;     // its first row
  fj_u32 sq_item;  // its Q buffer's address
  int q_row0;      // the thread's first row
  int dl_row0;     // the warp's first row
  int kv_len;      // kFjKvCache: its sequence's keys (FjSm90Consumer::kv_end)
  // e4m3 with persistent CTAs (FjSm90Consumer::kTileScale): the score's scale times the head's q
  // and k descales, and v's descale (one CTA per tile folds them in at the kernel's start).
  float scale, v_scale;
};

// The kernel multiplies the call's scale by factors on the device (e4m3 q / k descales, an e4m3
// KV cache's k_scale): its sign is known only there.
constexpr bool kFjScaledOnDevice = kFjFp8 || kFjKvFp8;

// A position g of the consumers' stage ring: its stage (g % kStages) and the parity of its round
// ((g / kStages) & 1), moved one position on by a compare and selects. The mainloops carry it
// from tile to tile instead of dividing the position by a stage count that is 3 at d 128 (a
// multiply-high, shifts and a multiply-subtract per barrier, in the loop's head).
template <int kStages>
struct FjRingPos {
  int stage, parity;
  FJ_DEVICE static FjRingPos at(int g) { return {g % kStages, (g / kStages) & 1}; }
  FJ_DEVICE FjRingPos next() const {
    return stage + 1 == kStages ? FjRingPos{0, parity ^ 1} : FjRingPos{stage + 1, parity};
  }
};

// A consumer warpgroup (query rows [64 cw, 64 cw + 64) of every query tile): the mainloop over
// a query tile's KV tiles (S = Q K^T and O += P V by wgmma, the turns between warpgroups), the
// scores and online softmax of a KV tile, and the epilogue (O normalized, LSE).
template <class T, class Cfg>
struct FjSm90Consumer {
  // Three consumer warpgroups with a mask_mod read a block mask as a union schedule
  // (mainloop_union).
  static constexpr bool kUnion = kFjUnionSchedule<T, Cfg>;
  // Intra-warpgroup overlap: S of tile i and P V of tile i - 1 issued in one turn (S of tile i,
  // P of tile i - 1 and O live at once: too many registers with d_v = 256, and with three
  // consumers at 160 registers unless d_v is 64: e4m3 at d 128 spilled 144 B and ptxas
  // serialized its wgmma). Three consumers at d_v 128 run the serial loop, faster than two with
  // the overlap (docs/kernels/forward_sm90.md "Three consumer warpgroups at d 128", "FP8").
  static constexpr bool kOverlap =
      T::kDimV <= 128 && !((T::kFp8 || T::kDimV > 64) && T::kConsumers == 3);
  // Three consumers' serial loop with a score_mod that reads kv_idx: the score_mod in a copy per
  // kind of tile (partial; full; the sequence's last, whose kv_idx is clamped), as 128-row tiles
  // have; with one copy alibi_causal ran 2.5 % behind 128-row tiles (docs/kernels/forward_sm90.md
  // "Three consumer warpgroups at d 128"). Otherwise a union kernel takes one copy that masks
  // partial tiles after it (two spilled in the overlapped loop at 160 registers), and a serial
  // loop without `divisible` no copy of its own for full tiles below the sequence's end: where the
  // score_mod does not read kv_idx the two differ only in the key bound (softcap at 192 rows
  // spilled 24 B with both).
  static constexpr bool kScoreCopies = kFjScoreReadsKv && !kOverlap;
  // Q's descriptors are the same for every tile; kept in registers across the loop they take
  // 2 * kDimQK / 16 of them, and they were what spilled first in kernels whose score_mod loads
  // buffers (relative_bias_causal d 128: 64 of its 72 B). With a score_mod they are rebuilt
  // every tile from an address the compiler cannot hoist (one add per k16 step: a descriptor's
  // low bits are address >> 4). relative_bias_causal still spilled then (the 64 bias loads of a
  // tile in flight: d 128 80 B, d 64 20 B), until its bias was read once per diagonal (kDl).
  static constexpr bool kRebuildQDesc = Cfg::kHasScoreMod || Cfg::kHasMaskMod;
  // The score_mod's diagonal load (kFjDiagLoad: bias[f(q_idx - kv_idx)]), once per diagonal of
  // the warp's 16 x kBlockN fragment instead of once per score: load_diagonals issues the loads
  // into registers before the tile's S is waited for, and each score takes its value from the
  // lane that loaded it (FjDiagLoads::shuffled; no shared memory).
  static constexpr bool kDl = Cfg::kHasScoreMod && kFjDiagLoad;
  // e4m3 with persistent CTAs: the descales of each tile's head (FjSm90QTile::scale, v_scale).
  static constexpr bool kTileScale = T::kFp8 && T::kPersistent;
  // A column load with persistent CTAs (but at d <= 64 with `divisible`): the thread's first row
  // from the thread index, read where the row is used (row0).
  static constexpr bool kRowFromTid =
      kFjColLoad && T::kPersistent && (T::kDimV > 64 || !Cfg::kIsDivisible);

  // O out by TMA stores from the staged tile (FjFwdTmaMaps::o; the 16-bit kernels): issued by
  // one thread per warpgroup, so the consumers go on to the next query tile while the copy
  // engine writes; the Q buffer it reads goes back to the producer at the next tile's start
  // (docs/kernels/forward_sm90.md "O through TMA stores"). Not at d <= 64 with a column load
  // and `divisible` (the kernel that keeps the warp-and-lane row, kRowFromTid): there either
  // release spilled 4 B (document_causal), so it keeps the 16-byte stores.
  static constexpr bool kTmaStore =
      !T::kFp8 && !(kFjColLoad && T::kDimV <= 64 && Cfg::kIsDivisible);
  // With two Q buffers the release waits for the stores' reads at the next tile's start, so that
  // the issuing thread does not stall its warpgroup's next S; at d 64 with a column load that
  // spilled 4 B (document_causal, persistent 192-row tiles: 2.5 % slower than the release right
  // after the stores), which those kernels keep.
  static constexpr bool kDeferRelease =
      kTmaStore && T::kQBufs == 2 && !(kFjColLoad && T::kDimV <= 64);

  const FjFwdArgs& args;
  const FjModParams& mods;
  const FjFp8Args& fp8;      // kTileScale
  const FjFwdTmaMaps& maps;  // o (kTmaStore)
  FjSm90Smem<T> sm;
  FjSm90KvCache<T, Cfg> cache;  // kFjKvCache
  // This consumer warpgroup; known to be warp-uniform where it picks the union schedule's run
  // (at d 128 the broadcast cost document_causal a 4 B spill).
  int cw;
  int wtid, warp, lane;
  fj_u32 sq_wg;  // this warpgroup's Q rows (of the current Q buffer)
  // Turns (FjTurns, wgmma_sm90.cuh): ping-pong with two consumer warpgroups, a rotation with
  // three; one turn per tile, over every query tile of the CTA. 1..kConsumers: the epilogue's.
  FjTurns<T::kConsumers, 1 + T::kConsumers> turns;
  int g;  // KV tiles consumed so far, over every query tile: the ring position
  // The accumulators and fragments: arrays the kernel declares, held by reference. As members,
  // their loop-indexed accesses kept the whole struct (its scalars too) in memory until the
  // loops were unrolled, and the kernel compiled differently (document_causal at 192 rows
  // spilled 4 B).
  float (&o)[1][T::kDTiles][4];
  float (&row_max)[1][2];
  float (&row_sum)[1][2];
  fj_u32 (&pa)[T::kPSteps][4];  // P of the previous tile, the A operand of its P V
  float (&s)[1][T::kNTiles][4];
  FjDiagLoads<T::kNTiles>& dl;

  // After the warpgroup's setmaxnreg.inc.
  FJ_DEVICE FjSm90Consumer(const FjFwdArgs& a, const FjModParams& m, const FjFp8Args& f,
                           const FjFwdTmaMaps& maps_, const FjSm90Smem<T>& sm_,
                           const FjKvCacheArgs& kv, int tid, int wg, float (&o_)[1][T::kDTiles][4],
                           float (&row_max_)[1][2], float (&row_sum_)[1][2],
                           fj_u32 (&pa_)[T::kPSteps][4], float (&s_)[1][T::kNTiles][4],
                           FjDiagLoads<T::kNTiles>& dl_)
      : args(a),
        mods(m),
        fp8(f),
        maps(maps_),
        sm(sm_),
        cache{kv},
        cw(kUnion ? fj_warp_uniform(wg - 1) : wg - 1),
        wtid(tid % 128),
        warp(wtid / 32),
        lane(tid % 32),
        sq_wg(sm_.sq + cw * 64 * 128),
        turns{cw},
        g(0),
        o(o_),
        row_max(row_max_),
        row_sum(row_sum_),
        pa(pa_),
        s(s_),
        dl(dl_) {}

  // The thread's first row of query tile t (FjSm90QTile::q_row0), with kRowFromTid from the thread
  // index read here.
  FJ_DEVICE int row0(const FjSm90QTile& t) const {
    if constexpr (kRowFromTid) {
      const int qt = fj_tid_here();
      return t.m_start + (qt / 128 - 1) * 64 + (qt % 128) / 4 + (qt % 128) / 32 * 8;
    } else {
      return t.q_row0;
    }
  }

  // The score's scale on query tile t's scores (kTileScale: the tile's own).
  FJ_DEVICE float tile_scale(const FjSm90QTile& t) const {
    if constexpr (kTileScale) {
      return t.scale;
    } else {
      return args.scale;
    }
  }

  // The keys of query tile t's sequence: seqlen_kv (read where used, as the kernel always did),
  // or on a KV cache its length.
  FJ_DEVICE int kv_end(const FjSm90QTile& t) const {
    if constexpr (kFjKvCache) {
      return t.kv_len;
    } else {
      return args.seqlen_kv;
    }
  }

  // On a KV cache, after the wait for a stage that the loaders gathered with cp.async (generic
  // proxy writes; FjSm90KvCache), before wgmma reads it through the async proxy. `tile` and
  // `other` are the KV tiles whose stages were waited for.
  FJ_DEVICE void gather_fence(const FjSm90QTile& t, int tile, int other) const {
    if constexpr (kFjKvCache) {
      if (cache.gathered(tile * T::kBlockN, t.kv_len) ||
          cache.gathered(other * T::kBlockN, t.kv_len)) {
        fj_fence_proxy_async();
      }
    }
  }

  // S = Q K^T of a stage: k16 steps over the head dim, 64-element chunks of Q and K.
  FJ_DEVICE void issue_qk(int stage) {
    const fj_u32 sk_stage = sm.sk + stage * T::kKBytes;
    fj_u32 q_base = sq_wg;
    if constexpr (kRebuildQDesc) asm volatile("mov.b32 %0, %1;\n" : "=r"(q_base) : "r"(sq_wg));
    const fj_u64 da0 = fj_smem_desc_sw128(q_base, 16, 1024);
    const fj_u64 db0 = fj_smem_desc_sw128(sk_stage, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < T::kStepsQK; ++kk) {  // the steps past kRealQK add zeros
      const int chunk = kk / 4, sub = kk % 4;
      const fj_u64 da = fj_desc_add(da0, chunk * T::kBlockM * 128 + sub * 32);
      const fj_u64 db = fj_desc_add(db0, chunk * T::kBlockN * 128 + sub * 32);
      fj_wgmma_ss(s[0], da, db, kk > 0 ? 1 : 0);
    }
    fj_wgmma_commit();
  }

  // O += P V of a stage: V MN-major, 64-element chunks of the head dim LBO apart; the C
  // fragments of n8 tiles 2j, 2j+1 of S are the A fragment of k16 step j.
  // e4m3: V^T K-major (rows the v tile's dims, 128 keys a 128-byte row; chunk c of 128 keys at
  // c * kDimV * 128), k32 step j 32 bytes into its chunk, as Q K^T reads K.
  FJ_DEVICE void issue_pv(int stage) {
    const fj_u32 sv_stage = sm.sv + stage * T::kVBytes;
    if constexpr (T::kFp8) {
      const fj_u64 dv0 = fj_smem_desc_sw128(sv_stage, 16, 1024);
#pragma unroll
      for (int j = 0; j < T::kPSteps; ++j) {
        const fj_u64 dv = fj_desc_add(dv0, (j / 4) * T::kDimV * 128 + (j % 4) * 32);
        fj_wgmma_rs(o[0], pa[j], dv, 1);
      }
    } else if constexpr (T::kConsumers == 2) {
      // One descriptor moved by one add per k16 step (fj_desc_add), as Q K^T's.
      const fj_u64 dv0 = fj_smem_desc_sw128(sv_stage, T::kBlockN * 128, 1024);
#pragma unroll
      for (int j = 0; j < T::kBlockN / 16; ++j) {
        fj_wgmma_rs(o[0], pa[j], fj_desc_add(dv0, j * 16 * 128), 1);
      }
    } else {
      // Three consumers: built per step (moved by fj_desc_add, relative_bias at d 64 with
      // 192-row persistent tiles spilled 4 B).
#pragma unroll
      for (int j = 0; j < T::kBlockN / 16; ++j) {
        const fj_u64 dv = fj_smem_desc_sw128(sv_stage + j * 16 * 128, T::kBlockN * 128, 1024);
        fj_wgmma_rs(o[0], pa[j], dv, 1);
      }
    }
    fj_wgmma_commit();
  }

  // Skipped by the whole warp when none of its rows moved its reference (fj_sm90_softmax).
  FJ_DEVICE void rescale_o(const float (&alpha)[2]) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
      fj_rescale_row<T>(o, 0, 0, alpha[0]);
      fj_rescale_row<T>(o, 0, 1, alpha[1]);
    }
  }

  // e4m3: P (in [0, 1]) rounded to e4m3 in S's registers (fj_wgmma_pack_a_e4m3; V^T's keys are
  // permuted to match, fj_fp8_vt_key).
  FJ_DEVICE void pack_p() {
    if constexpr (T::kFp8) {
      fj_wgmma_pack_a_e4m3(pa, s[0]);
    } else {
      fj_wgmma_pack_a<typename T::Element>(pa, s[0]);
    }
  }

  // This warp is done with a stage.
  FJ_DEVICE void release(int stage) const {
    __syncwarp();
    if (lane == 0) fj_mbar_arrive(sm.bar_e + 8 * stage);
  }

  // This warp is done with the Q tile (its last S = Q K^T has completed): with one Q buffer,
  // the producer may load the next tile's Q (with two, the epilogue releases the buffer).
  FJ_DEVICE void release_q() const {
    if constexpr (T::kQBufs == 1) {
      __syncwarp();
      if (lane == 0) fj_mbar_arrive(sm.bar_qe);
    }
  }

  // The score_mod's diagonal loads of a KV tile (kDl).
  FJ_DEVICE void load_diagonals(const FjSm90QTile& t, int tile) {
    if constexpr (kDl) {
      const int n_start = tile * T::kBlockN;
      // q_idx - kv_idx = (dl_row0 + row) - (n_start + col) = (dl_row0 - n_start) - k.
      dl.issue(mods, t.b, t.h, t.dl_row0 - n_start, -1, args.seqlen_q - t.dl_row0,
               kv_end(t) - n_start, lane);
    }
  }

  // Scores and online softmax of a KV tile (S in s, turned into P in place); the factors by
  // which O must be rescaled are left in alpha.
  FJ_DEVICE void softmax(const FjSm90QTile& t, bool partial, int n_start, float (&alpha)[2]) {
    constexpr float kLog2e = 1.4426950408889634f;
    // The lane's first key; with a column load from the thread index read here (kept from the
    // kernel's start it was spilled and reloaded once per tile: document_causal, 192 rows).
    const int kv_col0 = n_start + (kFjColLoad ? fj_tid_here() & 3 : lane & 3) * 2;
    float c = kLog2e;
    const float scale = tile_scale(t);
    if constexpr (kUnion && !kScoreCopies && Cfg::kHasScoreMod && Cfg::kHasMaskMod) {
      // One copy of the score_mod, the mask_mod after it where the tile is partial: a
      // partial and a full copy of the score_mod chosen by a tile's status bits spilled
      // 130-260 B at 160 registers (softcap_causal, relative_bias_causal;
      // docs/kernels/forward_sm90.md "Union schedule").
      fj_sm90_scores<Cfg, T, false, false, kDl>(s, args, mods, scale, t.b, t.h, row0(t), n_start,
                                                kv_end(t), kv_col0, dl, lane);
      if (partial) fj_sm90_mask<Cfg, T>(s, args, mods, t.b, t.h, row0(t), kv_end(t), kv_col0);
    } else if (!Cfg::kHasScoreMod && !(Cfg::kHasMaskMod && partial) &&
               ((!kFjScaledOnDevice && !kUnion) || scale > 0.0f)) {
      // No mod to call on this tile: the scale goes into the exponent's factor too (the row
      // max of the raw scores times a positive c is that of the scaled ones). The host runs
      // this kernel only with a positive scale (InputFacts::scale_positive), so no path for
      // another sign is compiled (a cold compile of noop 9-17 % less CPU). Kept: where the
      // kernel multiplies the scale by device values (e4m3 descales, an e4m3 cache's k_scale),
      // and in the union kernels (192-row tiles: without it document_causal spilled 8 B).
      fj_sm90_scores<Cfg, T, false, true, false>(s, args, mods, scale, t.b, t.h, row0(t), n_start,
                                                 kv_end(t), kv_col0, dl, lane);
      c = scale * kLog2e;
    } else if (partial && kFjColLoad) {
      // The mask_mod's column load read once per warp (fj_sm90_mask).
      fj_sm90_scores<Cfg, T, false, false, kDl>(s, args, mods, scale, t.b, t.h, row0(t), n_start,
                                                kv_end(t), kv_col0, dl, lane);
      fj_sm90_mask<Cfg, T>(s, args, mods, t.b, t.h, row0(t), kv_end(t), kv_col0);
    } else if (partial) {
      fj_sm90_scores<Cfg, T, true, false, kDl>(s, args, mods, scale, t.b, t.h, row0(t), n_start,
                                               kv_end(t), kv_col0, dl, lane);
    } else if (!Cfg::kIsDivisible && Cfg::kHasScoreMod && (kOverlap || kScoreCopies) &&
               n_start + T::kBlockN <= kv_end(t)) {
      // A full tile below the sequence's end: the score_mod's kv_idx needs no clamp (one per
      // score; S = 4000 alibi+causal ran 9 % below its padded work's share of S = 4096).
      fj_sm90_scores<Cfg, T, false, false, kDl, false>(s, args, mods, scale, t.b, t.h, row0(t),
                                                       n_start, kv_end(t), kv_col0, dl, lane);
    } else {
      fj_sm90_scores<Cfg, T, false, false, kDl>(s, args, mods, scale, t.b, t.h, row0(t), n_start,
                                                kv_end(t), kv_col0, dl, lane);
    }
    fj_sm90_softmax<T>(s, row_max, row_sum, alpha, c);
  }

  // The overlapped loop's three steps over a run of tiles at ring positions g0, g0 + 1, ...:
  // the first tile's S alone (first_s); S of a tile with P V of the one before in one turn
  // (next_s_pv: the softmax of S runs while the tensor cores do P V, O is rescaled once P V is
  // done); the last P V (last_pv). `q_done`: the tile's S is the query tile's last (one Q
  // buffer: release it).
  FJ_DEVICE void first_s(const FjSm90QTile& t, int gi, int tile, bool partial, float (&alpha)[2],
                         bool q_done) {
    fj_mbar_wait(sm.bar_k + 8 * (gi % T::kNumStages), (gi / T::kNumStages) & 1);
    gather_fence(t, tile, tile);
    turns.begin();
    fj_wgmma_fence();
    issue_qk(gi % T::kNumStages);
    turns.end();
    load_diagonals(t, tile);
    fj_wgmma_wait<0>();
    fj_fence_regs(s[0]);
    if (q_done) release_q();
    softmax(t, partial, tile * T::kBlockN, alpha);  // O is still zero: no rescale
    pack_p();
  }

  // `prev_tile`: the tile whose P V goes with this one's S (kFjKvCache: its V may be gathered).
  // `pos`: this tile's ring position, `pos_prev` the one before (prev_tile's).
  FJ_DEVICE void next_s_pv(const FjSm90QTile& t, FjRingPos<T::kNumStages> pos,
                           FjRingPos<T::kNumStages> pos_prev, int tile, int prev_tile, bool partial,
                           float (&alpha)[2], bool q_done) {
    const int stage = pos.stage;
    const int prev = pos_prev.stage;
    fj_mbar_wait(sm.bar_k + 8 * stage, pos.parity);
    fj_mbar_wait(sm.bar_v + 8 * prev, pos_prev.parity);
    gather_fence(t, tile, prev_tile);
    turns.begin();
    fj_wgmma_fence();
    issue_qk(stage);
    issue_pv(prev);
    turns.end();
    load_diagonals(t, tile);
    fj_wgmma_wait<1>();
    fj_fence_regs(s[0]);
    softmax(t, partial, tile * T::kBlockN, alpha);
    // ptxas places this wait at the top of the softmax's basic block, so the softmax runs
    // after P V rather than under it; the ping-pong of the consumers keeps the tensor cores
    // busy meanwhile. Forcing the wait below the softmax (a never-taken branch on its row
    // sums) measured 2-4 % slower (docs/kernels/forward_sm90.md "Design notes").
    fj_wgmma_wait<0>();
    fj_fence_regs(o[0]);
    // 16-bit P is packed here, in the exponentials' basic block (before the rescale's vote and
    // branch), so ptxas interleaves its F2FP with the MUFU.EX2 stream instead of issuing 32 of
    // them after it: under ncu every main case 1-3 % faster. e4m3's pack (F2FP and PRMT) there
    // measured 5-8 % slower (bench --fp8), so it keeps its place after the rescale.
    if constexpr (!T::kFp8) pack_p();
    if (q_done) release_q();
    release(prev);
    rescale_o(alpha);
    if constexpr (T::kFp8) pack_p();
  }

  FJ_DEVICE void last_pv(const FjSm90QTile& t, int gl, int tile) {
    fj_mbar_wait(sm.bar_v + 8 * (gl % T::kNumStages), (gl / T::kNumStages) & 1);
    gather_fence(t, tile, tile);
    fj_wgmma_fence();
    issue_pv(gl % T::kNumStages);
    fj_wgmma_wait<0>();
    fj_fence_regs(o[0]);
    release(gl % T::kNumStages);
  }

  // An entry of the union schedule this warpgroup skips (at ring position gi): pass the turn;
  // release the stage once both loads landed (the producer re-arms its barriers only after
  // every warp released it).
  FJ_DEVICE void skip(int gi) {
    turns.begin();
    turns.end();
    fj_mbar_wait(sm.bar_k + 8 * (gi % T::kNumStages), (gi / T::kNumStages) & 1);
    fj_mbar_wait(sm.bar_v + 8 * (gi % T::kNumStages), (gi / T::kNumStages) & 1);
    release(gi % T::kNumStages);
  }

  // The mainloop over a union schedule (FjUnionScheduleArgs): entry i is a tile and each
  // warpgroup's status there (absent, partial, full), and each warpgroup's tiles are one run of
  // entries (bounds in the row's header). Every warpgroup takes one turn per entry; outside its
  // run it passes the turn and releases the stage once it has landed. It is such a kernel's
  // only loop (without a block mask: one run of partial tiles); two loops in one kernel cost
  // registers (document_causal spilled 88 B) and compile time. Without a mask_mod (the host
  // then takes no 192-row tiles with a block mask, InputFacts::mask_mod), mainloop_overlap: the
  // union loop measured 401 TFLOP/s there against 431 on noop (docs/kernels/forward_sm90.md
  // "Union schedule").
  // The entries before this warpgroup's run of tiles, the run as mainloop_overlap (S of the
  // first tile alone, then S of a tile with P V of the one before, then the last P V), the
  // entries after it. Every wgmma sits unconditionally in its block: issued or waited for under
  // a runtime condition, ptxas serializes every wgmma of the kernel (noop 317 TFLOP/s against
  // 434); runs found by the tiles' status bits instead of the row's bounds spilled 150-350 B
  // (docs/kernels/forward_sm90.md "Union schedule"). `run`: with kPersistent, this warpgroup's
  // run from the tile slot (begin | end << 16); otherwise the bounds come from the row's header.
  FJ_DEVICE void mainloop_union(const FjSm90QTile& t, const FjKvSchedule& sched, int run) {
    const int num_total = sched.num_total;
    const bool masked = args.mask.kv_num_blocks != nullptr;
    int run_begin = 0, run_end = num_total;
    if constexpr (T::kPersistent) {
      run_begin = run & 0xffff;
      run_end = run >> 16;
    } else if (masked) {
      const int* row = fj_union_row(args.mask, t.b, t.h, t.m_block);
      run_begin = fj_warp_uniform(row[1 + 2 * cw]);
      run_end = fj_warp_uniform(row[2 + 2 * cw]);
      // A KV cache's sequence without keys: no entries (fj_sm90_schedule), so no run.
      if constexpr (kFjKvCache) {
        if (num_total == 0) run_begin = run_end = 0;
      }
    }
    const int shift = kFjUnionStatusShift + 2 * cw;
    auto partial_of = [&](int e) { return !masked || ((e >> shift) & 3) == 1; };
    for (int i = 0; i < run_begin; ++i)
      skip(g + i);
    if constexpr (!kOverlap) {
      // d_v 128 or e4m3: the serial loop over the run (the overlapped one does not fit 160
      // registers there).
      for (int i = run_begin; i < run_end; ++i) {
        const int e = fj_warp_uniform(fj_union_entry(sched, i));
        serial_step(t, g + i, e & kFjUnionTileMask, partial_of(e), false);
      }
    } else if (run_begin < run_end) {
      float alpha[2];
      int e = fj_warp_uniform(fj_union_entry(sched, run_begin));
      int next_e = run_begin + 1 < run_end ? fj_union_entry(sched, run_begin + 1) : 0;  // one ahead
      first_s(t, g + run_begin, e & kFjUnionTileMask, partial_of(e), alpha, false);
      // On a KV cache the tile before (its V may be gathered: gather_fence); without one it
      // stays 0, and the loop is the one measured.
      int prev_tile = kFjKvCache ? e & kFjUnionTileMask : 0;
      // Ring positions from the index here: carried from tile to tile (FjRingPos), as
      // mainloop_overlap does, document_causal at 192 rows spilled 8 B.
      for (int i = run_begin + 1; i < run_end; ++i) {
        e = fj_warp_uniform(next_e);
        if (i + 1 < run_end) next_e = fj_union_entry(sched, i + 1);
        next_s_pv(t, FjRingPos<T::kNumStages>::at(g + i), FjRingPos<T::kNumStages>::at(g + i - 1),
                  e & kFjUnionTileMask, prev_tile, partial_of(e), alpha, false);
        if constexpr (kFjKvCache) prev_tile = e & kFjUnionTileMask;
      }
      last_pv(t, g + run_end - 1, prev_tile);
    }
    for (int i = run_end; i < num_total; ++i)
      skip(g + i);
    release_q();
  }

  // The mainloop with the intra-warpgroup overlap (num_total > 0): tile 0's S only; then S of
  // tile i with P V of tile i - 1; then the last P V.
  FJ_DEVICE void mainloop_overlap(const FjSm90QTile& t, const FjKvSchedule& sched) {
    const int num_total = sched.num_total;
    // Full tiles first (fj_sm90_visit): visit i is the schedule's entry v(i).
    const int v0 = fj_sm90_visit(sched, 0);
    int next_tile = num_total > 1 ? sched.tile(fj_sm90_visit(sched, 1)) : 0;  // one tile ahead
    float alpha[2];
    // On a KV cache the tile before (its V may be gathered); without one it stays 0, and the loop
    // is the one measured.
    int prev_tile = kFjKvCache ? sched.tile(v0) : 0;
    first_s(t, g, sched.tile(v0), v0 < sched.num_partial, alpha, num_total == 1);
    auto pos = FjRingPos<T::kNumStages>::at(g);
    for (int i = 1; i < num_total; ++i) {
      const int tile = next_tile;
      if (i + 1 < num_total) next_tile = sched.tile(fj_sm90_visit(sched, i + 1));
      const auto pos_next = pos.next();
      next_s_pv(t, pos_next, pos, tile, prev_tile, fj_sm90_visit(sched, i) < sched.num_partial,
                alpha, i + 1 == num_total);
      pos = pos_next;
      if constexpr (kFjKvCache) prev_tile = tile;
    }
    last_pv(t, g + num_total - 1, prev_tile);
  }

  // One tile of the loop without the overlap at ring position gi: S, its softmax, then P V.
  // `q_done`: the tile's S is the query tile's last (one Q buffer: release it).
  FJ_DEVICE void serial_step(const FjSm90QTile& t, int gi, int tile, bool partial, bool q_done) {
    const int stage = gi % T::kNumStages;
    const int parity = (gi / T::kNumStages) & 1;
    float alpha[2];
    fj_mbar_wait(sm.bar_k + 8 * stage, parity);
    gather_fence(t, tile, tile);
    turns.begin();
    fj_wgmma_fence();
    issue_qk(stage);
    turns.end();
    load_diagonals(t, tile);
    fj_wgmma_wait<0>();
    fj_fence_regs(s[0]);
    if (q_done) release_q();
    softmax(t, partial, tile * T::kBlockN, alpha);
    rescale_o(alpha);
    pack_p();
    fj_mbar_wait(sm.bar_v + 8 * stage, parity);
    gather_fence(t, tile, tile);
    fj_wgmma_fence();
    issue_pv(stage);
    fj_wgmma_wait<0>();
    fj_fence_regs(o[0]);
    release(stage);
  }

  // The mainloop without the overlap (d_v = 256: S, P and O of two tiles do not fit the
  // registers; nor with three consumers at d_v 128 or e4m3; num_total > 0).
  FJ_DEVICE void mainloop_serial(const FjSm90QTile& t, const FjKvSchedule& sched) {
    const int num_total = sched.num_total;
    int next_tile = sched.tile(fj_sm90_visit(sched, 0));
    for (int i = 0; i < num_total; ++i) {
      const int tile = next_tile;
      if (i + 1 < num_total) next_tile = sched.tile(fj_sm90_visit(sched, i + 1));
      serial_step(t, g + i, tile, fj_sm90_visit(sched, i) < sched.num_partial, i + 1 == num_total);
    }
  }

  // The epilogue of a query tile: O normalized by the row sums, the LSE, O stored.
  FJ_DEVICE void epilogue(const FjSm90QTile& t) {
    constexpr float kLn2 = 0.6931471805599453f;
    // O goes out through this tile's Q buffer (16-byte stores) unless a single buffer already
    // holds the next tile's Q.
    constexpr bool kStaged = T::kQBufs == 2 || !T::kMultiItem;
    if constexpr (kStaged) fj_fence_proxy_async();  // Q rows last read by wgmma
    // The epilogue's rows from the thread index read here: kept across the tile loop, they were
    // the last spills of the document masks at d 128 (the loop needs every register).
    const int etid = fj_tid_here() % 128;
    const int ecw = fj_tid_here() / 128 - 1;
    const int wg_row0 = t.m_start + ecw * 64;  // this warpgroup's first query row
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float sum = row_sum[0][hr];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      float inv = sum == 0.0f ? 0.0f : 1.0f / sum;  // fully masked row: 0, LSE -inf (or sink)
      const int row = wg_row0 + (etid / 32) * 16 + (etid % 32) / 4 + hr * 8;
      float lse = sum == 0.0f ? fj_neg_inf() : row_max[0][hr] * kLn2 + logf(sum);
      if constexpr (kFjHasSinkMod) {
        const float sink = fj_sink_mod(mods, t.b, t.h, fj_imin(row, args.seqlen_q - 1));
        inv = fj_softmax_finish(row_max[0][hr], sum, sink, lse);
      }
      // e4m3: O in units of V's descale factor (the kernel left it in the tile slot; with
      // persistent CTAs the tile's, kTileScale). An e4m3 KV cache (kFjKvFp8): likewise v_scale
      // of the kv head.
      if constexpr (kTileScale) {
        inv *= t.v_scale;
      } else if constexpr (T::kFp8 || kFjKvFp8) {
        inv *= __int_as_float(fj_lds_b32(sm.tile_slot));
      }
      if (args.lse != nullptr && (etid & 3) == 0 && row < args.seqlen_q) {
        args.lse[(fj_i64)t.b * args.lse_stride_b + (fj_i64)t.h * args.lse_stride_h + row] = lse;
      }
      if constexpr (kStaged) {
        // Through shared memory (this warpgroup's Q rows), 16-byte stores below.
        fj_sw128_store_acc_half<typename T::Element, T::kBlockM>(
            t.sq_item, ecw * 64 + (etid / 32) * 16, etid % 32, o[0], hr, inv);
      } else {
        // Straight from the registers: the Q tile is already the next query tile's.
        if (row < args.seqlen_q) {
          unsigned char* out_row =
              static_cast<unsigned char*>(args.out) +
              T::kElemBytes * ((fj_i64)t.b * args.o_stride_b + (fj_i64)t.h * args.o_stride_h +
                               (fj_i64)row * args.o_stride_s + (etid & 3) * 2);
#pragma unroll
          for (int dt = 0; dt < T::kDTiles; ++dt)
            if (dt * 8 < T::kRealV)  // the real columns of O
              T::Mma::store2(out_row + T::kElemBytes * dt * 8, o[0][dt][hr * 2] * inv,
                             o[0][dt][hr * 2 + 1] * inv);
        }
      }
    }
    if constexpr (kStaged && kTmaStore) {
      // This thread's O writes before the copy engine reads them (async proxy), then one
      // thread's stores of the warpgroup's 64 rows, a box per 64 columns of the real head dim;
      // rows past seqlen_q are not written. The buffer's release waits for their reads (run(),
      // at the next tile's start).
      fj_fence_proxy_async();
      fj_bar_sync(1 + ecw, 128);
      if (etid == 0) {
#pragma unroll
        for (int c = 0; c < T::kDimV / 64; ++c) {
          if (c * 64 < T::kRealV) {
            fj_tma_store_4d(&maps.o, t.sq_item + (c * T::kBlockM + ecw * 64) * 128, c * 64, wg_row0,
                            t.h, t.b);
          }
        }
        fj_bulk_commit();
        if constexpr (T::kQBufs == 2 && !kDeferRelease) {
          // The buffer back to the producer once the stores have read it (kDeferRelease).
          fj_bulk_wait_read<0>();
          fj_mbar_arrive_count(sm.bar_qe + 8 * t.u, 4);
        }
      }
    } else if constexpr (kStaged) {
      fj_bar_sync(1 + ecw, 128);
      char* out_tile =
          static_cast<char*>(args.out) +
          T::kElemBytes * ((fj_i64)t.b * args.o_stride_b + (fj_i64)t.h * args.o_stride_h +
                           (fj_i64)wg_row0 * args.o_stride_s);
      fj_sw128_copy_out64<T::kDimV, T::kBlockM, T::kRealV>(out_tile, args.o_stride_s, t.sq_item,
                                                           ecw * 64, wg_row0, args.seqlen_q, etid);
      if constexpr (T::kQBufs == 2) {
        // The buffer's next Q (tile q_item + 2) is a TMA write: order this warp's generic
        // accesses to it before that, then release it.
        fj_fence_proxy_async();
        __syncwarp();
        if ((etid & 31) == 0) fj_mbar_arrive(sm.bar_qe + 8 * t.u);
      }
    }
  }

  // Every query tile of the CTA: its KV tiles by one of the mainloops, then its epilogue.
  FJ_DEVICE void run() {
    turns.start();
    FjSm90ConsumerTiles<T, Cfg> tiles(args, sm);
    int slot_runs[3] = {0, 0, 0};  // kUnion and kPersistent: the tile's runs from its slot
    int b, h, m_block;
    for (int q_item = 0;; ++q_item) {
      if constexpr (kDeferRelease) {
        // The previous tile's O stores (epilogue) have read its Q buffer once this thread's bulk
        // group is read: the buffer goes back to the producer, one arrival per warp of the
        // warpgroup (the Q-empty barrier's count). Before the tile slot's wait: the producer's
        // next Q into it (or its end of tiles) waits for this.
        if (q_item > 0 && wtid == 0) {
          fj_bulk_wait_read<0>();
          fj_mbar_arrive_count(sm.bar_qe + 8 * sm.q_buf(q_item - 1), 4);
        }
      }
      const int u = sm.q_buf(q_item);
      if constexpr (T::kPersistent) {
        // The producer's tile for this Q buffer (stored with its Q, on the same barrier).
        const int code = tiles.wait_slot(q_item, u);
        if (code < 0) break;
        tiles.take(u, code, b, h, m_block, slot_runs);
      } else {
        if (!tiles.items.next(args, b, h, m_block)) break;
      }
      const int m_start = m_block * T::kBlockM;
      const fj_u32 sq_item = sm.sq + u * T::kQBytes;
      sq_wg = sq_item + cw * 64 * 128;
      // On a KV cache the sequence's length (one load per query tile), else seqlen_kv.
      const int kv_len = kFjKvCache ? cache.length(args, b) : 0;
      const FjKvSchedule sched =
          tiles.schedule(b, h, m_block, kFjKvCache ? kv_len : args.seqlen_kv, slot_runs);
      // The thread's first row. With a column load (document masks) its lane part is taken
      // here (warp * 16 + lane / 4 = wtid / 4 + warp * 8): computed once at the kernel's start,
      // it was spilled and reloaded once per query tile (document_causal at 192 rows, 4 B at
      // d 64). With persistent CTAs (kRowFromTid) all of it comes from the thread index where
      // the row is used (row0): taken from it here, at the tile's start, the row still spilled
      // at d 128 (12 B). At d <= 64 with `divisible` the thread-index form spilled 12 B and this
      // one none, so those persistent kernels keep this one; one CTA per tile took 8 -> 32 B in
      // the thread-index form (docs/kernels/forward_sm90.md "The mask_mod's column load"). The
      // other kernels keep the form they were measured with.
      const int q_row0 = !kFjColLoad   ? m_start + cw * 64 + warp * 16 + (lane >> 2)
                         : kRowFromTid ? 0  // row0(), where used
                                       : m_start + cw * 64 + fj_here(wtid >> 2) + (wtid >> 5) * 8;
      const int dl_row0 = m_start + cw * 64 + warp * 16;  // this warp's first query row
      float scale = 0.0f, v_scale = 0.0f;                 // kTileScale
#if defined(FJ_FWD_FP8)
      if constexpr (kTileScale) {
        const int h_kv = h / Cfg::kGqaRatio;
        scale = args.scale * fj_fp8_descale(fp8.q_descale, fp8.q_descale_stride, h) *
                fj_fp8_descale(fp8.k_descale, fp8.k_descale_stride, h_kv);
        v_scale = fj_fp8_descale(fp8.v_descale, fp8.v_descale_stride, h_kv);
      }
#endif
      const FjSm90QTile t{b,      h,       m_block, u,     m_start, sq_item,
                          q_row0, dl_row0, kv_len,  scale, v_scale};
#pragma unroll
      for (int dt = 0; dt < T::kDTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          o[0][dt][e] = 0.0f;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        row_max[0][hr] = fj_neg_inf();
        row_sum[0][hr] = 0.0f;
      }
      if constexpr (!T::kPersistent) fj_mbar_wait(sm.bar_q + 8 * u, sm.q_uses(q_item) & 1);
      if constexpr (kUnion) {
        // kPersistent: this warpgroup's run of entries from the slot (selected here: selected in
        // mainloop_union, the kernel compiled differently).
        mainloop_union(t, sched, cw == 0 ? slot_runs[0] : cw == 1 ? slot_runs[1] : slot_runs[2]);
      } else if (sched.num_total == 0) {
        release_q();
      } else if constexpr (kOverlap) {
        mainloop_overlap(t, sched);
      } else {
        mainloop_serial(t, sched);
      }
      g += sched.num_total;
      epilogue(t);
    }
    turns.finish();  // the last warpgroup's last hand-over
    // The last tile's O stores complete before the CTA (and its shared memory) is gone.
    if (kTmaStore && wtid == 0) fj_bulk_wait_all();
  }
};

// The forward kernel: the CTA's shared memory and barriers, then warpgroup 0 as the producer and
// the others as consumers (the header describes the design).
// On a KV cache (FJ_FWD_KV_CACHE) it takes the cache's table and lengths as a fourth parameter.
extern "C" __global__ void __launch_bounds__((FjConfig::kBlockM / 64 + 1) * 128, 1)
#if defined(FJ_FWD_KV_FP8)
    flexjit_forward(const FjFwdArgs args_in, const FjModParams mods,
                    const __grid_constant__ FjFwdTmaMaps maps, const FjKvCacheArgs kv_cache,
                    const FjFwdKvFp8Args kv_fp8) {
  const FjFp8Args fp8 = {nullptr, nullptr, nullptr, 0, 0, 0};  // no e4m3 q, k, v: never read
  // One query tile, so one (b, h), per CTA (grid (m blocks, Hq, B)): k_scale of the kv head folds
  // into the scale, so that the mods see the score of the dequantized keys.
  FjFwdArgs args = args_in;
  args.scale *= __ldg(kv_fp8.k_scale + blockIdx.y / FjConfig::kGqaRatio);
#elif defined(FJ_FWD_KV_CACHE)
    flexjit_forward(const FjFwdArgs args, const FjModParams mods,
                    const __grid_constant__ FjFwdTmaMaps maps, const FjKvCacheArgs kv_cache) {
  const FjFp8Args fp8 = {nullptr, nullptr, nullptr, 0, 0, 0};  // no e4m3 q, k, v: never read
#elif defined(FJ_FWD_FP8)
    flexjit_forward(const FjFwdArgs args_in, const FjModParams mods,
                    const __grid_constant__ FjFwdTmaMaps maps, const FjFp8Args fp8) {
  const FjKvCacheArgs kv_cache = {nullptr, 0, nullptr};  // no KV cache: never read
  // One query tile, so one (b, h), per CTA (grid (m blocks, Hq, B)): q's and k's descale factors
  // fold into the scale, so that the score is the real q·k times the scale (mods unchanged).
  // Persistent CTAs take each tile's (FjSm90Consumer::kTileScale).
  FjFwdArgs args = args_in;
  if constexpr (FjConfig::kPersistent == 0) {
    args.scale *=
        fj_fp8_descale(fp8.q_descale, fp8.q_descale_stride, blockIdx.y) *
        fj_fp8_descale(fp8.k_descale, fp8.k_descale_stride, blockIdx.y / FjConfig::kGqaRatio);
  }
#else
    flexjit_forward(const FjFwdArgs args, const FjModParams mods,
                    const __grid_constant__ FjFwdTmaMaps maps) {
  const FjKvCacheArgs kv_cache = {nullptr, 0, nullptr};        // no KV cache: never read
  const FjFp8Args fp8 = {nullptr, nullptr, nullptr, 0, 0, 0};  // no e4m3 q, k, v: never read
#endif
  using T = FjSm90Traits<FjConfig>;
  using Cfg = FjConfig;
  extern __shared__ unsigned char fj_smem_raw[];
  const FjSm90Smem<T> sm(fj_smem_addr(fj_smem_raw));
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) sm.init_barriers();
#if defined(FJ_FWD_FP8)
  // V's factor for the epilogue, in the tile slot (one CTA per tile; persistent CTAs take each
  // tile's, kTileScale, and the slot carries the tile).
  if (FjConfig::kPersistent == 0 && tid == 0) {
    fj_sts_b32(sm.tile_slot, __float_as_int(fj_fp8_descale(fp8.v_descale, fp8.v_descale_stride,
                                                           blockIdx.y / FjConfig::kGqaRatio)));
  }
#elif defined(FJ_FWD_KV_FP8)
  // v_scale of the kv head for the epilogue, in the tile slot (unused without persistent CTAs).
  if (tid == 0) {
    fj_sts_b32(sm.tile_slot,
               __float_as_int(__ldg(kv_fp8.v_scale + blockIdx.y / FjConfig::kGqaRatio)));
  }
#endif
  __syncthreads();

  if (wg == 0) {
    fj_setmaxnreg_dec<T::kProducerRegs>();
    // One thread (as `tid == 0`: the compiler then knows the work counter's atomic is one
    // thread's), or on a KV cache the warpgroup's 128 loaders.
    if (T::kLoaders == 1 ? tid == 0 : tid < T::kLoaders) {
      FjSm90Producer<T, Cfg>(args, maps, sm, kv_cache, tid).run();
    }
    return;
  }
  fj_setmaxnreg_inc<T::kConsumerRegs>();
  float o[1][T::kDTiles][4];
  float row_max[1][2];
  float row_sum[1][2];
  fj_u32 pa[T::kPSteps][4];
  float s[1][T::kNTiles][4];
  FjDiagLoads<T::kNTiles> dl;
  FjSm90Consumer<T, Cfg>(args, mods, fp8, maps, sm, kv_cache, tid, wg, o, row_max, row_sum, pa, s,
                         dl)
      .run();
}

#endif  // FLEXJIT_FORWARD_SM90_CUH_
