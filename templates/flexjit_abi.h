// The ABI between flexjit's host code and its generated kernels.
//
// This header is compiled both by the host C++ compiler (src/runtime, src/codegen) and, embedded,
// by NVRTC as part of every generated kernel. It uses only fixed-width scalar types and no CUDA
// or C++ standard headers, so both sides see the same layout.
//
// Conventions shared by every kernel family:
//  - Tensors are [B, H, S, D] with arbitrary element strides for B, H and S; D is contiguous.
//  - Strides and offsets are 64-bit (fj_i64). Index products that can pass 2^31 are formed in
//    64 bits.
//  - A block mask may be absent (kv_num_blocks == 0): then every KV tile is visited as a partial
//    tile (mask_mod applied, if the kernel has one).
#ifndef FLEXJIT_ABI_H_
#define FLEXJIT_ABI_H_

typedef long long fj_i64;

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FJ_HOST_DEVICE __host__ __device__
#else
#define FJ_HOST_DEVICE
#endif

// FlexAttention's BlockMask as kernels read it. Arrays are int32.
//   kv_num_blocks      [Bm, Hm, num_q_blocks]                 partial KV blocks per Q block
//   kv_indices         [Bm, Hm, num_q_blocks, max_kv_blocks]  their KV block indices
//   full_kv_num_blocks [Bm, Hm, num_q_blocks]                 full KV blocks (mask_mod skipped)
//   full_kv_indices    [Bm, Hm, num_q_blocks, max_kv_blocks]
// Bm and Hm are 1 (broadcast: stride 0) or equal to B and Hq. full_* may be null (no full
// blocks). The sparse block sizes are multiples of the kernel's BLOCK_M / BLOCK_N.
struct FjBlockMaskArgs {
  const int* kv_num_blocks;
  const int* kv_indices;
  const int* full_kv_num_blocks;
  const int* full_kv_indices;
  fj_i64 num_stride_b, num_stride_h;                // of *_num_blocks (elements; 0 broadcasts)
  fj_i64 idx_stride_b, idx_stride_h, idx_stride_m;  // of *_indices (elements; 0 broadcasts)
  int q_block_size;                                 // SPARSE_Q_BLOCK_SIZE
  int kv_block_size;                                // SPARSE_KV_BLOCK_SIZE
};

// Arguments of the forward kernel `flexjit_forward(const FjFwdArgs, const FjModParams)`.
// Launch: grid (ceil(seqlen_q / BLOCK_M), heads_q, batch), block (NUM_WARPS * 32), dynamic
// shared memory fj_forward_smem_bytes(...).
struct FjFwdArgs {
  const void* q;  // [B, Hq, Sq, Dqk]
  const void* k;  // [B, Hkv, Skv, Dqk]
  const void* v;  // [B, Hkv, Skv, Dv]
  void* out;      // [B, Hq, Sq, Dv], same dtype as q
  float* lse;     // [B, Hq, Sq] natural-log logsumexp (-inf for a fully masked row); may be null
  fj_i64 q_stride_b, q_stride_h, q_stride_s;  // in elements
  fj_i64 k_stride_b, k_stride_h, k_stride_s;
  fj_i64 v_stride_b, v_stride_h, v_stride_s;
  fj_i64 o_stride_b, o_stride_h, o_stride_s;
  fj_i64 lse_stride_b, lse_stride_h;  // lse is contiguous along S
  int batch, heads_q, heads_kv, seqlen_q, seqlen_kv;
  float scale;  // multiplies q·k before score_mod (default 1/sqrt(Dqk))
  struct FjBlockMaskArgs mask;
  // The persistent sm_90a forward's workspace: the work counter (int 0 of 16 bytes, zeroed on the
  // stream before the launch), then per CTA and Q buffer a 16-byte tile slot
  // (fj_forward_sm90_persistent_workspace_bytes); null for every other kernel.
  int* sched_counter;
};

