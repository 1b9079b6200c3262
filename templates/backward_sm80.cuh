// flexjit backward attention kernels for sm_80 and newer (mma.sync; FlashAttention-2's math,
// PyTorch FlexAttention's split of the work). docs/kernels/backward_sm80.md has the design.
//
// Spliced last, after flexjit_abi.h, prelude.cuh, the generated FjConfig, mods and mod
// gradients (fj_dscore, fj_bufgrad, FjGradParams), mma_sm80.cuh and attention_sm80.cuh. One
// module holds one entry point; the three are built as three kernels of the backward plan:
//
//   flexjit_bwd_preprocess  lse2 = lse * log2(e) (+inf for a fully masked row: its P is 0) and
//                           delta = rowsum(dO * O) - dlse, in fp32, into the plan's workspace
//   flexjit_bwd_dkdv        one CTA per KV tile of one (batch, kv head): K and V stay in shared
//                           memory; for every q head of the GQA group and every q tile that the
//                           transposed block mask lists (partial tiles apply mask_mod):
//                             S^T = K Q^T, dP^T = V dO^T                      (fj_qk)
//                             P^T = 2^(score_mod(scale S^T) log2 e - lse2)
//                             dS'^T = P^T (dP^T - delta)  -> captured-buffer gradients (fp32
//                                   atomics, or with kDeterministic the warp's partial slice)
//                             dS^T = dS'^T * d score_mod / d score
//                             dV += P^T dO, dK += dS^T Q                       (fj_pv)
//                           so dK / dV of a kv head sum over its q heads without any race.
//   flexjit_bwd_bufgrad_reduce  (the dK/dV module's second kernel, deterministic mode) sums the
//                           partial slices in a fixed order into the buffer gradients.
//   flexjit_bwd_dq          one CTA per q tile, over the KV tiles of the block mask (as the
//                           forward): S, dP, P, dS as above, dQ += dS K. A second pass instead
//                           of fp32 atomics into a dQ accumulator: no workspace, no convert
//                           kernel, and dQ is deterministic.
// Warps own 16-row slices of the CTA's tile (kv rows in dK/dV, q rows in dQ). With head dim
// 256 the dK / dV accumulators of 16 rows do not fit one warp's registers: kDSplit warps share
// a row slice, each accumulating 1/kDSplit of the head dim (S^T and dP^T are computed by each).
// Head dims: the dK/dV and dQ kernels' kHeadDimQK / kHeadDimV are tile dims (64 / 128 / 256), the
// problem's kRealDimQK / kRealDimV any multiple of 8 up to them (FjBwdTraits); the row kernels
// (preprocess, dQ convert) take the problem's dims as kHeadDimQK / kHeadDimV, and kDqAccumDim is
// the dQ accumulator's row width.
#ifndef FLEXJIT_BACKWARD_SM80_CUH_
#define FLEXJIT_BACKWARD_SM80_CUH_

// The fragment counts and tiles of one warp-level GEMM for fj_qk / fj_pv (attention_sm80.cuh):
// fj_qk: [kMTiles*16 x kNTiles*8] = A B^T over DimK; fj_pv: [kMTiles*16 x DimOutCols] += P B,
// where B's rows are DimOutRow elements wide (the columns computed start where the caller
// points the B address: a multiple of 8 16-byte chunks keeps the swizzle phase).
template <class Element, int MTiles, int NTiles, int DimK, int DimOutRow, int DimOutCols>
struct FjGemmShape {
  using Mma = FjMma<Element>;
  static constexpr int kMTiles = MTiles;
  static constexpr int kNTiles = NTiles;
  static constexpr int kElemBytes = (int)sizeof(Element);
  static constexpr bool kTf32 = kElemBytes == 4;
  static constexpr int kKSteps = DimK * kElemBytes / 32;
  static constexpr bool kQInRegs = false;
  static constexpr int kDTiles = DimOutCols / 8;
  using TileQK = FjSwizzledTile<DimK, kElemBytes>;
  using TileV = FjSwizzledTile<DimOutRow, kElemBytes>;
  static_assert(DimOutCols % 16 == 0 && DimOutRow % DimOutCols == 0,
                "flexjit backward_sm80: output columns must split the row evenly");
  static_assert((DimOutCols * kElemBytes / 16) % 8 == 0 || DimOutCols == DimOutRow,
                "flexjit backward_sm80: a split of the head dim must keep whole swizzle rows");
};

template <class Cfg>
struct FjBwdTraits {
  using Element = typename Cfg::Element;
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr int kNumWarps = Cfg::kNumWarps;
  static constexpr int kNumStages = Cfg::kNumStages;
  static constexpr int kThreads = kNumWarps * 32;
  static constexpr int kDimQK = Cfg::kHeadDimQK;  // tile dims: the shared-memory layouts
  static constexpr int kDimV = Cfg::kHeadDimV;
  // The problem's head dims (multiples of 8, <= the tiles): loads zero-fill the columns past
  // them, so the padded columns of S, dP, dK, dV and dQ are zero; stores write only theirs.
  static constexpr int kRealQK = Cfg::kRealDimQK;
  static constexpr int kRealV = Cfg::kRealDimV;
  static constexpr int kElemBytes = (int)sizeof(Element);
  // fp32 inputs: S and dP to fp32 accuracy (3 tf32 products each). dS = P (dP - delta) cancels,
  // and a tf32 dP alone leaves errors of 1e-3 of |dP| in dQ and dK.
  static constexpr bool kSplit = kElemBytes == 4;
  using TileQK = FjSwizzledTile<kDimQK, kElemBytes, kRealQK>;
  using TileV = FjSwizzledTile<kDimV, kElemBytes, kRealV>;
  static constexpr int kQKBytesM = kBlockM * kDimQK * kElemBytes;  // a Q (or dQ) tile
  static constexpr int kVBytesM = kBlockM * kDimV * kElemBytes;    // a dO tile
  static constexpr int kQKBytesN = kBlockN * kDimQK * kElemBytes;  // a K (or dK) tile
  static constexpr int kVBytesN = kBlockN * kDimV * kElemBytes;    // a V (or dV) tile
  static_assert((kDimQK == 64 || kDimQK == 128 || kDimQK == 256) &&
                    (kDimV == 64 || kDimV == 128 || kDimV == 256),
                "flexjit backward_sm80: tile dims must be 64, 128 or 256");
  static_assert(kBlockM % 16 == 0 && kBlockN % 16 == 0, "flexjit backward_sm80: tiles of 16s");
  static_assert(kNumStages >= 1 && kNumStages <= 3, "flexjit backward_sm80: 1..3 stages");
};

// Two f32 values of a fragment stored as two adjacent elements (see the forward's epilogue).
template <class T>
FJ_DEVICE void fj_stage_fragment_row(unsigned char* tile_smem, int row, int col_tile, int lane,
                                     float x0, float x1, float mul) {
  using Tile = typename T::Tile;
  constexpr bool kTf32 = T::kElemBytes == 4;
  const int chunk = kTf32 ? 2 * col_tile + ((lane & 3) >> 1) : col_tile;
  const int in_chunk = kTf32 ? (lane & 1) * 8 : (lane & 3) * 4;
  T::Mma::store2(tile_smem + Tile::offset(row, chunk) + in_chunk, x0 * mul, x1 * mul);
}

// Copies a staged kRows x Tile tile of shared memory to global memory, rows < rows_valid and the
// chunks of the head dim (Tile::kValidChunks).
template <class Tile, int kRows, int kThreads>
FJ_DEVICE void fj_store_tile(char* gmem, fj_i64 stride_bytes, const unsigned char* smem,
                             int rows_valid, int tid) {
  constexpr int kPerThread = (kRows * Tile::kChunks + kThreads - 1) / kThreads;
#pragma unroll
  for (int it = 0; it < kPerThread; ++it) {
    const int idx = it * kThreads + tid;
    const int r = idx / Tile::kChunks;
    const int c = idx % Tile::kChunks;
    if (r >= kRows || r >= rows_valid || c >= Tile::kValidChunks) continue;
    *reinterpret_cast<fj_u32x4*>(gmem + (fj_i64)r * stride_bytes + c * 16) =
        *reinterpret_cast<const fj_u32x4*>(smem + Tile::offset(r, c));
  }
}

