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
// for kNumWarps x 16 x (kHeadDimV + 2) floats. That is fj_decode_split_smem_bytes(). e4m3 K / V
// (kKvFp8): the stages hold e4m3 tiles (E = 1 for K and V, FjDecFp8Tile), which the mainloop
// reads with ldmatrix and converts in registers (FjDecWarp::qk_fp8 / pv_fp8).
#ifndef FLEXJIT_DECODE_SPLIT_CUH_
#define FLEXJIT_DECODE_SPLIT_CUH_

// Address of the padded tile's ldmatrix operands (the FjLdsmAddr interface): rows row0 + 16 * i,
// chunks 2 * j + c. Rows of kRowBytes = kDim * 2 + 16 put the 8 rows of an ldmatrix in 8
// different 16-byte bank groups (kRowBytes / 4 = 4 mod 32 words), conflict-free unswizzled.
template <class Tile>
struct FjDecPaddedAddr {
  fj_u32 base;
  FJ_DEVICE FjDecPaddedAddr(fj_u32 smem, int row0, int c)
      : base(smem + row0 * Tile::kRowBytes + c * 16) {}
  FJ_DEVICE fj_u32 at(int i, int j) const { return base + i * 16 * Tile::kRowBytes + j * 32; }
};

// A K or V tile of 2-byte elements: the swizzled tile of the cp.async loads (kPadded false), or
// rows padded by 16 bytes for the bulk copies, each key row's kRealDim elements contiguous.
template <bool kPadded, int kDim, int kRealDim>
struct FjDecKvTile : FjSwizzledTile<kDim, 2, kRealDim> {
  using Addr = FjLdsmAddr<FjSwizzledTile<kDim, 2, kRealDim>>;
};
template <int kDim, int kRealDim>
struct FjDecKvTile<true, kDim, kRealDim> {
  static constexpr int kElemsPerChunk = 8;
  static constexpr int kChunks = kDim / 8;
  static constexpr int kValidChunks = kRealDim / 8;
  static constexpr int kRowBytes = kDim * 2 + 16;
  static constexpr int kRealRowBytes = kRealDim * 2;  // one bulk copy
  using Addr = FjDecPaddedAddr<FjDecKvTile>;
};

// An e4m3 K or V tile (kKvFp8): rows of kDim bytes, 16 elements per 16-byte chunk, chunks
// swizzled so that the 8 rows of an ldmatrix (8 consecutive keys, one logical chunk) hit 8
// different 16-byte bank groups: chunk ^ (row % 8) for rows of 128 bytes and more, chunk ^
// ((row / 2) % 4) for 64-byte rows (two rows per 128 bytes). The mainloop reads it with ldmatrix
// as a tile of b16 (byte pairs) and converts in registers (fj_e4m3x4, prelude.cuh).
template <int kDim, int kRealDim>
struct FjDecFp8Tile {
  static constexpr int kElemsPerChunk = 16;
  static constexpr int kChunks = kDim / 16;
  static constexpr int kValidChunks = kRealDim / 16;
  static constexpr int kRowBytes = kDim;
  static_assert(kChunks == 4 || kChunks == 8 || kChunks == 16,
                "flexjit decode_split: e4m3 tile dims must be 64, 128 or 256");
  static FJ_DEVICE int swizzle(int row) { return kChunks >= 8 ? (row & 7) : ((row >> 1) & 3); }
  static FJ_DEVICE int offset(int row, int chunk) {
    return row * kRowBytes + ((chunk ^ swizzle(row)) << 4);
  }
};

// Addresses of the ldmatrix operands of an e4m3 tile (the FjLdsmAddr interface): rows row0 + 16
// * i (row0 % 8 fixed per lane), logical chunks 2 * j + c (c = 0 or 1 fixed per lane). The
// swizzle depends on row0 % 8 only, so as in FjLdsmAddr only j % 4 (j % 2 for 4 chunks) needs a
// register.
template <class Tile>
struct FjDecFp8Addr {
  static constexpr int kBases = Tile::kChunks >= 8 ? 4 : 2;
  fj_u32 base[kBases];
  FJ_DEVICE FjDecFp8Addr(fj_u32 smem, int row0, int c) {
    const int z = c ^ Tile::swizzle(row0);
#pragma unroll
    for (int jm = 0; jm < kBases; ++jm)
      base[jm] = smem + row0 * Tile::kRowBytes + (((2 * jm) ^ z) << 4);
  }
  FJ_DEVICE fj_u32 at(int i, int j) const {
    return base[j % kBases] + i * 16 * Tile::kRowBytes + (j / kBases) * kBases * 32;
  }
};

// The K / V tile type: 2-byte elements (FjDecKvTile), or e4m3 (FjDecFp8Tile).
template <bool kFp8, bool kPadded, int kDim, int kRealDim>
struct FjDecKvTileOf {
  using type = FjDecKvTile<kPadded, kDim, kRealDim>;
};
template <bool kPadded, int kDim, int kRealDim>
struct FjDecKvTileOf<true, kPadded, kDim, kRealDim> {
  struct type : FjDecFp8Tile<kDim, kRealDim> {
    using Addr = FjDecFp8Addr<FjDecFp8Tile<kDim, kRealDim>>;
  };
};

// The B fragments of V for one n8 tile pair out of an ldmatrix.trans register of an e4m3 tile
// read as b16: x holds (key 2t: dims 2g, 2g + 1) in its low half and (key 2t + 1: the same dims)
// in its high half; `even` gets keys (2t, 2t + 1) of dim 2g, `odd` those of dim 2g + 1.
template <class Element>
FJ_DEVICE void fj_dec_e4m3_keys(fj_u32 x, fj_u32& even, fj_u32& odd) {
  fj_u32 y;
  asm("prmt.b32 %0, %1, %1, 0x3120;\n" : "=r"(y) : "r"(x));
  fj_e4m3x4<Element>(y, even, odd);
}

// Pointer type of the K / V elements: 2-byte elements, or e4m3 bytes.
template <bool kFp8>
struct FjDecKvElem {
  using type = unsigned short;
};
template <>
struct FjDecKvElem<true> {
  using type = unsigned char;
};

