// flexjit sm_90a building blocks: thin inline-PTX wrappers for mbarriers, TMA tile loads,
// warpgroup MMA (wgmma) fences and shared-memory matrix descriptors, register reallocation
// and named barriers (PTX ISA 8.x, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate",
// "Tensor copy", "mbarrier"). The wgmma instructions themselves (one operand list per shape) are
// generated into the kernel's source: fj_wgmma_ss (A and B from shared memory) and fj_wgmma_rs
// (A from registers), overloaded on the accumulator array float[N / 8][4] (codegen/cuda/Wgmma.h).
//
// Shared-memory tiles use the 128-byte swizzle that TMA writes and wgmma reads: a tile of R rows
// x 64 16-bit elements (128 bytes a row) is R / 8 atoms of 1024 bytes; inside an atom the
// 16-byte unit u of row r lives at unit u ^ (r % 8). Wider rows are split into 64-element column
// chunks stored one after another (chunk c of an R-row tile at c * R * 128). Tiles start on
// 1024-byte boundaries.
//
// Spliced after the generated mods (and the wgmma wrappers) and mma_sm80.cuh (FjMma's packing),
// before forward_sm90.cuh or backward_sm90.cuh.
#ifndef FLEXJIT_WGMMA_SM90_CUH_
#define FLEXJIT_WGMMA_SM90_CUH_

typedef unsigned long long fj_u64;

