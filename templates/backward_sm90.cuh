// flexjit backward attention kernels for sm_90a (Hopper): TMA loads, wgmma, warp specialization.
// docs/kernels/backward_sm90.md has the design.
//
// Spliced last, after flexjit_abi.h, prelude.cuh, the generated FjConfig, mods, mod gradients
// and wgmma wrappers, mma_sm80.cuh (16-bit packing), attention_sm80.cuh (the block schedule),
// backward_sm80.cuh (fj_bwd_element, the element step shared with the sm_80 kernels; its entry
// points need FJ_BWD_* defines, which these modules do not set) and wgmma_sm90.cuh. One module
// holds one entry point:
//
//   flexjit_bwd_dkdv (FJ_BWD_SM90_DKDV): one CTA per KV tile of kBlockN = 128 keys of one
//       (batch, kv head); warpgroup 0 produces, warpgroups 1 and 2 (64 kv rows each) consume.
//       K and V are loaded once; for every q head of the GQA group and every q tile of kBlockM
//       rows that the transposed block mask lists (partial tiles apply mask_mod), the producer
//       streams Q, dO (TMA) and the tile's lse2 and delta (bulk copies) into a kNumStages ring,
//       and each consumer computes, for its 64 kv rows:
//         S^T = K Q^T, dP^T = V dO^T   wgmma, both operands in shared memory, K-major
//         P^T, dS^T                    fj_bwd_element on the accumulator fragments (buffer
//                                      gradients go out here)
//         dV += P^T dO, dK += dS^T Q   wgmma, A from registers, B (dO, Q) MN-major
//         dQ (kDqAtomic, the default)  dS^T to shared memory, dQ = dS K (half the columns per
//                                      consumer, both operands MN-major), f32 bulk reductions
//                                      into the workspace's accumulator (docs/kernels/
//                                      backward_sm90.md "dQ inside the dK/dV kernel")
//       then releases the stage. dK (times scale) and dV go out through the consumer's own
//       rows of the K and V tiles.
//   flexjit_bwd_dq (FJ_BWD_SM90_DQ): one CTA per q tile of kBlockM = 128 rows of one (batch,
//       q head), the forward's schedule over the block mask's KV tiles: Q and dO loaded once,
//       K and V per tile into the ring; consumer c (64 q rows) computes S = Q K^T,
//       dP = dO V^T (both K-major), dS, and dQ += dS K (dS from registers, K MN-major).
// The wgmma accumulator of m64nN is the m16n8 fragment of mma.sync repeated N / 8 times for
// each warp's 16 rows, so the sm_80 element step runs on it unchanged: thread (g, t) holds rows
// g, g + 8 of its warp's 16 and columns 8j + 2t, 8j + 2t + 1. No overlap between the GEMMs and
// the element step inside a warpgroup in this first version (every group of wgmma is waited for
// at once); between the two consumers, ping-pong turns (FjBwdTurns).
// Head dims: kHeadDimQK / kHeadDimV (kDimQK / kDimV) are tile dims (64 or 128), the layouts
// widths; the problem's own kRealDimQK / kRealDimV (multiples of 8, at most 56 below the tile)
// are what the TMA tensor maps span, so the padded columns of Q, K, V, dO load as zeros (and
// add nothing to S, dP, dK, dV, dQ), S^T / dP^T (S / dP) issue only the k16 steps holding real
// columns, and dK, dV, dQ go out with their real columns only (docs/kernels/backward_sm90.md
// "Head dims").
// Shared memory (dynamic, aligned here to 1024 bytes; fj_bwd_*_sm90_smem_bytes in
// flexjit_abi.h): 128-byte swizzled tiles (wgmma_sm90.cuh), then the f32 arrays, then the
// mbarriers.
#ifndef FLEXJIT_BACKWARD_SM90_CUH_
#define FLEXJIT_BACKWARD_SM90_CUH_

template <class Cfg>
struct FjBwdSm90Traits {
  using Element = typename Cfg::Element;
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr int kNumStages = Cfg::kNumStages;
  static constexpr int kDimQK = Cfg::kHeadDimQK;
  static constexpr int kDimV = Cfg::kHeadDimV;
  static constexpr int kRealQK = Cfg::kRealDimQK;  // the problem's head dims (<= the tiles)
  static constexpr int kRealV = Cfg::kRealDimV;
  // The head-dim extent of S (q.k) and dP (dO.v) products: the k16 steps with real columns.
  static constexpr int kKQK = (kRealQK + 15) / 16 * 16;
  static constexpr int kKV = (kRealV + 15) / 16 * 16;
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = (kConsumers + 1) * 128;
  static constexpr int kElemBytes = 2;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(sizeof(Element) == 2, "flexjit backward_sm90: bf16 or f16 elements");
  static_assert(kDimQK % 64 == 0 && kDimV % 64 == 0 && kDimQK <= 128 && kDimV <= 128,
                "flexjit backward_sm90: tile head dims 64 or 128");
  static_assert(kRealQK % 8 == 0 && kRealV % 8 == 0 && kRealQK > kDimQK - 64 && kRealQK <= kDimQK &&
                    kRealV > kDimV - 64 && kRealV <= kDimV,
                "flexjit backward_sm90: head dims are multiples of 8 in their tile's last 64 "
                "columns");
  static_assert(kNumStages >= 1 && kNumStages <= 4, "flexjit backward_sm90: 1..4 stages");
  static_assert(fj_sm90_reg_split_fits(kProducerRegs, kConsumerRegs, kConsumers),
                "flexjit backward_sm90: register split exceeds the CTA's launch allocation");
};

// This warp's elements of a [rows x cols] accumulator pair (s: scores in, P out; dp: dP in, dS
// out) through the element step. kRowsAreKv: the rows are keys (dK/dV: S^T) or queries (dQ: S).
// lse2 / delta of the q index come from `q_lse2` / `q_delta` (indexed by column in dK/dV, by
// the row half in dQ).
// kDiag (dK/dV only): the diagonal buffer-gradient site goes into `diag` (FjDiagGrad). kDl: the
// score_mod's diagonal load comes from `dl` (FjDiagLoads::mine).
template <class Cfg, bool kApplyMask, bool kRowsAreKv, bool kDiag, bool kDl, int kN8,
          bool kCheck = !Cfg::kIsDivisible>
