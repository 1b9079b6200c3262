// flexjit sm_80+ building blocks: thin inline-PTX wrappers for cp.async, ldmatrix, mma.sync and
// 16-bit conversions, plus the swizzled shared-memory tile layout the forward kernel uses.
//
// Spliced after the generated mods and before forward_sm80.cuh; needs only prelude.cuh.
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16", 16-bit A/B, f32 C/D), with
// g = lane / 4 (group) and t = lane % 4 (thread in group):
//   A (16x16, row-major)  reg0: (g, 2t..2t+1)   reg1: (g+8, 2t..)   reg2: (g, 2t+8..)  reg3: (g+8,
//   2t+8..) B (16x8, k x n)       reg0: (k=2t..2t+1, n=g)                   reg1: (k=2t+8.., n=g)
//   C (16x8, f32)         c0,c1: (g, 2t..2t+1)                     c2,c3: (g+8, 2t..2t+1)
// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i; register i of every lane
// receives matrix i with lane holding (row g, cols 2t..2t+1) — or, with .trans, (rows 2t..2t+1,
// col g) of the stored matrix.
// fp32 inputs run on tf32 tensor cores, mma.m16n8k8 ("Matrix fragments for mma.m16n8k8", .tf32):
//   A (16x8)  a0: (g, t)  a1: (g+8, t)  a2: (g, t+4)  a3: (g+8, t+4)
//   B (8x8)   b0: (k=t, n=g)            b1: (k=t+4, n=g)              C as above.
// An ldmatrix (.b16) of 32-bit data sees each 16-byte row as 4 floats: lane (g, t) receives float
// t of row g, which is exactly a0..a3 / b0, b1 for the same row addresses the 16-bit path uses
// (one k8 step of fp32 = 32 bytes of a row = one k16 step of 16-bit elements).
#ifndef FLEXJIT_MMA_SM80_CUH_
#define FLEXJIT_MMA_SM80_CUH_

