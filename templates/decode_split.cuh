// flexjit split-KV decoding kernel for sm_80 and newer (flash-decoding structure, mma.sync).
//
// Spliced last, after flexjit_abi.h, prelude.cuh, the generated FjConfig and mods, and
// mma_sm80.cuh. docs/kernels/decode.md describes the design; FjDecodeArgs (flexjit_abi.h) the
// arguments, the grid and the workspace layout.
//
// Rows: a CTA packs every q head of one GQA group (kGqaRatio heads of kv head hkv) times the
// seqlen_q query tokens into the M dimension: packed row pr = h_local * seqlen_q + q_token,
// kRows (16..128) rows per CTA, row_groups CTAs when kGqaRatio * seqlen_q > kRows. K and V of
// the kv head are then read once per row group for the whole group (the point of packing).
// Warps: kRows / 16 warps along M (one m16 fragment each) times kWarpsN warps along N; each warp
// owns kWarpN = kBlockN / kWarpsN keys of every KV tile and keeps its own online softmax, so the
// main loop has no cross-warp traffic beyond the pipeline barrier. The epilogue merges the
// kWarpsN partial softmaxes through shared memory and writes the CTA's partial out (normalized
// by its row sum) and its log2-domain LSE to the workspace.
// Splits: blockIdx.x takes an equal share of the tiles this (b, hkv) visits (all tiles of the
// sequence's length, or the block mask's list: partial tiles first, then full tiles).
// Paged K / V (kPageSize > 0): logical key n lives in page page_table[b][n / kPageSize] at slot
// n % kPageSize; kPageSize >= kBlockN needs one table read per tile, smaller pages one per row.
// Head dims: kHeadDimQK / kHeadDimV are the tile dims (64 / 128 / 256) the layouts are built for,
// kRealDimQK / kRealDimV the problem's (multiples of 8, kernels/HeadDims.h): loads zero-fill the
// columns past them, the k steps and O fragments stop at them, and the partials are rows of
// kRealDimV floats.
// Shared memory (bytes, E = 2): Q tile kRows x kHeadDimQK, then kNumStages x {K tile kBlockN x
// kHeadDimQK, V tile kBlockN x kHeadDimV}, all swizzled (FjSwizzledTile); the epilogue reuses it
// for kNumWarps x 16 x (kHeadDimV + 2) floats. That is fj_decode_split_smem_bytes().
#ifndef FLEXJIT_DECODE_SPLIT_CUH_
#define FLEXJIT_DECODE_SPLIT_CUH_

template <class Cfg>
struct FjDecTraits {
  using Element = typename Cfg::Element;
  using Mma = FjMma<Element>;
  static constexpr int kRows = Cfg::kRows;
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr int kNumWarps = Cfg::kNumWarps;
  static constexpr int kNumStages = Cfg::kNumStages;
  static constexpr int kDimQK = Cfg::kHeadDimQK;  // tile dims
  static constexpr int kDimV = Cfg::kHeadDimV;
  static constexpr int kRealQK = Cfg::kRealDimQK;  // the problem's head dims (<= the tiles)
  static constexpr int kRealV = Cfg::kRealDimV;
  static constexpr int kPageSize = Cfg::kPageSize;
  static constexpr int kThreads = kNumWarps * 32;
  static constexpr int kWarpsM = kRows / 16;
  static constexpr int kWarpsN = kNumWarps / kWarpsM;
  static constexpr int kWarpN = kBlockN / kWarpsN;  // keys of a tile per warp
  static constexpr int kNTiles = kWarpN / 8;
  // n8 fragments of O: the real v dim rounded up to the 16 columns of one ldmatrix.x4.trans.
  static constexpr int kDTiles = (kRealV + 15) / 16 * 2;
  static constexpr int kElemBytes = (int)sizeof(Element);
  static constexpr int kKSteps = (kRealQK + 15) / 16;  // k16 steps over the real qk dim
  static constexpr bool kQInRegs = kKSteps * 4 <= 32;
  static constexpr int kQBytes = kRows * kDimQK * kElemBytes;
  static constexpr int kKBytes = kBlockN * kDimQK * kElemBytes;
  static constexpr int kVBytes = kBlockN * kDimV * kElemBytes;
  static constexpr int kStageBytes = kKBytes + kVBytes;
  static constexpr int kRedBytes = kNumWarps * 16 * (kDimV + 2) * 4;
  using TileQK = FjSwizzledTile<kDimQK, 2, kRealQK>;
  using TileV = FjSwizzledTile<kDimV, 2, kRealV>;

