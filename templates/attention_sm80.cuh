// flexjit sm_80+ attention building blocks shared by the forward (forward_sm80.cuh) and the
// backward (backward_sm80.cuh) kernels: tile loads (cp.async into swizzled shared memory), the
// block-mask tile schedule, and the two warp-level GEMM shapes of attention on mma.sync:
//   fj_qk:  S  = A B^T   A (rows of the warp) and B both row-major tiles in shared memory
//   fj_pv:  O += P B     P in registers (C fragments of an fj_qk result), B row-major in
//                        shared memory with the reduction dimension along its rows
// Both are templated on a traits type T (FjFwdTraits in the forward, FjGemmShape in the
// backward) giving the fragment counts (kMTiles, kNTiles, kKSteps, kDTiles), the tiles (TileQK:
// the K dimension of fj_qk; TileV: the output dimension of fj_pv), the element's Mma and kTf32.
//
// Spliced after mma_sm80.cuh.
#ifndef FLEXJIT_ATTENTION_SM80_CUH_
#define FLEXJIT_ATTENTION_SM80_CUH_

// Copies a kRows x kDim tile (row stride `stride` elements of Tile::kBytesPerElem) into swizzled
// shared memory with cp.async; rows >= rows_valid are zero-filled (checked only when kCheck), and
// so are the chunks past the head dim (Tile::kValidChunks; none when it fills the tile).
// Thread tid copies chunk tid % kChunks of rows tid / kChunks + i * kRowStep: one 64-bit pointer
// that advances by a fixed step, and one shared address plus immediates (kRowStep % 8 == 0 keeps
// the swizzle phase of the row fixed), so the copy costs few registers in the main loop.
template <int kBytes>
struct FjUnit;
template <>
struct FjUnit<2> {
  using Type = unsigned short;
};
template <>
struct FjUnit<4> {
  using Type = unsigned int;
};

template <class Tile, int kRows, int kThreads, bool kCheck>
FJ_DEVICE void fj_load_tile(fj_u32 smem, const void* gmem, fj_i64 stride, int rows_valid, int tid) {
  static_assert(kThreads % Tile::kChunks == 0, "flexjit: a thread must keep its chunk column");
  constexpr int kRowStep = kThreads / Tile::kChunks;
  constexpr int kPerThread = kRows / kRowStep;
  static_assert(kRows % kRowStep == 0, "flexjit: tile rows must split evenly over threads");
  const int r0 = tid / Tile::kChunks;
  const int c = tid % Tile::kChunks;
  // Elements of Tile::kBytesPerElem bytes: pointer arithmetic in elements, as the 16-bit path
  // always had it (the byte form costs the d=128 mask kernel extra spills).
  using Unit = typename FjUnit<Tile::kBytesPerElem>::Type;
  const Unit* g = static_cast<const Unit*>(gmem);
  const Unit* src = g + (fj_i64)r0 * stride + c * Tile::kElemsPerChunk;
  const fj_i64 step = (fj_i64)kRowStep * stride;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int r = r0 + i * kRowStep;
    const bool valid = (!kCheck || r < rows_valid) && c < Tile::kValidChunks;
    // An invalid row or chunk reads nothing; point it at row 0 of the tile, always in bounds.
    const fj_u32 dst = kRowStep % 8 == 0
                           ? smem + Tile::offset(r0, c) + i * kRowStep * Tile::kRowBytes
                           : smem + Tile::offset(r, c);
    fj_cp_async_16(dst, valid ? src : g, valid);
    src += step;
  }
}

// The KV tiles one CTA visits, in order: partial tiles (mask_mod applied) then full tiles.
struct FjKvSchedule {
  const int* partial_idx;  // sparse KV block indices of this q block, or null: tile i is tile i
  const int* full_idx;
  int num_partial;  // in kernel tiles
  int num_total;
  int tiles_per_block;  // kernel tiles per sparse KV block

  FJ_DEVICE int tile(int i) const {
    if (partial_idx == nullptr) return i;
    const int* list = i < num_partial ? partial_idx : full_idx;
    const int j = i < num_partial ? i : i - num_partial;
    return list[j / tiles_per_block] * tiles_per_block + j % tiles_per_block;
  }
};