template <bool kFirst, class A, class B>
struct FjDecSelect {
  using type = A;
};
template <class A, class B>
struct FjDecSelect<false, A, B> {
  using type = B;
};

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
  static constexpr int kKvCopy = Cfg::kKvCopy;  // 0 cp.async, 1 / 2 bulk copies (L2 hint)
  static constexpr bool kKvFp8 = Cfg::kKvFp8;   // e4m3 K / V
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
  // K / V tiles: swizzled for cp.async (kKvCopy == 0), padded rows for the bulk copies (one per
  // key row; a row lands contiguously, so it cannot be swizzled), e4m3 rows (kKvFp8: cp.async,
  // swizzled; the mainloop converts what it reads in registers).
  using TileK = typename FjDecKvTileOf<kKvFp8, kKvCopy != 0, kDimQK, kRealQK>::type;
  using TileV = typename FjDecKvTileOf<kKvFp8, kKvCopy != 0, kDimV, kRealV>::type;
  static constexpr int kKBytes = kBlockN * TileK::kRowBytes;
  static constexpr int kVBytes = kBlockN * TileV::kRowBytes;
  static constexpr int kStageBytes = kKBytes + kVBytes;  // the ring's stage, after Q
  static constexpr int kRedBytes = kNumWarps * 16 * (kDimV + 2) * 4;
  // Bulk copies: the stages' mbarriers (8 bytes each) after everything else, the epilogue's
  // reduction buffers included (they reuse the ring, never the barriers).
  static constexpr int kBarOffset = kQBytes + kNumStages * kStageBytes > kRedBytes
                                        ? kQBytes + kNumStages* kStageBytes
                                        : kRedBytes;
  using TileQK = FjSwizzledTile<kDimQK, 2, kRealQK>;
  using KvElem = typename FjDecKvElem<kKvFp8>::type;
  // e4m3 K / V with Q in registers: the mainloop's operands are f16 whatever q's dtype (bf16 Q
  // is scaled by a power of two into f16 once, FjDecWarp::q_to_f16; docs/math.md "FP8 KV
  // caches"), so the e4m3 values need one conversion (cvt.rn.f16x2.e4m3x2) and no bf16 step.
  static constexpr bool kFp8F16 = kKvFp8 && kQInRegs;
  using Elem8 = typename FjDecSelect<kFp8F16, fj_f16, Element>::type;
  using Mma8 = FjMma<Elem8>;
  // The L2 policy of the K / V copies: the variant's kKvHint, or evict_first for kKvCopy == 2
  // and for e4m3 K / V (the H100 measured 1.62x -> 1.72x the bf16 decode's tokens per second
  // with it; bf16 K / V unchanged, so their default keeps plain copies: docs/kernels/decode.md
  // "FP8 KV caches").
  static constexpr int kPolicy =
      Cfg::kKvHint != 0 ? Cfg::kKvHint : (kKvCopy == 2 || kKvFp8 ? 1 : 0);
  using KAddr = typename TileK::Addr;
  using VAddr = typename TileV::Addr;

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
  static_assert(kKvCopy >= 0 && kKvCopy <= 2, "flexjit decode_split: kKvCopy 0..2");
  static_assert(kKvCopy != 0 || kKvFp8 ||
                    (kBlockN * TileQK::kChunks % kThreads == 0 &&
                     kBlockN * TileV::kChunks % kThreads == 0),
                "flexjit decode_split: KV tiles must split evenly into 16-byte copies per thread");
  static_assert(kBlockN % 32 == 0, "flexjit decode_split: whole key rows per lane of warp 0");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static_assert(kKvCopy == 0, "flexjit decode_split: bulk K / V copies (kKvCopy) need sm_90");
#endif
  static_assert(kBarOffset + (kKvCopy != 0 ? 8 * kNumStages : 0) ==
                    fj_decode_split_smem_bytes_kv(kRows, kBlockN, kDimQK, kDimV, kElemBytes,
                                                  kNumStages, kNumWarps, kKvCopy, kKvFp8),
                "flexjit decode_split: shared-memory layout and fj_decode_split_smem_bytes_kv "
                "disagree");
  static_assert(!kKvFp8 || kKvCopy == 0, "flexjit decode_split: e4m3 K / V load with cp.async");
  static_assert(!kKvFp8 || (kRealQK % 16 == 0 && kRealV % 16 == 0),
                "flexjit decode_split: e4m3 K / V need head dims that are multiples of 16");
  static_assert(!kKvFp8 || (kThreads % TileK::kChunks == 0 && kThreads % TileV::kChunks == 0),
                "flexjit decode_split: e4m3 KV tiles must split evenly into 16-byte copies");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  static_assert(!kKvFp8, "flexjit decode_split: e4m3 K / V need sm_89 (cvt.f16x2.e4m3x2)");
#endif
};

// Where the keys of one (b, kv head) live: contiguous rows, or pages through the table. E: the
// element's storage (unsigned short, or unsigned char for e4m3); strides are in elements.
template <class E>
struct FjDecKv {
  const E* k;  // contiguous: row 0 of (b, hkv); paged: the pool at head hkv
  const E* v;
  fj_i64 k_stride_s, v_stride_s;    // between keys (slots of a page)
  fj_i64 k_stride_pg, v_stride_pg;  // between pages (paged only)
  const int* table;                 // this sequence's page table row, or null
};

// One 16-byte K / V copy. kKvHint (FjConfig; docs/kernels/decode.md, "L2 hints"): 0 plain
// cp.async.cg; 1 with an L2::evict_first cache policy (K and V are read once: the lines they
// occupy in the L2 go first, so the streaming reads do not push out other data, dirty lines
// that would need a write-back included); 2 the same plus the L2::256B prefetch-size hint.
//
// The hinted copies take their shared address through `xor` with %dynamic_smem_size >> 31: zero
// (a block's shared memory is far below 2^31 bytes), but ptxas cannot fold it, and an xor cannot
// be split into a register, the pipeline stage's uniform register and an immediate. ptxas (CUDA
// 13.0) addresses some hinted copies in that form otherwise (`LDGSTS [R19+UR0+0x8000],
// desc[UR1][R26.64]`), and there it encodes the cache-policy descriptor in an odd uniform
// register: an illegal pair, which faults with CUDA_ERROR_ILLEGAL_INSTRUCTION. With the xor the
// copies read `LDGSTS [R23], desc[UR6][R26.64]` (docs/kernels/decode.md "The odd-register
// descriptor and its workaround"; tests/unit/test_decode_l2_hint.cpp scans the SASS where
// cuobjdump is found). The xor is in each copy's asm statement: one on the tile's first-row
// address instead, with immediates for the other rows, saves instructions but costs registers
// (spills at d = 256).
#define FJ_DEC_OPAQUE_DST                                                                      \
  "{\n .reg .u32 fj_z, fj_d;\n mov.u32 fj_z, %%dynamic_smem_size;\n shr.u32 fj_z, fj_z, 31;\n" \
  " xor.b32 fj_d, %0, fj_z;\n"