  static_assert(kElemBytes == 2, "flexjit decode_split: Element must be fj_bf16 or fj_f16");
  static_assert(kRows % 16 == 0 && kRows >= 16 && kRows <= 128,
                "flexjit decode_split: kRows must be 16, 32, 48, ... 128");
  static_assert(kNumWarps % kWarpsM == 0, "flexjit decode_split: kNumWarps % (kRows / 16) != 0");
  static_assert(kBlockN % kWarpsN == 0 && kWarpN % 16 == 0,
                "flexjit decode_split: each warp needs a multiple of 16 keys per tile");
  static_assert((kDimQK == 64 || kDimQK == 128 || kDimQK == 256) &&
                    (kDimV == 64 || kDimV == 128 || kDimV == 256),
                "flexjit decode_split: tile dims must be 64, 128 or 256");
  static_assert(kNumStages >= 1 && kNumStages <= 4, "flexjit decode_split: 1..4 stages");
  static_assert(Cfg::kKvHint >= 0 && Cfg::kKvHint <= 2, "flexjit decode_split: kKvHint 0..2");
  static_assert(kPageSize == 0 || (kPageSize & (kPageSize - 1)) == 0,
                "flexjit decode_split: the page size must be a power of two");
  static_assert(kBlockN * TileQK::kChunks % kThreads == 0 &&
                    kBlockN * TileV::kChunks % kThreads == 0,
                "flexjit decode_split: KV tiles must split evenly into 16-byte copies per thread");
  static_assert((kQBytes + kNumStages * kStageBytes > kRedBytes
                     ? kQBytes + kNumStages * kStageBytes
                     : kRedBytes) == fj_decode_split_smem_bytes(kRows, kBlockN, kDimQK, kDimV,
                                                                kElemBytes, kNumStages, kNumWarps),
                "flexjit decode_split: shared-memory layout and fj_decode_split_smem_bytes "
                "disagree");
};

// Where the keys of one (b, kv head) live: contiguous rows, or pages through the table.
struct FjDecKv {
  const unsigned short* k;  // contiguous: row 0 of (b, hkv); paged: the pool at head hkv
  const unsigned short* v;
  fj_i64 k_stride_s, v_stride_s;    // between keys (slots of a page)
  fj_i64 k_stride_pg, v_stride_pg;  // between pages (paged only)
  const int* table;                 // this sequence's page table row, or null
};

// One 16-byte K / V copy. kKvHint (FjConfig; docs/kernels/decode.md, "L2 hints"): 0 plain
// cp.async.cg; 1 with an L2::evict_first cache policy (K and V are read once: the lines they
// occupy in the L2 go first, so the streaming reads do not push out other data, dirty lines
// that would need a write-back included); 2 the same plus the L2::256B prefetch-size hint.
template <int kKvHint>
FJ_DEVICE void fj_dec_cp_async_16(fj_u32 dst, const void* src, bool valid,
                                  unsigned long long policy) {
  if constexpr (kKvHint == 0) {
    fj_cp_async_16(dst, src, valid);
  } else if constexpr (kKvHint == 1) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(src), "r"(valid ? 16 : 0), "l"(policy)
                 : "memory");
  } else {
    asm volatile(
        "cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
        "l"(src), "r"(valid ? 16 : 0), "l"(policy)
        : "memory");
  }
}

// The L2 cache policy of the K / V copies (unused when kKvHint == 0).
template <int kKvHint>
FJ_DEVICE unsigned long long fj_dec_kv_policy() {
  unsigned long long policy = 0;
  if constexpr (kKvHint != 0) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  }
  return policy;
}

