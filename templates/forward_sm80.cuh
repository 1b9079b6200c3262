// flexjit forward attention kernel for sm_80 and newer (FlashAttention-2 structure).
//
// Spliced last, after flexjit_abi.h, prelude.cuh, the generated FjConfig and mods,
// mma_sm80.cuh, attention_sm80.cuh and forward_common.cuh. docs/kernels/forward_sm80.md describes
// the design, the fragment ownership and the register / shared-memory budget of each default
// configuration.
//
// One CTA computes kBlockM query rows of one (batch, query head); warp w owns rows
// [w * kWarpRows, (w + 1) * kWarpRows) of the tile, as kMTiles m16 fragments. Per KV tile:
//   S = Q K^T (mma.sync m16n8k16, fp32), score_mod / mask_mod / bounds, online softmax in the log2
//   domain, P packed to 16 bits in registers and used directly as the A operand of O += P V.
// Element = float runs the same structure on tf32 tensor cores (mma m16n8k8, operands rounded
// with cvt.rna.tf32): a k8 step of fp32 covers the same 32 bytes of a row as a k16 step of 16-bit
// elements, so tiles, swizzle, cp.async and the Q/K ldmatrix addressing are shared byte for byte;
// only O += P V (V read with ld.shared, no 32-bit ldmatrix.trans) and the epilogue differ.
// Shared memory (dynamic, bytes, all tiles swizzled per FjSwizzledTile, E = sizeof(Element)):
// (kHeadDimQK / kHeadDimV are the tile dims, 64 / 128 / 256; a problem's head dims kRealDimQK /
// kRealDimV, multiples of 8, are computed in them: loads zero-fill the columns past them, the k
// steps and O fragments stop at them, and the epilogue stores only their columns.)
//   [0, Q)                          Q tile, kBlockM x kHeadDimQK; reused for the O tile
//                                   (kBlockM x kHeadDimV) in the epilogue, so Q = kBlockM *
//                                   max(kHeadDimQK, kHeadDimV) * E
//   then kNumStages x { K tile kBlockN x kHeadDimQK, V tile kBlockN x kHeadDimV }
// which is fj_forward_smem_bytes() in flexjit_abi.h.
//
// On a KV cache (chunked prefill: the config defines FJ_FWD_KV_CACHE and FjConfig::kPageSize)
// the kernel takes a third parameter, FjKvCacheArgs: sequence b's keys end at seq_lens[b], and
// with kPageSize > 0 K / V tiles are gathered from page pools through the page table (one table
// entry per tile when kPageSize >= kBlockN, else one per key row). Mods and block masks see the
// logical key index. Without FJ_FWD_KV_CACHE the kernel is the contiguous one, unchanged.
#ifndef FLEXJIT_FORWARD_SM80_CUH_
#define FLEXJIT_FORWARD_SM80_CUH_

template <class Cfg>
struct FjFwdTraits {
  using Element = typename Cfg::Element;
  using Mma = FjMma<Element>;
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr int kNumWarps = Cfg::kNumWarps;
  static constexpr int kNumStages = Cfg::kNumStages;
  static constexpr int kDimQK = Cfg::kHeadDimQK;  // tile dims: the shared-memory layouts
  static constexpr int kDimV = Cfg::kHeadDimV;
  static constexpr int kRealQK = Cfg::kRealDimQK;  // the problem's head dims (<= the tiles)
  static constexpr int kRealV = Cfg::kRealDimV;
  static constexpr int kThreads = kNumWarps * 32;
  static constexpr int kWarpRows = kBlockM / kNumWarps;
  static constexpr int kMTiles = kWarpRows / 16;  // m16 fragments per warp
  static constexpr int kNTiles = kBlockN / 8;     // n8 fragments of S per m16 row block
  // n8 fragments of O per m16 row block: the real v dim rounded up to the 16 columns one
  // ldmatrix.x4.trans of V covers (the columns past it are zero in shared memory).
  static constexpr int kDTiles = (kRealV + 15) / 16 * 2;
  static constexpr int kElemBytes = (int)sizeof(Element);
  static constexpr bool kTf32 = kElemBytes == 4;
  // mma k steps of Q K^T: k16 (16-bit) or k8 (tf32), i.e. 32 bytes of a Q / K row each, over the
  // real qk dim (a last step past it multiplies zero-filled columns).
  static constexpr int kKSteps = (kRealQK * kElemBytes + 31) / 32;
  // Q fragments stay in registers when they are few; otherwise they are re-read from shared
  // memory (ldmatrix) at every k step, as FlashAttention-2 does for d >= 128.
  static constexpr bool kQInRegs = kMTiles * kKSteps * 4 <= 32;
  static constexpr int kQBytes = kBlockM * (kDimQK > kDimV ? kDimQK : kDimV) * kElemBytes;
  static constexpr int kKBytes = kBlockN * kDimQK * kElemBytes;
  static constexpr int kVBytes = kBlockN * kDimV * kElemBytes;
  static constexpr int kStageBytes = kKBytes + kVBytes;
  using TileQK = FjSwizzledTile<kDimQK, kElemBytes, kRealQK>;
  using TileV = FjSwizzledTile<kDimV, kElemBytes, kRealV>;