template <class E, int kDim>
struct FjStageShape {
  using Mma = FjMma<E>;
  using Tile = FjSwizzledTile<kDim, (int)sizeof(E)>;
  static constexpr int kElemBytes = (int)sizeof(E);
};

// ---- preprocess ------------------------------------------------------------------------------

// Sum of the products of 16 bytes of elements (8 bf16 / f16, or 4 f32).
template <class E>
struct FjDot16;
template <>
struct FjDot16<fj_bf16> {
  static FJ_DEVICE float lo(fj_u32 x) { return __int_as_float((int)(x << 16)); }
  static FJ_DEVICE float hi(fj_u32 x) { return __int_as_float((int)(x & 0xffff0000u)); }
  static FJ_DEVICE float dot(const fj_u32x4& a, const fj_u32x4& b) {
    return lo(a.x) * lo(b.x) + hi(a.x) * hi(b.x) + lo(a.y) * lo(b.y) + hi(a.y) * hi(b.y) +
           lo(a.z) * lo(b.z) + hi(a.z) * hi(b.z) + lo(a.w) * lo(b.w) + hi(a.w) * hi(b.w);
  }
};
template <>
struct FjDot16<fj_f16> {
  static FJ_DEVICE float cvt(fj_u32 x) {
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"((unsigned short)(x & 0xffffu)));
    return r;
  }
  static FJ_DEVICE float lo(fj_u32 x) { return cvt(x); }
  static FJ_DEVICE float hi(fj_u32 x) { return cvt(x >> 16); }
  static FJ_DEVICE float dot(const fj_u32x4& a, const fj_u32x4& b) {
    return lo(a.x) * lo(b.x) + hi(a.x) * hi(b.x) + lo(a.y) * lo(b.y) + hi(a.y) * hi(b.y) +
           lo(a.z) * lo(b.z) + hi(a.z) * hi(b.z) + lo(a.w) * lo(b.w) + hi(a.w) * hi(b.w);
  }
};
template <>
struct FjDot16<float> {
  static FJ_DEVICE float dot(const fj_u32x4& a, const fj_u32x4& b) {
    return __uint_as_float(a.x) * __uint_as_float(b.x) +
           __uint_as_float(a.y) * __uint_as_float(b.y) +
           __uint_as_float(a.z) * __uint_as_float(b.z) +
           __uint_as_float(a.w) * __uint_as_float(b.w);
  }
};