FJ_DEVICE void fj_bwd_sm90_elements(float (&s)[kN8][4], float (&dp)[kN8][4], const FjBwdArgs& args,
                                    const FjModParams& mods, const FjGradParams& grads,
                                    const float* col_lse2, const float* col_delta,
                                    const float (&row_lse2)[2], const float (&row_delta)[2], int b,
                                    int h, int row0, int col0, int lane, bool add_grads,
                                    float (&grad_acc)[kFjGradSlots], FjDiagGrad<kN8>* diag,
                                    const float* dl) {
  static_assert(!kDiag || kRowsAreKv, "flexjit backward_sm90: diagonal sums in dK/dV only");
#pragma unroll
  for (int nt = 0; nt < kN8; ++nt) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = nt * 8 + (lane & 3) * 2 + c;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int row_idx = row0 + hr * 8 + (lane >> 2), col_idx = col0 + col;
        int q_idx, kv_idx;
        float lse2, delta;
        if constexpr (kRowsAreKv) {
          q_idx = col_idx, kv_idx = row_idx;
          lse2 = col_lse2[col], delta = col_delta[col];
        } else {
          q_idx = row_idx, kv_idx = col_idx;
          lse2 = row_lse2[hr], delta = row_delta[hr];
        }
        const bool ok = !kCheck || (q_idx < args.seqlen_q && kv_idx < args.seqlen_kv);
        if constexpr (kCheck) {
          q_idx = fj_imin(q_idx, args.seqlen_q - 1);
          kv_idx = fj_imin(kv_idx, args.seqlen_kv - 1);
        }
        float diag_v = 0.0f;
        float dl_v = 0.0f;
        if constexpr (kDl) dl_v = dl[8 * (nt - hr) + c];
        fj_bwd_element<Cfg, kApplyMask, kDiag, kDl>(s[nt][hr * 2 + c], dp[nt][hr * 2 + c], mods,
                                                    grads, args.scale, lse2, delta, b, h, q_idx,
                                                    kv_idx, ok, add_grads, grad_acc, &diag_v, dl_v);
        if constexpr (kDiag) diag->put(nt, c, hr, diag_v, lane);
      }
    }
  }
}

// Issues D = A B^T over kDim (k16 steps) for this warpgroup: A = 64 rows starting at row a_row0
// of a kRowsA-row swizzled tile, B = the kN rows of a kN-row tile (both K-major).
template <int kDim, int kRowsA, int kN>
FJ_DEVICE void fj_bwd_sm90_ss(float (&d)[kN / 8][4], fj_u32 tile_a, int a_row0, fj_u32 tile_b) {
  const fj_u64 da0 = fj_smem_desc_sw128(tile_a + a_row0 * 128, 16, 1024);
  const fj_u64 db0 = fj_smem_desc_sw128(tile_b, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < kDim / 16; ++kk) {
    const int chunk = kk / 4, sub = kk % 4;
    const fj_u64 da = fj_desc_add(da0, chunk * kRowsA * 128 + sub * 32);
    const fj_u64 db = fj_desc_add(db0, chunk * kN * 128 + sub * 32);
    fj_wgmma_ss(d, da, db, kk > 0 ? 1 : 0);
  }
}

// Issues D += A B for this warpgroup: A (64 x kK) from registers (k16 step j in a[j]), B the
// kK x kDim tile of kK rows stored row-major (MN-major: 64-column chunks kK * 128 bytes apart).
template <int kK, int kDim>
FJ_DEVICE void fj_bwd_sm90_rs(float (&d)[kDim / 8][4], const fj_u32 (&a)[kK / 16][4],
                              fj_u32 tile_b) {
  const fj_u64 db0 = fj_smem_desc_sw128(tile_b, kK * 128, 1024);
#pragma unroll
  for (int j = 0; j < kK / 16; ++j) {
    const fj_u64 db = fj_desc_add(db0, j * 16 * 128);
    fj_wgmma_rs(d, a[j], db, 1);
  }
}

// Issues D (+)= dS K[:, c0 .. c0 + kW) for this warpgroup (kW columns of dQ): A = dS (64 q x kBN
// kv) read MN-major from the dS^T tile (kBN kv rows of 64 q, 128 bytes each), B = those columns
// of the K tile (kBN kv rows, MN-major; a column offset inside a 64-column chunk moves the
// descriptor's start, which the 128-byte swizzle, a function of the address, allows). Both
// descriptors step 16 rows (2048 bytes) per k16.
template <int kBN, int kW>
FJ_DEVICE void fj_bwd_sm90_dq_piece(float (&d)[kW / 8][4], fj_u32 tile_ds, fj_u32 tile_k, int c0) {
  const fj_u32 k_cols = tile_k + (c0 / 64) * kBN * 128 + (c0 % 64) * 2;
  // (Descriptors built per step, unlike the GEMMs above: moved by fj_desc_add from one built per
  // GEMM, alibi's dK/dV kernel at d 128 spilled 44 B against 16.)
#pragma unroll
  for (int j = 0; j < kBN / 16; ++j) {
    const fj_u64 da = fj_smem_desc_sw128(tile_ds + j * 16 * 128, kBN * 128, 1024);
    const fj_u64 db = fj_smem_desc_sw128(k_cols + j * 16 * 128, kBN * 128, 1024);
    fj_wgmma_tt(d, da, db, j > 0 ? 1 : 0);
  }
}

// Adds this warp's 16 rows of dQ's kW columns of one consumer (accumulator d) into the f32
// accumulator's block `gdst` (the warp's 16 x kW floats of dq_accum_layout 1: float4 k of lane l
// at (32 k + l) * 16 bytes, the order the convert kernel reads): stored in that order into the
// warp's `stage` in shared memory (consecutive lanes, consecutive 16 bytes: no bank conflicts),
// then one bulk reduction (cp.reduce.async.bulk .add.f32) by lane 0. Global red instructions
// from the consumers cost the fused kernel 25 % (docs/kernels/backward_sm90.md "Design notes"); the
// bulk reduction moves whole lines through the async proxy. Lane 0 waits until its previous
// reduction has read the stage before the warp overwrites it.
template <int kW>
FJ_DEVICE void fj_bwd_sm90_dq_stage(fj_u32 stage, int lane, const float (&d)[kW / 8][4]) {
  if (lane == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  __syncwarp();
#pragma unroll
  for (int k = 0; k < kW / 8; ++k) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(stage + (k * 32 + lane) * 16),
                 "f"(d[k][0]), "f"(d[k][1]), "f"(d[k][2]), "f"(d[k][3])
                 : "memory");
  }
}
// The bulk reduction of the warp's stage into `gdst`, once every lane's stores are ordered
// before the async proxy (fj_fence_proxy_async by each lane since its stores).
template <int kW>
FJ_DEVICE void fj_bwd_sm90_dq_reduce(float* gdst, fj_u32 stage, int lane) {
  __syncwarp();
  if (lane == 0) {
    asm volatile(
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
        "cp.async.bulk.commit_group;\n" ::"l"(gdst),
        "r"(stage), "n"(kW / 8 * 32 * 16)
        : "memory");
  }
}
template <int kW>
FJ_DEVICE void fj_bwd_sm90_dq_bulk_add(float* gdst, fj_u32 stage, int lane,
                                       const float (&d)[kW / 8][4]) {
  fj_bwd_sm90_dq_stage<kW>(stage, lane, d);
  fj_fence_proxy_async();  // the stores, before the bulk copy (async proxy) reads them
  fj_bwd_sm90_dq_reduce<kW>(gdst, stage, lane);
}

// The dK/dV kernel's walk over a head's q tiles: step jw takes the schedule's tile j. With dQ
// added here (kRotate), each CTA starts at a different tile (two per kv tile on), so the CTAs of
// one head, which run together, do not add into the same dQ rows at the same time.
template <bool kRotate>
FJ_DEVICE int fj_bwd_sm90_walk(int jw, int num_total, int n_block) {
  if constexpr (!kRotate) return jw;
  const int j = jw + (2 * n_block) % num_total;
  return j >= num_total ? j - num_total : j;
}