// Copies keys [n_start, n_start + kRows) of K or V (row stride `stride`, page stride `pstride`)
// into a swizzled tile with cp.async; keys >= len and the chunks past the head dim
// (Tile::kValidChunks) are zero-filled and read nothing. Thread tid
// copies chunk tid % kChunks of rows tid / kChunks + i * kRowStep.
template <class Tile, int kRows, int kThreads, int kPageSize, int kKvHint>
FJ_DEVICE void fj_dec_load_tile(fj_u32 smem, const unsigned short* base, fj_i64 stride,
                                fj_i64 pstride, const int* table, int n_start, int len, int tid,
                                unsigned long long policy) {
  static_assert(kThreads % Tile::kChunks == 0, "flexjit: a thread must keep its chunk column");
  constexpr int kRowStep = kThreads / Tile::kChunks;
  constexpr int kPerThread = kRows / kRowStep;
  static_assert(kRows % kRowStep == 0, "flexjit: tile rows must split evenly over threads");
  const int r0 = tid / Tile::kChunks;
  const int c = tid % Tile::kChunks;
  const unsigned short* tile_base = base;
  if constexpr (kPageSize >= kRows) {
    // The whole tile lies in one page (kRows divides kPageSize).
    const int page = table[n_start / kPageSize];
    tile_base = base + (fj_i64)page * pstride + (fj_i64)(n_start % kPageSize) * stride;
  } else if constexpr (kPageSize == 0) {
    tile_base = base + (fj_i64)n_start * stride;
  }
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int r = r0 + i * kRowStep;
    const int n = n_start + r;
    const bool valid = n < len && c < Tile::kValidChunks;
    const unsigned short* src = base;  // an invalid row reads nothing: any mapped address
    if (valid) {
      if constexpr (kPageSize > 0 && kPageSize < kRows) {
        const int page = table[n / kPageSize];
        src = base + (fj_i64)page * pstride + (fj_i64)(n % kPageSize) * stride;
      } else {
        src = tile_base + (fj_i64)r * stride;
      }
      src += c * Tile::kElemsPerChunk;
    }
    fj_dec_cp_async_16<kKvHint>(smem + Tile::offset(r, c), src, valid, policy);
  }
}

// The KV tiles a CTA visits: schedule steps [begin, end) of the (b, row group) list, where the
// list is every tile of the sequence (no block mask) or the mask's partial then full tiles.
struct FjDecSchedule {
  const int* partial_idx;  // sparse KV block indices, or null: step i is tile i
  const int* full_idx;
  int num_partial;  // in kernel tiles
  int tiles_per_block;
  int begin, end;

  FJ_DEVICE int tile(int i) const {
    if (partial_idx == nullptr) return i;
    const int* list = i < num_partial ? partial_idx : full_idx;
    const int j = i < num_partial ? i : i - num_partial;
    return list[j / tiles_per_block] * tiles_per_block + j % tiles_per_block;
  }
};

// The block mask row is the one of query block 0 (every packed row's query index is below the
// mask's q block size: the host checks seqlen_q <= q_block_size) and of head `h_mask` (the mask
// is broadcast over heads, or kGqaRatio == 1).
template <class Cfg>
FJ_DEVICE FjDecSchedule fj_dec_schedule(const FjDecodeArgs& args, int b, int h_mask, int len,
                                        int split) {
  constexpr int kBlockN = Cfg::kBlockN;
  FjDecSchedule s;
  const FjBlockMaskArgs& bm = args.mask;
  int total;
  if (bm.kv_num_blocks == nullptr) {
    s.partial_idx = nullptr;
    s.full_idx = nullptr;
    s.tiles_per_block = 1;
    s.num_partial = (len + kBlockN - 1) / kBlockN;
    total = s.num_partial;
  } else {
    const fj_i64 num_off = (fj_i64)b * bm.num_stride_b + (fj_i64)h_mask * bm.num_stride_h;
    const fj_i64 idx_off = (fj_i64)b * bm.idx_stride_b + (fj_i64)h_mask * bm.idx_stride_h;
    s.tiles_per_block = bm.kv_block_size / kBlockN;
    s.partial_idx = bm.kv_indices + idx_off;
    s.num_partial = bm.kv_num_blocks[num_off] * s.tiles_per_block;
    s.full_idx = nullptr;
    total = s.num_partial;
    if (Cfg::kHasFullBlocks && bm.full_kv_num_blocks != nullptr) {
      s.full_idx = bm.full_kv_indices + idx_off;
      total += bm.full_kv_num_blocks[num_off] * s.tiles_per_block;
    }
  }
  const int per = (total + args.num_splits - 1) / args.num_splits;
  s.begin = fj_imin(split * per, total);
  s.end = fj_imin(s.begin + per, total);
  return s;
}