  static_assert(kWarpRows % 16 == 0 && kMTiles >= 1 && kMTiles <= 2,
                "flexjit forward_sm80: kBlockM / kNumWarps must be 16 or 32");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16, "flexjit forward_sm80: kBlockN % 16 != 0");
  static_assert((kDimQK == 64 || kDimQK == 128 || kDimQK == 256) &&
                    (kDimV == 64 || kDimV == 128 || kDimV == 256),
                "flexjit forward_sm80: tile dims must be 64, 128 or 256");
  static_assert(kNumStages >= 1 && kNumStages <= 4, "flexjit forward_sm80: 1..4 stages");
  static_assert(kBlockM * TileQK::kChunks % kThreads == 0 &&
                    kBlockN * TileQK::kChunks % kThreads == 0 &&
                    kBlockN * TileV::kChunks % kThreads == 0 &&
                    kBlockM * TileV::kChunks % kThreads == 0,
                "flexjit forward_sm80: tiles must split evenly into 16-byte copies per thread");
  static_assert(kQBytes + kNumStages * kStageBytes ==
                    fj_forward_smem_bytes(kBlockM, kBlockN, kDimQK, kDimV, kElemBytes, kNumStages),
                "flexjit forward_sm80: shared-memory layout and fj_forward_smem_bytes disagree");
};

#if defined(FJ_FWD_KV_CACHE)
// The pages of the rows one thread copies of a kRows-key tile (fj_load_tile's assignment: rows
// tid / kChunks + i * kRowStep), for pages smaller than the tile: one table read per row, shared
// by the K and V copies when their rows split the same way; -1 past the sequence's length.
template <class Tile, int kRows, int kThreads, int kPageSize>
struct FjPagedRows {
  static_assert(kThreads % Tile::kChunks == 0, "flexjit: a thread must keep its chunk column");
  static constexpr int kRowStep = kThreads / Tile::kChunks;
  static constexpr int kPerThread = kRows / kRowStep;
  static_assert(kRows % kRowStep == 0, "flexjit: tile rows must split evenly over threads");
  int page[kPerThread];

  FJ_DEVICE void lookup(const int* table, int n_start, int len, int tid) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int n = n_start + tid / Tile::kChunks + i * kRowStep;
      page[i] = n < len ? table[n / kPageSize] : -1;
    }
  }

  // Copies the rows into a swizzled tile with cp.async from a pool (`head`: page 0 of the kv
  // head; slot stride `stride`, page stride `page_stride`, in elements); rows without a page and
  // chunks past the head dim are zero-filled and read nothing.
  FJ_DEVICE void load(fj_u32 smem, const void* head, fj_i64 stride, fj_i64 page_stride, int n_start,
                      int tid) const {
    using Unit = typename FjUnit<Tile::kBytesPerElem>::Type;
    const Unit* base = static_cast<const Unit*>(head);
    const int r0 = tid / Tile::kChunks;
    const int c = tid % Tile::kChunks;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int r = r0 + i * kRowStep;
      const int n = n_start + r;
      const bool valid = page[i] >= 0 && c < Tile::kValidChunks;
      const Unit* src = base;  // an invalid row or chunk reads nothing: page 0 is always mapped
      if (valid) {
        src = base + (fj_i64)page[i] * page_stride + (fj_i64)(n % kPageSize) * stride +
              c * Tile::kElemsPerChunk;
      }
      fj_cp_async_16(smem + Tile::offset(r, c), src, valid);
    }
  }
};
#endif