#if defined(FJ_BWD_PREPROCESS)
// 4 warps, 16 rows each: lane l sums 16-byte chunks l, l + 32, ... of the row, then the warp
// reduces. Rows in [seqlen_q, seqlen_q_pad) get lse2 = +inf and delta = 0. With a dQ
// accumulator, its rows are zeroed here too.
extern "C" __global__ void __launch_bounds__(128) flexjit_bwd_preprocess(const FjBwdArgs args) {
  using E = typename FjConfig::Element;
  constexpr int kChunks = FjConfig::kHeadDimV * (int)sizeof(E) / 16;
  constexpr float kLog2e = 1.4426950408889634f;
  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const fj_i64 ws_row0 = ((fj_i64)b * args.heads_q + h) * args.seqlen_q_pad;
  for (int r = 0; r < 16; ++r) {
    const int row = blockIdx.x * 64 + warp * 16 + r;
    if (row >= args.seqlen_q_pad) return;
    float acc = 0.0f;
    if (row < args.seqlen_q) {
      const char* o = static_cast<const char*>(args.out) +
                      sizeof(E) * ((fj_i64)b * args.o_stride_b + (fj_i64)h * args.o_stride_h +
                                   (fj_i64)row * args.o_stride_s);
      const char* d = static_cast<const char*>(args.dout) +
                      sizeof(E) * ((fj_i64)b * args.do_stride_b + (fj_i64)h * args.do_stride_h +
                                   (fj_i64)row * args.do_stride_s);
      for (int c = lane; c < kChunks; c += 32) {
        acc += FjDot16<E>::dot(*reinterpret_cast<const fj_u32x4*>(o + 16 * c),
                               *reinterpret_cast<const fj_u32x4*>(d + 16 * c));
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
      acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (args.dq_accum != nullptr) {  // the dK/dV kernel adds dQ into it (rows kDqAccumDim wide)
      fj_u32x4* acc_row =
          reinterpret_cast<fj_u32x4*>(args.dq_accum + (ws_row0 + row) * FjConfig::kDqAccumDim);
      for (int c = lane; c < FjConfig::kDqAccumDim / 4; c += 32)
        acc_row[c] = fj_u32x4{0u, 0u, 0u, 0u};
    }
    if (lane != 0) continue;
    float lse2 = __int_as_float(0x7f800000);  // +inf: P = 0 in the row
    float delta = 0.0f;
    if (row < args.seqlen_q) {
      const float lse =
          args.lse[(fj_i64)b * args.lse_stride_b + (fj_i64)h * args.lse_stride_h + row];
      if (lse != fj_neg_inf()) lse2 = lse * kLog2e;
      delta = acc;
      if (args.dlse != nullptr) {
        delta -= args.dlse[(fj_i64)b * args.dlse_stride_b + (fj_i64)h * args.dlse_stride_h + row];
      }
    }
    args.lse2[ws_row0 + row] = lse2;
    args.delta[ws_row0 + row] = delta;
  }
}
#endif  // FJ_BWD_PREPROCESS

// ---- the score recomputation shared by dK/dV and dQ ------------------------------------------

// For one element: the pre-mod score x = scale * q.k, its probability p (0 where masked or out
// of bounds), and on return ds = d loss / d (scale * q.k) with dp = dO . v. `valid`: inside
// the problem (bounds). With `add_grads` the buffer gradients get dS' = p (dp - delta): added at
// once, or summed into grad_acc for the sites with one address per head (fj_bufgrad_flush).
// kDiag: the caller sums the diagonal site (kFjDiagGradSite) itself; its contribution comes
// back in diag_v (0 without add_grads).
// kDl: the score_mod's diagonal load (kFjDiagLoad) comes in as `dl`, loaded by the caller.
template <class Cfg, bool kApplyMask, bool kDiag = false, bool kDl = false>
FJ_DEVICE void fj_bwd_element(float& s_io, float& dp_io, const FjModParams& mods,
                              const FjGradParams& grads, float scale, float lse2, float delta,
                              int b, int h, int q_idx, int kv_idx, bool valid, bool add_grads,
                              float (&grad_acc)[kFjGradSlots], float* diag_v = nullptr,
                              float dl = 0.0f) {
  constexpr float kLog2e = 1.4426950408889634f;
  const float x = s_io * scale;
  float y = x;
  if constexpr (Cfg::kHasScoreMod) {
    if constexpr (kDl) {
      y = fj_score_mod(mods, x, b, h, q_idx, kv_idx, dl);
    } else {
      y = fj_score_mod(mods, x, b, h, q_idx, kv_idx);
    }
  }
  if constexpr (kApplyMask && Cfg::kHasMaskMod) {
    if (!fj_mask_mod(mods, b, h, q_idx, kv_idx)) valid = false;
  }
  const float p = valid ? fj_ex2_approx(y * kLog2e - lse2) : 0.0f;
  const float ds_mod = p * (dp_io - delta);  // d loss / d score_mod's value
  float ds = ds_mod;
  if constexpr (Cfg::kHasScoreMod) {
    if constexpr (kFjHasBufferGrads) {
      if constexpr (kDl) {
        if (add_grads) {
          fj_bufgrad<kDiag>(mods, grads, ds_mod, x, b, h, q_idx, kv_idx, grad_acc, dl);
        }
        if constexpr (kDiag) {
          *diag_v =
              add_grads ? fj_bufgrad_diag_value(mods, ds_mod, x, b, h, q_idx, kv_idx, dl) : 0.0f;
        }
      } else {
        if (add_grads) fj_bufgrad<kDiag>(mods, grads, ds_mod, x, b, h, q_idx, kv_idx, grad_acc);
        if constexpr (kDiag) {
          *diag_v = add_grads ? fj_bufgrad_diag_value(mods, ds_mod, x, b, h, q_idx, kv_idx) : 0.0f;
        }
      }
    }
    // Where P is 0, ds is 0: ds_mod is 0 there, and the select keeps a derivative that is inf or
    // NaN at a masked score from making it NaN (not needed for a constant one: kFjDScoreConst).
    if constexpr (kFjDScoreConst) {
      ds = ds_mod * fj_dscore(mods, x, b, h, q_idx, kv_idx);
    } else if constexpr (kDl) {
      ds = p == 0.0f ? 0.0f : ds_mod * fj_dscore(mods, x, b, h, q_idx, kv_idx, dl);
    } else {
      ds = p == 0.0f ? 0.0f : ds_mod * fj_dscore(mods, x, b, h, q_idx, kv_idx);
    }
  }
  s_io = p;
  dp_io = ds;
}

// ---- buffer gradients along diagonals (kFjDiagGradSite) --------------------------------------

// A warp's dK/dV accumulator fragment covers 16 kv rows x 8 kN8 q columns: thread (g, t) =
// (lane / 4, lane % 4) holds kv rows g, g + 8 and q columns 8 nt + 2t + c. Element (row, col)
// lies on diagonal k = col - row in [-15, 8 kN8 - 1], where q_idx - kv_idx is d = d0 + dir * k
// (d0 = q0 - kv0 at the fragment's first (q, kv); dir = +1, the rows being kv), and the
// diagonal site's indices are a function of d (kFjDiagGradSite). Instead of one atomic per element,
// the warp sums each diagonal:
//   put()    in the element loop (nt outer, then c, then hr): element (g + 8 hr, 8 nt + u),
//            u = 2t + c, lies on diagonal k = 8 (nt - hr) + u - g. Row g + 8 of column tile nt
//            and row g of tile nt - 1 share their diagonals: a thread adds the two in a register
//            and stores the sum at (r = 8 nt + u, g) of its warp's table (one store per two
//            elements);
//   flush()  diagonal k is the sum over g of the table's (k + g + 8, g): lane l sums diagonals
//            l - 15, l + 17, ... with 8 loads at immediate offsets each, and adds each nonzero
//            sum with one fp32 atomic at the site's indices on diagonal d
//            (fj_bufgrad_diag_add_at).
// The table: rows r in [-7, 8 kN8 + 15) of 9 floats (8 used: the odd row length spreads both the
// stores and the loads over the banks); the rows outside [0, 8 kN8 + 8) are zero (init()) and
// every row inside is rewritten by every tile.
template <int kN8>
struct FjDiagGrad {
  static constexpr int kRowLo = 7;                // rows below r = 0
  static constexpr int kRows = 8 * kN8 + 8 + 14;  // r in [-7, 8 kN8 + 15)
  static constexpr int kFloats = kRows * 9;       // per warp
  float* scratch;                                 // this warp's kFloats (shared memory)
  float* mine;                                    // (u = 2t, g): the lane's first element
  float hold[2] = {0.0f, 0.0f};                   // row g of the current column tile
  float pend[2] = {0.0f, 0.0f};                   // row g of the previous column tile

  FJ_DEVICE static constexpr int at(int r, int g) { return 9 * (r + kRowLo) + g; }

  // Zeroes the rows no tile writes. Every lane of the warp together, once.
  FJ_DEVICE void init(float* warp_scratch, int lane) {
    scratch = warp_scratch;
    mine = scratch + at((lane & 3) * 2, lane >> 2);
    for (int i = lane; i < 9 * kRowLo; i += 32) {
      scratch[i] = 0.0f;
      scratch[at(8 * kN8 + 8, 0) + i] = 0.0f;
    }
    __syncwarp();
  }

  FJ_DEVICE void put(int nt, int c, int hr, float v, int lane) {
    if (hr == 0) {
      hold[c] = v;
      return;
    }
    // Row 8 nt + u: row g + 8 of tile nt, row g of tile nt - 1 (at an immediate offset from the
    // lane's first element).
    (void)lane;
    mine[at(8 * nt + c, 0) - at(0, 0)] = pend[c] + v;
    pend[c] = hold[c];
  }

  // After the element loop: the last row group, then the sums. Every lane of the warp together.
  FJ_DEVICE void flush(const FjModParams& mods, const FjGradParams& grads, int b, int h, int d0,
                       int dir, int lane) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      mine[at(8 * kN8 + c, 0) - at(0, 0)] = pend[c];
      pend[c] = 0.0f;
    }
    __syncwarp();
    if constexpr (kFjGradSmemFloats > 0) {
      // Into the CTA's private copy: every lane calls the add together (fj_grad_add_shared sums
      // the lanes whose diagonals share an address, as T5's buckets far from the diagonal do).
      // A lane without a sum takes the diagonal of one that has, so the site's indices are
      // evaluated only on diagonals that hold an element, as below.
#pragma unroll
      for (int k0 = -15; k0 < 8 * kN8; k0 += 32) {
        const int k = k0 + lane;
        float sum = 0.0f;
        if (k < 8 * kN8) {
          const float* row = scratch + at(k + 8, 0);
#pragma unroll
          for (int g = 0; g < 8; ++g)
            sum += row[10 * g];
        }
        const int d = (int)((unsigned)d0 + (unsigned)(dir * k));
        const unsigned nz = __ballot_sync(0xffffffffu, sum != 0.0f);
        if (nz != 0u) {
          const int d_any = __shfl_sync(0xffffffffu, d, __ffs(nz) - 1);
          fj_bufgrad_diag_add_at(mods, grads, b, h, sum != 0.0f ? d : d_any, sum);
        }
      }
    } else {
#pragma unroll
      for (int k0 = -15; k0 < 8 * kN8; k0 += 32) {
        const int k = k0 + lane;
        if (k < 8 * kN8) {
          const float* row = scratch + at(k + 8, 0);  // (k + g + 8, g) = row + 10 g
          float sum = 0.0f;
#pragma unroll
          for (int g = 0; g < 8; ++g)
            sum += row[10 * g];
          // d0 + dir * k in wrapping i32 arithmetic, as q_idx - kv_idx itself.
          const int d = (int)((unsigned)d0 + (unsigned)(dir * k));
          if (sum != 0.0f) fj_bufgrad_diag_add_at(mods, grads, b, h, d, sum);
        }
      }
    }
    __syncwarp();
  }
};

// ---- dK / dV ---------------------------------------------------------------------------------

#if defined(FJ_BWD_DKDV)
// Deterministic buffer gradients: the partial slice of the 16 kv rows [kv_start + 16 * row_warp,
// +16) of (b, kv head h_kv). Slices of one (b, h_kv) are numbered by 16-row kv group over
// round_up(Skv, 128) rows, whatever the tiles (the host sizes them: backward_bufgrad_slices).
FJ_DEVICE fj_i64 fj_bwd_bufgrad_slice(int b, int h_kv, int heads_kv, int seqlen_kv, int kv_start,
                                      int row_warp) {
  const fj_i64 per_head = ((fj_i64)seqlen_kv + 127) / 128 * 8;
  return ((fj_i64)b * heads_kv + h_kv) * per_head + kv_start / 16 + row_warp;
}

