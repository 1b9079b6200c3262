// flexjit forward schedule: the union schedule of a block mask for the sm_90a forward's 192-row
// tiles (forward_schedule/block_per_tile; docs/kernels/forward_sm90.md "Union schedule").
//
// Spliced after flexjit_abi.h (FjUnionScheduleArgs, kFjUnion*), prelude.cuh and the generated
// FjScheduleConfig; no mods reach it, so one module per arch serves every forward. It is the
// forward's companion kernel (kernels::Variant::companions): its own NVRTC program, compiled
// beside the forward's on another thread and cached once for all mods, where it was once a second
// entry point of every 192-row forward module with a mask_mod (~0.1-0.2 s of that module's cold
// compile; docs/caching.md).
//
// For query tiles of block_m rows whose consumer warpgroups (64 rows each) lie in different q
// blocks of the mask: one CTA per (b, h, query tile) of the mask marks each KV tile (of block_n
// keys) with its status in the q blocks its warpgroups lie in (shared memory, kFjUnionSmemPerTile
// bytes per tile), then writes the tiles of the first warpgroup's block A alone, then those of A
// and the next block B, then B's alone (each part ascending, compacted by a block-wide count), so
// that every warpgroup's tiles are one run of entries, whose bounds go into the row's header. The
// mask's q blocks are multiples of 128 rows (ForwardSm90Wgmma::unsupported), so 192 rows meet at
// most two. A thread merging the lists alone took ~60 us for 11 rows (a chain of dependent
// loads); this is a few. Launched before flexjit_forward, which reads the result
// (fj_sm90_schedule, and the runs through the tile slot or fj_union_row).
#ifndef FLEXJIT_FORWARD_SCHEDULE_CUH_
#define FLEXJIT_FORWARD_SCHEDULE_CUH_

extern "C" __global__ void __launch_bounds__(FjScheduleConfig::kThreads)
    flexjit_forward_union_schedule(const FjUnionScheduleArgs a) {
  extern __shared__ unsigned char fj_union_status[];  // [2][max_tiles]: 0, 1 partial, 2 full
  __shared__ int warp_count[FjScheduleConfig::kThreads / 32];
  const int t = blockIdx.x;
  const int m = t % a.num_m;
  const int h = t / a.num_m % a.hm;
  const int b = t / a.num_m / a.hm;
  const FjBlockMaskArgs& src = a.src;
  const int tiles_per_block = src.kv_block_size / a.block_n;
  const int consumers = a.block_m / 64;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nthreads = blockDim.x;
  // The forward's work counter, zeroed here instead of by a memset of its own between the two
  // kernels.
  if (a.zero != nullptr && t == 0 && tid == 0) *a.zero = 0;
  // The q blocks A (the first warpgroup's) and B (the next one's, if another); per warpgroup
  // which (0 A, 1 B, -1: its rows start past seqlen_q).
  int qb[2] = {-1, -1};
  int side[kFjUnionMaxConsumers];
  for (int c = 0; c < kFjUnionMaxConsumers; ++c) {
    const int row0 = m * a.block_m + 64 * c;
    side[c] = -1;
    if (c >= consumers || row0 >= a.seqlen_q) continue;
    const int q = row0 / src.q_block_size;
    if (qb[0] < 0 || q == qb[0]) {
      qb[0] = q;
      side[c] = 0;
    } else {
      qb[1] = q;
      side[c] = 1;
    }
  }
  unsigned char* status = fj_union_status;
  for (int i = tid; i < 2 * a.max_tiles; i += nthreads)
    status[i] = 0;
  __syncthreads();
  for (int k = 0; k < 2; ++k) {
    if (qb[k] < 0) continue;
    const fj_i64 num_off = (fj_i64)b * src.num_stride_b + (fj_i64)h * src.num_stride_h + qb[k];
    const fj_i64 idx_off = (fj_i64)b * src.idx_stride_b + (fj_i64)h * src.idx_stride_h +
                           (fj_i64)qb[k] * src.idx_stride_m;
    for (int full = 0; full < 2; ++full) {
      const int* num = full ? src.full_kv_num_blocks : src.kv_num_blocks;
      if (num == nullptr) continue;
      const int* list = (full ? src.full_kv_indices : src.kv_indices) + idx_off;
      const int len = num[num_off] * tiles_per_block;
      for (int j = tid; j < len; j += nthreads) {
        const int tile = list[j / tiles_per_block] * tiles_per_block + j % tiles_per_block;
        if (tile >= 0 && tile < a.max_tiles) status[k * a.max_tiles + tile] = 1 + full;
      }
    }
  }
  __syncthreads();
  int* const out = a.entries + (fj_i64)t * a.max_tiles;
  int n = 0, count[3];
  // Part 0: in A only (1), part 1: in both (3), part 2: in B only (2).
  for (int part = 0; part < 3; ++part) {
    const int want = part == 0 ? 1 : part == 1 ? 3 : 2;
    const int before = n;
    for (int base = 0; base < a.max_tiles; base += nthreads) {
      const int tile = base + tid;
      const int sa = tile < a.max_tiles ? status[tile] : 0;
      const int sb = tile < a.max_tiles ? status[a.max_tiles + tile] : 0;
      const bool take = ((sa != 0 ? 1 : 0) | (sb != 0 ? 2 : 0)) == want;
      const unsigned ballot = __ballot_sync(0xffffffffu, take);
      if (lane == 0) warp_count[warp] = __popc(ballot);
      __syncthreads();
      int offset = n, total = 0;
      for (int w = 0; w < nthreads / 32; ++w) {
        if (w < warp) offset += warp_count[w];
        total += warp_count[w];
      }
      if (take) {
        int e = tile;
        for (int c = 0; c < kFjUnionMaxConsumers; ++c) {
          if (side[c] >= 0) e |= (side[c] == 0 ? sa : sb) << (kFjUnionStatusShift + 2 * c);
        }
        out[offset + __popc(ballot & ((1u << lane) - 1u))] = e;
      }
      n += total;
      __syncthreads();  // warp_count is rewritten next round
    }
    count[part] = n - before;
  }
  if (tid == 0) {
    int* const row = a.num + (fj_i64)t * kFjUnionRowInts;
    row[0] = n;
    for (int c = 0; c < kFjUnionMaxConsumers; ++c) {
      row[1 + 2 * c] = side[c] == 1 ? count[0] : 0;
      row[2 + 2 * c] = side[c] == 0 ? count[0] + count[1] : side[c] == 1 ? n : 0;
    }
    row[kFjUnionRowInts - 1] = 0;
  }
}
#endif  // FLEXJIT_FORWARD_SCHEDULE_CUH_
