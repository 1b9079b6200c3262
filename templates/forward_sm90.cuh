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
// Shared memory (dynamic, aligned here to 1024 bytes; fj_forward_sm90_smem_bytes):
//   Q tile kBlockM x max(kHeadDimQK, kHeadDimV) (reused for the O tile), kNumStages K tiles
//   (kBlockN x kHeadDimQK), kNumStages V tiles (kBlockN x kHeadDimV), and the mbarriers. The
//   tile indices are not passed through shared memory: every consumer reads them from the block
//   mask itself, one tile ahead.
#ifndef FLEXJIT_FORWARD_SM90_CUH_
#define FLEXJIT_FORWARD_SM90_CUH_

template <class Cfg>
struct FjSm90Traits {
  using Element = typename Cfg::Element;
  using Mma = FjMma<Element>;
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr int kNumStages = Cfg::kNumStages;
  static constexpr int kDimQK = Cfg::kHeadDimQK;
  static constexpr int kDimV = Cfg::kHeadDimV;
  static constexpr int kConsumers = kBlockM / 64;
  static constexpr int kThreads = (kConsumers + 1) * 128;
  static constexpr int kMTiles = 1;            // one m16 row block per warp
  static constexpr int kNTiles = kBlockN / 8;  // n8 fragments of S
  static constexpr int kDTiles = kDimV / 8;    // n8 fragments of O
  static constexpr int kElemBytes = 2;
  static constexpr int kDimQO = kDimQK > kDimV ? kDimQK : kDimV;
  static constexpr int kQBytes = kBlockM * kDimQO * kElemBytes;
  static constexpr int kQLoadBytes = kBlockM * kDimQK * kElemBytes;
  static constexpr int kKBytes = kBlockN * kDimQK * kElemBytes;
  static constexpr int kVBytes = kBlockN * kDimV * kElemBytes;
  static constexpr int kOffK = kQBytes;
  static constexpr int kOffV = kOffK + kNumStages * kKBytes;
  static constexpr int kOffBar = kOffV + kNumStages * kVBytes;
  static constexpr int kOffEnd = kOffBar + 8 * (2 + 3 * kNumStages);
  // Query tiles per CTA (FjConfig::kQTiles): 1, or 2 (m blocks N - 1 - j and j of CTA j).
  static constexpr int kQTiles = Cfg::kQTiles;
  // Register split (65536 per SM, one CTA): the producer keeps few, the consumers take the rest
  // (FlashAttention-3's 24 / 240 with two consumer warpgroups, 32 / 160 with three).
  static constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;

  static_assert(sizeof(Element) == 2, "flexjit forward_sm90: bf16 or f16 elements");
  static_assert(kConsumers == 2 || kConsumers == 3, "flexjit forward_sm90: kBlockM is 128 or 192");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 256,
                "flexjit forward_sm90: kBlockN must be a multiple of 16 up to 256");
  static_assert(kDimQK % 64 == 0 && kDimV % 64 == 0 && kDimV <= 256,
                "flexjit forward_sm90: head dims must be multiples of 64 (v at most 256)");
  static_assert(kNumStages >= 1 && kNumStages <= 4, "flexjit forward_sm90: 1..4 stages");
  static_assert(kQTiles == 1 || kQTiles == 2, "flexjit forward_sm90: 1 or 2 query tiles per CTA");
  static_assert(kOffEnd + 1024 == fj_forward_sm90_smem_bytes(kBlockM, kBlockN, kDimQK, kDimV,
                                                             kElemBytes, kNumStages),
                "flexjit forward_sm90: shared-memory layout and fj_forward_sm90_smem_bytes "
                "disagree");
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536,
                "flexjit forward_sm90: register split exceeds the register file");
};