// The schedule of one CTA over a block mask's rows: row block `row_block` (of kRowTile rows) of
// (b, h) visits the column tiles (of kColTile) listed by `bm`, partial ones first. The forward
// and the dQ kernel read the kv_* arrays (rows = queries); the dK/dV kernel reads the transposed
// q_* arrays through the same struct (rows = keys; FjBwdArgs::mask_t). Without a block mask
// (bm.kv_num_blocks null) every one of the ceil(num_cols / kColTile) tiles is partial.
template <int kRowTile, int kColTile, bool kHasFullBlocks>
FJ_DEVICE FjKvSchedule fj_block_schedule(const FjBlockMaskArgs& bm, int num_cols, int b, int h,
                                         int row_block) {
  FjKvSchedule s;
  if (bm.kv_num_blocks == nullptr) {
    s.partial_idx = nullptr;
    s.full_idx = nullptr;
    s.tiles_per_block = 1;
    s.num_partial = (num_cols + kColTile - 1) / kColTile;
    s.num_total = s.num_partial;
    return s;
  }
  const int qb = row_block * kRowTile / bm.q_block_size;
  const fj_i64 num_off = (fj_i64)b * bm.num_stride_b + (fj_i64)h * bm.num_stride_h + qb;
  const fj_i64 idx_off =
      (fj_i64)b * bm.idx_stride_b + (fj_i64)h * bm.idx_stride_h + (fj_i64)qb * bm.idx_stride_m;
  s.tiles_per_block = bm.kv_block_size / kColTile;
  s.partial_idx = bm.kv_indices + idx_off;
  s.num_partial = bm.kv_num_blocks[num_off] * s.tiles_per_block;
  s.full_idx = nullptr;
  s.num_total = s.num_partial;
  if (kHasFullBlocks && bm.full_kv_num_blocks != nullptr) {
    s.full_idx = bm.full_kv_indices + idx_off;
    s.num_total += bm.full_kv_num_blocks[num_off] * s.tiles_per_block;
  }
  return s;
}

// The cp.async pipeline over a schedule's tiles, kStages deep: tiles[k] is the tile of step
// i + k (block-sparse schedules read tile indices from global memory; holding them ahead in
// registers keeps that load out of the path between the barrier and the next copy). Used as
//   FjTilePipeline<S> pipe;  pipe.start(sched, load);
//   for (int i = 0; i < sched.num_total; ++i) {
//     const int tile = pipe.next(i, sched, load);  // step i's copies landed, i + S - 1's issued
//     ... compute on stage i % S ...
//     if constexpr (S == 1) __syncthreads();
//   }
//   fj_cp_async_wait<0>();
// `load(tile, stage)` issues one tile's copies into a stage (no commit). Every step commits one
// group (empty ones too), so the wait_group counts hold.
template <int kStages>
struct FjTilePipeline {
  int tiles[kStages];

  // Reads the first kStages tile indices and issues the first kStages - 1 tiles.
  template <class Load>
  FJ_DEVICE void start(const FjKvSchedule& sched, Load& load) {
#pragma unroll
    for (int k = 0; k < kStages; ++k)
      tiles[k] = k < sched.num_total ? sched.tile(k) : 0;
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < sched.num_total) load(tiles[st], st);
      fj_cp_async_commit();
    }
  }

  // Waits until step i's tile is in shared memory for every thread (and everyone is done with
  // step i - 1's stage), issues step i + kStages - 1's copies, shifts the window; returns step
  // i's tile.
  template <class Load>
  FJ_DEVICE int next(int i, const FjKvSchedule& sched, Load& load) {
    if constexpr (kStages == 1) {
      load(tiles[0], 0);
      fj_cp_async_commit();
      fj_cp_async_wait<0>();
    } else {
      fj_cp_async_wait<kStages - 2>();
    }
    __syncthreads();
    if constexpr (kStages > 1) {
      const int ahead = i + kStages - 1;
      if (ahead < sched.num_total) load(tiles[kStages - 1], ahead % kStages);
      fj_cp_async_commit();
    }
    const int tile = tiles[0];
#pragma unroll
    for (int k = 0; k + 1 < kStages; ++k)
      tiles[k] = tiles[k + 1];
    tiles[kStages - 1] = i + kStages < sched.num_total ? sched.tile(i + kStages) : 0;
    return tile;
  }
};