// The third parameter of the sm_80 forward kernel on a KV cache (chunked prefill; problem flags
// page_size / seq_lens): `flexjit_forward(const FjFwdArgs, const FjModParams, const
// FjKvCacheArgs)`. With a page table, FjFwdArgs::k / v are pools [num_pages, page_size, Hkv, D]
// (k_stride_b is the page stride, k_stride_s the slot stride) and seqlen_kv is the table's
// capacity max_pages * page_size; key n of sequence b is slot n % page_size of page
// page_table[b][n / page_size]. Without one, K / V are [B, Hkv, Skv, D] as usual.
struct FjKvCacheArgs {
  const int* page_table;       // [B, max_pages], rows contiguous; null: contiguous K / V
  fj_i64 page_table_stride_b;  // elements
  const int* seq_lens;         // [B] keys of each sequence (clamped to seqlen_kv); null: seqlen_kv
};

// The fifth parameter of the sm_90a forward on an e4m3 KV cache (forward_sm90.cuh with
// FJ_FWD_KV_CACHE and FJ_FWD_KV_FP8; problem flag kv_e4m3; docs/kernels/forward_sm90.md "e4m3 KV
// caches"): `flexjit_forward(const FjFwdArgs, const FjModParams, const __grid_constant__
// FjFwdTmaMaps, const FjKvCacheArgs, const FjFwdKvFp8Args)`. FjFwdArgs::k / v hold e4m3 bytes
// (strides in elements, i.e. bytes); key n of kv head h is k[n] * k_scale[h], its value
// v[n] * v_scale[h]. q and out stay bf16 / f16.
struct FjFwdKvFp8Args {
  const float* k_scale;  // [heads_kv] f32
  const float* v_scale;  // [heads_kv] f32
};

// The e4m3 staging tile of the sm_90a forward on an e4m3 KV cache: one KV tile of K and V as
// e4m3 bytes (block_n rows of head_dim_qk, then of head_dim_v; tile dims), after the rest of
// fj_forward_sm90_smem_bytes' layout.
FJ_HOST_DEVICE inline constexpr int fj_forward_sm90_kv_fp8_staging_bytes(int block_n,
                                                                         int head_dim_qk,
                                                                         int head_dim_v) {
  return block_n * (head_dim_qk + head_dim_v);
}

// Dynamic shared memory of the forward kernel for a configuration (bytes). The kernel's layout
// and this formula live together in forward_sm80.cuh's description; keep them in step.
FJ_HOST_DEVICE inline constexpr int fj_forward_smem_bytes(int block_m, int block_n, int head_dim_qk,
                                                          int head_dim_v, int elem_bytes,
                                                          int num_stages) {
  // The Q tile (reused as the O tile in the epilogue, hence the wider of the two head dims),
  // then num_stages buffers of a K tile and a V tile (forward_sm80.cuh).
  return elem_bytes * (block_m * (head_dim_qk > head_dim_v ? head_dim_qk : head_dim_v) +
                       num_stages * block_n * (head_dim_qk + head_dim_v));
}

// A TMA tensor map (CUtensorMap, 128 opaque bytes, 64-byte aligned) as a kernel parameter
// receives it: encoded on the host by cuTensorMapEncodeTiled (src/device/TensorMap.cpp), read
// by cp.async.bulk.tensor through its address (a `const __grid_constant__` parameter).
struct alignas(64) FjTmaDesc {
  unsigned long long opaque[16];
};

// The third parameter of the sm_90a forward kernel (templates/forward_sm90.cuh):
// `flexjit_forward(const FjFwdArgs, const FjModParams, const __grid_constant__ FjFwdTmaMaps)`.
// q, k and v as 4-D tensors {D, S, H, B} (innermost first) read in boxes of 64 elements
// (128 bytes) x BLOCK_M (q) or BLOCK_N (k, v) rows with the 128-byte swizzle; rows past the
// sequence length read as zero. Launch: grid (ceil(ceil(seqlen_q / BLOCK_M) / Q_TILES), heads_q,
// batch) with Q_TILES query tiles per CTA (1 or 2), or, persistent, grid (G, 1, 1) with G at
// most the pairs of query tiles (batch * heads_q * ceil(ceil(seqlen_q / BLOCK_M) / 2); the SM
// count); block (BLOCK_M / 64 + 1) * 128 threads (one producer warpgroup, one consumer
// warpgroup per 64 query rows), dynamic shared memory fj_forward_sm90_smem_bytes(...).
// `o`: out as {D, S, H, B} in boxes of 64 columns x 64 rows (one consumer warpgroup's rows) with
// the 128-byte swizzle, written by TMA stores from the O tile staged in shared memory (rows past
// S and columns past D are not written); not read by the e4m3 kernels (q, k, v in e4m3).
struct FjFwdTmaMaps {
  struct FjTmaDesc q, k, v, o;
};