template <int kKvHint>
FJ_DEVICE void fj_dec_cp_async_16(fj_u32 dst, const void* src, bool valid,
                                  unsigned long long policy) {
  if constexpr (kKvHint == 0) {
    fj_cp_async_16(dst, src, valid);
  } else if constexpr (kKvHint == 1) {
    asm volatile(
        FJ_DEC_OPAQUE_DST
        " cp.async.cg.shared.global.L2::cache_hint [fj_d], [%1], 16, %2, %3;\n}\n" ::"r"(dst),
        "l"(src), "r"(valid ? 16 : 0), "l"(policy)
        : "memory");
  } else {
    asm volatile(
        FJ_DEC_OPAQUE_DST
        " cp.async.cg.shared.global.L2::cache_hint.L2::256B [fj_d], [%1], 16, %2, %3;\n}\n" ::"r"(
            dst),
        "l"(src), "r"(valid ? 16 : 0), "l"(policy)
        : "memory");
  }
}
#undef FJ_DEC_OPAQUE_DST

// The L2 cache policy of the K / V copies (unused when kKvHint == 0).
template <int kKvHint>
FJ_DEVICE unsigned long long fj_dec_kv_policy() {
  unsigned long long policy = 0;
  if constexpr (kKvHint != 0) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  }
  return policy;
}

// ---- bulk copies (kKvCopy 1, 2; sm_90): one cp.async.bulk per key row, an mbarrier per stage ---

FJ_DEVICE void fj_dec_mbar_init(fj_u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// One arrival that also expects `bytes` of bulk-copy transactions in the current phase.
FJ_DEVICE void fj_dec_mbar_arrive_expect_tx(fj_u32 bar, fj_u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Waits for the phase of parity `parity` (acquire: the copies' bytes are visible after it).
FJ_DEVICE void fj_dec_mbar_wait(fj_u32 bar, int parity) {
  fj_u32 done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) of global memory into this CTA's
// shared memory through the async proxy, completing as transaction bytes on mbarrier `bar`;
// kPolicy != 0 adds the L2 cache policy (evict_first; bulk copies have no prefetch-size hint).
template <int kPolicy>
FJ_DEVICE void fj_dec_bulk_copy(fj_u32 dst, const void* src, fj_u32 bytes, fj_u32 bar,
                                unsigned long long policy) {
  if constexpr (kPolicy == 0) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];\n" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
        "[%1], %2, [%3], %4;\n" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar), "l"(policy)
        : "memory");
  }
}