// The fixed-order reduction of the partial slices into the buffer gradients (deterministic
// mode; launched after flexjit_bwd_dkdv on the same stream). Block: 32 warps x 32 elements of a
// slice. The ceil(Skv / 16) slices of each (b, kv head) that some warp wrote, (b, h_kv) major,
// are numbered t = 0, 1, ...; warp w sums t in [8w, 8w + 8), [8w + 256, 8w + 264), ... in
// increasing order (8 loads in flight, added in order), then warp 0 sums the 32 warp sums in
// order and writes the gradient. Every element of every gradient is written.
extern "C" __global__ void __launch_bounds__(1024)
    flexjit_bwd_bufgrad_reduce(const FjBwdArgs args, const FjGradParams grads) {
  constexpr int kWarps = 32, kUnroll = 8;
  __shared__ float sums[kWarps][33];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const fj_i64 n = fj_bufgrad_slice_elems(grads);
  const fj_i64 e = (fj_i64)blockIdx.x * 32 + lane;
  const float* partials = fj_bufgrad_partials(grads);
  const fj_i64 used = (args.seqlen_kv + 15) / 16;  // slices written per (b, h_kv)
  const fj_i64 per_head = ((fj_i64)args.seqlen_kv + 127) / 128 * 8;
  const fj_i64 total = (fj_i64)args.batch * args.heads_kv * used;
  float acc = 0.0f;
  if (e < n) {
    for (fj_i64 t0 = (fj_i64)warp * kUnroll; t0 < total; t0 += kWarps * kUnroll) {
      float x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const fj_i64 t = t0 + u;
        x[u] = t < total ? partials[((t / used) * per_head + t % used) * n + e] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (t0 + u < total) acc += x[u];
    }
  }
  sums[warp][lane] = acc;
  __syncthreads();
  if (warp != 0 || e >= n) return;
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w)
    sum += sums[w][lane];
  fj_bufgrad_store(grads, e, sum);
}

// Shapes and shared-memory layout of the dK/dV kernel: the K and V tiles (loaded once), the
// kNumStages stages of Q, dO, lse2 and delta, and with dq_atomic the f32 dS tile.
template <class Cfg>
struct FjDkDvSm80Shape {
  using T = FjBwdTraits<Cfg>;
  using E = typename T::Element;
  static constexpr int kBM = T::kBlockM, kBN = T::kBlockN, kThreads = T::kThreads;
  static constexpr int kRowWarps = kBN / 16;
  static constexpr int kDSplit = T::kNumWarps / kRowWarps;
  static_assert(kRowWarps * kDSplit == T::kNumWarps && kDSplit >= 1,
                "flexjit bwd_dkdv: num_warps must be a multiple of block_n / 16");
  static constexpr int kDqkW = T::kDimQK / kDSplit, kDvW = T::kDimV / kDSplit;  // per warp
  using ShapeS = FjGemmShape<E, 1, kBM / 8, T::kDimQK, T::kDimQK, T::kDimQK>;
  using ShapeDP = FjGemmShape<E, 1, kBM / 8, T::kDimV, T::kDimV, T::kDimV>;
  using ShapeDV = FjGemmShape<E, 1, kBM / 8, T::kDimV, T::kDimV, kDvW>;
  using ShapeDK = FjGemmShape<E, 1, kBM / 8, T::kDimQK, T::kDimQK, kDqkW>;
  static constexpr bool kCheck = !Cfg::kIsDivisible;
  static constexpr int kStageBytes = T::kQKBytesM + T::kVBytesM + 8 * kBM;
  // dQ by atomics: the dS tile in f32, [q][kv] with a padded row (conflict-free transposing
  // stores), read back by q-row slices; each slice's kDqWarps warps split the head dim.
  static constexpr int kDsStride = kBN + 4;
  static constexpr int kDsBytes = Cfg::kDqAtomic ? 4 * kBM * kDsStride : 0;
  static constexpr int kQSlices = kBM / 16;
  static constexpr int kDqWarps =
      Cfg::kDqAtomic && T::kNumWarps / kQSlices > 0 ? T::kNumWarps / kQSlices : 1;
  static constexpr int kDqCols = T::kDimQK / kDqWarps;         // head-dim columns per warp
  static constexpr int kDqPass = kDqCols < 64 ? kDqCols : 64;  // columns per product
  static_assert(!Cfg::kDqAtomic || (T::kNumWarps % kQSlices == 0 && kDqCols % 16 == 0),
                "flexjit bwd_dkdv: dq_atomic needs num_warps a multiple of block_m / 16");
  static_assert(T::kQKBytesN + T::kVBytesN + T::kNumStages * kStageBytes + kDsBytes ==
                    fj_bwd_dkdv_smem_bytes(kBM, kBN, T::kDimQK, T::kDimV, T::kElemBytes,
                                           T::kNumStages, Cfg::kDqAtomic ? 1 : 0),
                "flexjit bwd_dkdv: shared-memory layout and fj_bwd_dkdv_smem_bytes disagree");
  static_assert(kBM / 4 <= kThreads / 2, "flexjit bwd_dkdv: lse2 / delta copies per thread");
};

// Loads: the K and V tiles of keys [n_start, n_start + kBN) of (b, h_kv), once.
template <class Cfg>
FJ_DEVICE void fj_dkdv_sm80_load_kv(const FjBwdArgs& args, fj_u32 sk, fj_u32 sv, int b, int h_kv,
                                    int n_start, int tid) {
  using T = FjBwdTraits<Cfg>;
  using S = FjDkDvSm80Shape<Cfg>;
  fj_load_tile<typename T::TileQK, S::kBN, S::kThreads, S::kCheck>(
      sk,
      static_cast<const char*>(args.k) +
          T::kElemBytes * ((fj_i64)b * args.k_stride_b + (fj_i64)h_kv * args.k_stride_h +
                           (fj_i64)n_start * args.k_stride_s),
      args.k_stride_s, args.seqlen_kv - n_start, tid);
  fj_load_tile<typename T::TileV, S::kBN, S::kThreads, S::kCheck>(
      sv,
      static_cast<const char*>(args.v) +
          T::kElemBytes * ((fj_i64)b * args.v_stride_b + (fj_i64)h_kv * args.v_stride_h +
                           (fj_i64)n_start * args.v_stride_s),
      args.v_stride_s, args.seqlen_kv - n_start, tid);
  fj_cp_async_commit();
}

// Loads: the Q, dO, lse2 and delta copies of q tile `tile` of head h into stage `stage` (the
// pipeline's load; a struct, not a lambda, so the kernel's loop stays short).
template <class Cfg>
struct FjDkDvSm80QLoader {
  using T = FjBwdTraits<Cfg>;
  using S = FjDkDvSm80Shape<Cfg>;
  const FjBwdArgs& args;
  const char* q_head;
  const char* do_head;
  fj_i64 ws_row0;  // the head's first row of lse2 / delta
  fj_u32 sstage;
  int tid;

  FJ_DEVICE void operator()(int tile, int stage) const {
    constexpr int kBM = S::kBM;
    const int m0 = tile * kBM;
    if (m0 >= args.seqlen_q) return;
    const fj_u32 st = sstage + stage * S::kStageBytes;
    fj_load_tile<typename T::TileQK, kBM, S::kThreads, S::kCheck>(
        st, q_head + T::kElemBytes * (fj_i64)m0 * args.q_stride_s, args.q_stride_s,
        args.seqlen_q - m0, tid);
    fj_load_tile<typename T::TileV, kBM, S::kThreads, S::kCheck>(
        st + T::kQKBytesM, do_head + T::kElemBytes * (fj_i64)m0 * args.do_stride_s,
        args.do_stride_s, args.seqlen_q - m0, tid);
    // kBM / 4 chunks of lse2, then of delta (rows of seqlen_q_pad: always in bounds).
    if (tid < kBM / 2) {
      const bool is_delta = tid >= kBM / 4;
      const int c = is_delta ? tid - kBM / 4 : tid;
      const float* src = (is_delta ? args.delta : args.lse2) + ws_row0 + m0 + 4 * c;
      fj_cp_async_16(st + T::kQKBytesM + T::kVBytesM + (is_delta ? 4 * kBM : 0) + 16 * c, src,
                     true);
    }
  }
};

