// Captured buffers (pointer, strides in elements) and runtime parameters: the by-value
// kernel argument. The host packs it by flexjit's ModParamLayout; the asserts below
// fail the compile if the two ever disagree.
struct alignas(8) FjModParams {
  const unsigned short* buf_pos_bias;  // pos_bias: bf16
  fj_i64 stride_pos_bias[2];
};
#ifndef FJ_OFFSETOF
#if defined(__CUDACC_RTC__)
#define FJ_OFFSETOF(type, member) __INTADDR__(&((type*)0)->member)
#else
#define FJ_OFFSETOF(type, member) __builtin_offsetof(type, member)
#endif
#endif
static_assert(sizeof(FjModParams) == 24, "FjModParams size differs from ModParamLayout");
static_assert(FJ_OFFSETOF(FjModParams, buf_pos_bias) == 0, "FjModParams::buf_pos_bias offset differs from ModParamLayout");
static_assert(FJ_OFFSETOF(FjModParams, stride_pos_bias[0]) == 8, "FjModParams::stride_pos_bias[0] offset differs from ModParamLayout");
static_assert(FJ_OFFSETOF(FjModParams, stride_pos_bias[1]) == 16, "FjModParams::stride_pos_bias[1] offset differs from ModParamLayout");

// score + pos_bias[q_idx][kv_idx]
__device__ __forceinline__ float fj_score_mod(const FjModParams& mp, float score, int b, int h, int q_idx, int kv_idx) {
  const fj_i64 t0 = (fj_i64)q_idx * mp.stride_pos_bias[0] + (fj_i64)kv_idx * mp.stride_pos_bias[1];
  const float t1 = fj_ld_bf16(mp.buf_pos_bias, t0);
  const float t2 = score + t1;
  return t2;
}

__device__ __forceinline__ bool fj_mask_mod(const FjModParams& mp, int b, int h, int q_idx, int kv_idx) {
  return true;
}

// The score_mod's diagonal load: a float buffer read at indices that depend on q_idx
// and kv_idx only through d = q_idx - kv_idx. The sm_90a kernels load a tile's
// diagonals once (fj_diag_load_at, only at diagonals that hold a position of the
// problem) and hand every element its value through the overloads that take fj_dl.
static constexpr bool kFjDiagLoad = false;
__device__ __forceinline__ float fj_diag_load_at(const FjModParams& mp, int b, int h, int d) { return (void)mp, (void)b, (void)h, (void)d, 0.0f; }
__device__ __forceinline__ float fj_score_mod(const FjModParams& mp, float score, int b, int h, int q_idx, int kv_idx, float fj_dl) { return (void)fj_dl, fj_score_mod(mp, score, b, h, q_idx, kv_idx); }

// The mask_mod's column load: an i32 / f32 buffer read at indices that depend on kv_idx
// and not on q_idx. The sm_90a forward loads a tile's columns once per warp and hands
// every row its column's value (a shuffle) through the overload that takes fj_cl.
static constexpr bool kFjColLoad = false;
using FjColLoad = int;
__device__ __forceinline__ int fj_col_load_at(const FjModParams& mp, int b, int h, int kv_idx) { return (void)mp, (void)b, (void)h, (void)kv_idx, 0; }
__device__ __forceinline__ bool fj_mask_mod(const FjModParams& mp, int b, int h, int q_idx, int kv_idx, int fj_cl) { return (void)fj_cl, fj_mask_mod(mp, b, h, q_idx, kv_idx); }

static constexpr bool kFjHasSinkMod = false;
__device__ __forceinline__ float fj_sink_mod(const FjModParams& mp, int b, int h, int q_idx) {
  return __int_as_float((int)0xff800000u);
}