// Copies keys [n_start, n_start + kRows) of K or V (row stride `stride`, page stride `pstride`)
// into a swizzled tile with cp.async; keys >= len and the chunks past the head dim
// (Tile::kValidChunks) are zero-filled and read nothing. Thread tid
// copies chunk tid % kChunks of rows tid / kChunks + i * kRowStep.
template <class Tile, int kRows, int kThreads, int kPageSize, int kKvHint, class E>
FJ_DEVICE void fj_dec_load_tile(fj_u32 smem, const E* base, fj_i64 stride, fj_i64 pstride,
                                const int* table, int n_start, int len, int tid,
                                unsigned long long policy) {
  static_assert(kThreads % Tile::kChunks == 0, "flexjit: a thread must keep its chunk column");
  constexpr int kRowStep = kThreads / Tile::kChunks;
  // More threads than chunks (e4m3 tiles of few keys): the first kRows * kChunks copy one each.
  constexpr int kPerThread = kRowStep > kRows ? 1 : kRows / kRowStep;
  static_assert(kRows % kRowStep == 0 || kRowStep % kRows == 0,
                "flexjit: tile rows must split evenly over threads");
  const int r0 = tid / Tile::kChunks;
  const int c = tid % Tile::kChunks;
  if constexpr (kRowStep > kRows) {
    if (r0 >= kRows) return;
  }
  const E* tile_base = base;
  if constexpr (kPageSize >= kRows) {
    // The whole tile lies in one page (kRows divides kPageSize).
    const int page = table[n_start / kPageSize];
    tile_base = base + (fj_i64)page * pstride + (fj_i64)(n_start % kPageSize) * stride;
  } else if constexpr (kPageSize == 0) {
    tile_base = base + (fj_i64)n_start * stride;
  }
  // Pages smaller than the tile: the thread's page entries are all read before its first copy.
  // Each copy's asm (its memory clobber) keeps a later load after it, so one lookup per copy
  // waited for its load before every copy: 16 such waits a tile at 16-key pages. Rows r0 + i
  // kRowStep with r0 < kRowStep share a page kRowsPerPage at a time (powers of two; n_start is
  // a multiple of the page), so one entry serves each group.
  constexpr bool kRowPages = kPageSize > 0 && kPageSize < kRows;
  constexpr int kRowsPerPage = kPageSize >= kRowStep ? kPageSize / kRowStep : 1;
  constexpr int kPages = kRowPages ? (kPerThread + kRowsPerPage - 1) / kRowsPerPage : 1;
  int pages[kPages];
  if constexpr (kRowPages) {
#pragma unroll
    for (int g = 0; g < kPages; ++g) {
      const int n0 = n_start + (kRowsPerPage == 1 ? r0 : 0) + g * kRowsPerPage * kRowStep;
      pages[g] = n0 < len ? table[n0 / kPageSize] : 0;
    }
  }
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int r = r0 + i * kRowStep;
    const int n = n_start + r;
    const bool valid = n < len && c < Tile::kValidChunks;
    const E* src = base;  // an invalid row reads nothing: any mapped address
    if (valid) {
      if constexpr (kRowPages) {
        src = base + (fj_i64)pages[i / kRowsPerPage] * pstride + (fj_i64)(n % kPageSize) * stride;
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

// ---- tile scheduling -------------------------------------------------------------------------

// The CTA's work and this thread's place in it: KV split `split` of the packed rows [row0, row0
// + kRows) of kv head hkv of sequence b, whose keys are [0, len); warp (warp_m, warp_n) of the
// kWarpsM x kWarpsN warps.
struct FjDecCta {
  int split, hkv, group, b;
  int tid, warp, lane, warp_m, warp_n;
  int packed_rows;  // rows of this kv head: kGqaRatio * seqlen_q
  int row0;         // first packed row of the CTA
  int len;          // the sequence's keys

  template <class T, class Cfg>
  FJ_DEVICE static FjDecCta make(const FjDecodeArgs& args) {
    FjDecCta c;
    c.split = blockIdx.x;
    c.hkv = blockIdx.y / args.row_groups;
    c.group = blockIdx.y % args.row_groups;
    c.b = blockIdx.z;
    c.tid = threadIdx.x;
    c.warp = c.tid / 32;
    c.lane = c.tid % 32;
    c.warp_m = c.warp / T::kWarpsN;
    c.warp_n = c.warp % T::kWarpsN;
    c.packed_rows = Cfg::kGqaRatio * args.seqlen_q;
    c.row0 = c.group * T::kRows;
    c.len = args.seqlen_kv;
    if (args.seq_lens != nullptr) c.len = fj_imax(0, fj_imin(args.seq_lens[c.b], args.seqlen_kv));
    return c;
  }

  // This thread's rows (g and g + 8 of the warp's m16 fragment): head and query index for the
  // mods, clamped to the last real row so that mods only see in-range indices. (The kernel's
  // arrays: loop-indexed members would keep the whole struct in memory until unrolled.)
  template <class Cfg>
  FJ_DEVICE void rows(int (&row_h)[2], int (&row_q)[2], const FjDecodeArgs& args) const {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int pr = fj_imin(row0 + warp_m * 16 + hr * 8 + (lane >> 2), packed_rows - 1);
      row_h[hr] = hkv * Cfg::kGqaRatio + pr / args.seqlen_q;
      row_q[hr] = pr % args.seqlen_q;
    }
  }
};

// ---- loads -----------------------------------------------------------------------------------

// Where kv head hkv of sequence b lives: contiguous rows, or the pool through its page table.
template <int kPageSize, class E>
FJ_DEVICE FjDecKv<E> fj_dec_kv(const FjDecodeArgs& args, int b, int hkv) {
  FjDecKv<E> kv;
  const E* k_all = static_cast<const E*>(args.k);
  const E* v_all = static_cast<const E*>(args.v);
  kv.k_stride_s = args.k_stride_s;
  kv.v_stride_s = args.v_stride_s;
  kv.k_stride_pg = args.k_stride_b;
  kv.v_stride_pg = args.v_stride_b;
  if constexpr (kPageSize > 0) {
    kv.k = k_all + (fj_i64)hkv * args.k_stride_h;
    kv.v = v_all + (fj_i64)hkv * args.v_stride_h;
    kv.table = args.page_table + (fj_i64)b * args.page_table_stride_b;
  } else {
    kv.k = k_all + (fj_i64)b * args.k_stride_b + (fj_i64)hkv * args.k_stride_h;
    kv.v = v_all + (fj_i64)b * args.v_stride_b + (fj_i64)hkv * args.v_stride_h;
    kv.table = nullptr;
  }
  return kv;
}

// The CTA's cp.async copies: the Q tile once, a KV tile (K then V) into a pipeline stage.
template <class T, class Cfg>
struct FjDecLoader {
  FjDecKv<typename T::KvElem> kv;
  fj_u32 sq, skv;  // the Q tile, stage 0 of the KV ring
  int len, tid;
  unsigned long long policy;  // the L2 policy of the K / V copies (T::kPolicy)
  fj_u32 bars;                // bulk copies: the stages' mbarriers (8 bytes apart)

  FJ_DEVICE void kv_tile(int tile, int stage) const {
    if constexpr (T::kKvCopy != 0) {
      kv_tile_bulk(tile, stage);
    } else {
      const int n_start = tile * T::kBlockN;
      if (n_start >= len) return;  // past the end of a ragged sparse block: skipped
      if constexpr (T::kKvFp8) {
        const fj_u32 s8 = skv + stage * T::kStageBytes;
        fj_dec_load_tile<typename T::TileK, T::kBlockN, T::kThreads, T::kPageSize, T::kPolicy>(
            s8, kv.k, kv.k_stride_s, kv.k_stride_pg, kv.table, n_start, len, tid, policy);
        fj_dec_load_tile<typename T::TileV, T::kBlockN, T::kThreads, T::kPageSize, T::kPolicy>(
            s8 + T::kKBytes, kv.v, kv.v_stride_s, kv.v_stride_pg, kv.table, n_start, len, tid,
            policy);
      } else {
        const fj_u32 sk = skv + stage * T::kStageBytes;
        fj_dec_load_tile<typename T::TileQK, T::kBlockN, T::kThreads, T::kPageSize, Cfg::kKvHint>(
            sk, kv.k, kv.k_stride_s, kv.k_stride_pg, kv.table, n_start, len, tid, policy);
        fj_dec_load_tile<typename T::TileV, T::kBlockN, T::kThreads, T::kPageSize, Cfg::kKvHint>(
            sk + T::kKBytes, kv.v, kv.v_stride_s, kv.v_stride_pg, kv.table, n_start, len, tid,
            policy);
      }
    }
  }

  // Bulk copies: warp 0 issues one cp.async.bulk per K row and per V row of the tile's keys
  // below `len` (lane l: rows l, l + 32, ...; a row's page read once for its K and V), after
  // lane 0's arrival that expects their bytes. Rows past `len` are not copied: they keep the
  // zeros of fj_dec_bulk_setup or an earlier tile's finite keys, masked to -inf (p = 0). Every
  // tile arrives on its stage's barrier, an empty one with 0 bytes, so that its wait returns.
  FJ_DEVICE void kv_tile_bulk(int tile, int stage) const {
    if (tid >= 32) return;
    using TK = typename T::TileK;
    using TV = typename T::TileV;
    const int n_start = tile * T::kBlockN;
    const int rows = fj_imax(0, fj_imin(len - n_start, T::kBlockN));
    const fj_u32 bar = bars + 8 * stage;
    if (tid == 0) fj_dec_mbar_arrive_expect_tx(bar, rows * (TK::kRealRowBytes + TV::kRealRowBytes));
    __syncwarp();
    const fj_u32 sk = skv + stage * T::kStageBytes;
#pragma unroll
    for (int j = 0; j < T::kBlockN / 32; ++j) {
      const int r = tid + 32 * j;
      if (r < rows) {
        const int n = n_start + r;
        const unsigned short* k_src;
        const unsigned short* v_src;
        if constexpr (T::kPageSize > 0) {
          const fj_i64 page = kv.table[n / T::kPageSize];
          const fj_i64 slot = n % T::kPageSize;
          k_src = kv.k + page * kv.k_stride_pg + slot * kv.k_stride_s;
          v_src = kv.v + page * kv.v_stride_pg + slot * kv.v_stride_s;
        } else {
          k_src = kv.k + (fj_i64)n * kv.k_stride_s;
          v_src = kv.v + (fj_i64)n * kv.v_stride_s;
        }
        fj_dec_bulk_copy<T::kPolicy>(sk + r * TK::kRowBytes, k_src, TK::kRealRowBytes, bar, policy);
        fj_dec_bulk_copy<T::kPolicy>(sk + T::kKBytes + r * TV::kRowBytes, v_src, TV::kRealRowBytes,
                                     bar, policy);
      }
    }
  }

  // Q: packed row r of the tile is head hkv * G + (row0 + r) / seqlen_q, token (row0 + r) %
  // seqlen_q; rows past the group's end and chunks past the head dim are zero-filled.
  FJ_DEVICE void q_tile(const FjDecodeArgs& args, const FjDecCta& cta) const {
    using TileQ = typename T::TileQK;
    const unsigned short* q_all = static_cast<const unsigned short*>(args.q);
    for (int i = tid; i < T::kRows * TileQ::kChunks; i += T::kThreads) {
      const int r = i / TileQ::kChunks;
      const int c = i % TileQ::kChunks;
      const int pr = cta.row0 + r;
      const bool valid = pr < cta.packed_rows && c < TileQ::kValidChunks;
      const unsigned short* src = q_all;
      if (valid) {
        const int h = cta.hkv * Cfg::kGqaRatio + pr / args.seqlen_q;
        const int qi = pr % args.seqlen_q;
        src = q_all + (fj_i64)cta.b * args.q_stride_b + (fj_i64)h * args.q_stride_h +
              (fj_i64)qi * args.q_stride_s + c * TileQ::kElemsPerChunk;
      }
      fj_cp_async_16(sq + TileQ::offset(r, c), src, valid);
    }
  }
};

// ---- mainloop, scores and softmax: one warp's 16 rows and kWarpN keys of a tile --------------

template <class T, class Cfg>
struct FjDecWarp {
  int warp, lane, warp_n;
  fj_u32 sq_warp;  // the warp's 16 rows of the Q tile

  FJ_DEVICE FjDecWarp(const FjDecCta& cta, fj_u32 sq)
      : warp(cta.warp),
        lane(cta.lane),
        warp_n(cta.warp_n),
        sq_warp(sq + cta.warp_m * 16 * T::TileQK::kRowBytes) {}

  FJ_DEVICE FjLdsmAddr<typename T::TileQK> q_addr() const {
    return FjLdsmAddr<typename T::TileQK>(sq_warp, ((lane >> 3) & 1) * 8 + (lane & 7), lane >> 4);
  }

  // Q's A fragments into registers (kQInRegs), once the Q group has landed.
  FJ_DEVICE void load_q(fj_u32 (&q_regs)[T::kQInRegs ? T::kKSteps : 1][4]) const {
    // The Q group: with cp.async K / V, kNumStages - 1 KV groups are younger; with bulk copies
    // it is the only group (and the main loop waits for none, so Q in shared memory is waited
    // for here too).
    constexpr int kYounger = T::kKvCopy != 0 ? 0 : T::kNumStages - 1;
    if constexpr (T::kQInRegs) {
      fj_cp_async_wait<kYounger>();
      __syncthreads();
      const FjLdsmAddr<typename T::TileQK> qa_addr = q_addr();
#pragma unroll
      for (int kk = 0; kk < T::kKSteps; ++kk)
        fj_ldsm_x4(q_regs[kk], qa_addr.at(0, kk));
    } else if constexpr (T::kKvCopy != 0) {
      fj_cp_async_wait<0>();
      __syncthreads();
    }
  }

  // Q's A fragment of k16 step kk: from registers, or from the Q tile.
  FJ_DEVICE void q_frag(fj_u32 (&qa)[4], const fj_u32 (&q_regs)[T::kQInRegs ? T::kKSteps : 1][4],
                        const FjLdsmAddr<typename T::TileQK>& qa_addr, int kk) const {
    if constexpr (T::kQInRegs) {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        qa[e] = q_regs[kk][e];
    } else {
      fj_ldsm_x4(qa, qa_addr.at(0, kk));
    }
  }

  // S = Q K^T for the warp's 16 rows and kWarpN keys of the K tile at sk.
  FJ_DEVICE void qk(float (&s)[T::kNTiles][4],
                    const fj_u32 (&q_regs)[T::kQInRegs ? T::kKSteps : 1][4], fj_u32 sk) const {
#pragma unroll
    for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[nt][e] = 0.0f;
    const FjLdsmAddr<typename T::TileQK> qa_addr = q_addr();
    const typename T::KAddr kb_addr(sk, (lane >> 4) * 8 + (lane & 7), (lane >> 3) & 1);
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

  // bf16 Q with e4m3 K / V (kFp8F16): the Q fragments to f16 times 2^-e, where 2^e brings the
  // largest |q| of the warp's 16 rows into [2^14, 2^15) (e clamped to -126 .. 126); returns
  // 2^e, which the score scale takes back (exact: a power of two). Every element at least
  // 2^-28 times that largest one converts exactly (bf16's 8 significant bits fit f16's 11); a
  // smaller one is an f16 subnormal, off by at most 2^-39 times the largest (docs/math.md "FP8
  // KV caches"). The warps of one row block see the same rows, so they take the same e.
  FJ_DEVICE float q_to_f16(fj_u32 (&q_regs)[T::kQInRegs ? T::kKSteps : 1][4]) const {
    float mx = 0.0f;
#pragma unroll
    for (int kk = 0; kk < T::kKSteps; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        mx = fmaxf(mx, fmaxf(fabsf(__uint_as_float(q_regs[kk][e] << 16)),
                             fabsf(__uint_as_float(q_regs[kk][e] & 0xFFFF0000u))));
#pragma unroll
    for (int m = 16; m >= 1; m /= 2)
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
    // The exponent field of the largest |q| (0 for 0 and subnormals, 255 for inf / NaN).
    const int e = fj_imax(-126, fj_imin(126, ((__float_as_uint(mx) >> 23) & 0xFF) - 127 - 14));
    const float down = __uint_as_float((fj_u32)(127 - e) << 23);
#pragma unroll
    for (int kk = 0; kk < T::kKSteps; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        q_regs[kk][i] = FjMma<fj_f16>::pack(__uint_as_float(q_regs[kk][i] << 16) * down,
                                            __uint_as_float(q_regs[kk][i] & 0xFFFF0000u) * down);
    return __uint_as_float((fj_u32)(127 + e) << 23);
  }

  // e4m3 K: one ldmatrix.x4 of the e4m3 tile read as b16 gives lane (g, t) key g's bytes 4t ..
  // 4t + 3 of four 16-dim chunks (matrices: keys 16 np + 0..7 / 8..15 times chunks 2 kp, 2 kp +
  // 1). Converted in registers, bytes 4t, 4t + 1 are the B fragment's k = 2t, 2t + 1 and bytes 4t
  // + 2, 4t + 3 its k = 2t + 8, 2t + 9: the k order of every 16 dims is permuted, and so are Q's
  // columns (fj_dec_fp8_q), which leaves the dot products unchanged. An odd chunk count reads the
  // zero-filled chunk after the real dim (inside the tile) and skips its mma.
  FJ_DEVICE void qk_fp8(float (&s)[T::kNTiles][4],
                        const fj_u32 (&q_regs)[T::kQInRegs ? T::kKSteps : 1][4], fj_u32 sk) const {
#pragma unroll
    for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[nt][e] = 0.0f;
    const FjLdsmAddr<typename T::TileQK> qa_addr = q_addr();
    const typename T::KAddr kb_addr(sk, (lane >> 4) * 8 + (lane & 7), (lane >> 3) & 1);
#pragma unroll
    for (int kp = 0; kp < (T::kKSteps + 1) / 2; ++kp) {
#pragma unroll
      for (int np = 0; np < T::kNTiles / 2; ++np) {
        fj_u32 kb[4];
        fj_ldsm_x4(kb, kb_addr.at(np, kp));
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int kk = 2 * kp + (m & 1);
          if (kk < T::kKSteps) {
            fj_u32 qa[4], b0, b1;
            q_frag(qa, q_regs, qa_addr, kk);
            fj_e4m3x4<typename T::Elem8>(kb[m], b0, b1);
            T::Mma8::mma(s[2 * np + (m >> 1)], qa, b0, b1);
          }
        }
      }
    }
  }

  // Scores in the log2 domain: scale, score_mod, mask_mod (unless the tile is `full`), key bound.
  FJ_DEVICE void scores(float (&s)[T::kNTiles][4], const int (&row_h)[2], const int (&row_q)[2],
                        const FjModParams& mods, float scale, int b, int n_start, int len,
                        bool full) const {
    constexpr float kLog2e = 1.4426950408889634f;
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
            if (!full && !fj_mask_mod(mods, b, row_h[hr], row_q[hr], kv_idx)) x = fj_neg_inf();
          }
          if (kv_raw >= len) x = fj_neg_inf();
          s[nt][hr * 2 + c] = x;
        }
      }
    }
  }

  // Online softmax (log2 domain): P into s, O rescaled; a row whose max is still -inf uses 0 as
  // its reference.
  FJ_DEVICE void softmax(float (&s)[T::kNTiles][4], float (&o)[T::kDTiles][4], float (&row_max)[2],
                         float (&row_sum)[2]) const {
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
      // e4m3 K / V: the rescale is skipped when no row of the warp got a new max (alpha == 1
      // exactly, the common case once the max has settled): a vote against kDTiles x 2 FMULs in
      // a loop where they are ~10 % of the issue (docs/kernels/decode.md "FP8 KV caches").
      if (!T::kKvFp8 || __any_sync(0xffffffffu, alpha != 1.0f)) {
#pragma unroll
        for (int dt = 0; dt < T::kDTiles; ++dt) {
          o[dt][hr * 2] *= alpha;
          o[dt][hr * 2 + 1] *= alpha;
        }
      }
    }
  }

  // O += P V (the V tile at sv): the C fragments of n8 tiles 2j, 2j + 1 are the A fragment of
  // k16 step j.
  FJ_DEVICE void pv(float (&o)[T::kDTiles][4], const float (&s)[T::kNTiles][4], fj_u32 sv) const {
    const typename T::VAddr vb_addr(sv, ((lane >> 3) & 1) * 8 + (lane & 7), lane >> 4);
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

  // e4m3 V, k16 step j: one ldmatrix.x4.trans of the e4m3 tile read as b16 (matrices: keys 16 j
  // + 0..7 / 8..15 times chunks 2 dq, 2 dq + 1) gives lane (g, t), per matrix, keys 2t and 2t + 1
  // of dims 2g, 2g + 1 of the chunk; a prmt regroups them by dim and the conversion makes the B
  // fragments of two n8 tiles: O tile 2c holds chunk c's even dims (column n = dim 16c + 2n),
  // tile 2c + 1 its odd dims (16c + 2n + 1); FjDecEpilogue::publish puts them back in order. An
  // odd chunk count reads the zero-filled chunk after the real dim and skips its mma.
  FJ_DEVICE void pv_fp8(float (&o)[T::kDTiles][4], const float (&s)[T::kNTiles][4],
                        fj_u32 sv) const {
    const typename T::VAddr vb_addr(sv, ((lane >> 3) & 1) * 8 + (lane & 7), lane >> 4);
#pragma unroll
    for (int j = 0; j < T::kNTiles / 2; ++j) {
      fj_u32 pa[4];
      pa[0] = T::Mma8::pack(s[2 * j][0], s[2 * j][1]);
      pa[1] = T::Mma8::pack(s[2 * j][2], s[2 * j][3]);
      pa[2] = T::Mma8::pack(s[2 * j + 1][0], s[2 * j + 1][1]);
      pa[3] = T::Mma8::pack(s[2 * j + 1][2], s[2 * j + 1][3]);
#pragma unroll
      for (int dq = 0; dq < (T::kDTiles / 2 + 1) / 2; ++dq) {
        fj_u32 vb[4];
        fj_ldsm_x4_trans(vb, vb_addr.at(j, dq));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int c = 2 * dq + h;
          if (2 * c < T::kDTiles) {
            fj_u32 b0e, b0o, b1e, b1o;
            fj_dec_e4m3_keys<typename T::Elem8>(vb[2 * h], b0e, b0o);
            fj_dec_e4m3_keys<typename T::Elem8>(vb[2 * h + 1], b1e, b1o);
            T::Mma8::mma(o[2 * c], pa, b0e, b1e);
            T::Mma8::mma(o[2 * c + 1], pa, b0o, b1o);
          }
        }
      }
    }
  }
};