extern "C" __global__ void __launch_bounds__(FjConfig::kNumWarps * 32, 1)
#if defined(FJ_FWD_KV_CACHE)
    flexjit_forward(const FjFwdArgs cache_args, const FjModParams mods,
                    const FjKvCacheArgs kv_cache) {
#else
    flexjit_forward(const FjFwdArgs args, const FjModParams mods) {
#endif
  using T = FjFwdTraits<FjConfig>;
  using Cfg = FjConfig;
  constexpr bool kCheck = !Cfg::kIsDivisible;
  extern __shared__ unsigned char fj_smem[];  // 16-byte aligned at least

  // Heaviest query tiles first: under a causal-like mask the last tiles visit the most keys, and
  // starting them early keeps the tail of the grid short (FlashAttention-2 does the same).
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int h_kv = h / Cfg::kGqaRatio;
  const int m_start = m_block * T::kBlockM;
#if defined(FJ_FWD_KV_CACHE)
  // On a KV cache the kernel reads sequence b's length as args.seqlen_kv: a copy of the
  // arguments with the length in it (the contiguous kernel reads its parameter as it always did).
  static_assert(!Cfg::kIsDivisible, "flexjit forward_sm80: a KV cache has ragged lengths");
  FjFwdArgs args = cache_args;
  if (kv_cache.seq_lens != nullptr) {
    args.seqlen_kv = fj_imax(0, fj_imin(kv_cache.seq_lens[b], cache_args.seqlen_kv));
  }
  // Pools: k_stride_b is the page stride and the table picks the page.
  const int kv_b = Cfg::kPageSize > 0 ? 0 : b;
  const int* page_row =
      Cfg::kPageSize > 0 ? kv_cache.page_table + (fj_i64)b * kv_cache.page_table_stride_b : nullptr;
#else
  const int kv_b = b;
#endif

  const char* q_tile = static_cast<const char*>(args.q) +
                       T::kElemBytes * ((fj_i64)b * args.q_stride_b + (fj_i64)h * args.q_stride_h +
                                        (fj_i64)m_start * args.q_stride_s);
  const char* k_head =
      static_cast<const char*>(args.k) +
      T::kElemBytes * ((fj_i64)kv_b * args.k_stride_b + (fj_i64)h_kv * args.k_stride_h);
  const char* v_head =
      static_cast<const char*>(args.v) +
      T::kElemBytes * ((fj_i64)kv_b * args.v_stride_b + (fj_i64)h_kv * args.v_stride_h);

  const fj_u32 sq = fj_smem_addr(fj_smem);
  const fj_u32 skv = sq + T::kQBytes;
  const fj_u32 sq_warp = sq + warp * T::kWarpRows * T::TileQK::kRowBytes;

  const FjKvSchedule sched = fj_kv_schedule<Cfg>(args, b, h, m_block);

  // Issues the K and V copies of KV tile `tile` into pipeline stage `stage`.
  auto load_kv = [&](int tile, int stage) {
    const int n_start = tile * T::kBlockN;
    if (n_start >= args.seqlen_kv) return;  // past the end of a ragged sparse block: skipped
    const fj_u32 sk = skv + stage * T::kStageBytes;
#if defined(FJ_FWD_KV_CACHE)
    // Paged: a tile within one page reads one table entry (kBlockN divides kPageSize), smaller
    // pages one per row, shared by K and V.
    if constexpr (Cfg::kPageSize >= T::kBlockN) {
      const fj_i64 page = page_row[n_start / Cfg::kPageSize];
      const fj_i64 slot = n_start % Cfg::kPageSize;
      const int rows = args.seqlen_kv - n_start;
      fj_load_tile<typename T::TileQK, T::kBlockN, T::kThreads, true>(
          sk, k_head + T::kElemBytes * (page * args.k_stride_b + slot * args.k_stride_s),
          args.k_stride_s, rows, tid);
      fj_load_tile<typename T::TileV, T::kBlockN, T::kThreads, true>(
          sk + T::kKBytes,
          v_head + T::kElemBytes * (page * args.v_stride_b + slot * args.v_stride_s),
          args.v_stride_s, rows, tid);
      return;
    } else if constexpr (Cfg::kPageSize > 0) {
      FjPagedRows<typename T::TileQK, T::kBlockN, T::kThreads, Cfg::kPageSize> k_rows;
      k_rows.lookup(page_row, n_start, args.seqlen_kv, tid);
      k_rows.load(sk, k_head, args.k_stride_s, args.k_stride_b, n_start, tid);
      if constexpr (T::TileQK::kChunks == T::TileV::kChunks &&
                    T::TileQK::kValidChunks == T::TileV::kValidChunks) {
        k_rows.load(sk + T::kKBytes, v_head, args.v_stride_s, args.v_stride_b, n_start, tid);
      } else {
        FjPagedRows<typename T::TileV, T::kBlockN, T::kThreads, Cfg::kPageSize> v_rows;
        v_rows.lookup(page_row, n_start, args.seqlen_kv, tid);
        v_rows.load(sk + T::kKBytes, v_head, args.v_stride_s, args.v_stride_b, n_start, tid);
      }
      return;
    }
#endif
    const int rows = args.seqlen_kv - n_start;
    fj_load_tile<typename T::TileQK, T::kBlockN, T::kThreads, kCheck>(
        sk, k_head + T::kElemBytes * (fj_i64)n_start * args.k_stride_s, args.k_stride_s, rows, tid);
    fj_load_tile<typename T::TileV, T::kBlockN, T::kThreads, kCheck>(
        sk + T::kKBytes, v_head + T::kElemBytes * (fj_i64)n_start * args.v_stride_s,
        args.v_stride_s, rows, tid);
  };

  // Q, then the first kNumStages - 1 KV tiles; one commit group each (empty groups keep the
  // group count uniform so wait_group arithmetic holds).
  fj_load_tile<typename T::TileQK, T::kBlockM, T::kThreads, kCheck>(sq, q_tile, args.q_stride_s,
                                                                    args.seqlen_q - m_start, tid);
  fj_cp_async_commit();
  // The KV pipeline (FjTilePipeline holds the tile indices ahead in registers; measured: an
  // all-full block mask ran 18% slower than the dense schedule with the index read in place).
  FjTilePipeline<T::kNumStages> pipe;
  pipe.start(sched, load_kv);

  fj_u32 q_regs[T::kQInRegs ? T::kMTiles : 1][T::kQInRegs ? T::kKSteps : 1][4];
  if constexpr (T::kQInRegs) {
    fj_cp_async_wait<T::kNumStages - 1>();  // the Q group
    __syncthreads();
    const FjLdsmAddr<typename T::TileQK> qa_addr(sq_warp, ((lane >> 3) & 1) * 8 + (lane & 7),
                                                 lane >> 4);
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
      for (int kk = 0; kk < T::kKSteps; ++kk) {
        fj_ldsm_x4(q_regs[mt][kk], qa_addr.at(mt, kk));
        T::Mma::prep(q_regs[mt][kk]);
      }
  }

  float o[T::kMTiles][T::kDTiles][4];
  float row_max[T::kMTiles][2];
  float row_sum[T::kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < T::kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o[mt][dt][e] = 0.0f;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      row_max[mt][hr] = fj_neg_inf();
      row_sum[mt][hr] = 0.0f;
    }
  }

  const int q_row0 = m_start + warp * T::kWarpRows + (lane >> 2);
  for (int i = 0; i < sched.num_total; ++i) {
    const int n_start = pipe.next(i, sched, load_kv) * T::kBlockN;
    if (n_start < args.seqlen_kv) {
      const fj_u32 sk = skv + (i % T::kNumStages) * T::kStageBytes;
      float s[T::kMTiles][T::kNTiles][4];
      fj_qk<T>(s, q_regs, sq_warp, sk, lane);
      const int kv_col0 = n_start + (lane & 3) * 2;
      if (i < sched.num_partial)
        fj_scores<Cfg, T, true>(s, args, mods, b, h, q_row0, n_start, kv_col0);
      else
        fj_scores<Cfg, T, false>(s, args, mods, b, h, q_row0, n_start, kv_col0);
      fj_softmax_update<T>(s, o, row_max, row_sum);
      fj_pv<T>(o, s, sk + T::kKBytes, lane);
    }
    if constexpr (T::kNumStages == 1) __syncthreads();
  }
  fj_cp_async_wait<0>();

  // Epilogue: normalize, write LSE, stage O (Element) in shared memory, then 16-byte stores.
  constexpr float kLn2 = 0.6931471805599453f;
  __syncthreads();  // all warps are done reading Q / K / V from shared memory
  unsigned char* so = fj_smem;
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float sum = row_sum[mt][hr];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      // A fully masked row has sum 0: output 0 and LSE -inf (the sink with one), never NaN.
      float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
      const int row = q_row0 + mt * 16 + hr * 8;
      float lse = sum == 0.0f ? fj_neg_inf() : row_max[mt][hr] * kLn2 + logf(sum);
      if constexpr (kFjHasSinkMod) {
        const float sink = fj_sink_mod(mods, b, h, fj_imin(row, args.seqlen_q - 1));
        inv = fj_softmax_finish(row_max[mt][hr], sum, sink, lse);
      }
      if (args.lse != nullptr && (lane & 3) == 0 && (!kCheck || row < args.seqlen_q)) {
        args.lse[(fj_i64)b * args.lse_stride_b + (fj_i64)h * args.lse_stride_h + row] = lse;
      }
      const int tile_row = warp * T::kWarpRows + mt * 16 + hr * 8 + (lane >> 2);
#pragma unroll
      for (int dt = 0; dt < T::kDTiles; ++dt) {
        // Elements (d = 8*dt + 2t, 2t + 1) of the row: 4 bytes (16-bit) or 8 bytes (fp32).
        const int chunk = T::kTf32 ? 2 * dt + ((lane & 3) >> 1) : dt;
        const int in_chunk = T::kTf32 ? (lane & 1) * 8 : (lane & 3) * 4;
        unsigned char* dst = so + T::TileV::offset(tile_row, chunk) + in_chunk;
        const float x0 = o[mt][dt][hr * 2] * inv, x1 = o[mt][dt][hr * 2 + 1] * inv;
        T::Mma::store2(dst, x0, x1);
      }
    }
  }
  __syncthreads();
  char* out_tile = static_cast<char*>(args.out) +
                   T::kElemBytes * ((fj_i64)b * args.o_stride_b + (fj_i64)h * args.o_stride_h +
                                    (fj_i64)m_start * args.o_stride_s);
  constexpr int kOutPerThread = T::kBlockM * T::TileV::kChunks / T::kThreads;
#pragma unroll
  for (int it = 0; it < kOutPerThread; ++it) {
    const int idx = it * T::kThreads + tid;
    const int r = idx / T::TileV::kChunks;
    const int c = idx % T::TileV::kChunks;
    if ((kCheck && m_start + r >= args.seqlen_q) || c >= T::TileV::kValidChunks) continue;
    *reinterpret_cast<fj_u32x4*>(out_tile + T::kElemBytes * (fj_i64)r * args.o_stride_s + c * 16) =
        *reinterpret_cast<const fj_u32x4*>(so + T::TileV::offset(r, c));
  }
}

#endif  // FLEXJIT_FORWARD_SM80_CUH_