// Deterministic buffer gradients (kDeterministic): this warp's 16 kv rows add into their own
// partial slice of the workspace (fj_bwd_bufgrad_slice); the CTA zeroes its slices first (even
// when no hook adds: the reduction reads them). The per-element hooks get the slice through the
// returned parameters; the per-head sums only at the flush (the slice's address is not live in
// the main loop). Otherwise the hooks add into the gradients with atomics: `grads`.
template <class Cfg>
FJ_DEVICE FjGradParams fj_dkdv_sm80_grad_target(const FjBwdArgs& args, const FjGradParams& grads,
                                                int b, int h_kv, int n_start, int row_warp,
                                                int tid) {
  using S = FjDkDvSm80Shape<Cfg>;
  FjGradParams gw = grads;
  if constexpr (Cfg::kDeterministic) {
    const fj_i64 first = fj_bwd_bufgrad_slice(b, h_kv, args.heads_kv, args.seqlen_kv, n_start, 0);
    const fj_i64 n4 = fj_bufgrad_slice_elems(grads) / 4 * S::kRowWarps;
    fj_u32x4* zero = reinterpret_cast<fj_u32x4*>(const_cast<float*>(fj_bufgrad_partials(grads)) +
                                                 first * fj_bufgrad_slice_elems(grads));
    for (fj_i64 i = tid; i < n4; i += S::kThreads)
      zero[i] = fj_u32x4{0u, 0u, 0u, 0u};
    if constexpr (kFjElementGradSites > 0) gw = fj_bufgrad_with_slice(grads, first + row_warp);
    __syncthreads();
  }
  return gw;
}

// P^T and dS^T of one q tile from S^T and dP^T (this warp's kv rows, the tile's kBM q columns,
// lse2 / delta from the stage); a partial tile applies mask_mod. Each warp of a
// kDSplit group sees the same elements: `adds` (part 0) adds the buffers' gradients.
template <class Cfg>
FJ_DEVICE void fj_dkdv_sm80_elements(float (&s)[1][Cfg::kBlockM / 8][4],
                                     float (&dp)[1][Cfg::kBlockM / 8][4], const FjBwdArgs& args,
                                     const FjModParams& mods, const FjGradParams& gw,
                                     float (&grad_acc)[kFjGradSlots], const float* s_lse2,
                                     const float* s_delta, int b, int h, int m0, int kv_row0,
                                     int lane, bool adds, bool partial) {
  constexpr bool kCheck = !Cfg::kIsDivisible;
#pragma unroll
  for (int nt = 0; nt < Cfg::kBlockM / 8; ++nt) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = nt * 8 + (lane & 3) * 2 + c;  // q row within the tile
      int q_idx = m0 + col;
      const bool q_ok = !kCheck || q_idx < args.seqlen_q;
      if constexpr (kCheck) q_idx = fj_imin(q_idx, args.seqlen_q - 1);
      const float lse2 = s_lse2[col], delta = s_delta[col];
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        int kv_idx = kv_row0 + hr * 8;
        const bool ok = q_ok && (!kCheck || kv_idx < args.seqlen_kv);
        if constexpr (kCheck) kv_idx = fj_imin(kv_idx, args.seqlen_kv - 1);
        if (!partial) {
          fj_bwd_element<Cfg, false>(s[0][nt][hr * 2 + c], dp[0][nt][hr * 2 + c], mods, gw,
                                     args.scale, lse2, delta, b, h, q_idx, kv_idx, ok, adds,
                                     grad_acc);
        } else {
          fj_bwd_element<Cfg, true>(s[0][nt][hr * 2 + c], dp[0][nt][hr * 2 + c], mods, gw,
                                    args.scale, lse2, delta, b, h, q_idx, kv_idx, ok, adds,
                                    grad_acc);
        }
      }
    }
  }
}

// dq_atomic: dQ[q] += dS[q][kv] K[kv]: dS^T (rows kv) into shared memory as dS (rows q), then
// each q-row slice times the K tile, added into the f32 accumulator (rows from ws_row0 + m0).
template <class Cfg>
FJ_DEVICE void fj_dkdv_sm80_dq_atomic(const float (&dp)[1][Cfg::kBlockM / 8][4],
                                      const FjBwdArgs& args, unsigned char* smem, fj_u32 sk,
                                      fj_i64 ws_row0, int m0, int warp, int lane, int row_warp,
                                      int part) {
  using T = FjBwdTraits<Cfg>;
  using S = FjDkDvSm80Shape<Cfg>;
  using E = typename T::Element;
  constexpr int kBM = S::kBM, kBN = S::kBN, kDsStride = S::kDsStride;
  constexpr bool kCheck = S::kCheck;
  float* sds =
      reinterpret_cast<float*>(smem + T::kQKBytesN + T::kVBytesN + T::kNumStages * S::kStageBytes);
  if (part == 0) {
#pragma unroll
    for (int nt = 0; nt < kBM / 8; ++nt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
#pragma unroll
        for (int c = 0; c < 2; ++c)
          sds[(nt * 8 + (lane & 3) * 2 + c) * kDsStride + row_warp * 16 + hr * 8 + (lane >> 2)] =
              dp[0][nt][hr * 2 + c];
  }
  __syncthreads();
  const int slice = warp / S::kDqWarps, col_warp = (warp % S::kDqWarps) * S::kDqCols;
  float ds[1][kBN / 8][4];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const float* src = sds + (slice * 16 + hr * 8 + (lane >> 2)) * kDsStride + (lane & 3) * 2;
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) {
      ds[0][nt][hr * 2] = src[nt * 8];
      ds[0][nt][hr * 2 + 1] = src[nt * 8 + 1];
    }
  }
  using ShapeDQ = FjGemmShape<E, 1, kBN / 8, T::kDimQK, T::kDimQK, S::kDqPass>;
  // Accumulator rows are kDqAccumDim floats wide (dq_accum_dim); only the columns of the head
  // dim are added.
  constexpr int kAccRow = Cfg::kDqAccumDim;
  float* acc_base = args.dq_accum + (ws_row0 + m0 + slice * 16 + (lane >> 2)) * kAccRow;
#pragma unroll
  for (int col0 = 0; col0 < S::kDqCols; col0 += S::kDqPass) {
    float part_dq[1][ShapeDQ::kDTiles][4];
#pragma unroll
    for (int dt = 0; dt < ShapeDQ::kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        part_dq[0][dt][e] = 0.0f;
    fj_pv<ShapeDQ>(part_dq, ds, sk + (col_warp + col0) * T::kElemBytes, lane);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      if (kCheck && m0 + slice * 16 + hr * 8 + (lane >> 2) >= args.seqlen_q) continue;
      const int col = col_warp + col0 + (lane & 3) * 2;
      float* row = acc_base + hr * 8 * kAccRow + col;
#pragma unroll
      for (int dt = 0; dt < ShapeDQ::kDTiles; ++dt) {
        if (T::kRealQK != T::kDimQK && col + dt * 8 >= T::kRealQK) continue;
        atomicAdd(row + dt * 8, part_dq[0][dt][hr * 2]);
        atomicAdd(row + dt * 8 + 1, part_dq[0][dt][hr * 2 + 1]);
      }
    }
  }
}

// Epilogue: dK (times scale) into the K tile's shared memory, dV into the V tile's, then 16-byte
// stores of the rows inside seqlen_kv.
template <class Cfg>
FJ_DEVICE void fj_dkdv_sm80_epilogue(
    const float (&dk)[1][FjDkDvSm80Shape<Cfg>::ShapeDK::kDTiles][4],
    const float (&dv)[1][FjDkDvSm80Shape<Cfg>::ShapeDV::kDTiles][4], const FjBwdArgs& args,
    unsigned char* smem, int b, int h_kv, int n_start, int row_warp, int part, int lane, int tid) {
  using T = FjBwdTraits<Cfg>;
  using S = FjDkDvSm80Shape<Cfg>;
  using E = typename T::Element;
  using StageK = FjStageShape<E, T::kDimQK>;
  using StageV = FjStageShape<E, T::kDimV>;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int row = row_warp * 16 + hr * 8 + (lane >> 2);
#pragma unroll
    for (int dt = 0; dt < S::ShapeDK::kDTiles; ++dt)
      fj_stage_fragment_row<StageK>(smem, row, part * S::ShapeDK::kDTiles + dt, lane,
                                    dk[0][dt][hr * 2], dk[0][dt][hr * 2 + 1], args.scale);
#pragma unroll
    for (int dt = 0; dt < S::ShapeDV::kDTiles; ++dt)
      fj_stage_fragment_row<StageV>(smem + T::kQKBytesN, row, part * S::ShapeDV::kDTiles + dt, lane,
                                    dv[0][dt][hr * 2], dv[0][dt][hr * 2 + 1], 1.0f);
  }
  __syncthreads();
  fj_store_tile<typename T::TileQK, S::kBN, S::kThreads>(
      static_cast<char*>(args.dk) +
          T::kElemBytes * ((fj_i64)b * args.dk_stride_b + (fj_i64)h_kv * args.dk_stride_h +
                           (fj_i64)n_start * args.dk_stride_s),
      T::kElemBytes * args.dk_stride_s, smem, args.seqlen_kv - n_start, tid);
  fj_store_tile<typename T::TileV, S::kBN, S::kThreads>(
      static_cast<char*>(args.dv) +
          T::kElemBytes * ((fj_i64)b * args.dv_stride_b + (fj_i64)h_kv * args.dv_stride_h +
                           (fj_i64)n_start * args.dv_stride_s),
      T::kElemBytes * args.dv_stride_s, smem + T::kQKBytesN, args.seqlen_kv - n_start, tid);
}