// ---- mbarriers (shared::cta, 64-bit) ------------------------------------------------------
FJ_DEVICE void fj_mbar_init(fj_u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the other threads and to the async proxy (TMA).
FJ_DEVICE void fj_mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also expects `bytes` of asynchronous transactions (TMA) in this phase.
FJ_DEVICE void fj_mbar_arrive_expect_tx(fj_u32 bar, fj_u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
FJ_DEVICE void fj_mbar_arrive(fj_u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// `count` arrivals at once (count >= 1).
FJ_DEVICE void fj_mbar_arrive_count(fj_u32 bar, int count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival on `bar` once every cp.async this thread issued before has completed (.noinc: the
// barrier's expected count includes it). The copies are generic-proxy writes: a reader through
// the async proxy (wgmma) fences after its wait (fj_fence_proxy_async).
FJ_DEVICE void fj_cp_async_mbar_arrive(fj_u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// kBytes (a multiple of 16) of global memory into this CTA's shared memory (both 16-byte
// aligned) through the async proxy, counted as kBytes transaction bytes on mbarrier `bar` (like
// a TMA load's). Global memory this thread wrote must be ordered before it first
// (fj_fence_proxy_async_global).
template <int kBytes>
FJ_DEVICE void fj_bulk_load(fj_u32 smem_dst, const void* gmem_src, fj_u32 bar) {
  static_assert(kBytes > 0 && kBytes % 16 == 0, "cp.async.bulk copies multiples of 16 bytes");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_dst),
      "l"(gmem_src), "n"(kBytes), "r"(bar)
      : "memory");
}
FJ_DEVICE void fj_fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
FJ_DEVICE int fj_lds_b32(fj_u32 addr) {
  int v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
FJ_DEVICE void fj_sts_b32(fj_u32 addr, int v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
// Waits until the phase of parity `parity` has completed (acquire: what the arriving threads
// wrote before arriving, and the transactions, are visible after it).
FJ_DEVICE void fj_mbar_wait(fj_u32 bar, int parity) {
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

// ---- TMA ----------------------------------------------------------------------------------
// Loads the box at coordinates (c0 innermost .. c3) of a 4-D tensor map into shared memory at
// `dst`, completing `bytes` (the whole box, out-of-bounds parts zero-filled) on barrier `bar`.
FJ_DEVICE void fj_tma_load_4d(fj_u32 dst, const FjTmaDesc* map, int c0, int c1, int c2, int c3,
                              fj_u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// A TMA store of the box at (c0, c1, c2, c3) of `map` from shared memory at `src` (laid out as
// the map's loads write it), in this thread's bulk async-group; parts of the box past the
// tensor's extents are not written.
FJ_DEVICE void fj_tma_store_4d(const FjTmaDesc* map, fj_u32 src, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          map),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// Closes this thread's bulk async-group of the stores issued since the last commit.
FJ_DEVICE void fj_bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of this thread's bulk groups have not finished reading their
// shared-memory sources (which may then be overwritten).
template <int kPending>
FJ_DEVICE void fj_bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Waits until this thread's bulk groups have completed (their writes done).
FJ_DEVICE void fj_bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
FJ_DEVICE void fj_tma_prefetch_desc(const FjTmaDesc* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}
// Loads rows [row, row + kRows) of (h, b), kDim elements wide, as kDim / 64 boxes of 64 columns
// (chunk c at dst + c * kRows * 128), all completing on `bar`.
template <int kDim, int kRows>
FJ_DEVICE void fj_tma_load_tile(fj_u32 dst, const FjTmaDesc* map, int row, int h, int b,
                                fj_u32 bar) {
#pragma unroll
  for (int c = 0; c < kDim / 64; ++c)
    fj_tma_load_4d(dst + c * kRows * 128, map, c * 64, row, h, b, bar);
}

// ---- wgmma --------------------------------------------------------------------------------
// Orders this warpgroup's register and shared-memory accesses before the wgmma that follow
// (needed before the first wgmma and whenever accumulators or A registers changed since).
FJ_DEVICE void fj_wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
FJ_DEVICE void fj_wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N committed wgmma groups of the warpgroup are pending.
template <int N>
FJ_DEVICE void fj_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across a wgmma sequence
// (the hardware writes them asynchronously until fj_wgmma_wait).
template <int N>
FJ_DEVICE void fj_fence_regs(float (&d)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      asm volatile("" : "+f"(d[i][e])::"memory");
}

// A shared-memory matrix descriptor for the 128-byte swizzle: start address, leading and stride
// byte offsets (PTX ISA "Matrix Descriptor Format"; bits 0-13 address >> 4, 16-29 LBO >> 4,
// 32-45 SBO >> 4, 62-63 swizzle mode, 1 = 128 bytes).
//   K-major operand (rows of the M or N dimension, 128-byte rows along K): SBO = 1024 (the next
//     8 rows), LBO unused; the k16 step j inside a 64-element chunk starts 32 * j bytes in.
//   MN-major operand (rows along K, 64 elements of N per 128-byte row): LBO = the distance
//     between 64-element chunks of N, SBO = 1024 (the next 8 rows of K).
FJ_DEVICE fj_u64 fj_smem_desc_sw128(fj_u32 addr, fj_u32 lbo_bytes, fj_u32 sbo_bytes) {
  fj_u64 d = (fj_u64)((addr & 0x3FFFFu) >> 4);
  d |= (fj_u64)((lbo_bytes >> 4) & 0x3FFFu) << 16;
  d |= (fj_u64)((sbo_bytes >> 4) & 0x3FFFu) << 32;
  d |= (fj_u64)1 << 62;
  return d;
}

// A descriptor of fj_smem_desc_sw128 moved `bytes` (a multiple of 16) further into shared
// memory: the start address field (bits 0-13, address >> 4) plus bytes >> 4, in the low word
// alone. Exact while the address stays inside the shared window (below 256 KB: the field cannot
// carry into bit 14). A wgmma sequence's steps then cost one add each from a descriptor built
// once, where a descriptor built per step is a chain of four dependent uniform-datapath
// instructions (add, mask, shift, or) in front of each wgmma.
FJ_DEVICE fj_u64 fj_desc_add(fj_u64 desc, fj_u32 bytes) {
  fj_u32 lo, hi;
  asm("mov.b64 {%0, %1}, %2;" : "=r"(lo), "=r"(hi) : "l"(desc));
  lo += bytes >> 4;
  fj_u64 r;
  asm("mov.b64 %0, {%1, %2};" : "=l"(r) : "r"(lo), "r"(hi));
  return r;
}

// The A fragments of a register-operand wgmma (fj_wgmma_rs) from an m64nN accumulator: the C
// fragments of n8 tiles 2j, 2j + 1 are the A fragment of k16 step j, packed to 16 bits.
template <class E, int kN8>
FJ_DEVICE void fj_wgmma_pack_a(fj_u32 (&a)[kN8 / 2][4], const float (&c)[kN8][4]) {
#pragma unroll
  for (int j = 0; j < kN8 / 2; ++j) {
    a[j][0] = FjMma<E>::pack(c[2 * j][0], c[2 * j][1]);
    a[j][1] = FjMma<E>::pack(c[2 * j][2], c[2 * j][3]);
    a[j][2] = FjMma<E>::pack(c[2 * j + 1][0], c[2 * j + 1][1]);
    a[j][3] = FjMma<E>::pack(c[2 * j + 1][2], c[2 * j + 1][3]);
  }
}

// Four f32 as e4m3 (OCP e4m3fn: round to nearest even, saturating to +-448) in one register, a
// in the lowest byte. cvt's e4m3x2 puts its first source in the upper byte.
FJ_DEVICE fj_u32 fj_pack_e4m3x4(float a, float b, float c, float d) {
  fj_u32 r;
  asm("{\n .reg .b16 lo, hi;\n"
      " cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
      " cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      " mov.b32 %0, {lo, hi};\n}\n"
      : "=r"(r)
      : "f"(a), "f"(b), "f"(c), "f"(d));
  return r;
}

// The e4m3 A fragments of k32 steps (fj_wgmma_rs of an e4m3 kernel) from an m64nN f32
// accumulator: step j from n8 tiles 4j .. 4j + 3, register r from tiles 4j + 2 (r / 2) and
// 4j + 2 (r / 2) + 1 in row half r % 2. The k order this makes is not the accumulator's column
// order: the B operand's rows must follow fj_fp8_vt_key (flexjit_abi.h), which derives it.
template <int kN8>
FJ_DEVICE void fj_wgmma_pack_a_e4m3(fj_u32 (&a)[kN8 / 4][4], const float (&c)[kN8][4]) {
#pragma unroll
  for (int j = 0; j < kN8 / 4; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int t = 4 * j + 2 * (r / 2), e = 2 * (r % 2);
      a[j][r] = fj_pack_e4m3x4(c[t][e], c[t][e + 1], c[t + 1][e], c[t + 1][e + 1]);
    }
}

// ---- 128-byte swizzled tiles in the epilogues --------------------------------------------
// The address of 16-byte unit u (elements 8u .. 8u + 7) of row r of a kRows-row swizzled tile.
template <int kRows>
FJ_DEVICE fj_u32 fj_sw128_unit(fj_u32 tile, int r, int u) {
  return tile + (u / 8) * kRows * 128 + r * 128 + (((u % 8) ^ (r % 8)) << 4);
}
// Stores this thread's row half hr (rows row0 + 8 hr + lane / 4, row0 the warp's first row in
// the tile) of an m64nN accumulator, times mul, as 16-bit elements into a kRows-row swizzled
// tile. The tile was last read by wgmma: the caller orders that first (fj_fence_proxy_async).
template <class E, int kRows, int kN8>
FJ_DEVICE void fj_sw128_store_acc_half(fj_u32 tile, int row0, int lane, const float (&acc)[kN8][4],
                                       int hr, float mul) {
  const int r = row0 + hr * 8 + (lane >> 2);
#pragma unroll
  for (int dt = 0; dt < kN8; ++dt) {
    // Elements 8 dt + 2t, +1: unit dt, 4 bytes per lane pair in.
    const fj_u32 addr = fj_sw128_unit<kRows>(tile, r, dt) + (lane & 3) * 4;
    const fj_u32 packed = FjMma<E>::pack(acc[dt][hr * 2] * mul, acc[dt][hr * 2 + 1] * mul);
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(packed) : "memory");
  }
}
// Both row halves, times mul.
template <class E, int kRows, int kN8>
FJ_DEVICE void fj_sw128_store_acc(fj_u32 tile, int row0, int lane, const float (&acc)[kN8][4],
                                  float mul) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr)
    fj_sw128_store_acc_half<E, kRows>(tile, row0, lane, acc, hr, mul);
}
// Stores A fragments made by fj_wgmma_pack_a (this warp's 16 rows from row0 of the tile, 16 * kK
// 16-bit columns; a[j] holds n8 tile 2 j's rows 0-7, 8-15, then tile 2 j + 1's) into a
// kRows-row swizzled tile: the layout wgmma reads back (K-major for rows along M or N, MN-major
// for rows along K). One stmatrix per k16 step: its four 8 x 8 matrices are a[j][0..3], lane l
// giving the address of row l % 8 of matrix l / 8 (8 rows of 16 bytes: all 32 banks).
// The row's address is made opaque to the compiler, so the kK addresses are formed here, not
// hoisted out of the caller's loop into registers that the caller's peak needs (ptxas spilled
// them in the dK/dV kernel).
template <int kRows, int kK>
FJ_DEVICE void fj_sw128_store_packed(fj_u32 tile, int row0, int lane, const fj_u32 (&a)[kK][4]) {
  const int m = lane >> 3;
  const int r = row0 + (m & 1) * 8 + (lane & 7);
  fj_u32 row_addr = tile + r * 128;
  asm volatile("" : "+r"(row_addr));
  // Unit 2 j + m / 2 of the row, swizzled: (2 (j % 4) ^ (m / 2) ^ (r % 8)) in chunk j / 4.
  const fj_u32 x = (((m >> 1) ^ (r & 7)) << 4);
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    const fj_u32 addr = row_addr + (j / 4) * kRows * 128 + (x ^ ((j % 4) << 5));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(a[j][0]), "r"(a[j][1]), "r"(a[j][2]), "r"(a[j][3])
                 : "memory");
  }
}
// Copies rows [row0, row0 + 64) of a kRows-row swizzled tile (kDim 16-bit elements a row) to
// global memory at `gmem` (row row0's first element; rows stride_elems elements apart) with
// 16-byte stores by the 128 threads of a warpgroup (wtid); row r goes out where first + r <
// limit (first: its index in the sequence). Only the first kCols columns (a multiple of 8: whole
// 16-byte units) go out: a head dim below the tile's (kDim) leaves the padding in shared memory.
template <int kDim, int kRows, int kCols = kDim>
FJ_DEVICE void fj_sw128_copy_out64(char* gmem, fj_i64 stride_elems, fj_u32 tile, int row0,
                                   int first, int limit, int wtid) {
  static_assert(kCols % 8 == 0 && kCols <= kDim, "fj_sw128_copy_out64: whole units of the row");
  constexpr int kUnitsPerRow = kDim / 8;
  constexpr int kPerThread = 64 * kUnitsPerRow / 128;
#pragma unroll
  for (int it = 0; it < kPerThread; ++it) {
    const int idx = it * 128 + wtid;
    const int r = idx / kUnitsPerRow;
    const int u = idx % kUnitsPerRow;
    if (first + r >= limit) continue;
    if constexpr (kCols < kDim) {
      if (u >= kCols / 8) continue;
    }
    const fj_u32 addr = fj_sw128_unit<kRows>(tile, row0 + r, u);
    fj_u32x4 val;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                 : "r"(addr));
    *reinterpret_cast<fj_u32x4*>(gmem + 2 * (fj_i64)r * stride_elems + u * 16) = val;
  }
}

// x, as a value the compiler must take from here: what is computed from it is computed here, not
// hoisted out of the loop this sits in nor kept live across it. For cheap values (a row index,
// a shared-memory address) that ptxas would otherwise keep in a register for the whole tile loop
// and spill when the consumers' registers run out.
FJ_DEVICE int fj_here(int x) {
  asm volatile("mov.b32 %0, %0;\n" : "+r"(x));
  return x;
}

// x (the same in every lane of the warp, all lanes active) as a value ptxas knows to be
// warp-uniform (CUTLASS's canonical_warp_idx_sync does the same): loop counts, ring positions
// and stage addresses computed from it stay on the uniform datapath. A count loaded from memory
// is not known to be uniform, and everything computed from it moves to the vector datapath
// (+6 % instructions on noop at d 64 from one such count: docs/kernels/forward_sm90.md "Union
// schedule").
FJ_DEVICE int fj_warp_uniform(int x) {
  return __shfl_sync(0xffffffffu, x, 0);
}

// threadIdx.x read here (an S2R), not a register kept from the kernel's start.
FJ_DEVICE int fj_tid_here() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
}