extern "C" __global__ void __launch_bounds__(FjConfig::kNumWarps * 32, 1)
    flexjit_decode_split(const FjDecodeArgs args, const FjModParams mods) {
  using T = FjDecTraits<FjConfig>;
  using Cfg = FjConfig;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ unsigned char fj_smem[];

  const int split = blockIdx.x;
  const int hkv = blockIdx.y / args.row_groups;
  const int group = blockIdx.y % args.row_groups;
  const int b = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int warp_m = warp / T::kWarpsN;
  const int warp_n = warp % T::kWarpsN;
  const int packed_rows = Cfg::kGqaRatio * args.seqlen_q;  // rows of this kv head
  const int row0 = group * T::kRows;                       // first packed row of the CTA

  int len = args.seqlen_kv;
  if (args.seq_lens != nullptr) len = fj_imax(0, fj_imin(args.seq_lens[b], args.seqlen_kv));

  // Heads of the group share one block-mask row only when the mask is broadcast over heads (or
  // the group is one head): the host guarantees one of the two.
  const FjDecSchedule sched = fj_dec_schedule<Cfg>(args, b, hkv * Cfg::kGqaRatio, len, split);

  FjDecKv kv;
  const unsigned short* k_all = static_cast<const unsigned short*>(args.k);
  const unsigned short* v_all = static_cast<const unsigned short*>(args.v);
  kv.k_stride_s = args.k_stride_s;
  kv.v_stride_s = args.v_stride_s;
  kv.k_stride_pg = args.k_stride_b;
  kv.v_stride_pg = args.v_stride_b;
  if constexpr (T::kPageSize > 0) {
    kv.k = k_all + (fj_i64)hkv * args.k_stride_h;
    kv.v = v_all + (fj_i64)hkv * args.v_stride_h;
    kv.table = args.page_table + (fj_i64)b * args.page_table_stride_b;
  } else {
    kv.k = k_all + (fj_i64)b * args.k_stride_b + (fj_i64)hkv * args.k_stride_h;
    kv.v = v_all + (fj_i64)b * args.v_stride_b + (fj_i64)hkv * args.v_stride_h;
    kv.table = nullptr;
  }

  const fj_u32 sq = fj_smem_addr(fj_smem);
  const fj_u32 skv = sq + T::kQBytes;

  const unsigned long long kv_policy = fj_dec_kv_policy<Cfg::kKvHint>();
  auto load_kv = [&](int tile, int stage) {
    const int n_start = tile * T::kBlockN;
    if (n_start >= len) return;  // past the end of a ragged sparse block: skipped
    const fj_u32 sk = skv + stage * T::kStageBytes;
    fj_dec_load_tile<typename T::TileQK, T::kBlockN, T::kThreads, T::kPageSize, Cfg::kKvHint>(
        sk, kv.k, kv.k_stride_s, kv.k_stride_pg, kv.table, n_start, len, tid, kv_policy);
    fj_dec_load_tile<typename T::TileV, T::kBlockN, T::kThreads, T::kPageSize, Cfg::kKvHint>(
        sk + T::kKBytes, kv.v, kv.v_stride_s, kv.v_stride_pg, kv.table, n_start, len, tid,
        kv_policy);
  };

  // Q: packed row r of the tile is head hkv * G + (row0 + r) / seqlen_q, token (row0 + r) %
  // seqlen_q; rows past the group's end and chunks past the head dim are zero-filled.
  {
    using TileQ = typename T::TileQK;
    const unsigned short* q_all = static_cast<const unsigned short*>(args.q);
    for (int i = tid; i < T::kRows * TileQ::kChunks; i += T::kThreads) {
      const int r = i / TileQ::kChunks;
      const int c = i % TileQ::kChunks;
      const int pr = row0 + r;
      const bool valid = pr < packed_rows && c < TileQ::kValidChunks;
      const unsigned short* src = q_all;
      if (valid) {
        const int h = hkv * Cfg::kGqaRatio + pr / args.seqlen_q;
        const int qi = pr % args.seqlen_q;
        src = q_all + (fj_i64)b * args.q_stride_b + (fj_i64)h * args.q_stride_h +
              (fj_i64)qi * args.q_stride_s + c * TileQ::kElemsPerChunk;
      }
      fj_cp_async_16(sq + TileQ::offset(r, c), src, valid);
    }
  }
  fj_cp_async_commit();

  const int num_steps = sched.end - sched.begin;
  int tiles[T::kNumStages];
#pragma unroll
  for (int k = 0; k < T::kNumStages; ++k)
    tiles[k] = k < num_steps ? sched.tile(sched.begin + k) : 0;
#pragma unroll
  for (int st = 0; st < T::kNumStages - 1; ++st) {
    if (st < num_steps) load_kv(tiles[st], st);
    fj_cp_async_commit();
  }

  // This thread's rows (g and g + 8 of the warp's m16 fragment): head and query index for the
  // mods, clamped to the last real row so that mods only see in-range indices.
  int row_h[2], row_q[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int pr = fj_imin(row0 + warp_m * 16 + hr * 8 + (lane >> 2), packed_rows - 1);
    row_h[hr] = hkv * Cfg::kGqaRatio + pr / args.seqlen_q;
    row_q[hr] = pr % args.seqlen_q;
  }

  const fj_u32 sq_warp = sq + warp_m * 16 * T::TileQK::kRowBytes;
  fj_u32 q_regs[T::kQInRegs ? T::kKSteps : 1][4];
  if constexpr (T::kQInRegs) {
    fj_cp_async_wait<T::kNumStages - 1>();  // the Q group
    __syncthreads();
    const FjLdsmAddr<typename T::TileQK> qa_addr(sq_warp, ((lane >> 3) & 1) * 8 + (lane & 7),
                                                 lane >> 4);
#pragma unroll
    for (int kk = 0; kk < T::kKSteps; ++kk)
      fj_ldsm_x4(q_regs[kk], qa_addr.at(0, kk));
  }

  float o[T::kDTiles][4];
  float row_max[2] = {fj_neg_inf(), fj_neg_inf()};
  float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int dt = 0; dt < T::kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      o[dt][e] = 0.0f;

  const float scale = args.scale;
  for (int i = 0; i < num_steps; ++i) {
    if constexpr (T::kNumStages == 1) {
      load_kv(tiles[0], 0);
      fj_cp_async_commit();
      fj_cp_async_wait<0>();
    } else {
      fj_cp_async_wait<T::kNumStages - 2>();
    }
    __syncthreads();
    if constexpr (T::kNumStages > 1) {
      const int next = i + T::kNumStages - 1;
      if (next < num_steps) load_kv(tiles[T::kNumStages - 1], next % T::kNumStages);
      fj_cp_async_commit();
    }
    const int n_start = tiles[0] * T::kBlockN;
#pragma unroll
    for (int k = 0; k + 1 < T::kNumStages; ++k)
      tiles[k] = tiles[k + 1];
    tiles[T::kNumStages - 1] =
        i + T::kNumStages < num_steps ? sched.tile(sched.begin + i + T::kNumStages) : 0;
    if (n_start < len) {
      const bool partial = sched.begin + i < sched.num_partial || sched.partial_idx == nullptr;
      const fj_u32 sk =
          skv + (i % T::kNumStages) * T::kStageBytes + warp_n * T::kWarpN * T::TileQK::kRowBytes;
      const fj_u32 sv = skv + (i % T::kNumStages) * T::kStageBytes + T::kKBytes +
                        warp_n * T::kWarpN * T::TileV::kRowBytes;
      // S = Q K^T for the warp's 16 rows and kWarpN keys.
      float s[T::kNTiles][4];
#pragma unroll
      for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[nt][e] = 0.0f;
      {
        const FjLdsmAddr<typename T::TileQK> qa_addr(sq_warp, ((lane >> 3) & 1) * 8 + (lane & 7),
                                                     lane >> 4);
        const FjLdsmAddr<typename T::TileQK> kb_addr(sk, (lane >> 4) * 8 + (lane & 7),
                                                     (lane >> 3) & 1);
#pragma unroll
        for (int kk = 0; kk < T::kKSteps; ++kk) {
          fj_u32 qa[4];
          if constexpr (T::kQInRegs) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
              qa[e] = q_regs[kk][e];
          } else {
            fj_ldsm_x4(qa, qa_addr.at(0, kk));
          }
#pragma unroll
          for (int np = 0; np < T::kNTiles / 2; ++np) {
            fj_u32 kb[4];
            fj_ldsm_x4(kb, kb_addr.at(np, kk));
            T::Mma::mma(s[2 * np], qa, kb[0], kb[1]);
            T::Mma::mma(s[2 * np + 1], qa, kb[2], kb[3]);
          }
        }
      }
      // Scores in the log2 domain: scale, score_mod, mask_mod (partial tiles), key bound.
      const int kv_col0 = n_start + warp_n * T::kWarpN + (lane & 3) * 2;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
#pragma unroll
        for (int nt = 0; nt < T::kNTiles; ++nt) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int kv_raw = kv_col0 + nt * 8 + c;
            const int kv_idx = fj_imin(kv_raw, len - 1);
            float x = s[nt][hr * 2 + c];
            if constexpr (Cfg::kHasScoreMod) {
              x = fj_score_mod(mods, x * scale, b, row_h[hr], row_q[hr], kv_idx) * kLog2e;
            } else {
              x *= scale * kLog2e;
            }
            if constexpr (Cfg::kHasMaskMod) {
              if (partial && !fj_mask_mod(mods, b, row_h[hr], row_q[hr], kv_idx)) x = fj_neg_inf();
            }
            if (kv_raw >= len) x = fj_neg_inf();
            s[nt][hr * 2 + c] = x;
          }
        }
      }
      // Online softmax (log2 domain); a row whose max is still -inf uses 0 as its reference.
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float mx = row_max[hr];
#pragma unroll
        for (int nt = 0; nt < T::kNTiles; ++nt)
          mx = fmaxf(mx, fmaxf(s[nt][hr * 2], s[nt][hr * 2 + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float ref = mx == fj_neg_inf() ? 0.0f : mx;
        const float alpha = fj_ex2_approx(row_max[hr] - ref);
        row_max[hr] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < T::kNTiles; ++nt) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float p = fj_ex2_approx(s[nt][hr * 2 + c] - ref);
            s[nt][hr * 2 + c] = p;
            sum += p;
          }
        }
        row_sum[hr] = row_sum[hr] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < T::kDTiles; ++dt) {
          o[dt][hr * 2] *= alpha;
          o[dt][hr * 2 + 1] *= alpha;
        }
      }
      // O += P V: the C fragments of n8 tiles 2j, 2j + 1 are the A fragment of k16 step j.
      const FjLdsmAddr<typename T::TileV> vb_addr(sv, ((lane >> 3) & 1) * 8 + (lane & 7),
                                                  lane >> 4);