// Dynamic shared memory of the sm_90a forward kernel: 1024 bytes of slack to align the tiles
// to the 128-byte swizzle's 1024-byte atoms, q_bufs Q tiles (1, or 2 where a CTA computes
// several query tiles; each reused for its O tile: the wider head dim), num_stages K and V
// tiles, then the mbarriers (per Q buffer Q full, Q empty; per stage K full, V full, KV empty)
// and per Q buffer a 16-byte tile slot. forward_sm90.cuh's FjSm90Traits checks the layout.
FJ_HOST_DEVICE inline constexpr int fj_forward_sm90_smem_bytes(int block_m, int block_n,
                                                               int head_dim_qk, int head_dim_v,
                                                               int elem_bytes, int num_stages,
                                                               int q_bufs = 1) {
  return 1024 +
         elem_bytes * (q_bufs * block_m * (head_dim_qk > head_dim_v ? head_dim_qk : head_dim_v) +
                       num_stages * block_n * (head_dim_qk + head_dim_v)) +
         (8 * (2 * q_bufs + 3 * num_stages) + 15) / 16 * 16 + 16 * q_bufs;
}

// The sm_90a forward on e4m3 (float8_e4m3fn) q, k, v (forward_sm90.cuh with FJ_FWD_FP8;
// docs/kernels/forward_sm90.md "FP8"): out is bf16, and the kernel takes a fourth parameter,
// `flexjit_forward(const FjFwdArgs, const FjModParams, const __grid_constant__ FjFwdTmaMaps,
// const FjFp8Args)`. A real value is the stored e4m3 value times its tensor's descale factor:
// one f32 for the tensor (stride 0) or one per head (stride 1; q by query head, k and v by KV
// head); a null pointer is a factor of 1. FjFwdTmaMaps::v is the map of V^T (FjFp8VtArgs), and
// FjFwdArgs::scale is the call's scale: the kernel multiplies it by q's and k's factors.
struct FjFp8Args {
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  int q_descale_stride, k_descale_stride, v_descale_stride;  // 0 or 1
};

// The e4m3 forward's V^T pre-pass `flexjit_forward_fp8_vt(const FjFp8VtArgs)` (its companion):
// grid (skv_pad / 64, heads_kv, batch), 256 threads. It writes vt [B, Hkv, Dv, skv_pad] (rows
// skv_pad bytes, skv_pad = Skv rounded up to 64) with the keys of every 32-key group permuted so
// that the QK^T accumulator's registers are P V's A fragment (fj_fp8_vt_key); keys past Skv are
// 0. v's strides are in elements (= bytes).
struct FjFp8VtArgs {
  const unsigned char* v;  // [B, Hkv, Skv, Dv]
  fj_i64 v_stride_b, v_stride_h, v_stride_s;
  unsigned char* vt;
  int heads_kv, seqlen_kv, skv_pad;
};

// The key that column k (0..31) of a 32-key group of V^T holds. The f32 accumulator of S gives a
// thread (lane l, t = l % 4) keys 8 n + 2 t + {0, 1} of every n8 tile n (CUTLASS CLayout_64xN;
// PTX ISA, wgmma "Matrix fragments for accumulator D"); the e4m3 A fragment of a k32 step holds
// in byte e of register r the k index 4 t + e + 16 (r / 2), rows l / 4 + 8 (r % 2) (CUTLASS
// ALayout_64x32; PTX ISA, "Matrix fragments for .m64nNk32 A"). Packing tiles 4 j .. 4 j + 3 of S
// as pa[j][r] = {S[4j + 2(r/2)][2(r%2)], [+1], S[4j + 2(r/2) + 1][2(r%2)], [+1]}
// (fj_wgmma_pack_a_e4m3) puts key 2 t + (e & 1) + 8 (e >> 1) + 16 (r / 2) at k index
// 4 t + e + 16 (r / 2): a permutation of the group's 32 keys, bits (k4 k3 k2 k1 k0) ->
// (k4 k1 k3 k2 k0). The sum over keys does not care in which order it runs, so V^T's column k
// holds that key and no byte moves between lanes (docs/kernels/forward_sm90.md "FP8").
FJ_HOST_DEVICE inline constexpr int fj_fp8_vt_key(int k) {
  return (k & 16) | (((k >> 1) & 1) << 3) | (((k >> 2) & 3) << 1) | (k & 1);
}