extern "C" __global__ void __launch_bounds__(FjConfig::kNumWarps * 32, 1)
    flexjit_bwd_dkdv(const FjBwdArgs args, const FjModParams mods, const FjGradParams grads) {
  using Cfg = FjConfig;
  using T = FjBwdTraits<Cfg>;
  using S = FjDkDvSm80Shape<Cfg>;
  constexpr int kBM = S::kBM, kBN = S::kBN;
  extern __shared__ unsigned char fj_smem[];

  const int n_block = blockIdx.x, h_kv = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row_warp = warp / S::kDSplit, part = warp % S::kDSplit;
  const int n_start = n_block * kBN;

  const fj_u32 sk = fj_smem_addr(fj_smem);
  const fj_u32 sv = sk + T::kQKBytesN;
  const fj_u32 sstage = sv + T::kVBytesN;
  const fj_u32 sk_warp = sk + row_warp * 16 * T::TileQK::kRowBytes;
  const fj_u32 sv_warp = sv + row_warp * 16 * T::TileV::kRowBytes;
  fj_dkdv_sm80_load_kv<Cfg>(args, sk, sv, b, h_kv, n_start, tid);
  if constexpr (kFjGradSmemFloats > 0) {
    // The CTA's private copy of small buffer gradients (docs/backward.md), zero before any add.
    fj_bufgrad_smem_zero(tid, Cfg::kNumWarps * 32);
    __syncthreads();
  }

  float dk[1][S::ShapeDK::kDTiles][4], dv[1][S::ShapeDV::kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < S::ShapeDK::kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dk[0][dt][e] = 0.0f;
#pragma unroll
  for (int dt = 0; dt < S::ShapeDV::kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dv[0][dt][e] = 0.0f;

  const fj_u32 dummy[1][1][4] = {};
  // This thread's kv rows (g, g + 8 of the warp's slice), clamped for the mods.
  const int kv_row0 = n_start + row_warp * 16 + (lane >> 2);
  const FjGradParams gw =
      fj_dkdv_sm80_grad_target<Cfg>(args, grads, b, h_kv, n_start, row_warp, tid);

  float grad_acc[kFjGradSlots];  // buffer-gradient sums with one address per head
  for (int g = 0; g < Cfg::kGqaRatio; ++g) {
    const int h = h_kv * Cfg::kGqaRatio + g;
#pragma unroll
    for (int i = 0; i < kFjGradSlots; ++i)
      grad_acc[i] = 0.0f;
    const FjKvSchedule sched =
        fj_block_schedule<kBN, kBM, Cfg::kHasFullBlocks>(args.mask_t, args.seqlen_q, b, h, n_block);
    const char* q_head =
        static_cast<const char*>(args.q) +
        T::kElemBytes * ((fj_i64)b * args.q_stride_b + (fj_i64)h * args.q_stride_h);
    const char* do_head =
        static_cast<const char*>(args.dout) +
        T::kElemBytes * ((fj_i64)b * args.do_stride_b + (fj_i64)h * args.do_stride_h);
    const fj_i64 ws_row0 = ((fj_i64)b * args.heads_q + h) * args.seqlen_q_pad;
    const FjDkDvSm80QLoader<Cfg> load_q{args, q_head, do_head, ws_row0, sstage, tid};
    FjTilePipeline<T::kNumStages> pipe;
    pipe.start(sched, load_q);
    for (int i = 0; i < sched.num_total; ++i) {
      const int m0 = pipe.next(i, sched, load_q) * kBM;
      if (m0 < args.seqlen_q) {
        const fj_u32 st = sstage + (i % T::kNumStages) * S::kStageBytes;
        const fj_u32 sq = st, sdo = st + T::kQKBytesM;
        const float* s_lse2 =
            reinterpret_cast<const float*>(fj_smem + (st - sk) + T::kQKBytesM + T::kVBytesM);
        float s[1][kBM / 8][4], dp[1][kBM / 8][4];
        fj_qk<typename S::ShapeS, T::kSplit>(s, dummy, sk_warp, sq, lane);
        fj_qk<typename S::ShapeDP, T::kSplit>(dp, dummy, sv_warp, sdo, lane);
        fj_dkdv_sm80_elements<Cfg>(s, dp, args, mods, gw, grad_acc, s_lse2, s_lse2 + kBM, b, h, m0,
                                   kv_row0, lane, part == 0, i < sched.num_partial);
        fj_pv<typename S::ShapeDV>(dv, s, sdo + part * S::kDvW * T::kElemBytes, lane);
        fj_pv<typename S::ShapeDK>(dk, dp, sq + part * S::kDqkW * T::kElemBytes, lane);
        if constexpr (Cfg::kDqAtomic) {
          fj_dkdv_sm80_dq_atomic<Cfg>(dp, args, fj_smem, sk, ws_row0, m0, warp, lane, row_warp,
                                      part);
        }
      }
      if constexpr (T::kNumStages == 1) __syncthreads();
    }
    fj_cp_async_wait<0>();
    __syncthreads();  // the next head's prologue overwrites the stages
    // Only the warp that added them holds sums (part 0 of a kDSplit group): in deterministic
    // mode its partner must not write the same slice.
    if constexpr (kFjUniformGradSites > 0) {
      if (part == 0) {
        if constexpr (Cfg::kDeterministic) {
          fj_bufgrad_flush(
              mods,
              fj_bufgrad_with_slice(grads, fj_bwd_bufgrad_slice(b, h_kv, args.heads_kv,
                                                                args.seqlen_kv, n_start, row_warp)),
              b, h, grad_acc);
        } else {
          fj_bufgrad_flush(mods, grads, b, h, grad_acc);
        }
      }
    }
  }
  fj_dkdv_sm80_epilogue<Cfg>(dk, dv, args, fj_smem, b, h_kv, n_start, row_warp, part, lane, tid);
  // Every add happened before the last head's __syncthreads above: the private copy out, one
  // fp32 atomic per element it holds.
  if constexpr (kFjGradSmemFloats > 0) fj_bufgrad_smem_flush(grads, tid, Cfg::kNumWarps * 32);
}
#endif  // FJ_BWD_DKDV

// ---- dQ --------------------------------------------------------------------------------------

#if defined(FJ_BWD_DQ)
// Shapes and shared-memory layout of the dQ kernel: the Q and dO tiles (loaded once), then the
// kNumStages stages of K and V.
template <class Cfg>
struct FjDqSm80Shape {
  using T = FjBwdTraits<Cfg>;
  using E = typename T::Element;
  static constexpr int kBM = T::kBlockM, kBN = T::kBlockN, kThreads = T::kThreads;
  static_assert(kBM == 16 * T::kNumWarps, "flexjit bwd_dq: one 16-row slice per warp");
  using ShapeS = FjGemmShape<E, 1, kBN / 8, T::kDimQK, T::kDimQK, T::kDimQK>;
  using ShapeDP = FjGemmShape<E, 1, kBN / 8, T::kDimV, T::kDimV, T::kDimV>;
  using ShapeDQ = FjGemmShape<E, 1, kBN / 8, T::kDimQK, T::kDimQK, T::kDimQK>;
  static constexpr bool kCheck = !Cfg::kIsDivisible;
  static constexpr int kStageBytes = T::kQKBytesN + T::kVBytesN;
  static_assert(T::kQKBytesM + T::kVBytesM + T::kNumStages * kStageBytes ==
                    fj_bwd_dq_smem_bytes(kBM, kBN, T::kDimQK, T::kDimV, T::kElemBytes,
                                         T::kNumStages),
                "flexjit bwd_dq: shared-memory layout and fj_bwd_dq_smem_bytes disagree");
};

// Loads: the Q and dO tiles of q rows [m_start, m_start + kBM) of (b, h), once.
template <class Cfg>
FJ_DEVICE void fj_dq_sm80_load_qdo(const FjBwdArgs& args, fj_u32 sq, fj_u32 sdo, int b, int h,
                                   int m_start, int tid) {
  using T = FjBwdTraits<Cfg>;
  using S = FjDqSm80Shape<Cfg>;
  fj_load_tile<typename T::TileQK, S::kBM, S::kThreads, S::kCheck>(
      sq,
      static_cast<const char*>(args.q) +
          T::kElemBytes * ((fj_i64)b * args.q_stride_b + (fj_i64)h * args.q_stride_h +
                           (fj_i64)m_start * args.q_stride_s),
      args.q_stride_s, args.seqlen_q - m_start, tid);
  fj_load_tile<typename T::TileV, S::kBM, S::kThreads, S::kCheck>(
      sdo,
      static_cast<const char*>(args.dout) +
          T::kElemBytes * ((fj_i64)b * args.do_stride_b + (fj_i64)h * args.do_stride_h +
                           (fj_i64)m_start * args.do_stride_s),
      args.do_stride_s, args.seqlen_q - m_start, tid);
  fj_cp_async_commit();
}

// Loads: the K and V copies of KV tile `tile` into stage `stage` (the pipeline's load).
template <class Cfg>
struct FjDqSm80KvLoader {
  using T = FjBwdTraits<Cfg>;
  using S = FjDqSm80Shape<Cfg>;
  const FjBwdArgs& args;
  const char* k_head;
  const char* v_head;
  fj_u32 skv;
  int tid;

  FJ_DEVICE void operator()(int tile, int stage) const {
    constexpr int kBN = S::kBN;
    const int n0 = tile * kBN;
    if (n0 >= args.seqlen_kv) return;
    const fj_u32 st = skv + stage * S::kStageBytes;
    fj_load_tile<typename T::TileQK, kBN, S::kThreads, S::kCheck>(
        st, k_head + T::kElemBytes * (fj_i64)n0 * args.k_stride_s, args.k_stride_s,
        args.seqlen_kv - n0, tid);
    fj_load_tile<typename T::TileV, kBN, S::kThreads, S::kCheck>(
        st + T::kQKBytesN, v_head + T::kElemBytes * (fj_i64)n0 * args.v_stride_s, args.v_stride_s,
        args.seqlen_kv - n0, tid);
  }
};

// P and dS of one KV tile from S and dP (this thread's q rows q_row0, q_row0 + 8 with their
// lse2 / delta; the tile's kBN keys from n0); a partial tile applies mask_mod. No buffer
// gradients here (the dK/dV kernel adds them).
template <class Cfg>
FJ_DEVICE void fj_dq_sm80_elements(float (&s)[1][Cfg::kBlockN / 8][4],
                                   float (&dp)[1][Cfg::kBlockN / 8][4], const FjBwdArgs& args,
                                   const FjModParams& mods, const float (&lse2)[2],
                                   const float (&delta)[2], int b, int h, int q_row0, int n0,
                                   int lane, bool partial) {
  constexpr bool kCheck = !Cfg::kIsDivisible;
  const FjGradParams no_grads = {};
  float no_acc[kFjGradSlots] = {};
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    int q_idx = q_row0 + hr * 8;
    if constexpr (kCheck) q_idx = fj_imin(q_idx, args.seqlen_q - 1);
#pragma unroll
    for (int nt = 0; nt < Cfg::kBlockN / 8; ++nt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        int kv_idx = n0 + nt * 8 + (lane & 3) * 2 + c;
        const bool ok = !kCheck || kv_idx < args.seqlen_kv;
        if constexpr (kCheck) kv_idx = fj_imin(kv_idx, args.seqlen_kv - 1);
        if (!partial) {
          fj_bwd_element<Cfg, false>(s[0][nt][hr * 2 + c], dp[0][nt][hr * 2 + c], mods, no_grads,
                                     args.scale, lse2[hr], delta[hr], b, h, q_idx, kv_idx, ok,
                                     false, no_acc);
        } else {
          fj_bwd_element<Cfg, true>(s[0][nt][hr * 2 + c], dp[0][nt][hr * 2 + c], mods, no_grads,
                                    args.scale, lse2[hr], delta[hr], b, h, q_idx, kv_idx, ok, false,
                                    no_acc);
        }
      }
    }
  }
}

