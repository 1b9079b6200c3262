// create_block_mask on the GPU: evaluates the mask_mod over every (Q tile, KV tile) and writes
// FlexAttention's block-sparse arrays (layout: FjBlockMaskBuildArgs in flexjit_abi.h).
//
// Spliced after the generated parts every kernel gets: flexjit_abi.h, the prelude, then
//   struct FjBlockMaskConfig { static constexpr int kQBlock, kKvBlock, kNumWarps; };
//   struct FjModParams { ... };                 // captured buffers and runtime parameters
//   __device__ bool fj_mask_mod(const FjModParams& p, int b, int h, int q_idx, int kv_idx);
// Positions past seqlen_q / seqlen_kv count as masked (PyTorch's create_block_mask pads the
// dense mask with False), so a boundary tile is never full unless it is whole. The host
// builder (src/runtime/BlockMask.cpp) follows the same rules; tests compare the two.

namespace fj_block_mask {

enum : unsigned char { kEmpty = 0, kPartial = 1, kFull = 2 };

// Classifies one tile with one warp: lanes walk the tile's positions; the warp stops as soon
// as it has seen both an attended and a masked position (the tile is then partial).
__device__ inline unsigned char classify_tile(const FjModParams& params, int b, int h, int q0,
                                              int kv0, int seqlen_q, int seqlen_kv, int lane) {
  constexpr int kQ = FjBlockMaskConfig::kQBlock;
  constexpr int kKv = FjBlockMaskConfig::kKvBlock;
  constexpr long long kPositions = (long long)kQ * kKv;
  bool any = false, all = true;
  for (long long base = 0; base < kPositions; base += 32) {
    const long long p = base + lane;
    bool v = false;
    if (p < kPositions) {
      const int q = q0 + (int)(p / kKv);
      const int kv = kv0 + (int)(p % kKv);
      v = q < seqlen_q && kv < seqlen_kv && fj_mask_mod(params, b, h, q, kv);
    }
    const unsigned active = __ballot_sync(0xffffffffu, p < kPositions);
    const unsigned hits = __ballot_sync(0xffffffffu, v);
    any = any || hits != 0u;
    all = all && hits == active;
    if (any && !all) return kPartial;
  }
  if (!any) return kEmpty;
  return all ? kFull : kPartial;
}

// Writes one row of (count, indices): the tiles of `kind` ascending, then the rest ascending
// (PyTorch's stable descending argsort), so a kernel prefetching past the count reads a valid
// index.
__device__ inline void write_row(const unsigned char* kinds, int n, unsigned char kind,
                                 int* count, int* indices) {
  int c = 0;
  for (int j = 0; j < n; ++j) {
    if (kinds[j] == kind) indices[c++] = j;
  }
  *count = c;
  int k = c;
  for (int j = 0; j < n; ++j) {
    if (kinds[j] != kind) indices[k++] = j;
  }
}

// True when `v` is among the first `count` (ascending) entries of `row`.
__device__ inline bool contains(const int* row, int count, int v) {
  int lo = 0, hi = count;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (row[mid] < v) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < count && row[lo] == v;
}

}  // namespace fj_block_mask

extern "C" __global__ void __launch_bounds__(FjBlockMaskConfig::kNumWarps * 32)
    flexjit_block_mask(const FjBlockMaskBuildArgs args, const FjModParams params) {
  extern __shared__ unsigned char fj_tile_kinds[];  // [num_kv_blocks]
  const int qb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = qb * FjBlockMaskConfig::kQBlock;
  for (int kvb = warp; kvb < args.num_kv_blocks; kvb += FjBlockMaskConfig::kNumWarps) {
    const unsigned char kind =
        fj_block_mask::classify_tile(params, b, h, q0, kvb * FjBlockMaskConfig::kKvBlock,
                                     args.seqlen_q, args.seqlen_kv, lane);
    if (lane == 0) fj_tile_kinds[kvb] = kind;
  }
  __syncthreads();
  const fj_i64 row = ((fj_i64)b * args.heads + h) * args.num_q_blocks + qb;
  const fj_i64 idx = row * args.num_kv_blocks;
  if (threadIdx.x == 0) {
    fj_block_mask::write_row(fj_tile_kinds, args.num_kv_blocks, fj_block_mask::kPartial,
                             args.kv_num_blocks + row, args.kv_indices + idx);
  } else if (threadIdx.x == 32 || (FjBlockMaskConfig::kNumWarps == 1 && threadIdx.x == 1)) {
    fj_block_mask::write_row(fj_tile_kinds, args.num_kv_blocks, fj_block_mask::kFull,
                             args.full_kv_num_blocks + row, args.full_kv_indices + idx);
  }
}

// One thread per (KV tile, h, b): gathers the Q tiles whose rows list this KV tile.
extern "C" __global__ void __launch_bounds__(128)
    flexjit_block_mask_transpose(const FjBlockMaskBuildArgs args) {
  const int kvb = blockIdx.x * blockDim.x + threadIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  if (kvb >= args.num_kv_blocks) return;
  const fj_i64 bh = (fj_i64)b * args.heads + h;
  const int nq = args.num_q_blocks, nkv = args.num_kv_blocks;
  for (int kind = 0; kind < 2; ++kind) {
    const int* num = kind == 0 ? args.kv_num_blocks : args.full_kv_num_blocks;
    const int* ind = kind == 0 ? args.kv_indices : args.full_kv_indices;
    int* tnum = kind == 0 ? args.q_num_blocks : args.full_q_num_blocks;
    int* tind = (kind == 0 ? args.q_indices : args.full_q_indices) + (bh * nkv + kvb) * nq;
    int c = 0;
    for (int qb = 0; qb < nq; ++qb) {
      const fj_i64 row = bh * nq + qb;
      if (fj_block_mask::contains(ind + row * nkv, num[row], kvb)) tind[c++] = qb;
    }
    tnum[bh * nkv + kvb] = c;
    for (int qb = 0; qb < nq; ++qb) {
      const fj_i64 row = bh * nq + qb;
      if (!fj_block_mask::contains(ind + row * nkv, num[row], kvb)) tind[c++] = qb;
    }
  }
}
