// create_block_mask on the GPU: classifies every (Q tile, KV tile) of every (b, h) as empty,
// partial or full, and writes FlexAttention's block-sparse arrays (layout: FjBlockMaskBuildArgs
// in flexjit_abi.h) with their transpose.
//
// Spliced after the generated parts every kernel gets: flexjit_abi.h, the prelude, then
//   struct FjBlockMaskConfig { static constexpr int kQBlock, kKvBlock, kNumWarps; };
//   struct FjModParams { ... };                 // captured buffers and runtime parameters
//   __device__ bool fj_mask_mod(const FjModParams& p, int b, int h, int q_idx, int kv_idx);
// Positions past seqlen_q / seqlen_kv count as masked (PyTorch's create_block_mask pads the
// dense mask with False), so a boundary tile is never full unless it is whole. The host
// builders (src/runtime/BlockMask.cpp, src/cpu/InterpretedBlockMask.cpp, src/cpu/JitBlockMask.cpp)
// follow the same rules; tests compare them.
//
// Two kernels, launched in this order on one stream:
//
//   flexjit_block_mask_classify(args, params, tiles, num_tiles, hints, kinds)
//     one warp per (b, h, listed tile); grid (ceil(Bm * Hm * num_tiles / kNumWarps)), block
//     kNumWarps * 32, no shared memory. `tiles` lists the tile numbers (qb * num_kv_blocks +
//     kvb) to evaluate, or is null for all num_q_blocks * num_kv_blocks tiles. Writes
//     kinds[(b * Hm + h) * tiles_per_bh + tile] for the listed tiles only.
//   flexjit_block_mask_index(args, hints, kinds)
//     one warp per kv_* row (b, h, qb) then per q_* column (b, h, kvb); grid
//     (ceil(Bm * Hm * (num_q_blocks + num_kv_blocks) / 4)), block 128. A tile's kind is
//     hints[tile] when that is not kUnknown (hints may be null: all unknown), else its entry in
//     `kinds`.
//
// `hints` [num_q_blocks * num_kv_blocks] are verdicts the host proved for every (b, h) by
// interval analysis (passes/MaskAnalysis.h); the host lists only the kUnknown tiles, so proven
// tiles cost no evaluation at all.

namespace fj_block_mask {

enum : unsigned char { kEmpty = 0, kPartial = 1, kFull = 2, kUnknown = 3 };

// Classifies one tile with one warp. A first pass evaluates a 8 x 4 grid of samples (corners
// included), which finds most partial tiles (those a mask boundary crosses) at once. Otherwise
// every in-range position is evaluated, kRows rows per step, and the warp stops at the first
// position that disagrees with the samples. Uniform tiles need every position: nothing else
// proves them on the device.
__device__ inline unsigned char classify_tile(const FjModParams& params, int b, int h, int q0,
                                              int kv0, int seqlen_q, int seqlen_kv, int lane) {
  constexpr int kQ = FjBlockMaskConfig::kQBlock;
  constexpr int kKv = FjBlockMaskConfig::kKvBlock;
  constexpr int kCols = (kKv + 31) / 32;  // positions per lane per row
  constexpr int kRows = kKv >= 256 ? 1 : 256 / kKv;
  const int nq = min(kQ, seqlen_q - q0);
  const int nkv = min(kKv, seqlen_kv - kv0);
  const bool cut = nq < kQ || nkv < kKv;

  const int sq = (lane & 7) * (nq - 1) / 7;
  const int skv = (lane >> 3) * (nkv - 1) / 3;
  const unsigned samples =
      __ballot_sync(0xffffffffu, fj_mask_mod(params, b, h, q0 + sq, kv0 + skv));
  // A true sample in a cut tile, or two samples that differ: partial.
  if (samples != 0u && (cut || samples != 0xffffffffu)) return kPartial;
  const bool want = samples != 0u;

  for (int r0 = 0; r0 < nq; r0 += kRows) {
    bool differ = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int qi = r0 + r, ki = c * 32 + lane;
        if (qi < nq && ki < nkv) {
          differ |= fj_mask_mod(params, b, h, q0 + qi, kv0 + ki) != want;
        }
      }
    }
    if (__any_sync(0xffffffffu, differ)) return kPartial;
  }
  if (!want) return kEmpty;
  return cut ? kPartial : kFull;
}

// The kind of tile (bh, tile): the host's verdict when it has one, else the device's.
__device__ inline unsigned char kind_of(const unsigned char* hints, const unsigned char* kinds,
                                        fj_i64 tiles_per_bh, fj_i64 bh, fj_i64 tile) {
  const unsigned char k = hints != nullptr ? hints[tile] : (unsigned char)kUnknown;
  return k != kUnknown ? k : kinds[bh * tiles_per_bh + tile];
}