// Bytes of FjFp8VtArgs::vt.
FJ_HOST_DEVICE inline constexpr fj_i64 fj_forward_fp8_vt_bytes(int batch, int heads_kv,
                                                               int seqlen_kv, int head_dim_v) {
  return (fj_i64)batch * heads_kv * head_dim_v * ((seqlen_kv + 63) / 64 * 64);
}

// Dynamic shared memory of the e4m3 forward (q_bufs Q buffers: 1, or 2 with persistent CTAs;
// tile dims in elements): the slack, the Q tiles (block_m x head_dim_qk bytes), each reused by
// the epilogue for its bf16 O tile (block_m x head_dim_v x 2 bytes), num_stages K tiles (block_n
// x head_dim_qk bytes) and V^T tiles (head_dim_v x block_n bytes), the mbarriers and per Q buffer
// a 16-byte slot (one CTA per tile: v's descale factor; persistent: the tile).
FJ_HOST_DEVICE inline constexpr int fj_forward_sm90_fp8_smem_bytes(int block_m, int block_n,
                                                                   int head_dim_qk, int head_dim_v,
                                                                   int num_stages, int q_bufs = 1) {
  return 1024 + q_bufs * block_m * (head_dim_qk > 2 * head_dim_v ? head_dim_qk : 2 * head_dim_v) +
         num_stages * block_n * (head_dim_qk + head_dim_v) +
         (8 * (2 * q_bufs + 3 * num_stages) + 15) / 16 * 16 + 16 * q_bufs;
}

// The sm_90a forward's union schedule (block_m 192 with a block mask): a 192-row query tile
// spans two of the mask's q blocks, but each of its three consumer warpgroups (64 rows) lies in
// one. flexjit_forward_union_schedule (forward_schedule.cuh) writes, per (b, h, query tile) of the
// mask, a row header {entries, then per warpgroup c the bounds [begin, end) of its run of
// entries, 0} and the entries: the union of the warpgroups' KV tiles, each a tile index with a
// 2-bit status per warpgroup c at bit kFjUnionStatusShift + 2c (0 absent: the warpgroup skips
// the tile; 1 partial: it applies the mask_mod; 2 full). The forward kernel reads it through
// FjFwdArgs::mask: kv_num_blocks the headers, kv_indices the entries, num_stride_* in headers,
// q_block_size block_m, kv_block_size block_n, no full_* lists (fj_sm90_schedule).
constexpr int kFjUnionStatusShift = 24;
constexpr int kFjUnionTileMask = (1 << kFjUnionStatusShift) - 1;
constexpr int kFjUnionMaxConsumers = 3;
constexpr int kFjUnionRowInts = 2 + 2 * kFjUnionMaxConsumers;
// The builder's shared memory per KV tile (its status in the two q blocks), and the most KV tiles
// a union schedule takes (64 KB of it: 4M keys in 128-key tiles).
constexpr int kFjUnionSmemPerTile = 2;
constexpr int kFjUnionMaxTiles = 32768;
struct FjUnionScheduleArgs {
  struct FjBlockMaskArgs src;  // the caller's block mask
  int* num;                    // [Bm, Hm, num_m, kFjUnionRowInts] row headers
  int* entries;                // [Bm, Hm, num_m, max_tiles]
  int bm, hm;                  // the mask's batch and heads (1: broadcast)
  int num_m;                   // ceil(seqlen_q / block_m)
  int max_tiles;  // KV tiles of block_n: src's kv blocks x kv_block_size / block_n (at most
                  // kFjUnionMaxTiles); launch: grid (Bm Hm num_m), block 256, dynamic shared
                  // memory kFjUnionSmemPerTile x max_tiles bytes
  int block_m, block_n, seqlen_q;
  int* zero;  // set to 0 by the first thread (the persistent forward's work counter), or null
};