// e4m3 K (FjDecWarp::qk_fp8): permutes the columns of the Q tile in place, once the Q group has
// landed, so that the mma's k index matches the order in which one 4-byte read of an e4m3 K row
// delivers the dims. Within every 16 dims (two chunks, words w0 .. w7 of 2 elements), the
// permuted row holds words w0 w2 w4 w6 | w1 w3 w5 w7: k = 2t, 2t + 1 (word t) take dims 4t, 4t +
// 1, and k = 2t + 8, 2t + 9 (word 4 + t) dims 4t + 2, 4t + 3.
template <class T>
FJ_DEVICE void fj_dec_fp8_q(fj_u32 sq, int tid) {
  using TileQ = typename T::TileQK;
  constexpr int kGroups = T::kDimQK / 16;
  fj_cp_async_wait<T::kNumStages - 1>();  // the Q group (kNumStages - 1 KV groups are younger)
  __syncthreads();
  for (int i = tid; i < T::kRows * kGroups; i += T::kThreads) {
    const int r = i / kGroups;
    const int g = i % kGroups;
    const fj_u32 a = sq + TileQ::offset(r, 2 * g);
    const fj_u32 b = sq + TileQ::offset(r, 2 * g + 1);
    fj_u32 w[8];
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "r"(a));
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(w[4]), "=r"(w[5]), "=r"(w[6]), "=r"(w[7])
                 : "r"(b));
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(w[0]), "r"(w[2]),
                 "r"(w[4]), "r"(w[6])
                 : "memory");
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(b), "r"(w[1]), "r"(w[3]),
                 "r"(w[5]), "r"(w[7])
                 : "memory");
  }
  __syncthreads();
}

