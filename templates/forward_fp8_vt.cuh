// flexjit e4m3 forward's V^T pre-pass (forward_fp8_vt/block_per_64_keys; docs/kernels/
// forward_sm90.md "FP8"): V [B, Hkv, Skv, Dv] e4m3 written as V^T [B, Hkv, Dv, skv_pad], each
// 32-key group permuted by fj_fp8_vt_key (flexjit_abi.h), so that P V's B operand is K-major as
// wgmma's e4m3 path needs it.
//
// Spliced after flexjit_abi.h (FjFp8VtArgs, fj_fp8_vt_key), prelude.cuh and the generated
// FjVtConfig (kRealDimV: v's head dim, a multiple of 16); no mods reach it, so one module per
// arch and head dim serves every e4m3 forward: the forward's companion kernel
// (kernels::Variant::companions), compiled beside it instead of inside it.
//
// 64 keys of one (b, kv head) per CTA, read as 16-byte rows into shared memory (keys past Skv as
// zeros), written as the real head dim's V^T rows, 16 keys per 16-byte store.
#ifndef FLEXJIT_FORWARD_FP8_VT_CUH_
#define FLEXJIT_FORWARD_FP8_VT_CUH_

struct alignas(16) FjVtUnit {
  fj_u32 x, y, z, w;
};

extern "C" __global__ void __launch_bounds__(256) flexjit_forward_fp8_vt(const FjFp8VtArgs a) {
  constexpr int kD = FjVtConfig::kRealDimV;  // a multiple of 16
  constexpr int kUnits = kD / 16;
  constexpr int kRow = kD + 16;  // padded rows: fewer bank conflicts on the column reads
  __shared__ __align__(16) unsigned char tile[64 * kRow];
  const int n0 = blockIdx.x * 64, h = blockIdx.y, b = blockIdx.z;
  const unsigned char* src = a.v + (fj_i64)b * a.v_stride_b + (fj_i64)h * a.v_stride_h;
  for (int i = threadIdx.x; i < 64 * kUnits; i += 256) {
    const int r = i / kUnits, u = i % kUnits;
    FjVtUnit val = {0u, 0u, 0u, 0u};
    if (n0 + r < a.seqlen_kv) {
      val = *reinterpret_cast<const FjVtUnit*>(src + (fj_i64)(n0 + r) * a.v_stride_s + u * 16);
    }
    *reinterpret_cast<FjVtUnit*>(tile + r * kRow + u * 16) = val;
  }
  __syncthreads();
  unsigned char* dst = a.vt + ((fj_i64)b * a.heads_kv + h) * kD * a.skv_pad + n0;
  for (int i = threadIdx.x; i < kD * 4; i += 256) {
    const int d = i / 4, w = i % 4;  // columns 16 w .. 16 w + 15 of the 64 of row d
    fj_u32 word[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      word[q] = 0u;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = 16 * w + 4 * q + e;
        const int key = (k & 32) | fj_fp8_vt_key(k & 31);
        word[q] |= (fj_u32)tile[key * kRow + d] << (8 * e);
      }
    }
    *reinterpret_cast<FjVtUnit*>(dst + (fj_i64)d * a.skv_pad + 16 * w) =
        FjVtUnit{word[0], word[1], word[2], word[3]};
  }
}

#endif  // FLEXJIT_FORWARD_FP8_VT_CUH_