// Bytes of a union schedule of `rows` (b, h, query tile) rows (the headers, then the entries;
// each 16-byte aligned).
FJ_HOST_DEVICE inline constexpr fj_i64 fj_forward_sm90_union_bytes(fj_i64 rows, fj_i64 max_tiles) {
  return rows * kFjUnionRowInts * 4 + (rows * max_tiles * 4 + 15) / 16 * 16;
}

// The persistent sm_90a forward's workspace for `ctas` CTAs: the 16-byte counter block, then a
// 16-byte tile slot per CTA and Q buffer.
FJ_HOST_DEVICE inline constexpr fj_i64 fj_forward_sm90_persistent_workspace_bytes(int ctas,
                                                                                  int q_bufs) {
  return 16 + 16 * (fj_i64)ctas * q_bufs;
}

// Arguments of the block-mask builder (templates/block_mask.cuh, whose header documents the
// launches), two kernels on one stream:
//   flexjit_block_mask_classify(args, params, tiles, num_tiles, hints, kinds): one warp per
//     (b, h, tile still undecided by the host's interval analysis) classifies it.
//   flexjit_block_mask_index(args, hints, kinds): one warp per kv_* row and per q_* column
//     writes kv_num_blocks / kv_indices / full_kv_* and the transposed q_* arrays.
// Arrays are dense int32 in the layout of FjBlockMaskArgs ([batch, heads, num_q_blocks] and
// [batch, heads, num_q_blocks, num_kv_blocks]; transposed: [.., num_kv_blocks(, num_q_blocks)]).
struct FjBlockMaskBuildArgs {
  int* kv_num_blocks;
  int* kv_indices;
  int* full_kv_num_blocks;
  int* full_kv_indices;
  int* q_num_blocks;
  int* q_indices;
  int* full_q_num_blocks;
  int* full_q_indices;
  int batch, heads;  // Bm, Hm of the mask (the b and h passed to mask_mod)
  int seqlen_q, seqlen_kv;
  int num_q_blocks, num_kv_blocks;
};

// Arguments of the backward kernels (templates/backward_sm80.cuh), three launches on one stream:
//   flexjit_bwd_preprocess(args): grid (ceil(seqlen_q_pad / 64), heads_q, batch), 128 threads;
//     writes lse2 and delta for every row below seqlen_q_pad.
//   flexjit_bwd_dkdv(args, mods, grads): grid (ceil(seqlen_kv / BLOCK_N), heads_kv, batch); one
//     CTA per KV tile loops over the q heads of its GQA group and their q tiles (mask_t).
//   flexjit_bwd_dq(args, mods): grid (ceil(seqlen_q / BLOCK_M), heads_q, batch); one CTA per
//     q tile loops over its KV tiles (mask), as the forward does. Or, when the dK/dV kernel adds
//     dQ into dq_accum with atomics (the preprocess zeroes it first):
//   flexjit_bwd_dq_convert(args): grid (seqlen_q_pad / 64, heads_q, batch), 128 threads;
//     dq = scale * dq_accum in q's dtype.
// lse2 and delta are the plan's workspace: [batch * heads_q, seqlen_q_pad] f32 each, rows of
// seqlen_q_pad (a multiple of 128) so that every q tile reads whole 16-byte chunks.
struct FjBwdArgs {
  const void* q;      // [B, Hq, Sq, Dqk]
  const void* k;      // [B, Hkv, Skv, Dqk]
  const void* v;      // [B, Hkv, Skv, Dv]
  const void* out;    // [B, Hq, Sq, Dv], the forward's output
  const void* dout;   // [B, Hq, Sq, Dv], dtype of q
  const float* lse;   // [B, Hq, Sq], the forward's (natural log; -inf for a fully masked row)
  const float* dlse;  // [B, Hq, Sq] incoming gradient of lse, or null
  void* dq;           // [B, Hq, Sq, Dqk], dtype of q
  void* dk;           // [B, Hkv, Skv, Dqk]
  void* dv;           // [B, Hkv, Skv, Dv]
  float* lse2;        // workspace: lse * log2(e); +inf where lse is -inf or past seqlen_q
  float* delta;       // workspace: rowsum(dout * out) - dlse; 0 past seqlen_q
  float* dq_accum;    // workspace [B * Hq, seqlen_q_pad, Dqk] f32 when the dK/dV kernel adds dQ
                      // there with atomics (then flexjit_bwd_dq_convert writes dq); else null
  fj_i64 q_stride_b, q_stride_h, q_stride_s;  // in elements
  fj_i64 k_stride_b, k_stride_h, k_stride_s;
  fj_i64 v_stride_b, v_stride_h, v_stride_s;
  fj_i64 o_stride_b, o_stride_h, o_stride_s;
  fj_i64 do_stride_b, do_stride_h, do_stride_s;
  fj_i64 dq_stride_b, dq_stride_h, dq_stride_s;
  fj_i64 dk_stride_b, dk_stride_h, dk_stride_s;
  fj_i64 dv_stride_b, dv_stride_h, dv_stride_s;
  fj_i64 lse_stride_b, lse_stride_h;  // lse and dlse are contiguous along S
  fj_i64 dlse_stride_b, dlse_stride_h;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_kv, seqlen_q_pad;
  float scale;
  // The sm_90a dK/dV kernel's grid: 0 (KV tiles, kv heads, batch); 1 (kv heads, KV tiles, batch),
  // which the host launches under a block mask while the KV tiles fit gridDim.y
  // (docs/kernels/backward_sm90.md "Block order"). Other kernels ignore it.
  int dkdv_heads_inner;
  struct FjBlockMaskArgs mask;    // kv_* arrays (dQ: rows are q blocks)
  struct FjBlockMaskArgs mask_t;  // the transposed q_* arrays in the kv_* fields (dK/dV: rows
                                  // are kv blocks, q_block_size = the kv block size)
};