// The scores of a tile for fj_sm90_softmax (the log2-domain factor left out: the softmax folds
// it into its FFMA). kRaw (no mod to call on this tile and a scale > 0): the raw q·k, no
// per-score work, the softmax multiplies by scale · log2(e); otherwise score_mod(q·k · scale)
// (or q·k · scale), the mask_mod on partial tiles, and the softmax multiplies by log2(e). Keys
// past seqlen_kv become -inf either way. Same indices as fj_scores (forward_common.cuh).
// kDl: the score_mod's diagonal load (kFjDiagLoad) comes from the warp's loads in `dl`.
template <class Cfg, class T, bool kApplyMask, bool kRaw, bool kDl>
FJ_DEVICE void fj_sm90_scores(float (&s)[1][T::kNTiles][4], const FjFwdArgs& args,
                              const FjModParams& mods, int b, int h, int q_row0, int n_start,
                              int kv_col0, const FjDiagLoads<T::kNTiles>& dl, int lane) {
  if constexpr (!kRaw) {
    const float scale = args.scale;
    // Mods only ever see in-range indices (their buffer loads stay in bounds); rows past
    // seqlen_q are computed on a clamped index and never written.
    auto row_index = [&](int hr) {
      const int q_idx = q_row0 + hr * 8;
      return Cfg::kIsDivisible ? q_idx : fj_imin(q_idx, args.seqlen_q - 1);
    };
    auto element = [&](int hr, int q_idx, int nt, int c, float dl_value) {
      int kv_idx = kv_col0 + nt * 8 + c;
      if constexpr (!Cfg::kIsDivisible) kv_idx = fj_imin(kv_idx, args.seqlen_kv - 1);
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
  if constexpr (!Cfg::kIsDivisible) {
    // Keys past seqlen_kv (zero-filled in shared memory) must not take part.
    if (n_start + T::kBlockN > args.seqlen_kv) {
#pragma unroll
      for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (kv_col0 + nt * 8 + (e & 1) >= args.seqlen_kv) s[0][nt][e] = fj_neg_inf();
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

// The query tile (m block) that CTA blockIdx.x computes as its item-th of n_items (kQTiles):
// with one tile per CTA, the heaviest first (causal); with two, CTA j takes m blocks N - 1 - j
// and j, whose causal KV ranges add up to the same number of tiles for every CTA.
template <class T>
struct FjQTiles {
  int num_m;  // query tiles of a head: ceil(seqlen_q / kBlockM)
  int j;      // blockIdx.x
  FJ_DEVICE explicit FjQTiles(int seqlen_q)
      : num_m((seqlen_q + T::kBlockM - 1) / T::kBlockM), j(blockIdx.x) {}
  FJ_DEVICE int count() const {
    if constexpr (T::kQTiles == 1) return 1;
    return num_m - 1 - j > j ? 2 : 1;
  }
  FJ_DEVICE int m_block(int item) const {
    if constexpr (T::kQTiles == 1) return num_m - 1 - j;
    return item == 0 ? num_m - 1 - j : j;
  }
};

extern "C" __global__ void __launch_bounds__((FjConfig::kBlockM / 64 + 1) * 128, 1)
    flexjit_forward(const FjFwdArgs args, const FjModParams mods,
                    const __grid_constant__ FjFwdTmaMaps maps) {
  using T = FjSm90Traits<FjConfig>;
  using Cfg = FjConfig;
  extern __shared__ unsigned char fj_smem_raw[];
  // The 128-byte swizzle repeats every 1024 bytes: tiles start on such a boundary.
  const fj_u32 smem_base = (fj_smem_addr(fj_smem_raw) + 1023u) & ~1023u;
  const fj_u32 sq = smem_base;
  const fj_u32 sk = smem_base + T::kOffK;
  const fj_u32 sv = smem_base + T::kOffV;
  // Q full at bar_q, Q empty (every consumer warp is done with the Q tile) at bar_qe; per stage
  // s: K full at bar_k + 8s, V full at bar_v + 8s, KV empty at bar_e + 8s.
  const fj_u32 bar_q = smem_base + T::kOffBar;
  const fj_u32 bar_qe = bar_q + 8;
  const fj_u32 bar_k = bar_qe + 8;
  const fj_u32 bar_v = bar_k + 8 * T::kNumStages;
  const fj_u32 bar_e = bar_v + 8 * T::kNumStages;

  const FjQTiles<T> qtiles(args.seqlen_q);
  const int n_items = qtiles.count();
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int h_kv = h / Cfg::kGqaRatio;

  if (tid == 0) {
    fj_mbar_init(bar_q, 1);
    fj_mbar_init(bar_qe, 4 * T::kConsumers);  // lane 0 of every consumer warp
#pragma unroll
    for (int s = 0; s < T::kNumStages; ++s) {
      fj_mbar_init(bar_k + 8 * s, 1);
      fj_mbar_init(bar_v + 8 * s, 1);
      fj_mbar_init(bar_e + 8 * s, 4 * T::kConsumers);  // lane 0 of every consumer warp
    }
    fj_mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----
    fj_setmaxnreg_dec<T::kProducerRegs>();
    if (tid == 0) {
      fj_tma_prefetch_desc(&maps.q);
      fj_tma_prefetch_desc(&maps.k);
      fj_tma_prefetch_desc(&maps.v);
      int g = 0;  // KV tiles loaded so far, over every query tile: the ring position
      for (int item = 0; item < n_items; ++item) {
        const int m_block = qtiles.m_block(item);
        const FjKvSchedule sched = fj_block_schedule<T::kBlockM, T::kBlockN, Cfg::kHasFullBlocks>(
            args.mask, args.seqlen_kv, b, h, m_block);
        // The next Q tile once the consumers' last S = Q K^T of the previous one is done: it
        // arrives while they finish that tile's P V and epilogue.
        if (item > 0) fj_mbar_wait(bar_qe, (item - 1) & 1);
        fj_mbar_arrive_expect_tx(bar_q, T::kQLoadBytes);
        fj_tma_load_tile<T::kDimQK, T::kBlockM>(sq, &maps.q, m_block * T::kBlockM, h, b, bar_q);
        int next_tile = sched.num_total > 0 ? sched.tile(0) : 0;
        for (int i = 0; i < sched.num_total; ++i, ++g) {
          const int tile = next_tile;
          if (i + 1 < sched.num_total) next_tile = sched.tile(i + 1);
          const int stage = g % T::kNumStages;
          if (g >= T::kNumStages) fj_mbar_wait(bar_e + 8 * stage, ((g / T::kNumStages) & 1) ^ 1);
          // A tile past the end of a ragged sparse block reads as zeros (TMA fills what lies
          // outside the tensor and still counts the whole box) and the consumers mask it.
          const int n_start = tile * T::kBlockN;
          fj_mbar_arrive_expect_tx(bar_k + 8 * stage, T::kKBytes);
          fj_tma_load_tile<T::kDimQK, T::kBlockN>(sk + stage * T::kKBytes, &maps.k, n_start, h_kv,
                                                  b, bar_k + 8 * stage);
          fj_mbar_arrive_expect_tx(bar_v + 8 * stage, T::kVBytes);
          fj_tma_load_tile<T::kDimV, T::kBlockN>(sv + stage * T::kVBytes, &maps.v, n_start, h_kv, b,
                                                 bar_v + 8 * stage);
        }
      }
    }
    return;
  }

  // ---- consumers ----
  fj_setmaxnreg_inc<T::kConsumerRegs>();
  const int cw = wg - 1;  // consumer warpgroup: query rows [64 cw, 64 cw + 64) of the tile
  const int wtid = tid % 128;
  const int warp = wtid / 32;
  const int lane = tid % 32;
  const fj_u32 sq_wg = sq + cw * 64 * 128;

  float o[1][T::kDTiles][4];
  float row_max[1][2];
  float row_sum[1][2];

  // Ping-pong: warpgroup c may issue wgmma after a bar.sync on kSchedBar + c, and hands the turn
  // to the other with a bar.arrive on its barrier (256 threads: 128 syncing, 128 arriving). One
  // turn per tile, over every query tile of the CTA; warpgroup 0 goes first (warpgroup 1's
  // arrival below), and consumes warpgroup 1's last hand-over at the end, so that no arrival is
  // left pending when the CTA exits.
  constexpr int kSchedBar = 3;  // 1, 2: the epilogue's per-warpgroup barriers
  constexpr bool kPingPong = T::kConsumers == 2;
  // Intra-warpgroup overlap: S of tile i and P V of tile i - 1 issued in one turn (S of tile i,
  // P of tile i - 1 and O live at once: too many registers with d_v = 256).
  constexpr bool kOverlap = T::kDimV <= 128;
  if (kPingPong && cw == 1) fj_bar_arrive(kSchedBar, 256);

  fj_u32 pa[T::kBlockN / 16][4];  // P of the previous tile, the A operand of its P V
  float s[1][T::kNTiles][4];
  // S = Q K^T of a stage: k16 steps over the head dim, 64-element chunks of Q and K.
  // Q's descriptors are the same for every tile; kept in registers across the loop they take
  // 2 * kDimQK / 16 of them, and they were what spilled first in kernels whose score_mod loads
  // buffers (relative_bias_causal d 128: 64 of its 72 B). With a score_mod they are rebuilt
  // every tile from an address the compiler cannot hoist (one add per k16 step: a descriptor's
  // low bits are address >> 4). relative_bias_causal still spilled then (the 64 bias loads of a
  // tile in flight: d 128 80 B, d 64 20 B), until its bias was read once per diagonal (kDl).
  constexpr bool kRebuildQDesc = Cfg::kHasScoreMod;
  auto issue_qk = [&](int stage) {
    const fj_u32 sk_stage = sk + stage * T::kKBytes;
    fj_u32 q_base = sq_wg;
    if constexpr (kRebuildQDesc) asm volatile("mov.b32 %0, %1;\n" : "=r"(q_base) : "r"(sq_wg));
    const fj_u64 da0 = fj_smem_desc_sw128(q_base, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < T::kDimQK / 16; ++kk) {
      const int chunk = kk / 4, sub = kk % 4;
      const fj_u64 da = da0 + (fj_u64)((chunk * T::kBlockM * 128 + sub * 32) >> 4);
      const fj_u64 db =
          fj_smem_desc_sw128(sk_stage + chunk * T::kBlockN * 128 + sub * 32, 16, 1024);
      fj_wgmma_ss(s[0], da, db, kk > 0 ? 1 : 0);
    }
    fj_wgmma_commit();
  };
  // O += P V of a stage: V MN-major, 64-element chunks of the head dim LBO apart; the C
  // fragments of n8 tiles 2j, 2j+1 of S are the A fragment of k16 step j.
  auto issue_pv = [&](int stage) {
    const fj_u32 sv_stage = sv + stage * T::kVBytes;
#pragma unroll
    for (int j = 0; j < T::kBlockN / 16; ++j) {
      const fj_u64 dv = fj_smem_desc_sw128(sv_stage + j * 16 * 128, T::kBlockN * 128, 1024);
      fj_wgmma_rs(o[0], pa[j], dv, 1);
    }
    fj_wgmma_commit();
  };
  // The score_mod's diagonal load (kFjDiagLoad: bias[f(q_idx - kv_idx)]), once per
  // diagonal of the warp's 16 x kBlockN fragment instead of once per score: load_diagonals(tile)
  // (per query tile, below) issues the loads into registers before the tile's S is waited for,
  // and each score takes its value from the lane that loaded it (FjDiagLoads::shuffled; no
  // shared memory).
  constexpr bool kDl = Cfg::kHasScoreMod && kFjDiagLoad;
  FjDiagLoads<T::kNTiles> dl;
  // Skipped by the whole warp when none of its rows moved its reference (fj_sm90_softmax).
  auto rescale_o = [&](const float(&alpha)[2]) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
      fj_rescale_row<T>(o, 0, 0, alpha[0]);
      fj_rescale_row<T>(o, 0, 1, alpha[1]);
    }
  };
  auto pack_p = [&] { fj_wgmma_pack_a<typename T::Element>(pa, s[0]); };
  auto release = [&](int stage) {
    __syncwarp();
    if (lane == 0) fj_mbar_arrive(bar_e + 8 * stage);
  };
  // This warp is done with the Q tile (its last S = Q K^T has completed).
  auto release_q = [&] {
    __syncwarp();
    if (lane == 0) fj_mbar_arrive(bar_qe);
  };
  auto turn_begin = [&] {
    if (kPingPong) fj_bar_sync(kSchedBar + cw, 256);
  };
  auto turn_end = [&] {
    if (kPingPong) fj_bar_arrive(kSchedBar + (cw ^ 1), 256);
  };

  int g = 0;  // KV tiles consumed so far, over every query tile: the ring position
  for (int item = 0; item < n_items; ++item) {
    const int m_block = qtiles.m_block(item);
    const int m_start = m_block * T::kBlockM;
    const FjKvSchedule sched = fj_block_schedule<T::kBlockM, T::kBlockN, Cfg::kHasFullBlocks>(
        args.mask, args.seqlen_kv, b, h, m_block);
    const int q_row0 = m_start + cw * 64 + warp * 16 + (lane >> 2);
    const int dl_row0 = m_start + cw * 64 + warp * 16;  // this warp's first query row
    auto load_diagonals = [&](int tile) {
      if constexpr (kDl) {
        const int n_start = tile * T::kBlockN;
        // q_idx - kv_idx = (dl_row0 + row) - (n_start + col) = (dl_row0 - n_start) - k.
        dl.issue(mods, b, h, dl_row0 - n_start, -1, args.seqlen_q - dl_row0,
                 args.seqlen_kv - n_start, lane);
      }
    };
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
    // Scores and online softmax of tile i (S in s, turned into P in place); the factors by which
    // O must be rescaled are left in alpha.
    auto softmax = [&](int i, int n_start, float(&alpha)[2]) {
      constexpr float kLog2e = 1.4426950408889634f;
      const int kv_col0 = n_start + (lane & 3) * 2;
      const bool partial = i < sched.num_partial;
      float c = kLog2e;
      if (!Cfg::kHasScoreMod && !(Cfg::kHasMaskMod && partial) && args.scale > 0.0f) {
        // No mod to call on this tile: the scale goes into the exponent's factor too.
        fj_sm90_scores<Cfg, T, false, true, false>(s, args, mods, b, h, q_row0, n_start, kv_col0,
                                                   dl, lane);
        c = args.scale * kLog2e;
      } else if (partial) {
        fj_sm90_scores<Cfg, T, true, false, kDl>(s, args, mods, b, h, q_row0, n_start, kv_col0, dl,
                                                 lane);
      } else {
        fj_sm90_scores<Cfg, T, false, false, kDl>(s, args, mods, b, h, q_row0, n_start, kv_col0, dl,
                                                  lane);
      }
      fj_sm90_softmax<T>(s, row_max, row_sum, alpha, c);
    };

    const int num_total = sched.num_total;
    fj_mbar_wait(bar_q, item & 1);
    if (num_total == 0) {
      release_q();
    } else if constexpr (kOverlap) {
      // Tile 0: S only.
      int tile = sched.tile(0);
      int next_tile = num_total > 1 ? sched.tile(1) : 0;  // read one tile ahead
      float alpha[2];
      fj_mbar_wait(bar_k + 8 * (g % T::kNumStages), (g / T::kNumStages) & 1);
      turn_begin();
      fj_wgmma_fence();
      issue_qk(g % T::kNumStages);
      turn_end();
      load_diagonals(tile);
      fj_wgmma_wait<0>();
      fj_fence_regs(s[0]);
      if (num_total == 1) release_q();
      softmax(0, tile * T::kBlockN, alpha);  // O is still zero: no rescale
      pack_p();
      // Tile i: S of tile i and P V of tile i - 1 issued together; the softmax of tile i runs
      // while the tensor cores multiply P V, and O is rescaled once that is done.
      for (int i = 1; i < num_total; ++i) {
        tile = next_tile;
        if (i + 1 < num_total) next_tile = sched.tile(i + 1);
        const int gi = g + i;
        const int stage = gi % T::kNumStages;
        const int prev = (gi - 1) % T::kNumStages;
        fj_mbar_wait(bar_k + 8 * stage, (gi / T::kNumStages) & 1);
        fj_mbar_wait(bar_v + 8 * prev, ((gi - 1) / T::kNumStages) & 1);
        turn_begin();
        fj_wgmma_fence();
        issue_qk(stage);
        issue_pv(prev);
        turn_end();
        load_diagonals(tile);
        fj_wgmma_wait<1>();
        fj_fence_regs(s[0]);
        softmax(i, tile * T::kBlockN, alpha);
        // ptxas places this wait at the top of the softmax's basic block, so the softmax runs
        // after P V rather than under it; the ping-pong of the two consumers keeps the tensor
        // cores busy meanwhile. Forcing the wait below the softmax (a never-taken branch on its
        // row sums) measured 2-4 % slower (docs/perf/NOTES.md v12).
        fj_wgmma_wait<0>();
        fj_fence_regs(o[0]);
        if (i + 1 == num_total) release_q();
        release(prev);
        rescale_o(alpha);
        pack_p();
      }
      // The last tile's P V.
      const int gl = g + num_total - 1;
      const int last = gl % T::kNumStages;
      fj_mbar_wait(bar_v + 8 * last, (gl / T::kNumStages) & 1);
      fj_wgmma_fence();
      issue_pv(last);
      fj_wgmma_wait<0>();
      fj_fence_regs(o[0]);
      release(last);
    } else {
      // Without the overlap (d_v = 256: S, P and O of two tiles do not fit the registers).
      int next_tile = sched.tile(0);
      for (int i = 0; i < num_total; ++i) {
        const int tile = next_tile;
        if (i + 1 < num_total) next_tile = sched.tile(i + 1);
        const int gi = g + i;
        const int stage = gi % T::kNumStages;
        const int parity = (gi / T::kNumStages) & 1;
        float alpha[2];
        fj_mbar_wait(bar_k + 8 * stage, parity);
        turn_begin();
        fj_wgmma_fence();
        issue_qk(stage);
        turn_end();
        load_diagonals(tile);
        fj_wgmma_wait<0>();
        fj_fence_regs(s[0]);
        if (i + 1 == num_total) release_q();
        softmax(i, tile * T::kBlockN, alpha);
        rescale_o(alpha);
        pack_p();
        fj_mbar_wait(bar_v + 8 * stage, parity);
        fj_wgmma_fence();
        issue_pv(stage);
        fj_wgmma_wait<0>();
        fj_fence_regs(o[0]);
        release(stage);
      }
    }
    g += num_total;

    // ---- epilogue: normalize, LSE, O ----
    constexpr float kLn2 = 0.6931471805599453f;
    if constexpr (T::kQTiles == 1) fj_fence_proxy_async();  // Q rows last read by wgmma
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float sum = row_sum[0][hr];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;  // fully masked row: 0, LSE -inf
      const int row = q_row0 + hr * 8;
      if (args.lse != nullptr && (lane & 3) == 0 && row < args.seqlen_q) {
        const float lse = sum == 0.0f ? fj_neg_inf() : row_max[0][hr] * kLn2 + logf(sum);
        args.lse[(fj_i64)b * args.lse_stride_b + (fj_i64)h * args.lse_stride_h + row] = lse;
      }
      if constexpr (T::kQTiles == 1) {
        // Through shared memory (this warpgroup's Q rows), 16-byte stores below.
        fj_sw128_store_acc_half<typename T::Element, T::kBlockM>(sq, cw * 64 + warp * 16, lane,
                                                                 o[0], hr, inv);
      } else {
        // Straight from the registers: the Q tile is already the next query tile's.
        if (row < args.seqlen_q) {
          unsigned char* out_row =
              static_cast<unsigned char*>(args.out) +
              T::kElemBytes * ((fj_i64)b * args.o_stride_b + (fj_i64)h * args.o_stride_h +
                               (fj_i64)row * args.o_stride_s + (lane & 3) * 2);
#pragma unroll
          for (int dt = 0; dt < T::kDTiles; ++dt)
            T::Mma::store2(out_row + T::kElemBytes * dt * 8, o[0][dt][hr * 2] * inv,
                           o[0][dt][hr * 2 + 1] * inv);
        }
      }
    }
    if constexpr (T::kQTiles == 1) {
      fj_bar_sync(1 + cw, 128);
      char* out_tile = static_cast<char*>(args.out) +
                       T::kElemBytes * ((fj_i64)b * args.o_stride_b + (fj_i64)h * args.o_stride_h +
                                        (fj_i64)(m_start + cw * 64) * args.o_stride_s);
      fj_sw128_copy_out64<T::kDimV, T::kBlockM>(out_tile, args.o_stride_s, sq, cw * 64,
                                                m_start + cw * 64, args.seqlen_q, wtid);
    }
  }
  if (kPingPong && cw == 0) fj_bar_sync(kSchedBar, 256);  // warpgroup 1's last hand-over
}

#endif  // FLEXJIT_FORWARD_SM90_CUH_