// Ping-pong between the two consumer warpgroups (the forward's scheme, docs/kernels/forward_sm90.md
// "Structure"): warpgroup c issues wgmma only inside a turn, taken with a bar.sync on kBar + c and
// handed over right after the issue with a bar.arrive on the other's barrier (256 threads: 128
// syncing, 128 arriving), so the tensor cores alternate between the two and one's element step runs
// under the other's GEMMs instead of both waiting on the same stage at once. Warpgroup 0 takes the
// first turn (start: warpgroup 1's arrival); every turn hands over, and warpgroup 0 absorbs
// warpgroup 1's last hand-over (finish), so no arrival is left pending at exit, however many turns
// there were. Both warpgroups walk the same tiles, hence take the same number of turns.
// The same protocol as FjTurns<2, 3> (wgmma_sm90.cuh, which the forward uses with immediate
// barrier ids and three consumers too); the backward keeps this copy until a device run has
// measured and verified it on FjTurns (docs/kernels/backward_sm90.md "Next").
struct FjBwdTurns {
  static constexpr int kBar = 3;  // 1, 2: the epilogues' per-warpgroup barriers
  int cw;
  FJ_DEVICE void start() const {
    if (cw == 1) fj_bar_arrive(kBar, 256);
  }
  FJ_DEVICE void begin() const { fj_bar_sync(kBar + cw, 256); }
  FJ_DEVICE void end() const { fj_bar_arrive(kBar + (cw ^ 1), 256); }
  FJ_DEVICE void finish() const {
    if (cw == 0) fj_bar_sync(kBar, 256);
  }
};

// Row `row` of (b, h) of a 16-bit [B, H, S, D] tensor with these element strides.
FJ_DEVICE char* fj_bhs_row(void* base, fj_i64 stride_b, fj_i64 stride_h, fj_i64 stride_s, int b,
                           int h, int row) {
  return static_cast<char*>(base) +
         2 * ((fj_i64)b * stride_b + (fj_i64)h * stride_h + (fj_i64)row * stride_s);
}

// S = A B^T and dP = A2 B2^T for this consumer, in one ping-pong turn, waited for: A and A2 are
// the consumer's 64 rows (from row a_row0) of kRowsA-row tiles whose first kDimS / kDimP columns
// (multiples of 16; the columns past them are zeros) the products sum over, B and B2 kN-row
// tiles (dK/dV: K, V against Q, dO; dQ: Q, dO against K, V).
template <int kDimS, int kDimP, int kRowsA, int kN>
FJ_DEVICE void fj_bwd_sm90_s_dp(float (&s)[kN / 8][4], float (&dp)[kN / 8][4],
                                const FjBwdTurns& turns, fj_u32 a, fj_u32 a2, int a_row0, fj_u32 b,
                                fj_u32 b2) {
  turns.begin();
  fj_wgmma_fence();
  fj_bwd_sm90_ss<kDimS, kRowsA, kN>(s, a, a_row0, b);
  fj_bwd_sm90_ss<kDimP, kRowsA, kN>(dp, a2, a_row0, b2);
  fj_wgmma_commit();
  turns.end();
  fj_wgmma_wait<0>();
  fj_fence_regs(s);
  fj_fence_regs(dp);
}

// The mbarriers of both kernels at `at` (8 bytes each): "once" for the tiles loaded once (dK/dV:
// K and V; dQ: Q and dO), then per stage s of the ring "full" at full + 8s (the producer's one
// arrival with the transaction bytes) and "empty" at empty + 8s (lane 0 of every consumer
// warp). init() runs in one thread, then the whole CTA syncs (__syncthreads).
template <int kStages, int kConsumers>
struct FjBwdRing {
  fj_u32 once, full, empty;
  FJ_DEVICE explicit FjBwdRing(fj_u32 at) : once(at), full(at + 8), empty(at + 8 + 8 * kStages) {}
  FJ_DEVICE void init() const {
    fj_mbar_init(once, 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      fj_mbar_init(full + 8 * s, 1);
      fj_mbar_init(empty + 8 * s, 4 * kConsumers);
    }
    fj_mbar_init_fence();
  }
};

// This warp is done with a stage: lane 0 arrives on its "empty" barrier.
FJ_DEVICE void fj_bwd_sm90_release(fj_u32 bar_empty, int lane) {
  __syncwarp();
  if (lane == 0) fj_mbar_arrive(bar_empty);
}