// Dynamic shared memory of the dK/dV kernel: K and V tiles (kept), then num_stages buffers of a
// Q tile, a dO tile and the tile's lse2 and delta (block_m floats each), then with dq_atomic
// the dS tile in f32 ([block_m][block_n + 4]) that the dQ products read.
FJ_HOST_DEVICE inline constexpr int fj_bwd_dkdv_smem_bytes(int block_m, int block_n,
                                                           int head_dim_qk, int head_dim_v,
                                                           int elem_bytes, int num_stages,
                                                           int dq_atomic) {
  return elem_bytes * block_n * (head_dim_qk + head_dim_v) +
         num_stages * (elem_bytes * block_m * (head_dim_qk + head_dim_v) + 8 * block_m) +
         (dq_atomic ? 4 * block_m * (block_n + 4) : 0);
}

// Dynamic shared memory of the dQ kernel: Q and dO tiles (kept; the Q tile is reused to stage
// dQ in the epilogue), then num_stages buffers of a K tile and a V tile.
FJ_HOST_DEVICE inline constexpr int fj_bwd_dq_smem_bytes(int block_m, int block_n, int head_dim_qk,
                                                         int head_dim_v, int elem_bytes,
                                                         int num_stages) {
  return elem_bytes * block_m * (head_dim_qk + head_dim_v) +
         num_stages * elem_bytes * block_n * (head_dim_qk + head_dim_v);
}

// The sm_90a backward kernels (templates/backward_sm90.cuh) take the tensor maps as their last
// parameter: `flexjit_bwd_dkdv(args, mods, grads, const __grid_constant__ FjBwdTmaMaps)` and
// `flexjit_bwd_dq(args, mods, const __grid_constant__ FjBwdTmaMaps)`. q and dout are read in boxes
// of 64 elements x BLOCK_M rows, k and v in boxes of 64 x BLOCK_N rows (128-byte swizzle, rows
// past the sequence length read as zero). Launch: 384 threads (a producer warpgroup and two
// consumer warpgroups of 64 rows); dK/dV grid (ceil(seqlen_kv / BLOCK_N), heads_kv, batch), dQ
// grid (ceil(seqlen_q / BLOCK_M), heads_q, batch).
struct FjBwdTmaMaps {
  struct FjTmaDesc q, k, v, dout;
};