// Writes, with one warp, the (count, indices) of the partial and of the full tiles along a
// line of n tiles (element j at tile first + j * step): the matching tiles ascending, then the
// rest ascending (PyTorch's stable descending argsort), so a kernel prefetching past the count
// reads a valid index.
__device__ inline void write_line(const unsigned char* hints, const unsigned char* kinds,
                                  fj_i64 tiles_per_bh, fj_i64 bh, fj_i64 first, fj_i64 step, int n,
                                  int* partial_count, int* partial_indices, int* full_count,
                                  int* full_indices, int lane) {
  const unsigned below = (1u << lane) - 1u;
  int np = 0, nf = 0;
  for (int j0 = 0; j0 < n; j0 += 32) {
    const int j = j0 + lane;
    const unsigned char k =
        j < n ? kind_of(hints, kinds, tiles_per_bh, bh, first + j * step) : (unsigned char)kUnknown;
    np += __popc(__ballot_sync(0xffffffffu, k == kPartial));
    nf += __popc(__ballot_sync(0xffffffffu, k == kFull));
  }
  if (lane == 0) {
    *partial_count = np;
    *full_count = nf;
  }
  int cp = 0, cf = 0;  // partial / full tiles before this chunk
  for (int j0 = 0; j0 < n; j0 += 32) {
    const int j = j0 + lane;
    const unsigned char k =
        j < n ? kind_of(hints, kinds, tiles_per_bh, bh, first + j * step) : (unsigned char)kUnknown;
    const unsigned p = __ballot_sync(0xffffffffu, k == kPartial);
    const unsigned f = __ballot_sync(0xffffffffu, k == kFull);
    if (j < n) {
      const int bp = cp + __popc(p & below), bf = cf + __popc(f & below);
      partial_indices[k == kPartial ? bp : np + (j - bp)] = j;
      full_indices[k == kFull ? bf : nf + (j - bf)] = j;
    }
    cp += __popc(p);
    cf += __popc(f);
  }
}

}  // namespace fj_block_mask

extern "C" __global__ void __launch_bounds__(FjBlockMaskConfig::kNumWarps * 32)
    flexjit_block_mask_classify(const FjBlockMaskBuildArgs args, const FjModParams params,
                                const int* tiles, int num_tiles, const unsigned char* hints,
                                unsigned char* kinds) {
  (void)hints;
  const int lane = threadIdx.x % 32;
  const fj_i64 t = (fj_i64)blockIdx.x * FjBlockMaskConfig::kNumWarps + threadIdx.x / 32;
  const fj_i64 total = (fj_i64)num_tiles * args.batch * args.heads;
  if (t >= total) return;  // uniform per warp
  const fj_i64 bh = t / num_tiles;
  const int i = (int)(t - bh * num_tiles);
  const int tile = tiles != nullptr ? tiles[i] : i;
  const int qb = tile / args.num_kv_blocks, kvb = tile % args.num_kv_blocks;
  const int b = (int)(bh / args.heads), h = (int)(bh % args.heads);
  const unsigned char k = fj_block_mask::classify_tile(
      params, b, h, qb * FjBlockMaskConfig::kQBlock, kvb * FjBlockMaskConfig::kKvBlock,
      args.seqlen_q, args.seqlen_kv, lane);
  if (lane == 0) kinds[bh * ((fj_i64)args.num_q_blocks * args.num_kv_blocks) + tile] = k;
}

extern "C" __global__ void __launch_bounds__(128)
    flexjit_block_mask_index(const FjBlockMaskBuildArgs args, const unsigned char* hints,
                             const unsigned char* kinds) {
  const int lane = threadIdx.x % 32;
  const fj_i64 w = (fj_i64)blockIdx.x * 4 + threadIdx.x / 32;
  const int nq = args.num_q_blocks, nkv = args.num_kv_blocks;
  const fj_i64 bhs = (fj_i64)args.batch * args.heads;
  const fj_i64 tiles_per_bh = (fj_i64)nq * nkv;
  if (w < bhs * nq) {  // kv_* row (bh, qb)
    const fj_i64 bh = w / nq;
    const int qb = (int)(w % nq);
    const fj_i64 row = bh * nq + qb;
    fj_block_mask::write_line(hints, kinds, tiles_per_bh, bh, (fj_i64)qb * nkv, 1, nkv,
                              args.kv_num_blocks + row, args.kv_indices + row * nkv,
                              args.full_kv_num_blocks + row, args.full_kv_indices + row * nkv,
                              lane);
  } else if (w < bhs * (nq + nkv)) {  // q_* column (bh, kvb)
    const fj_i64 c = w - bhs * nq;
    const fj_i64 bh = c / nkv;
    const int kvb = (int)(c % nkv);
    const fj_i64 col = bh * nkv + kvb;
    fj_block_mask::write_line(hints, kinds, tiles_per_bh, bh, kvb, nkv, nq, args.q_num_blocks + col,
                              args.q_indices + col * nq, args.full_q_num_blocks + col,
                              args.full_q_indices + col * nq, lane);
  }
}