#pragma unroll
      for (int j = 0; j < T::kNTiles / 2; ++j) {
        fj_u32 pa[4];
        pa[0] = T::Mma::pack(s[2 * j][0], s[2 * j][1]);
        pa[1] = T::Mma::pack(s[2 * j][2], s[2 * j][3]);
        pa[2] = T::Mma::pack(s[2 * j + 1][0], s[2 * j + 1][1]);
        pa[3] = T::Mma::pack(s[2 * j + 1][2], s[2 * j + 1][3]);
#pragma unroll
        for (int dp = 0; dp < T::kDTiles / 2; ++dp) {
          fj_u32 vb[4];
          fj_ldsm_x4_trans(vb, vb_addr.at(j, dp));
          T::Mma::mma(o[2 * dp], pa, vb[0], vb[1]);
          T::Mma::mma(o[2 * dp + 1], pa, vb[2], vb[3]);
        }
      }
    }
    if constexpr (T::kNumStages == 1) __syncthreads();
  }
  fj_cp_async_wait<0>();
  __syncthreads();  // every warp is done with Q / K / V in shared memory
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Programmatic dependent launch: the combine kernel may be launched from here on (its
  // griddepcontrol.wait still waits for this grid's writes); a no-op without it.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif

  // Epilogue: each warp publishes its rows' max, sum and unnormalized O; then the CTA merges the
  // kWarpsN partial softmaxes of every row and writes the split's partials.
  float* red = reinterpret_cast<float*>(fj_smem);
  float* red_o = red;                                 // [kNumWarps][16][kDimV]
  float* red_m = red + T::kNumWarps * 16 * T::kDimV;  // [kNumWarps][16]
  float* red_s = red_m + T::kNumWarps * 16;           // [kNumWarps][16]
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float sum = row_sum[hr];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int r = hr * 8 + (lane >> 2);
    if ((lane & 3) == 0) {
      red_m[warp * 16 + r] = row_max[hr];
      red_s[warp * 16 + r] = sum;
    }
#pragma unroll
    for (int dt = 0; dt < T::kDTiles; ++dt) {
      float* dst = red_o + (warp * 16 + r) * T::kDimV + dt * 8 + (lane & 3) * 2;
      dst[0] = o[dt][hr * 2];
      dst[1] = o[dt][hr * 2 + 1];
    }
  }
  __syncthreads();
  const int num_splits = args.num_splits;
  for (int idx = tid; idx < T::kRows * T::kRealV; idx += T::kThreads) {
    const int r = idx / T::kRealV;  // row of the CTA
    const int d = idx % T::kRealV;
    const int pr = row0 + r;
    if (pr >= packed_rows) break;  // rows are visited in order
    const int wm = r / 16, r16 = r % 16;
    float m = fj_neg_inf();
#pragma unroll
    for (int wn = 0; wn < T::kWarpsN; ++wn)
      m = fmaxf(m, red_m[(wm * T::kWarpsN + wn) * 16 + r16]);
    float sum = 0.0f, acc = 0.0f;
    if (m != fj_neg_inf()) {
#pragma unroll
      for (int wn = 0; wn < T::kWarpsN; ++wn) {
        const int w = wm * T::kWarpsN + wn;
        const float f = exp2f(red_m[w * 16 + r16] - m);  // 0 for a warp that saw no key
        sum += red_s[w * 16 + r16] * f;
        acc += red_o[(w * 16 + r16) * T::kDimV + d] * f;
      }
    }
    const int h = hkv * Cfg::kGqaRatio + pr / args.seqlen_q;
    const int qi = pr % args.seqlen_q;
    const fj_i64 row = ((fj_i64)b * args.heads_q + h) * args.seqlen_q + qi;
    const fj_i64 slot = row * num_splits + split;
    // sum == 0: every key of the split was masked (or there was none): out 0, lse -inf.
    args.o_part[slot * T::kRealV + d] = sum > 0.0f ? acc / sum : 0.0f;
    if (d == 0) args.lse_part[slot] = sum > 0.0f ? m + log2f(sum) : fj_neg_inf();
  }
}

#endif  // FLEXJIT_DECODE_SPLIT_CUH_