// Epilogue: dQ (times scale) into the Q tile's shared memory (everyone is done with Q), then
// 16-byte stores of the rows inside seqlen_q.
template <class Cfg>
FJ_DEVICE void fj_dq_sm80_epilogue(const float (&dq)[1][FjDqSm80Shape<Cfg>::ShapeDQ::kDTiles][4],
                                   const FjBwdArgs& args, unsigned char* smem, int b, int h,
                                   int m_start, int warp, int lane, int tid) {
  using T = FjBwdTraits<Cfg>;
  using S = FjDqSm80Shape<Cfg>;
  using StageQ = FjStageShape<typename T::Element, T::kDimQK>;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int row = warp * 16 + hr * 8 + (lane >> 2);
#pragma unroll
    for (int dt = 0; dt < S::ShapeDQ::kDTiles; ++dt)
      fj_stage_fragment_row<StageQ>(smem, row, dt, lane, dq[0][dt][hr * 2], dq[0][dt][hr * 2 + 1],
                                    args.scale);
  }
  __syncthreads();
  fj_store_tile<typename T::TileQK, S::kBM, S::kThreads>(
      static_cast<char*>(args.dq) +
          T::kElemBytes * ((fj_i64)b * args.dq_stride_b + (fj_i64)h * args.dq_stride_h +
                           (fj_i64)m_start * args.dq_stride_s),
      T::kElemBytes * args.dq_stride_s, smem, args.seqlen_q - m_start, tid);
}