// S = Q K^T for this warp's rows and one KV tile: s[mt][nt] is the C fragment of rows
// mt*16.. and keys nt*8.. of the tile.
// kSplit (fp32 elements only): fp32-accurate products through FjMma<float>::mma_split.
template <class T, bool kSplit = false>
FJ_DEVICE void fj_qk(
    float (&s)[T::kMTiles][T::kNTiles][4],
    const fj_u32 (&q_regs)[T::kQInRegs ? T::kMTiles : 1][T::kQInRegs ? T::kKSteps : 1][4],
    fj_u32 sq_warp, fj_u32 sk, int lane) {
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[mt][nt][e] = 0.0f;
  // ldmatrix lane roles: lanes 8i..8i+7 address matrix i.
  //   Q (A operand): matrix i = rows (i%2)*8.., k chunk i/2.
  //   K (B operand of two n8 tiles): matrix i = keys (i/2)*8.., k chunk i%2.
  const FjLdsmAddr<typename T::TileQK> qa_addr(sq_warp, ((lane >> 3) & 1) * 8 + (lane & 7),
                                               lane >> 4);
  const FjLdsmAddr<typename T::TileQK> kb_addr(sk, (lane >> 4) * 8 + (lane & 7), (lane >> 3) & 1);
#pragma unroll
  for (int kk = 0; kk < T::kKSteps; ++kk) {
    fj_u32 qa[T::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
      if constexpr (T::kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          qa[mt][e] = q_regs[mt][kk][e];
      } else {
        fj_ldsm_x4(qa[mt], qa_addr.at(mt, kk));
        if constexpr (!kSplit) T::Mma::prep(qa[mt]);
      }
    }
#pragma unroll
    for (int np = 0; np < T::kNTiles / 2; ++np) {
      fj_u32 kb[4];
      fj_ldsm_x4(kb, kb_addr.at(np, kk));
      if constexpr (kSplit) {
        static_assert(T::kTf32 && !T::kQInRegs, "flexjit: split products are for fp32 tiles");
#pragma unroll
        for (int mt = 0; mt < T::kMTiles; ++mt) {
          T::Mma::mma_split(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          T::Mma::mma_split(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      } else {
        T::Mma::prep(kb);
#pragma unroll
        for (int mt = 0; mt < T::kMTiles; ++mt) {
          T::Mma::mma(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          T::Mma::mma(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }
  }
}

// O += P V with P (probabilities, fp32 C fragments) packed to 16 bits in registers: the C
// fragments of n8 tiles 2j and 2j+1 are exactly the A fragment of k16 step j.
template <class T>
FJ_DEVICE void fj_pv_16bit(float (&o)[T::kMTiles][T::kDTiles][4],
                           const float (&p)[T::kMTiles][T::kNTiles][4], fj_u32 sv, int lane) {
  // V (B operand via .trans, two n8 tiles of head dim): matrix i = keys (i%2)*8.., d chunk i/2.
  const FjLdsmAddr<typename T::TileV> vb_addr(sv, ((lane >> 3) & 1) * 8 + (lane & 7), lane >> 4);
#pragma unroll
  for (int j = 0; j < T::kNTiles / 2; ++j) {
    fj_u32 pa[T::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
      pa[mt][0] = T::Mma::pack(p[mt][2 * j][0], p[mt][2 * j][1]);
      pa[mt][1] = T::Mma::pack(p[mt][2 * j][2], p[mt][2 * j][3]);
      pa[mt][2] = T::Mma::pack(p[mt][2 * j + 1][0], p[mt][2 * j + 1][1]);
      pa[mt][3] = T::Mma::pack(p[mt][2 * j + 1][2], p[mt][2 * j + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < T::kDTiles / 2; ++dp) {
      fj_u32 vb[4];
      fj_ldsm_x4_trans(vb, vb_addr.at(j, dp));
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt) {
        T::Mma::mma(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
        T::Mma::mma(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
      }
    }
  }
}

// O += P V on tf32 tensor cores (m16n8k8), one k8 step per n8 tile of P. The C fragment of
// tile nt holds keys 2t and 2t+1 where the A fragment wants k = t and t+4: the k order inside
// the step is free as long as A and B agree, so logical k = t is key 2t and k = t + 4 is key
// 2t + 1. Then a = {c0, c2, c1, c3} straight from the registers (no shuffle), and B holds
// b0 = V[2t][d], b1 = V[2t + 1][d] with d = dt*8 + g, read with 32-bit ld.shared (ldmatrix.trans
// moves 16-bit halves, useless for fp32). The 32 lanes of one read touch rows 2t (+1) and chunks
// 2dt + g/4: chunk ^ row % 8 takes 8 distinct values, so the read is bank-conflict free.
template <class T>
FJ_DEVICE void fj_pv_tf32(float (&o)[T::kMTiles][T::kDTiles][4],
                          const float (&p)[T::kMTiles][T::kNTiles][4], fj_u32 sv, int lane) {
  using Tile = typename T::TileV;
  const int g = lane >> 2, t = lane & 3;
  // Row 8*nt + 2t + e, d = 8*dt + g: stored chunk (2dt + g/4) ^ (2t + e), which is
  // 8*(dt/4) + (2*((dt%4) ^ t) | ((g/4) ^ e)): one base per (e, dt % 4), the rest immediates.
  fj_u32 base[2][4];
#pragma unroll
  for (int e = 0; e < 2; ++e)
#pragma unroll
    for (int dm = 0; dm < 4; ++dm)
      base[e][dm] =
          sv + (2 * t + e) * Tile::kRowBytes + ((2 * (dm ^ t) | ((g >> 2) ^ e)) << 4) + (g & 3) * 4;
#pragma unroll
  for (int nt = 0; nt < T::kNTiles; ++nt) {
    fj_u32 pa[T::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
      pa[mt][0] = T::Mma::tf32(p[mt][nt][0]);
      pa[mt][1] = T::Mma::tf32(p[mt][nt][2]);
      pa[mt][2] = T::Mma::tf32(p[mt][nt][1]);
      pa[mt][3] = T::Mma::tf32(p[mt][nt][3]);
    }
#pragma unroll
    for (int dt = 0; dt < T::kDTiles; ++dt) {
      const int imm = nt * 8 * Tile::kRowBytes + (dt >> 2) * 128;
      const fj_u32 b0 = T::Mma::tf32(fj_lds_f32(base[0][dt & 3] + imm));
      const fj_u32 b1 = T::Mma::tf32(fj_lds_f32(base[1][dt & 3] + imm));
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt)
        T::Mma::mma(o[mt][dt], pa[mt], b0, b1);
    }
  }
}

template <class T>
FJ_DEVICE void fj_pv(float (&o)[T::kMTiles][T::kDTiles][4],
                     const float (&p)[T::kMTiles][T::kNTiles][4], fj_u32 sv, int lane) {
  if constexpr (T::kTf32) {
    fj_pv_tf32<T>(o, p, sv, lane);
  } else {
    fj_pv_16bit<T>(o, p, sv, lane);
  }
}

// The score_mod's diagonal load (kFjDiagLoad; the sm_90a kernels), once per diagonal of a
// warp's fragment instead of once per element: in the same 16-row x 8 kN8-column fragment,
// element (row, col) lies on diagonal k = col - row in [-15, 8 kN8 - 1], where q_idx - kv_idx
// is d = d0 + dir * k (d0 at k = 0; dir = -1 when rows are q, +1 when rows are kv), and reads
// the site's value there, fj_diag_load_at(d). issue() loads the diagonals into registers (lane l:
// entry e = k + 15 = l, l + 32, ... in v[0], v[1], ...) before the tile's GEMMs are waited for.
// Element (g + 8 hr, 8 nt + 2t + c) (g = lane / 4, t = lane % 4) then reads its value either
// through shared memory (the backward: commit() puts the entries in the warp's table, the element
// reads mine(lane)[8 (nt - hr) + c]) or straight from the lanes that loaded it (the forward:
// shuffled(8 (nt - hr) + c, lane), no shared memory). Only diagonals that hold a position of
// the problem (rows < `rows`, columns < `cols`) are loaded: there the user's contract keeps the
// index in bounds; the others read as 0 and belong to elements outside the problem.
template <int kN8>
struct FjDiagLoads {
  static constexpr int kCount = 8 * kN8 + 15;
  static constexpr int kPer = (kCount + 31) / 32;  // loads per lane
  static constexpr int kFloats = kPer * 32;        // per warp
  float* table;                                    // this warp's kFloats (shared memory)
  float v[kPer];

  FJ_DEVICE void issue(const FjModParams& mods, int b, int h, int d0, int dir, int rows, int cols,
                       int lane) {
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      const int k = p * 32 + lane - 15;
      v[p] = 0.0f;
      if (k < 8 * kN8 && rows > 0 && k > -rows && k < cols) {
        // d0 + dir * k in wrapping i32 arithmetic, as q_idx - kv_idx itself.
        v[p] = fj_diag_load_at(mods, b, h, (int)((unsigned)d0 + (unsigned)(dir * k)));
      }
    }
  }

  // Every lane of the warp together: the previous tile's reads are done before the writes.
  FJ_DEVICE void commit(int lane) {
    __syncwarp();
#pragma unroll
    for (int p = 0; p < kPer; ++p)
      table[p * 32 + lane] = v[p];
    __syncwarp();
  }

  FJ_DEVICE const float* mine(int lane) const {
    return table + 15 + (lane & 3) * 2 - (lane >> 2);
  }

  // The value of element (g + 8 hr, 8 nt + 2t + c) for j = 8 (nt - hr) + c (a constant once the
  // caller's loops are unrolled), from the lane that loaded it: its entry e = j + 15 + 2t - g.
  // Over the warp, e spans the 14 entries [j + 8, j + 21], in one v[p] or across two (then two
  // shuffles and a select). Every lane of the warp together.
  FJ_DEVICE float shuffled(int j, int lane) const {
    const int e = j + 15 + (lane & 3) * 2 - (lane >> 2);
    const int p0 = (j + 8) >> 5, p1 = (j + 21) >> 5;
    const float lo = __shfl_sync(0xffffffffu, v[p0], e & 31);
    if (p0 == p1) return lo;
    const float hi = __shfl_sync(0xffffffffu, v[p1], e & 31);
    return (e >> 5) == p0 ? lo : hi;
  }
};

#endif  // FLEXJIT_ATTENTION_SM80_CUH_