// ---- the KV pipeline: kNumStages cp.async groups ahead of the tile being computed --------------

// Fills `tiles` with the KV tiles of steps 0 .. kNumStages - 1 and puts stages 0 .. kNumStages - 2
// in flight (a commit group each, empty past the schedule). The steady state (wait, issue the
// tile kNumStages - 1 steps on, shift `tiles`) stays in the kernel's loop: as a function of the
// step it compiled to other code (the stage's `% kNumStages` on a step not known to be >= 0).
template <class T, class Loader>
FJ_DEVICE void fj_dec_prologue(int (&tiles)[T::kNumStages], const FjDecSchedule& sched,
                               const Loader& loads, int num_steps) {
#pragma unroll
  for (int k = 0; k < T::kNumStages; ++k)
    tiles[k] = k < num_steps ? sched.tile(sched.begin + k) : 0;
#pragma unroll
  for (int st = 0; st < T::kNumStages - 1; ++st) {
    if (st < num_steps) loads.kv_tile(tiles[st], st);
    if constexpr (T::kKvCopy == 0) fj_cp_async_commit();
  }
}

// Bulk copies: the stages' mbarriers (one arrival each: lane 0 of warp 0) and a zeroed KV ring
// (the padding columns a head dim below its tile reads, and rows past a sequence's end before
// any tile lands there, must not hold NaN patterns), visible to every thread and to the async
// proxy before the first copy.
template <class T>
FJ_DEVICE void fj_dec_bulk_setup(unsigned char* smem, fj_u32 bars, int tid) {
  if (tid == 0) {
#pragma unroll
    for (int st = 0; st < T::kNumStages; ++st)
      fj_dec_mbar_init(bars + 8 * st, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  fj_u32x4* ring = reinterpret_cast<fj_u32x4*>(smem + T::kQBytes);
  for (int i = tid; i < T::kNumStages * T::kStageBytes / 16; i += T::kThreads)
    ring[i] = fj_u32x4{0u, 0u, 0u, 0u};
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
}

// ---- epilogue ----------------------------------------------------------------------------------

// Each warp publishes its rows' max, sum and unnormalized O; then the CTA merges the kWarpsN
// partial softmaxes of every row and writes the split's partials (normalized by the row sum) and
// its log2-domain LSE.
template <class T, class Cfg>
struct FjDecEpilogue {
  float* red_o;  // [kNumWarps][16][kDimV]
  float* red_m;  // [kNumWarps][16]
  float* red_s;  // [kNumWarps][16]

  FJ_DEVICE explicit FjDecEpilogue(unsigned char* smem) {
    float* red = reinterpret_cast<float*>(smem);
    red_o = red;
    red_m = red + T::kNumWarps * 16 * T::kDimV;
    red_s = red_m + T::kNumWarps * 16;
  }

  FJ_DEVICE void publish(const FjDecWarp<T, Cfg>& w, const float (&o)[T::kDTiles][4],
                         const float (&row_max)[2], const float (&row_sum)[2]) const {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float sum = row_sum[hr];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int r = hr * 8 + (w.lane >> 2);
      if ((w.lane & 3) == 0) {
        red_m[w.warp * 16 + r] = row_max[hr];
        red_s[w.warp * 16 + r] = sum;
      }
      if constexpr (T::kKvFp8) {
        // e4m3 V (FjDecWarp::pv_fp8): tiles 2c / 2c + 1 hold chunk c's even / odd dims, so lane
        // t's four values are dims 16c + 4t .. 4t + 3.
#pragma unroll
        for (int c = 0; c < T::kDTiles / 2; ++c) {
          float* dst = red_o + (w.warp * 16 + r) * T::kDimV + c * 16 + (w.lane & 3) * 4;
          dst[0] = o[2 * c][hr * 2];
          dst[1] = o[2 * c + 1][hr * 2];
          dst[2] = o[2 * c][hr * 2 + 1];
          dst[3] = o[2 * c + 1][hr * 2 + 1];
        }
      } else {
#pragma unroll
        for (int dt = 0; dt < T::kDTiles; ++dt) {
          float* dst = red_o + (w.warp * 16 + r) * T::kDimV + dt * 8 + (w.lane & 3) * 2;
          dst[0] = o[dt][hr * 2];
          dst[1] = o[dt][hr * 2 + 1];
        }
      }
    }
  }

  FJ_DEVICE void merge(const FjDecodeArgs& args, const FjDecCta& cta) const {
    const int num_splits = args.num_splits;
    for (int idx = cta.tid; idx < T::kRows * T::kRealV; idx += T::kThreads) {
      const int r = idx / T::kRealV;  // row of the CTA
      const int d = idx % T::kRealV;
      const int pr = cta.row0 + r;
      if (pr >= cta.packed_rows) break;  // rows are visited in order
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
      const int h = cta.hkv * Cfg::kGqaRatio + pr / args.seqlen_q;
      const int qi = pr % args.seqlen_q;
      const fj_i64 row = ((fj_i64)cta.b * args.heads_q + h) * args.seqlen_q + qi;
      const fj_i64 slot = row * num_splits + cta.split;
      // sum == 0: every key of the split was masked (or there was none): out 0, lse -inf.
      args.o_part[slot * T::kRealV + d] = sum > 0.0f ? acc / sum : 0.0f;
      if (d == 0) args.lse_part[slot] = sum > 0.0f ? m + log2f(sum) : fj_neg_inf();
    }
  }
};

// ---- the kernel --------------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(FjConfig::kNumWarps * 32, 1)
    flexjit_decode_split(const FjDecodeArgs args, const FjModParams mods) {
  using T = FjDecTraits<FjConfig>;
  using Cfg = FjConfig;
  extern __shared__ unsigned char fj_smem[];
  const FjDecCta cta = FjDecCta::make<T, Cfg>(args);
  // Heads of the group share one block-mask row only when the mask is broadcast over heads (or
  // the group is one head): the host guarantees one of the two.
  const FjDecSchedule sched =
      fj_dec_schedule<Cfg>(args, cta.b, cta.hkv * Cfg::kGqaRatio, cta.len, cta.split);
  const FjDecKv<typename T::KvElem> kv =
      fj_dec_kv<T::kPageSize, typename T::KvElem>(args, cta.b, cta.hkv);
  const fj_u32 sq = fj_smem_addr(fj_smem);
  const FjDecLoader<T, Cfg> loads{kv,
                                  sq,
                                  sq + T::kQBytes,
                                  cta.len,
                                  cta.tid,
                                  fj_dec_kv_policy<T::kPolicy>(),
                                  sq + T::kBarOffset};
  if constexpr (T::kKvCopy != 0) fj_dec_bulk_setup<T>(fj_smem, loads.bars, cta.tid);
  loads.q_tile(args, cta);
  fj_cp_async_commit();
  const int num_steps = sched.end - sched.begin;
  int tiles[T::kNumStages];
  fj_dec_prologue<T>(tiles, sched, loads, num_steps);

  int row_h[2], row_q[2];
  cta.rows<Cfg>(row_h, row_q, args);
  const FjDecWarp<T, Cfg> w(cta, sq);
  fj_u32 q_regs[T::kQInRegs ? T::kKSteps : 1][4];
  if constexpr (T::kKvFp8) fj_dec_fp8_q<T>(sq, cta.tid);
  w.load_q(q_regs);
  float o[T::kDTiles][4];
  float row_max[2] = {fj_neg_inf(), fj_neg_inf()};
  float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int dt = 0; dt < T::kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      o[dt][e] = 0.0f;
  // e4m3 K / V: q . (k * k_scale) = k_scale * (q . k), folded into the score scale, and with
  // bf16 q run in f16 the power of two Q was scaled by (FjDecWarp::q_to_f16).
  float q_pow2 = 1.0f;
  if constexpr (T::kFp8F16 && !FjIsF16<typename T::Element>::value) q_pow2 = w.q_to_f16(q_regs);
  const float scale = T::kKvFp8 ? args.scale * args.k_scale[cta.hkv] * q_pow2 : args.scale;
  for (int i = 0; i < num_steps; ++i) {
    if constexpr (T::kKvCopy != 0) {
      // Bulk copies: tile i landed when its stage's barrier completes phase i / kNumStages.
      if constexpr (T::kNumStages == 1) loads.kv_tile(tiles[0], 0);
      fj_dec_mbar_wait(loads.bars + 8 * (i % T::kNumStages), (i / T::kNumStages) & 1);
    } else if constexpr (T::kNumStages == 1) {
      loads.kv_tile(tiles[0], 0);
      fj_cp_async_commit();
      fj_cp_async_wait<0>();
    } else {
      fj_cp_async_wait<T::kNumStages - 2>();
    }
    __syncthreads();  // tile i is visible to all; every warp is done with tile i - 1's stage
    if constexpr (T::kNumStages > 1) {
      const int next = i + T::kNumStages - 1;
      if (next < num_steps) loads.kv_tile(tiles[T::kNumStages - 1], next % T::kNumStages);
      if constexpr (T::kKvCopy == 0) fj_cp_async_commit();
    }
    const int n_start = tiles[0] * T::kBlockN;
#pragma unroll
    for (int k = 0; k + 1 < T::kNumStages; ++k)
      tiles[k] = tiles[k + 1];
    tiles[T::kNumStages - 1] =
        i + T::kNumStages < num_steps ? sched.tile(sched.begin + i + T::kNumStages) : 0;
    if (n_start < cta.len) {
      // A full tile of the block mask skips the mask_mod. (Passed as `full`: the scores' test as
      // `partial && !mask` compiled to other predicate code, with more registers for some mods.)
      const bool full = !(sched.begin + i < sched.num_partial || sched.partial_idx == nullptr);
      const fj_u32 stage = (i % T::kNumStages) * T::kStageBytes;
      const fj_u32 sk = loads.skv + stage + w.warp_n * T::kWarpN * T::TileK::kRowBytes;
      const fj_u32 sv = loads.skv + stage + T::kKBytes + w.warp_n * T::kWarpN * T::TileV::kRowBytes;
      float s[T::kNTiles][4];
      if constexpr (T::kKvFp8) {
        w.qk_fp8(s, q_regs, sk);
      } else {
        w.qk(s, q_regs, sk);
      }
      w.scores(s, row_h, row_q, mods, scale, cta.b, n_start, cta.len, full);
      w.softmax(s, o, row_max, row_sum);
      if constexpr (T::kKvFp8) {
        w.pv_fp8(o, s, sv);
      } else {
        w.pv(o, s, sv);
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
  if constexpr (T::kKvFp8) {  // sum_j p_j (v_j * v_scale) = v_scale * sum_j p_j v_j
    const float v_scale = args.v_scale[cta.hkv];
#pragma unroll
    for (int dt = 0; dt < T::kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o[dt][e] *= v_scale;
  }
  const FjDecEpilogue<T, Cfg> epilogue(fj_smem);
  epilogue.publish(w, o, row_max, row_sum);
  __syncthreads();
  epilogue.merge(args, cta);
}

#endif  // FLEXJIT_DECODE_SPLIT_CUH_