// ---- warpgroups ---------------------------------------------------------------------------
// Register reallocation between warpgroups (every thread of the warpgroup executes it).
template <int kRegs>
FJ_DEVICE void fj_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
FJ_DEVICE void fj_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
// Whether a split of a CTA of (kConsumers + 1) warpgroups into a producer at `producer`
// registers and consumers at `consumer` fits the CTA's launch allocation (65536 / threads per
// thread, rounded down to 8: 168 at 384 threads), within which setmaxnreg moves registers: past
// it setmaxnreg.inc waits forever (a producer at 32 with consumers at 240 hung every launch).
FJ_HOST_DEVICE inline constexpr bool fj_sm90_reg_split_fits(int producer, int consumer,
                                                            int consumers) {
  return producer * 128 + consumer * 128 * consumers <=
         65536 / ((consumers + 1) * 128) / 8 * 8 * ((consumers + 1) * 128);
}
// Named barriers (ids 1..15; 0 is __syncthreads): `threads` a multiple of 32.
FJ_DEVICE void fj_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
FJ_DEVICE void fj_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The same with the barrier id an immediate: no register holds it across a loop (a computed
// id kept live over the forward's tile loop was its last spill at d 128).
template <int kId, int kThreads>
FJ_DEVICE void fj_bar_sync_n() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
template <int kId, int kThreads>
FJ_DEVICE void fj_bar_arrive_n() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// Turns between kConsumers (2 or 3) consumer warpgroups that issue wgmma (FlashAttention-3's
// warp scheduler barriers): warpgroup c issues only inside a turn, taken with a bar.sync on
// kBar + c and handed to warpgroup (c + 1) mod kConsumers right after the issue with a
// bar.arrive on that one's barrier (256 threads: 128 syncing, 128 arriving). So the tensor
// cores take the warpgroups' GEMMs in a fixed rotation (ping-pong with two) and one's softmax
// or element step runs under the others' GEMMs. Warpgroup 0 takes the first turn (start: the
// last warpgroup's arrival); warpgroup 0 absorbs the last hand-over (finish), so no arrival is
// left pending at exit. Every warpgroup must take the same number of turns. The ids are
// immediates (one branch per turn on the warp-uniform cw).
template <int kConsumers, int kBar>
struct FjTurns {
  static_assert(kConsumers == 2 || kConsumers == 3, "flexjit: turns between 2 or 3 warpgroups");
  static_assert(kBar >= 1 && kBar + kConsumers <= 16, "flexjit: named barrier ids 1..15");
  int cw;
  FJ_DEVICE void start() const {
    if (cw == kConsumers - 1) fj_bar_arrive_n<kBar, 256>();
  }
  FJ_DEVICE void begin() const {
    if (cw == 0) {
      fj_bar_sync_n<kBar, 256>();
    } else if (kConsumers == 2 || cw == 1) {
      fj_bar_sync_n<kBar + 1, 256>();
    } else {
      fj_bar_sync_n<kBar + (kConsumers - 1), 256>();
    }
  }
  FJ_DEVICE void end() const {
    if (cw == kConsumers - 1) {
      fj_bar_arrive_n<kBar, 256>();
    } else if (cw == 0) {
      fj_bar_arrive_n<kBar + 1, 256>();
    } else {
      fj_bar_arrive_n<kBar + (kConsumers - 1), 256>();
    }
  }
  FJ_DEVICE void finish() const {
    if (cw == 0) fj_bar_sync_n<kBar, 256>();
  }
};

// Orders this thread's generic-proxy shared-memory accesses with the async proxy (TMA, wgmma).
FJ_DEVICE void fj_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#endif  // FLEXJIT_WGMMA_SM90_CUH_