// Dynamic shared memory of the sm_90a dK/dV kernel: 1024 bytes of alignment slack, the K and V
// tiles, num_stages Q tiles, num_stages dO tiles, with dq_atomic two dS^T tiles (block_n x
// block_m, the dQ products' A operand, double-buffered) and the f32 dQ rows of a step on their
// way to the bulk reductions (block_m x head_dim_qk), per stage the q tile's lse2 and delta
// (block_m floats each), then the mbarriers (K/V full; per stage full, empty).
FJ_HOST_DEVICE inline constexpr int fj_bwd_dkdv_sm90_smem_bytes(int block_m, int block_n,
                                                                int head_dim_qk, int head_dim_v,
                                                                int elem_bytes, int num_stages,
                                                                int dq_atomic) {
  return 1024 + elem_bytes * (block_n + num_stages * block_m) * (head_dim_qk + head_dim_v) +
         (dq_atomic ? 2 * elem_bytes * block_n * block_m + 4 * block_m * head_dim_qk : 0) +
         num_stages * 2 * 4 * block_m + 8 * (1 + 2 * num_stages);
}

// Dynamic shared memory of the sm_90a dQ kernel: 1024 bytes of slack, the Q and dO tiles (Q is
// reused to stage dQ), num_stages K tiles, num_stages V tiles, the mbarriers (Q/dO full; per
// stage full, empty).
FJ_HOST_DEVICE inline constexpr int fj_bwd_dq_sm90_smem_bytes(int block_m, int block_n,
                                                              int head_dim_qk, int head_dim_v,
                                                              int elem_bytes, int num_stages) {
  return 1024 + elem_bytes * (block_m + num_stages * block_n) * (head_dim_qk + head_dim_v) +
         8 * (1 + 2 * num_stages);
}

// Split-KV decoding (templates/decode_split.cuh, decode_combine.cuh; docs/kernels/decode.md),
// two kernels on one stream:
//   flexjit_decode_split(args, params): grid (num_splits, heads_kv * row_groups, batch), block
//     (NUM_WARPS * 32), dynamic shared memory fj_decode_split_smem_bytes(...). A CTA computes the
//     rows (q head of the GQA group, query token) of one row group against its split of the KV
//     range and writes unnormalized-free partials: o_part normalized by its own row sum, lse_part
//     in the log2 domain (-inf when the split saw no key).
//   flexjit_decode_combine(args): one warp per (b, h, q) row, LSE-weighted sum of the splits.
// Workspace (f32): o_part [batch * heads_q * seqlen_q, num_splits, Dv] then lse_part
// [batch * heads_q * seqlen_q, num_splits]; row index ((b * heads_q + h) * seqlen_q + q).
// K and V are either contiguous [B, Hkv, Skv, D] (k_stride_b is the batch stride) or paged:
// pools [num_pages, page_size, Hkv, D] (k_stride_b is the page stride) read through
// page_table [B, max_pages] int32; then seqlen_kv is the table's capacity max_pages * page_size.
struct FjDecodeArgs {
  const void* q;  // [B, Hq, Sq, Dqk]
  const void* k;
  const void* v;
  fj_i64 q_stride_b, q_stride_h, q_stride_s;  // in elements
  fj_i64 k_stride_b, k_stride_h, k_stride_s;  // b: batch, or page when paged
  fj_i64 v_stride_b, v_stride_h, v_stride_s;
  const int* page_table;       // [B, max_pages] or null (contiguous K / V)
  fj_i64 page_table_stride_b;  // elements; rows are contiguous
  const int* seq_lens;         // [B] KV length per sequence, or null: seqlen_kv for all
  float* o_part;               // workspace, see above
  float* lse_part;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_kv;
  int num_splits;  // gridDim.x
  int row_groups;  // CTAs per kv head along the packed rows: ceil(gqa * seqlen_q / ROWS)
  float scale;
  struct FjBlockMaskArgs mask;
  // e4m3 K / V (FjConfig::kKvFp8): [heads_kv] f32 dequantization scales, the key of kv head h
  // being k * k_scale[h] (folded into the score scale) and its value v * v_scale[h] (applied to
  // the split's out); null for 2-byte K / V.
  const float* k_scale;
  const float* v_scale;
};

struct FjDecodeCombineArgs {
  const float* o_part;  // the split kernel's workspace
  const float* lse_part;
  void* out;   // [B, Hq, Sq, Dv], dtype of q
  float* lse;  // [B, Hq, Sq] natural log; may be null
  fj_i64 o_stride_b, o_stride_h, o_stride_s;
  fj_i64 lse_stride_b, lse_stride_h;
  int batch, heads_q, seqlen_q, num_splits;
};