// Shared-state-space address of a generic pointer into shared memory.
FJ_DEVICE fj_u32 fj_smem_addr(const void* p) {
  fj_u32 r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

FJ_DEVICE float fj_neg_inf() {
  return __int_as_float(0xff800000u);
}

// 2^x, approximate (2 ulp): only the kernel's own softmax uses it, never mod code.
FJ_DEVICE float fj_ex2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// 16-byte global -> shared copy; when !valid nothing is read and the 16 bytes are zero-filled
// (src-size 0). `src` must still be a mapped address; callers pass a known-valid one.
FJ_DEVICE void fj_cp_async_16(fj_u32 dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
FJ_DEVICE void fj_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still pending.
template <int N>
FJ_DEVICE void fj_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

FJ_DEVICE void fj_ldsm_x4(fj_u32 (&r)[4], fj_u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
FJ_DEVICE void fj_ldsm_x4_trans(fj_u32 (&r)[4], fj_u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Per-element-type operations: D += A * B (f32 accumulate; m16n8k16 for 16-bit elements,
// m16n8k8 tf32 for float) on operands as ldmatrix delivers them, after prep(); and packing two
// f32 into one 32-bit register of two 16-bit values (lo in bits 0..15, round to nearest even).
template <class E>
struct FjMma {
  static_assert(sizeof(E) == 0,
                "flexjit forward_sm80: Element must be fj_bf16, fj_f16 or float (tf32)");
};
template <>
struct FjMma<fj_bf16> {
  static FJ_DEVICE void prep(fj_u32 (&)[4]) {}
  static FJ_DEVICE void mma(float (&d)[4], const fj_u32 (&a)[4], fj_u32 b0, fj_u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static FJ_DEVICE fj_u32 pack(float lo, float hi) {
    fj_u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // d = {hi, lo}
    return r;
  }
  // Stores (x0, x1) as two adjacent elements at a 4-byte aligned pointer (shared or global).
  static FJ_DEVICE void store2(unsigned char* dst, float x0, float x1) {
    *reinterpret_cast<fj_u32*>(dst) = pack(x0, x1);
  }
};
template <>
struct FjMma<fj_f16> {
  static FJ_DEVICE void prep(fj_u32 (&)[4]) {}
  static FJ_DEVICE void mma(float (&d)[4], const fj_u32 (&a)[4], fj_u32 b0, fj_u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static FJ_DEVICE fj_u32 pack(float lo, float hi) {
    fj_u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  // Stores (x0, x1) as two adjacent elements at a 4-byte aligned pointer (shared or global).
  static FJ_DEVICE void store2(unsigned char* dst, float x0, float x1) {
    *reinterpret_cast<fj_u32*>(dst) = pack(x0, x1);
  }
};
// fp32 in, tf32 tensor cores: operands are rounded to tf32 (10-bit mantissa, round to nearest,
// ties away: cvt.rna) once per fragment load; the tensor core would otherwise truncate, which
// biases every product toward zero.
template <>
struct FjMma<float> {
  static FJ_DEVICE fj_u32 tf32(float x) {
    fj_u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
  }
  static FJ_DEVICE void prep(fj_u32 (&r)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      r[i] = tf32(__uint_as_float(r[i]));
  }
  static FJ_DEVICE void mma(float (&d)[4], const fj_u32 (&a)[4], fj_u32 b0, fj_u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  // D += A * B with fp32 operands (raw bits, not prepared) to about fp32 accuracy: each operand
  // is split into a tf32 high part and a tf32 remainder, and three products are summed
  // (lo*hi + hi*lo + hi*hi, the small ones first; lo*lo is below fp32's rounding). The
  // backward uses it for S and dP, whose differences (dP - delta) cancel.
  static FJ_DEVICE void mma_split(float (&d)[4], const fj_u32 (&a)[4], fj_u32 b0, fj_u32 b1) {
    fj_u32 ah[4], al[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      ah[i] = tf32(__uint_as_float(a[i]));
      al[i] = tf32(__uint_as_float(a[i]) - __uint_as_float(ah[i]));
    }
    const fj_u32 bh0 = tf32(__uint_as_float(b0)), bh1 = tf32(__uint_as_float(b1));
    const fj_u32 bl0 = tf32(__uint_as_float(b0) - __uint_as_float(bh0));
    const fj_u32 bl1 = tf32(__uint_as_float(b1) - __uint_as_float(bh1));
    mma(d, al, bh0, bh1);
    mma(d, ah, bl0, bl1);
    mma(d, ah, bh0, bh1);
  }
  // 8-byte aligned pointer.
  static FJ_DEVICE void store2(unsigned char* dst, float x0, float x1) {
    float* d = reinterpret_cast<float*>(dst);
    asm volatile("st.v2.f32 [%0], {%1, %2};\n" ::"l"(d), "f"(x0), "f"(x1) : "memory");
  }
};

FJ_DEVICE float fj_lds_f32(fj_u32 addr) {
  float r;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(r) : "r"(addr));
  return r;
}

// Swizzled row-major tile of kDim elements of kElemBytes (2, or 4 for fp32) per row; kDim is a
// multiple of 64, so a row is kDim * kElemBytes / 16 >= 8 16-byte chunks. Chunk c of row r is
// stored at chunk c ^ (r % 8). Any 8 consecutive rows read at one logical chunk (what an ldmatrix
// 8x8 matrix or a fragment store touches) then cover 8 distinct chunk slots mod 8, i.e. all 32
// banks once: no bank conflicts.
// kRealDim (a multiple of 8, at most kDim) is the problem's head dim computed in this tile
// (kernels/HeadDims.h): only its first kValidChunks chunks of a row hold data; loads zero-fill the
// rest and stores skip them.
template <int kDim, int kElemBytes = 2, int kRealDim = kDim>
struct FjSwizzledTile {
  static_assert(kDim % 64 == 0, "flexjit: tile dims must be multiples of 64");
  static_assert(kElemBytes == 2 || kElemBytes == 4, "flexjit: 2- or 4-byte elements");
  static_assert(kRealDim % 8 == 0 && kRealDim >= 8 && kRealDim <= kDim,
                "flexjit: a head dim is a multiple of 8 no larger than its tile dim");
  static constexpr int kBytesPerElem = kElemBytes;
  static constexpr int kElemsPerChunk = 16 / kElemBytes;
  static constexpr int kChunks = kDim * kElemBytes / 16;
  static constexpr int kValidChunks = kRealDim * kElemBytes / 16;
  static constexpr int kRowBytes = kDim * kElemBytes;
  // Byte offset of (row, 16-byte chunk).
  static FJ_DEVICE int offset(int row, int chunk) {
    return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
  }
};

// Addresses of the ldmatrix operands a lane reads in an unrolled loop: rows row0 + 16*i (row0 %
// 8 fixed per lane) and chunks 2*j + c (c = 0 or 1 fixed per lane). Since 2j + c = 2j ^ c, the
// stored chunk is 2j ^ z with z = c ^ (row0 % 8) < 8, i.e. (2j & ~7) + ((2j & 7) ^ z): only
// j % 4 needs a register, the rest is an immediate. (Letting the compiler form offset() for
// every unrolled (i, j) costs one live register per pair: that alone spilled d=128.)
template <class Tile>
struct FjLdsmAddr {
  fj_u32 base[4];  // row0 and (2*(j%4)) ^ z folded in, for j % 4 = 0..3
  FJ_DEVICE FjLdsmAddr(fj_u32 smem, int row0, int c) {
    const int z = c ^ (row0 & 7);
#pragma unroll
    for (int jm = 0; jm < 4; ++jm)
      base[jm] = smem + row0 * Tile::kRowBytes + (((2 * jm) ^ z) << 4);
  }
  // Shared address of row row0 + 16*i, logical chunk 2*j + c (i and j compile-time after
  // unrolling; Tile::kChunks >= 8 so chunk 2j stays inside the row).
  FJ_DEVICE fj_u32 at(int i, int j) const {
    return base[j & 3] + i * 16 * Tile::kRowBytes + (j >> 2) * 128;
  }
};

// 16-byte vector for epilogue copies (no vector_types.h).
struct alignas(16) fj_u32x4 {
  fj_u32 x, y, z, w;
};

#endif  // FLEXJIT_MMA_SM80_CUH_