extern "C" __global__ void __launch_bounds__(FjConfig::kNumWarps * 32, 1)
    flexjit_bwd_dq(const FjBwdArgs args, const FjModParams mods) {
  using Cfg = FjConfig;
  using T = FjBwdTraits<Cfg>;
  using S = FjDqSm80Shape<Cfg>;
  constexpr int kBM = S::kBM, kBN = S::kBN;
  extern __shared__ unsigned char fj_smem[];

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest tiles first, as the forward
  const int h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int h_kv = h / Cfg::kGqaRatio;
  const int m_start = m_block * kBM;

  const fj_u32 sq = fj_smem_addr(fj_smem);
  const fj_u32 sdo = sq + T::kQKBytesM;
  const fj_u32 skv = sdo + T::kVBytesM;
  const fj_u32 sq_warp = sq + warp * 16 * T::TileQK::kRowBytes;
  const fj_u32 sdo_warp = sdo + warp * 16 * T::TileV::kRowBytes;
  const char* k_head =
      static_cast<const char*>(args.k) +
      T::kElemBytes * ((fj_i64)b * args.k_stride_b + (fj_i64)h_kv * args.k_stride_h);
  const char* v_head =
      static_cast<const char*>(args.v) +
      T::kElemBytes * ((fj_i64)b * args.v_stride_b + (fj_i64)h_kv * args.v_stride_h);
  fj_dq_sm80_load_qdo<Cfg>(args, sq, sdo, b, h, m_start, tid);

  const FjKvSchedule sched =
      fj_block_schedule<kBM, kBN, Cfg::kHasFullBlocks>(args.mask, args.seqlen_kv, b, h, m_block);
  const FjDqSm80KvLoader<Cfg> load_kv{args, k_head, v_head, skv, tid};
  FjTilePipeline<T::kNumStages> pipe;
  pipe.start(sched, load_kv);

  // This thread's rows g and g + 8 of the warp's slice: their lse2 and delta.
  const int q_row0 = m_start + warp * 16 + (lane >> 2);
  const fj_i64 ws_row0 = ((fj_i64)b * args.heads_q + h) * args.seqlen_q_pad;
  float lse2[2], delta[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    lse2[hr] = args.lse2[ws_row0 + q_row0 + hr * 8];  // rows < seqlen_q_pad
    delta[hr] = args.delta[ws_row0 + q_row0 + hr * 8];
  }

  float dq[1][S::ShapeDQ::kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < S::ShapeDQ::kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dq[0][dt][e] = 0.0f;
  const fj_u32 dummy[1][1][4] = {};
  for (int i = 0; i < sched.num_total; ++i) {
    const int n0 = pipe.next(i, sched, load_kv) * kBN;
    if (n0 < args.seqlen_kv) {
      const fj_u32 st = skv + (i % T::kNumStages) * S::kStageBytes;
      float s[1][kBN / 8][4], dp[1][kBN / 8][4];
      fj_qk<typename S::ShapeS, T::kSplit>(s, dummy, sq_warp, st, lane);
      fj_qk<typename S::ShapeDP, T::kSplit>(dp, dummy, sdo_warp, st + T::kQKBytesN, lane);
      fj_dq_sm80_elements<Cfg>(s, dp, args, mods, lse2, delta, b, h, q_row0, n0, lane,
                               i < sched.num_partial);
      fj_pv<typename S::ShapeDQ>(dq, dp, st, lane);
    }
    if constexpr (T::kNumStages == 1) __syncthreads();
  }
  fj_cp_async_wait<0>();
  __syncthreads();  // everyone is done with Q: it becomes the dQ staging tile
  fj_dq_sm80_epilogue<Cfg>(dq, args, fj_smem, b, h, m_start, warp, lane, tid);
}
#endif  // FJ_BWD_DQ

// ---- dQ from the atomic accumulator ------------------------------------------------------------

// Four f32 values stored as four consecutive elements of E (16-byte / 8-byte aligned).
template <class E>
FJ_DEVICE void fj_store4(char* dst, float x0, float x1, float x2, float x3) {
  if constexpr (sizeof(E) == 4) {
    *reinterpret_cast<fj_u32x4*>(dst) = fj_u32x4{__float_as_uint(x0), __float_as_uint(x1),
                                                 __float_as_uint(x2), __float_as_uint(x3)};
  } else {
    fj_u32* d32 = reinterpret_cast<fj_u32*>(dst);
    d32[0] = FjMma<E>::pack(x0, x1);
    d32[1] = FjMma<E>::pack(x2, x3);
  }
}

// Two f32 values stored as two consecutive elements of E.
template <class E>
FJ_DEVICE void fj_store2(char* dst, float x0, float x1) {
  if constexpr (sizeof(E) == 4) {
    float* d = reinterpret_cast<float*>(dst);
    d[0] = x0;
    d[1] = x1;
  } else {
    *reinterpret_cast<fj_u32*>(dst) = FjMma<E>::pack(x0, x1);
  }
}

#if defined(FJ_BWD_DQ_CONVERT)
// 64 rows per CTA, 128 threads: dq = scale * dq_accum, 4 elements per step. kDqLayout 0: the
// accumulator's rows; 1: the 64-row block in the sm_90a dK/dV kernel's fragment order
// (backward_sm90.cuh, fj_bwd_sm90_dq_bulk_add): [consumer c][warp w][k][lane][4] with kW =
// kDqAccumDim / 2 columns per consumer (its tile dim), k < kW / 8; lane (g, t) holds rows w 16 +
// g (elements 0, 1) and + 8 (2, 3) at columns c kW + 8 k + 2 t, + 1, of which those below
// kHeadDimQK go out.
extern "C" __global__ void __launch_bounds__(128) flexjit_bwd_dq_convert(const FjBwdArgs args) {
  using E = typename FjConfig::Element;
  constexpr int kD = FjConfig::kHeadDimQK;
  const int h = blockIdx.y, b = blockIdx.z;
  const fj_i64 ws_row0 = ((fj_i64)b * args.heads_q + h) * args.seqlen_q_pad;
  if constexpr (FjConfig::kDqLayout == 1) {
    constexpr int kTile = FjConfig::kDqAccumDim;
    constexpr int kW = kTile / 2, kK = kW / 8;
    const float* block = args.dq_accum + (ws_row0 + blockIdx.x * 64) * kTile;
    // Through shared memory, so that dq goes out in whole rows: the block's 64 rows of dq in E
    // (kRowBytes a row, padded by 16 so that the fragment-order writes of a warp's 8 rows x 4
    // lanes fall in distinct banks), then 16-byte stores along the rows. Every load of a thread
    // first (kPer 16-byte pieces in flight), then the shared-memory writes. Writing each
    // fragment's pair straight to global memory, one load at a time, the kernel took 124 us at
    // the main shape against cuDNN's 69 us for the same bytes (H100, 2026-11-28).
    constexpr int kPer = 64 * kTile / 4 / 128, kRowBytes = kTile * (int)sizeof(E) + 16;
    __shared__ __align__(16) unsigned char rows[64 * kRowBytes];
    fj_u32x4 piece[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int f = threadIdx.x + 128 * u;
      piece[u] = *reinterpret_cast<const fj_u32x4*>(block + 4 * f);
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int f = threadIdx.x + 128 * u;
      const int lane = f % 32, k = (f / 32) % kK, w = (f / (32 * kK)) % 4, c = f / (128 * kK);
      const int col = c * kW + 8 * k + 2 * (lane & 3);
      const int r = w * 16 + (lane >> 2);
      const fj_u32x4 a = piece[u];
      fj_store2<E>(reinterpret_cast<char*>(rows + r * kRowBytes + col * sizeof(E)),
                   __uint_as_float(a.x) * args.scale, __uint_as_float(a.y) * args.scale);
      fj_store2<E>(reinterpret_cast<char*>(rows + (r + 8) * kRowBytes + col * sizeof(E)),
                   __uint_as_float(a.z) * args.scale, __uint_as_float(a.w) * args.scale);
    }
    __syncthreads();
    // The first kD columns of each row below seqlen_q, in 16-byte chunks (kD is a multiple of 8).
    constexpr int kChunks = kD * (int)sizeof(E) / 16;
    for (int idx = threadIdx.x; idx < 64 * kChunks; idx += 128) {
      const int r = idx / kChunks, ch = idx % kChunks;
      const int q = blockIdx.x * 64 + r;
      if (q >= args.seqlen_q) continue;
      const fj_u32x4 v = *reinterpret_cast<const fj_u32x4*>(rows + r * kRowBytes + 16 * ch);
      *reinterpret_cast<fj_u32x4*>(static_cast<char*>(args.dq) +
                                   sizeof(E) * ((fj_i64)b * args.dq_stride_b +
                                                (fj_i64)h * args.dq_stride_h +
                                                (fj_i64)q * args.dq_stride_s) +
                                   16 * ch) = v;
    }
    return;
  }
  // Layout 0: rows of kDqAccumDim floats, the first kD of them dQ's.
  for (int idx = threadIdx.x; idx < 64 * kD / 4; idx += 128) {
    const int r = idx / (kD / 4), c4 = idx % (kD / 4);
    const int q = blockIdx.x * 64 + r;
    if (q >= args.seqlen_q) continue;
    const fj_u32x4 a = *reinterpret_cast<const fj_u32x4*>(
        args.dq_accum + (ws_row0 + q) * FjConfig::kDqAccumDim + 4 * c4);
    const float x0 = __uint_as_float(a.x) * args.scale, x1 = __uint_as_float(a.y) * args.scale;
    const float x2 = __uint_as_float(a.z) * args.scale, x3 = __uint_as_float(a.w) * args.scale;
    char* dst = static_cast<char*>(args.dq) +
                sizeof(E) * ((fj_i64)b * args.dq_stride_b + (fj_i64)h * args.dq_stride_h +
                             (fj_i64)q * args.dq_stride_s + 4 * c4);
    fj_store4<E>(dst, x0, x1, x2, x3);
  }
}
#endif  // FJ_BWD_DQ_CONVERT

#endif  // FLEXJIT_BACKWARD_SM80_CUH_