// Context parallelism's merge of partial attention results (templates/cp_merge.cuh): one warp
// per row (b, h, s) of a query chunk. flexjit_cp_merge merges part / part_lse into the running
// acc / acc_lse (f32, contiguous [B, H, S, dv] and [B, H, S]); flexjit_cp_finalize writes acc
// and acc_lse into out (Element) and out_lse (may be null) with their strides;
// flexjit_cp_accumulate adds part into rows [acc_row0, acc_row0 + S) of acc, contiguous
// [B, H, acc_seqlen, dv] (the backward's dK / dV and buffer gradients).
struct FjCpMergeArgs {
  float* acc;
  float* acc_lse;
  const void* part;       // merge: [B, H, S, dv], Element
  const float* part_lse;  // merge: [B, H, S]
  void* out;              // finalize: [B, H, S, dv], Element
  float* out_lse;         // finalize: [B, H, S]; may be null
  fj_i64 part_stride_b, part_stride_h, part_stride_s;
  fj_i64 part_lse_stride_b, part_lse_stride_h;
  fj_i64 out_stride_b, out_stride_h, out_stride_s;
  fj_i64 out_lse_stride_b, out_lse_stride_h;
  int batch, heads, seqlen, dv;
  int acc_seqlen, acc_row0;  // accumulate: where the rows land in acc
};

// The page check of a KV cache (templates/decode_check.cuh): grid (batch), block 128.
struct FjDecodeCheckArgs {
  const int* page_table;  // [B, max_pages], or null (lengths only)
  fj_i64 page_table_stride_b;
  const int* seq_lens;  // [B]
  unsigned long long* result;
  fj_i64 max_pages, page_size, num_pages, capacity;
};

// Dynamic shared memory of flexjit_decode_split: the Q tile (rows x Dqk) and num_stages K / V
// tiles, or the cross-warp reduction of the epilogue (num_warps x 16 rows x (Dv + 2) floats)
// where that is larger (it reuses the same memory).
FJ_HOST_DEVICE inline constexpr int fj_decode_split_smem_bytes(int rows, int block_n,
                                                               int head_dim_qk, int head_dim_v,
                                                               int elem_bytes, int num_stages,
                                                               int num_warps) {
  return elem_bytes * (rows * head_dim_qk + num_stages * block_n * (head_dim_qk + head_dim_v)) >
                 num_warps * 16 * (head_dim_v + 2) * 4
             ? elem_bytes * (rows * head_dim_qk + num_stages * block_n * (head_dim_qk + head_dim_v))
             : num_warps * 16 * (head_dim_v + 2) * 4;
}

// The same for a K / V copy mode (the decode_split config key kv_copy) and K / V element type:
// kv_copy 0 with 2-byte K / V is the layout above; kv_copy 1 and 2 (cp.async.bulk per key row)
// pad every K / V row by 16 bytes and put one 8-byte mbarrier per stage after the rest; e4m3
// K / V (kv_fp8, with kv_copy 0) are num_stages stages of e4m3 tiles (1 byte per element) after
// Q, which the mainloop converts in registers.
FJ_HOST_DEVICE inline constexpr int fj_decode_split_smem_bytes_kv(int rows, int block_n,
                                                                  int head_dim_qk, int head_dim_v,
                                                                  int elem_bytes, int num_stages,
                                                                  int num_warps, int kv_copy,
                                                                  bool kv_fp8) {
  const int red = num_warps * 16 * (head_dim_v + 2) * 4;
  const int q = elem_bytes * rows * head_dim_qk;
  const int ring = kv_fp8 ? num_stages * block_n * (head_dim_qk + head_dim_v)
                   : kv_copy == 0
                       ? num_stages * block_n * elem_bytes * (head_dim_qk + head_dim_v)
                       : num_stages * block_n * (elem_bytes * (head_dim_qk + head_dim_v) + 32);
  return (q + ring > red ? q + ring : red) + (kv_copy != 0 ? 8 * num_stages : 0);
}

#endif  // FLEXJIT_ABI_H_