template <int kN8>
FJ_DEVICE void fj_zero_acc(float (&d)[kN8][4]) {
#pragma unroll
  for (int i = 0; i < kN8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      d[i][e] = 0.0f;
}

// ---- dK / dV ---------------------------------------------------------------------------------

#if defined(FJ_BWD_SM90_DKDV)
// Shapes and shared-memory layout: K and V (loaded once), the ring's Q and dO stages, with
// dq_atomic two dS^T tiles and each consumer warp's dQ stage, then the mbarriers.
// dq_atomic: each consumer stores its dS^T rows into the step's dS^T tile (step parity) before
// its dV / dK turn, and issues half of a step's dQ columns in that turn: consumer 1 the second
// half of this step (both halves of dS^T are in by then: consumer 0 stored its own before its
// turn), consumer 0 the first half of the previous step (and of the last after the loop).
// Every consumer issues in every turn (at the first step consumer 0's product is discarded):
// wgmma under a condition the compiler cannot prove warpgroup-uniform gets serialized. The
// turns order every read of a dS^T tile before the stores two steps later.
template <class Cfg>
struct FjDkDvSm90Layout {
  using T = FjBwdSm90Traits<Cfg>;
  static constexpr int kBM = T::kBlockM, kBN = T::kBlockN, kS = T::kNumStages;
  static_assert(kBN == 64 * T::kConsumers, "flexjit bwd_dkdv sm90: 64 kv rows per consumer");
  static_assert(kBM == 64 || kBM == 128, "flexjit bwd_dkdv sm90: q tiles of 64 or 128");
  static constexpr int kKBytes = kBN * T::kDimQK * 2, kVBytes = kBN * T::kDimV * 2;
  static constexpr int kQBytes = kBM * T::kDimQK * 2, kDoBytes = kBM * T::kDimV * 2;
  static constexpr int kOffV = kKBytes;
  static constexpr int kOffQ = kOffV + kVBytes;
  static constexpr int kOffDo = kOffQ + kS * kQBytes;
  // dq_atomic: dQ = dS K in this kernel (docs/kernels/backward_sm90.md "dQ inside the dK/dV
  // kernel").
  static constexpr bool kDqAtomic = Cfg::kDqAtomic;
  static_assert(!kDqAtomic || kBM == 64, "flexjit bwd_dkdv sm90: dq_atomic takes q tiles of 64");
  static constexpr int kDqW = T::kDimQK / 2;              // dQ's columns per consumer and step
  static constexpr int kDsBytes = kBN * kBM * 2;          // one dS^T tile
  static constexpr int kStageBytes = kDqW / 8 * 32 * 16;  // a warp's dQ rows on their way out (f32)
  static constexpr int kOffDs = kOffDo + kS * kDoBytes;
  static constexpr int kOffStage = kOffDs + (kDqAtomic ? 2 * kDsBytes : 0);
  // Per stage, the q tile's lse2 then delta (kBM floats each), loaded with Q and dO.
  static constexpr int kStatBytes = 2 * 4 * kBM;
  static constexpr int kOffStats = kOffStage + (kDqAtomic ? 4 * T::kConsumers * kStageBytes : 0);
  static constexpr int kOffBar = kOffStats + kS * kStatBytes;
  // Named barriers kStatBar + s (s < kS): the consumers' reads of stage s's lse2 / delta before
  // the producer's next bulk copy into it (1, 2: epilogues; 3, 4: turns; 5, 6: the meetings).
  static constexpr int kStatBar = 7;
  static_assert(kStatBar + kS <= 16, "flexjit bwd_dkdv sm90: 16 named barriers");
  static constexpr int kOffEnd = kOffBar + 8 * (1 + 2 * kS);
  static_assert(kOffEnd + 1024 == fj_bwd_dkdv_sm90_smem_bytes(kBM, kBN, T::kDimQK, T::kDimV, 2, kS,
                                                              kDqAtomic ? 1 : 0),
                "flexjit bwd_dkdv sm90: shared-memory layout and fj_bwd_dkdv_sm90_smem_bytes "
                "disagree");
};

// The producer: one thread loads K and V once (bar_kv), then walks every q head's tiles in the
// consumers' order and streams Q and dO into the ring's stages (full / empty).
template <class Cfg>
FJ_DEVICE void fj_dkdv_sm90_producer(const FjBwdArgs& args, const FjBwdTmaMaps& maps, fj_u32 sk,
                                     fj_u32 sv, fj_u32 sq, fj_u32 sdo, fj_u32 sstats, fj_u32 bar_kv,
                                     fj_u32 bar_full, fj_u32 bar_empty, int n_block, int n_start,
                                     int h_kv, int b) {
  using T = FjBwdSm90Traits<Cfg>;
  using L = FjDkDvSm90Layout<Cfg>;
  constexpr int kBM = L::kBM, kBN = L::kBN, kS = L::kS;
  constexpr int kKBytes = L::kKBytes, kVBytes = L::kVBytes, kQBytes = L::kQBytes;
  constexpr int kDoBytes = L::kDoBytes;
  constexpr bool kDqAtomic = L::kDqAtomic;
  fj_tma_prefetch_desc(&maps.q);
  fj_tma_prefetch_desc(&maps.dout);
  fj_mbar_arrive_expect_tx(bar_kv, kKBytes + kVBytes);
  fj_tma_load_tile<T::kDimQK, kBN>(sk, &maps.k, n_start, h_kv, b, bar_kv);
  fj_tma_load_tile<T::kDimV, kBN>(sv, &maps.v, n_start, h_kv, b, bar_kv);
  int i = 0;  // the ring's step, over all heads
  for (int g = 0; g < Cfg::kGqaRatio; ++g) {
    const int h = h_kv * Cfg::kGqaRatio + g;
    const FjKvSchedule sched =
        fj_block_schedule<kBN, kBM, Cfg::kHasFullBlocks>(args.mask_t, args.seqlen_q, b, h, n_block);
    for (int jw = 0; jw < sched.num_total; ++jw) {
      const int j = fj_bwd_sm90_walk<kDqAtomic>(jw, sched.num_total, n_block);
      const int m0 = sched.tile(j) * kBM;
      // A tile past seqlen_q (a ragged sparse block) is skipped by both sides: its lse2 /
      // delta would lie past the workspace row.
      if (m0 >= args.seqlen_q) continue;
      const int stage = i % kS;
      if (i >= kS) {
        fj_mbar_wait(bar_empty + 8 * stage, ((i / kS) & 1) ^ 1);
        // The consumers' reads of the stage's lse2 / delta, before the bulk copy overwrites
        // them: the empty mbarrier orders them too, but compute-sanitizer's racecheck follows a
        // generic read before an async-proxy write only through a named barrier. The producer
        // warp's other lanes have exited, so this thread's bar.sync counts as the warp's 32.
        fj_bar_sync(L::kStatBar + stage, 32 + 128 * T::kConsumers);
      }
      const fj_u32 bar = bar_full + 8 * stage;
      fj_mbar_arrive_expect_tx(bar, kQBytes + kDoBytes + L::kStatBytes);
      fj_tma_load_tile<T::kDimQK, kBM>(sq + stage * kQBytes, &maps.q, m0, h, b, bar);
      fj_tma_load_tile<T::kDimV, kBM>(sdo + stage * kDoBytes, &maps.dout, m0, h, b, bar);
      // The tile's lse2 and delta (kBM floats each, rows < seqlen_q_pad) with them, into the
      // stage: read from global memory in the element step, they waited there for the L1 or the
      // L2 (ncu: 10 % of the consumers' stall samples at noop, after the v35 prefetch into L1).
      const fj_i64 row = ((fj_i64)b * args.heads_q + h) * args.seqlen_q_pad + m0;
      const fj_u32 st = sstats + stage * L::kStatBytes;
      fj_bulk_load<4 * kBM>(st, args.lse2 + row, bar);
      fj_bulk_load<4 * kBM>(st + 4 * kBM, args.delta + row, bar);
      ++i;
    }
  }
  // The consumers' arrivals after the last (up to kS) steps, taken so that none is pending when
  // the CTA exits.
  for (int t = i > kS ? i - kS : 0; t < i; ++t)
    fj_bar_sync(L::kStatBar + t % kS, 32 + 128 * T::kConsumers);
}

// P^T and dS^T of a consumer warp's 16 kv rows over one q tile (from m0; lse2 / delta of its
// rows), the buffer gradients out. A partial tile applies mask_mod (without one, both branches
// would be the same code). Without `divisible` and with dQ added here (dq_atomic), only a tile at
// the end of either sequence (`edge`) checks the bounds per element: checked in every tile, the
// kernels without a mask_mod ran short of registers and ptxas serialized their wgmma (C7512:
// noop, alibi, sinks at d 128). Without dQ (dq_atomic 0) every tile checks: split there, three
// configurations spilled 4-68 bytes.
template <class Cfg, int kN8>
FJ_DEVICE void fj_dkdv_sm90_elements(float (&s)[kN8][4], float (&dp)[kN8][4], const FjBwdArgs& args,
                                     const FjModParams& mods, const FjGradParams& grads,
                                     const float* lse2, const float* delta, int b, int h,
                                     int kv_row0, int m0, int lane, float (&grad_acc)[kFjGradSlots],
                                     FjDiagGrad<kN8>& diag, const float* dl, bool partial,
                                     bool edge) {
  constexpr bool kDiag = kFjDiagGradSite, kDl = kFjDiagLoad;
  const float no_rows[2] = {0.0f, 0.0f};
  if (Cfg::kHasMaskMod && partial) {
    fj_bwd_sm90_elements<Cfg, true, true, kDiag, kDl>(s, dp, args, mods, grads, lse2, delta,
                                                      no_rows, no_rows, b, h, kv_row0, m0, lane,
                                                      true, grad_acc, &diag, dl);
  } else if (!Cfg::kIsDivisible && (edge || !FjDkDvSm90Layout<Cfg>::kDqAtomic)) {
    fj_bwd_sm90_elements<Cfg, false, true, kDiag, kDl, kN8, true>(
        s, dp, args, mods, grads, lse2, delta, no_rows, no_rows, b, h, kv_row0, m0, lane, true,
        grad_acc, &diag, dl);
  } else {
    fj_bwd_sm90_elements<Cfg, false, true, kDiag, kDl, kN8, false>(
        s, dp, args, mods, grads, lse2, delta, no_rows, no_rows, b, h, kv_row0, m0, lane, true,
        grad_acc, &diag, dl);
  }
}

// The consumer warps' diagonal tables in static shared memory: the buffer-gradient site's sums
// (kFjDiagGradSite; FjDiagGrad in backward_sm80.cuh) and the score_mod's diagonal loads
// (kFjDiagLoad, a tile's diagonals once per warp).
template <class Cfg>
FJ_DEVICE void fj_dkdv_sm90_diag_tables(FjDiagGrad<Cfg::kBlockM / 8>& diag,
                                        FjDiagLoads<Cfg::kBlockM / 8>& loads, int cw, int warp,
                                        int lane) {
  using T = FjBwdSm90Traits<Cfg>;
  using Diag = FjDiagGrad<Cfg::kBlockM / 8>;
  using Loads = FjDiagLoads<Cfg::kBlockM / 8>;
  constexpr bool kDiag = kFjDiagGradSite, kDl = kFjDiagLoad;
  __shared__ __align__(16) float fj_diag_smem[kDiag ? 4 * T::kConsumers * Diag::kFloats : 4];
  if constexpr (kDiag) diag.init(fj_diag_smem + (cw * 4 + warp) * Diag::kFloats, lane);
  __shared__ __align__(16) float fj_dl_smem[kDl ? 4 * T::kConsumers * Loads::kFloats : 4];
  loads.table = fj_dl_smem + (kDl ? (cw * 4 + warp) * Loads::kFloats : 0);
}

// dq_atomic: this warp's part of dQ's accumulator block `blk` (dq_accum_layout 1: the 64 rows
// of the block, consumer cw's kDqW columns, then this warp's 16 rows). The accumulator's rows are
// kDimQK (the tile dim) floats wide: kernels::dq_accum_dim.
template <class Cfg>
FJ_DEVICE float* fj_dkdv_sm90_dq_block(const FjBwdArgs& args, int b, int cw, int warp, int blk) {
  using T = FjBwdSm90Traits<Cfg>;
  return args.dq_accum +
         ((fj_i64)b * args.heads_q * args.seqlen_q_pad + (fj_i64)blk * 64) * T::kDimQK +
         (cw * 4 + warp) * 16 * FjDkDvSm90Layout<Cfg>::kDqW;
}

// dq_atomic, after a turn: waits for the dQ piece (its own wgmma group, issued first) and stores
// its rows into the warp's stage if they belong to a block (`blk` >= 0; -1: none, consumer 0's
// first step). The reduction into the accumulator goes out at the next step's top, after the
// fence.proxy.async that the step's dS^T stores need anyway (fj_dkdv_sm90_dq_flush): with a
// fence of its own here, the fence waited on the stores (10 % of the consumers' stall samples).
template <class Cfg>
FJ_DEVICE void fj_dkdv_sm90_dq_out(float (&dq)[FjDkDvSm90Layout<Cfg>::kDqW / 8][4], fj_u32 my_stage,
                                   int blk, int lane) {
  fj_wgmma_wait<1>();
  fj_fence_regs(dq);
  if (blk >= 0) fj_bwd_sm90_dq_stage<FjDkDvSm90Layout<Cfg>::kDqW>(my_stage, lane, dq);
}

// dq_atomic: the rows in the warp's stage (of block `blk`, -1: none) into the accumulator, after
// a fence.proxy.async of every lane.
template <class Cfg>
FJ_DEVICE void fj_dkdv_sm90_dq_flush(const FjBwdArgs& args, fj_u32 my_stage, int blk, int b, int cw,
                                     int warp, int lane) {
  if (blk >= 0) {
    fj_bwd_sm90_dq_reduce<FjDkDvSm90Layout<Cfg>::kDqW>(
        fj_dkdv_sm90_dq_block<Cfg>(args, b, cw, warp, blk), my_stage, lane);
  }
}

// dq_atomic, after the loop (i steps, the last one's q block prev_block): consumer 0's half of the
// last step (consumer 1's stores came before its last hand-over, which finish() absorbed;
// consumer 1 issues the same product and discards it, to keep wgmma uniform); then both
// consumers meet before either epilogue overwrites K rows that the other's dQ products read.
template <class Cfg>
FJ_DEVICE void fj_dkdv_sm90_last_dq(const FjBwdArgs& args, fj_u32 sk, fj_u32 sds, fj_u32 my_stage,
                                    int i, int prev_block, int pending, int b, int cw, int warp,
                                    int lane) {
  using L = FjDkDvSm90Layout<Cfg>;
  // The last step's rows (block `pending`) still in the stage.
  fj_fence_proxy_async();
  fj_dkdv_sm90_dq_flush<Cfg>(args, my_stage, pending, b, cw, warp, lane);
  float dq[L::kDqW / 8][4];
  fj_wgmma_fence();
  fj_bwd_sm90_dq_piece<L::kBN, L::kDqW>(dq, sds + ((i + 1) & 1) * L::kDsBytes, sk, 0);
  fj_wgmma_commit();
  fj_wgmma_wait<0>();
  fj_fence_regs(dq);
  if (cw == 0 && prev_block >= 0) {
    fj_bwd_sm90_dq_bulk_add<L::kDqW>(fj_dkdv_sm90_dq_block<Cfg>(args, b, cw, warp, prev_block),
                                     my_stage, lane, dq);
  }
  // The reductions have read their stages before the CTA's shared memory goes away (their
  // writes complete with the grid, as TMA stores' do).
  if (lane == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  fj_bar_sync(5, 256);
}

// Epilogue: dK (times scale) and dV through this warpgroup's rows of the K and V tiles (row0 =
// its first kv row), then out.
template <class Cfg>
FJ_DEVICE void fj_dkdv_sm90_epilogue(const float (&dk)[Cfg::kHeadDimQK / 8][4],
                                     const float (&dv)[Cfg::kHeadDimV / 8][4],
                                     const FjBwdArgs& args, fj_u32 sk, fj_u32 sv, int b, int h_kv,
                                     int row0, int cw, int warp, int lane, int wtid) {
  using T = FjBwdSm90Traits<Cfg>;
  using E = typename T::Element;
  constexpr int kBN = T::kBlockN;
  fj_fence_proxy_async();  // the K / V rows were last read by wgmma (async proxy)
  fj_sw128_store_acc<E, kBN>(sk, cw * 64 + warp * 16, lane, dk, args.scale);
  fj_sw128_store_acc<E, kBN>(sv, cw * 64 + warp * 16, lane, dv, 1.0f);
  fj_bar_sync(1 + cw, 128);
  fj_sw128_copy_out64<T::kDimQK, kBN, T::kRealQK>(
      fj_bhs_row(args.dk, args.dk_stride_b, args.dk_stride_h, args.dk_stride_s, b, h_kv, row0),
      args.dk_stride_s, sk, cw * 64, row0, args.seqlen_kv, wtid);
  fj_sw128_copy_out64<T::kDimV, kBN, T::kRealV>(
      fj_bhs_row(args.dv, args.dv_stride_b, args.dv_stride_h, args.dv_stride_s, b, h_kv, row0),
      args.dv_stride_s, sv, cw * 64, row0, args.seqlen_kv, wtid);
}

extern "C" __global__ void __launch_bounds__(384, 1)
    flexjit_bwd_dkdv(const FjBwdArgs args, const FjModParams mods, const FjGradParams grads,
                     const __grid_constant__ FjBwdTmaMaps maps) {
  using Cfg = FjConfig;
  using T = FjBwdSm90Traits<Cfg>;
  using E = typename T::Element;
  using L = FjDkDvSm90Layout<Cfg>;
  constexpr int kBM = L::kBM, kBN = L::kBN, kS = L::kS, kQBytes = L::kQBytes;
  constexpr int kDoBytes = L::kDoBytes, kDqW = L::kDqW, kDsBytes = L::kDsBytes;
  constexpr bool kDqAtomic = L::kDqAtomic;
  extern __shared__ unsigned char fj_smem_raw[];
  const fj_u32 base = (fj_smem_addr(fj_smem_raw) + 1023u) & ~1023u;
  const fj_u32 sk = base, sv = base + L::kOffV, sq = base + L::kOffQ, sdo = base + L::kOffDo;
  const fj_u32 sds = base + L::kOffDs, sstage = base + L::kOffStage;
  const fj_u32 sstats = base + L::kOffStats;
  // The stats as generic pointers (the consumers' loads of them are LDS; from `base`, the offset
  // folds into the loads' immediates, from `sstats` it took a uniform add).
  const float* const stats = reinterpret_cast<const float*>(
      fj_smem_raw + (base - fj_smem_addr(fj_smem_raw)) + L::kOffStats);
  // once: K and V; full: Q, dO, lse2 and delta of a stage.
  const FjBwdRing<kS, T::kConsumers> ring(base + L::kOffBar);
  const fj_u32 bar_kv = ring.once, bar_full = ring.full, bar_empty = ring.empty;

  // Under a block mask the host launches the kv heads inner (x) and the KV tiles next (y), so
  // that a batch's KV tile 0 of every head starts first (under a causal mask the heaviest: every
  // q tile from its own on), the lightest last (docs/kernels/backward_sm90.md "Block order").
  // Both forms are blockIdx reads, which ptxas re-reads where used instead of keeping them.
  const bool heads_inner = args.dkdv_heads_inner != 0;
  const int n_block = heads_inner ? blockIdx.y : blockIdx.x;
  const int h_kv = heads_inner ? blockIdx.x : blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, wg = tid / 128;
  const int n_start = n_block * kBN;

  if (tid == 0) ring.init();
  // The CTA's private copy of small buffer gradients (docs/backward.md), zero before any add.
  if constexpr (kFjGradSmemFloats > 0) fj_bufgrad_smem_zero(tid, (T::kConsumers + 1) * 128);
  __syncthreads();

  if (wg == 0) {
    fj_setmaxnreg_dec<T::kProducerRegs>();
    if (tid != 0) return;
    fj_dkdv_sm90_producer<Cfg>(args, maps, sk, sv, sq, sdo, sstats, bar_kv, bar_full, bar_empty,
                               n_block, n_start, h_kv, b);
    return;
  }

  // ---- consumers: warpgroup cw owns kv rows [64 cw, 64 cw + 64) of the tile ----
  fj_setmaxnreg_inc<T::kConsumerRegs>();
  const int cw = wg - 1;
  const int wtid = tid % 128, warp = wtid / 32, lane = tid % 32;
  float dk[T::kDimQK / 8][4], dv[T::kDimV / 8][4];
  fj_zero_acc(dk);
  fj_zero_acc(dv);
  const int kv_row0 = n_start + cw * 64 + warp * 16;  // this warp's first kv row
  const bool edge = n_start + kBN > args.seqlen_kv;   // the last kv tile: checked elements
  float grad_acc[kFjGradSlots];
  constexpr bool kDiag = kFjDiagGradSite, kDl = kFjDiagLoad;
  FjDiagGrad<kBM / 8> diag;
  FjDiagLoads<kBM / 8> loads;
  fj_dkdv_sm90_diag_tables<Cfg>(diag, loads, cw, warp, lane);
  const FjBwdTurns turns{cw};
  // dq_atomic (FjDkDvSm90Layout): a step's q tile as one number (one register across the loop:
  // alibi's kernel spilled with two), the index of its 64-row block among batch b's rows of the
  // workspace; -1 for none.
  auto q_block = [&](int h, int m0) { return h * (args.seqlen_q_pad / 64) + m0 / 64; };
  int prev_block = -1;  // the previous step's
  int pending = -1;     // the q block of the dQ rows in this warp's stage, not yet reduced
  const fj_u32 my_stage = sstage + (cw * 4 + warp) * L::kStageBytes;  // this warp's dQ stage
  turns.start();
  fj_mbar_wait(bar_kv, 0);
  int i = 0;
  for (int g = 0; g < Cfg::kGqaRatio; ++g) {
    const int h = h_kv * Cfg::kGqaRatio + g;
#pragma unroll
    for (int k = 0; k < kFjGradSlots; ++k)
      grad_acc[k] = 0.0f;
    const FjKvSchedule sched =
        fj_block_schedule<kBN, kBM, Cfg::kHasFullBlocks>(args.mask_t, args.seqlen_q, b, h, n_block);
    for (int jw = 0; jw < sched.num_total; ++jw) {
      const int j = fj_bwd_sm90_walk<kDqAtomic>(jw, sched.num_total, n_block);
      const int m0 = sched.tile(j) * kBM;
      if (m0 >= args.seqlen_q) continue;
      const int stage = i % kS;
      const fj_u32 sq_st = sq + stage * kQBytes, sdo_st = sdo + stage * kDoBytes;
      if constexpr (kDl) {
        // Rows: this warp's 16 kv rows; columns: the tile's kBM q rows (S^T). Element (row, col)
        // has q_idx - kv_idx = (m0 + col) - (kv_row0 + row) = (m0 - kv_row0) + k.
        loads.issue(mods, b, h, m0 - kv_row0, 1, args.seqlen_kv - kv_row0, args.seqlen_q - m0,
                    lane);
      }
      fj_mbar_wait(bar_full + 8 * stage, (i / kS) & 1);
      float s[kBM / 8][4], dp[kBM / 8][4];
      fj_bwd_sm90_s_dp<T::kKQK, T::kKV, kBN, kBM>(s, dp, turns, sk, sv, cw * 64, sq_st, sdo_st);
      if constexpr (kDl) loads.commit(lane);
      // lse2 / delta of the tile's q rows m0 .. m0 + kBM - 1 (< seqlen_q_pad, a multiple of 128)
      // from the stage.
      const float* const st = stats + stage * (L::kStatBytes / 4);
      fj_dkdv_sm90_elements<Cfg>(s, dp, args, mods, grads, st, st + kBM, b, h, kv_row0, m0, lane,
                                 grad_acc, diag, loads.mine(lane), j < sched.num_partial,
                                 edge || m0 + kBM > args.seqlen_q);
      fj_u32 pa[kBM / 16][4], dsa[kBM / 16][4];
      fj_wgmma_pack_a<E>(pa, s);
      fj_wgmma_pack_a<E>(dsa, dp);
      // dq_atomic: the step whose dQ columns [cw kDqW, + kDqW) this consumer adds in this turn
      // (its q block; -1: none).
      const int dq_blk = cw == 1 ? q_block(h, m0) : prev_block;
      float dq[kDqW / 8][4];  // live from its issue to its reductions only
      if constexpr (kDqAtomic) {
        fj_sw128_store_packed<kBN>(sds + (i & 1) * kDsBytes, cw * 64 + warp * 16, lane, dsa);
        prev_block = q_block(h, m0);
      }
      // The dS^T stores before the wgmma (async proxy) that read them, and the stage's lse2 /
      // delta reads before the producer's next bulk copy into it (its named barrier).
      fj_fence_proxy_async();
      fj_bar_arrive(L::kStatBar + stage, 32 + 128 * T::kConsumers);
      // ... and the previous step's dQ rows, stored before this fence, into the accumulator.
      if constexpr (kDqAtomic) {
        fj_dkdv_sm90_dq_flush<Cfg>(args, my_stage, pending, b, cw, warp, lane);
        pending = dq_blk;
      }
      turns.begin();
      fj_wgmma_fence();
      if constexpr (kDqAtomic) {
        // Its own group, first: its reductions go out (and its registers are free) while dV / dK
        // run. Consumer 1: this step's dS^T (parity i); consumer 0: the previous step's (i - 1).
        fj_bwd_sm90_dq_piece<kBN, kDqW>(dq, sds + ((i + 1 - cw) & 1) * kDsBytes, sk, cw * kDqW);
        fj_wgmma_commit();
      }
      fj_bwd_sm90_rs<kBM, T::kDimV>(dv, pa, sdo_st);
      fj_bwd_sm90_rs<kBM, T::kDimQK>(dk, dsa, sq_st);
      fj_wgmma_commit();
      turns.end();
      if constexpr (kDqAtomic) fj_dkdv_sm90_dq_out<Cfg>(dq, my_stage, dq_blk, lane);
      // The diagonal sums go out under the dV / dK GEMMs.
      if constexpr (kDiag) diag.flush(mods, grads, b, h, m0 - kv_row0, 1, lane);
      fj_wgmma_wait<0>();
      fj_fence_regs(dv);
      fj_fence_regs(dk);
      fj_bwd_sm90_release(bar_empty + 8 * stage, lane);
      ++i;
    }
    if constexpr (kFjUniformGradSites > 0) fj_bufgrad_flush(mods, grads, b, h, grad_acc);
  }
  turns.finish();
  if constexpr (kDqAtomic)
    fj_dkdv_sm90_last_dq<Cfg>(args, sk, sds, my_stage, i, prev_block, pending, b, cw, warp, lane);
  fj_dkdv_sm90_epilogue<Cfg>(dk, dv, args, sk, sv, b, h_kv, n_start + cw * 64, cw, warp, lane,
                             wtid);
  if constexpr (kFjGradSmemFloats > 0) {
    // The consumers' adds all done (the producer adds none; barrier 6 is the consumers' alone),
    // then the private copy out: one fp32 atomic per element it holds.
    fj_bar_sync(6, T::kConsumers * 128);
    fj_bufgrad_smem_flush(grads, tid - 128, T::kConsumers * 128);
  }
}
#endif  // FJ_BWD_SM90_DKDV

// ---- dQ --------------------------------------------------------------------------------------

#if defined(FJ_BWD_SM90_DQ)
// Shapes and shared-memory layout: Q and dO (loaded once), the ring's K and V stages, then the
// mbarriers.
template <class Cfg>
struct FjDqSm90Layout {
  using T = FjBwdSm90Traits<Cfg>;
  static constexpr int kBM = T::kBlockM, kBN = T::kBlockN, kS = T::kNumStages;
  static_assert(kBM == 64 * T::kConsumers, "flexjit bwd_dq sm90: 64 q rows per consumer");
  static_assert(kBN % 16 == 0 && kBN >= 16 && kBN <= 128, "flexjit bwd_dq sm90: kv tile");
  static constexpr int kQBytes = kBM * T::kDimQK * 2, kDoBytes = kBM * T::kDimV * 2;
  static constexpr int kKBytes = kBN * T::kDimQK * 2, kVBytes = kBN * T::kDimV * 2;
  static constexpr int kOffDo = kQBytes;
  static constexpr int kOffK = kOffDo + kDoBytes;
  static constexpr int kOffV = kOffK + kS * kKBytes;
  static constexpr int kOffBar = kOffV + kS * kVBytes;
  static constexpr int kOffEnd = kOffBar + 8 * (1 + 2 * kS);
  static_assert(kOffEnd + 1024 == fj_bwd_dq_sm90_smem_bytes(kBM, kBN, T::kDimQK, T::kDimV, 2, kS),
                "flexjit bwd_dq sm90: shared-memory layout and fj_bwd_dq_sm90_smem_bytes "
                "disagree");
};

// The producer: one thread loads Q and dO once (bar_qdo), then the schedule's K and V tiles into
// the ring's stages (full / empty).
template <class Cfg>
FJ_DEVICE void fj_dq_sm90_producer(const FjBwdTmaMaps& maps, const FjKvSchedule& sched, fj_u32 sq,
                                   fj_u32 sdo, fj_u32 sk, fj_u32 sv, fj_u32 bar_qdo,
                                   fj_u32 bar_full, fj_u32 bar_empty, int m_start, int h, int h_kv,
                                   int b) {
  using T = FjBwdSm90Traits<Cfg>;
  using L = FjDqSm90Layout<Cfg>;
  constexpr int kBM = L::kBM, kBN = L::kBN, kS = L::kS;
  fj_tma_prefetch_desc(&maps.k);
  fj_tma_prefetch_desc(&maps.v);
  fj_mbar_arrive_expect_tx(bar_qdo, L::kQBytes + L::kDoBytes);
  fj_tma_load_tile<T::kDimQK, kBM>(sq, &maps.q, m_start, h, b, bar_qdo);
  fj_tma_load_tile<T::kDimV, kBM>(sdo, &maps.dout, m_start, h, b, bar_qdo);
  for (int i = 0; i < sched.num_total; ++i) {
    // A tile past seqlen_kv (a ragged sparse block) reads as zeros; its scores are masked.
    const int n0 = sched.tile(i) * kBN;
    const int stage = i % kS;
    if (i >= kS) fj_mbar_wait(bar_empty + 8 * stage, ((i / kS) & 1) ^ 1);
    const fj_u32 bar = bar_full + 8 * stage;
    fj_mbar_arrive_expect_tx(bar, L::kKBytes + L::kVBytes);
    fj_tma_load_tile<T::kDimQK, kBN>(sk + stage * L::kKBytes, &maps.k, n0, h_kv, b, bar);
    fj_tma_load_tile<T::kDimV, kBN>(sv + stage * L::kVBytes, &maps.v, n0, h_kv, b, bar);
  }
}

// P and dS of a consumer's 64 q rows over one KV tile (from n0); a partial tile applies mask_mod.
// No buffer gradients here (the dK/dV kernel adds them).
template <class Cfg, int kBN>
FJ_DEVICE void fj_dq_sm90_elements(float (&s)[kBN / 8][4], float (&dp)[kBN / 8][4],
                                   const FjBwdArgs& args, const FjModParams& mods,
                                   const float (&lse2)[2], const float (&delta)[2], int b, int h,
                                   int q_row0, int n0, int lane, const float* dl, bool partial) {
  constexpr bool kDl = kFjDiagLoad;
  const FjGradParams no_grads = {};
  float no_acc[kFjGradSlots] = {};
  FjDiagGrad<kBN / 8>* const no_diag = nullptr;
  if (!(Cfg::kHasMaskMod && partial)) {
    fj_bwd_sm90_elements<Cfg, false, false, false, kDl>(s, dp, args, mods, no_grads, nullptr,
                                                        nullptr, lse2, delta, b, h, q_row0, n0,
                                                        lane, false, no_acc, no_diag, dl);
  } else {
    fj_bwd_sm90_elements<Cfg, true, false, false, kDl>(s, dp, args, mods, no_grads, nullptr,
                                                       nullptr, lse2, delta, b, h, q_row0, n0, lane,
                                                       false, no_acc, no_diag, dl);
  }
}

// Epilogue: dQ (times scale) through this warpgroup's rows of the Q tile (row0 = its first q
// row), then out.
template <class Cfg>
FJ_DEVICE void fj_dq_sm90_epilogue(const float (&dq)[Cfg::kHeadDimQK / 8][4], const FjBwdArgs& args,
                                   fj_u32 sq, int b, int h, int row0, int cw, int warp, int lane,
                                   int wtid) {
  using T = FjBwdSm90Traits<Cfg>;
  fj_fence_proxy_async();
  fj_sw128_store_acc<typename T::Element, T::kBlockM>(sq, cw * 64 + warp * 16, lane, dq,
                                                      args.scale);
  fj_bar_sync(1 + cw, 128);
  fj_sw128_copy_out64<T::kDimQK, T::kBlockM, T::kRealQK>(
      fj_bhs_row(args.dq, args.dq_stride_b, args.dq_stride_h, args.dq_stride_s, b, h, row0),
      args.dq_stride_s, sq, cw * 64, row0, args.seqlen_q, wtid);
}

extern "C" __global__ void __launch_bounds__(384, 1)
    flexjit_bwd_dq(const FjBwdArgs args, const FjModParams mods,
                   const __grid_constant__ FjBwdTmaMaps maps) {
  using Cfg = FjConfig;
  using T = FjBwdSm90Traits<Cfg>;
  using L = FjDqSm90Layout<Cfg>;
  using E = typename T::Element;
  constexpr int kBM = L::kBM, kBN = L::kBN, kS = L::kS;
  extern __shared__ unsigned char fj_smem_raw[];
  const fj_u32 base = (fj_smem_addr(fj_smem_raw) + 1023u) & ~1023u;
  const fj_u32 sq = base, sdo = base + L::kOffDo, sk = base + L::kOffK, sv = base + L::kOffV;
  // once: Q and dO; full: K and V of a stage.
  const FjBwdRing<kS, T::kConsumers> ring(base + L::kOffBar);
  const fj_u32 bar_qdo = ring.once, bar_full = ring.full, bar_empty = ring.empty;

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest tiles first, as the forward
  const int h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, wg = tid / 128;
  const int h_kv = h / Cfg::kGqaRatio;
  const int m_start = m_block * kBM;

  if (tid == 0) ring.init();
  __syncthreads();

  const FjKvSchedule sched =
      fj_block_schedule<kBM, kBN, Cfg::kHasFullBlocks>(args.mask, args.seqlen_kv, b, h, m_block);

  if (wg == 0) {
    fj_setmaxnreg_dec<T::kProducerRegs>();
    if (tid != 0) return;
    fj_dq_sm90_producer<Cfg>(maps, sched, sq, sdo, sk, sv, bar_qdo, bar_full, bar_empty, m_start, h,
                             h_kv, b);
    return;
  }

  // ---- consumers: warpgroup cw owns q rows [64 cw, 64 cw + 64) of the tile ----
  fj_setmaxnreg_inc<T::kConsumerRegs>();
  const int cw = wg - 1;
  const int wtid = tid % 128, warp = wtid / 32, lane = tid % 32;
  const int q_row0 = m_start + cw * 64 + warp * 16;  // this warp's first q row
  const fj_i64 ws_row0 = ((fj_i64)b * args.heads_q + h) * args.seqlen_q_pad;
  float lse2[2], delta[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    lse2[hr] = args.lse2[ws_row0 + q_row0 + hr * 8 + (lane >> 2)];  // rows < seqlen_q_pad
    delta[hr] = args.delta[ws_row0 + q_row0 + hr * 8 + (lane >> 2)];
  }
  float dq[T::kDimQK / 8][4];
  fj_zero_acc(dq);
  // The score_mod's diagonal load (kFjDiagLoad): rows are q here, so q_idx - kv_idx runs the
  // other way along k = col - row.
  constexpr bool kDl = kFjDiagLoad;
  using Loads = FjDiagLoads<kBN / 8>;
  __shared__ __align__(16) float fj_dl_smem[kDl ? 4 * T::kConsumers * Loads::kFloats : 4];
  Loads loads;
  loads.table = fj_dl_smem + (kDl ? (cw * 4 + warp) * Loads::kFloats : 0);
  const FjBwdTurns turns{cw};
  turns.start();
  fj_mbar_wait(bar_qdo, 0);
  for (int i = 0; i < sched.num_total; ++i) {
    const int n0 = sched.tile(i) * kBN;
    const int stage = i % kS;
    const fj_u32 sk_st = sk + stage * L::kKBytes, sv_st = sv + stage * L::kVBytes;
    if constexpr (kDl) {
      // q_idx - kv_idx = (q_row0 + row) - (n0 + col) = (q_row0 - n0) - k.
      loads.issue(mods, b, h, q_row0 - n0, -1, args.seqlen_q - q_row0, args.seqlen_kv - n0, lane);
    }
    fj_mbar_wait(bar_full + 8 * stage, (i / kS) & 1);
    float s[kBN / 8][4], dp[kBN / 8][4];
    fj_bwd_sm90_s_dp<T::kKQK, T::kKV, kBM, kBN>(s, dp, turns, sq, sdo, cw * 64, sk_st, sv_st);
    if constexpr (kDl) loads.commit(lane);
    fj_dq_sm90_elements<Cfg, kBN>(s, dp, args, mods, lse2, delta, b, h, q_row0, n0, lane,
                                  loads.mine(lane), i < sched.num_partial);
    fj_u32 dsa[kBN / 16][4];
    fj_wgmma_pack_a<E>(dsa, dp);
    turns.begin();
    fj_wgmma_fence();
    fj_bwd_sm90_rs<kBN, T::kDimQK>(dq, dsa, sk_st);
    fj_wgmma_commit();
    turns.end();
    fj_wgmma_wait<0>();
    fj_fence_regs(dq);
    fj_bwd_sm90_release(bar_empty + 8 * stage, lane);
  }
  turns.finish();
  fj_dq_sm90_epilogue<Cfg>(dq, args, sq, b, h, m_start + cw * 64, cw, warp, lane, wtid);
}
#endif  // FJ_BWD_SM90_DQ

#endif  // FLEXJIT_BACKWARD_SM90_CUH_
