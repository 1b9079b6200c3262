// Captured buffers (pointer, strides in elements) and runtime parameters: the by-value
// kernel argument. The host packs it by flexjit's ModParamLayout; the asserts below
// fail the compile if the two ever disagree.
struct alignas(8) FjModParams {
  const float* buf_rel_table;  // rel_table: f32
  fj_i64 stride_rel_table[2];
};
#ifndef FJ_OFFSETOF
#if defined(__CUDACC_RTC__)
#define FJ_OFFSETOF(type, member) __INTADDR__(&((type*)0)->member)
#else
#define FJ_OFFSETOF(type, member) __builtin_offsetof(type, member)
#endif
#endif
static_assert(sizeof(FjModParams) == 24, "FjModParams size differs from ModParamLayout");
static_assert(FJ_OFFSETOF(FjModParams, buf_rel_table) == 0, "FjModParams::buf_rel_table offset differs from ModParamLayout");
static_assert(FJ_OFFSETOF(FjModParams, stride_rel_table[0]) == 8, "FjModParams::stride_rel_table[0] offset differs from ModParamLayout");
static_assert(FJ_OFFSETOF(FjModParams, stride_rel_table[1]) == 16, "FjModParams::stride_rel_table[1] offset differs from ModParamLayout");

// score + rel_table[h][min(int(floor(log(float(abs(q_idx - kv_idx)) + 1.0) * 4.0)), 31)]
__device__ __forceinline__ float fj_score_mod(const FjModParams& mp, float score, int b, int h, int q_idx, int kv_idx) {
  const int t0 = fj_isub(q_idx, kv_idx);
  const int t1 = fj_iabs(t0);
  const float t2 = (float)t1;
  const float t3 = t2 + 1.0f;
  const float t4 = fj_log(t3);
  const float t5 = t4 * 4.0f;
  const float t6 = fj_floor(t5);
  const int t7 = fj_f2i(t6);
  const int t8 = fj_imin(t7, 31);
  const fj_i64 t9 = (fj_i64)h * mp.stride_rel_table[0] + (fj_i64)t8 * mp.stride_rel_table[1];
  const float t10 = fj_ld_f32(mp.buf_rel_table, t9);
  const float t11 = score + t10;
  return t11;
}

__device__ __forceinline__ bool fj_mask_mod(const FjModParams& mp, int b, int h, int q_idx, int kv_idx) {
  return true;
}

// The score_mod's diagonal load: a float buffer read at indices that depend on q_idx
// and kv_idx only through d = q_idx - kv_idx. The sm_90a kernels load a tile's
// diagonals once (fj_diag_load_at, only at diagonals that hold a position of the
// problem) and hand every element its value through the overloads that take fj_dl.
static constexpr bool kFjDiagLoad = true;
__device__ __forceinline__ float fj_diag_load_at(const FjModParams& mp, int b, int h, int d) {
  // rel_table[h, min(int(floor(log(float(abs(q_idx - kv_idx)) + 1.0) * 4.0)), 31)] at q_idx = d, kv_idx = 0
  const int q_idx = d, kv_idx = 0;
  (void)q_idx, (void)kv_idx;
  const int t0 = fj_isub(q_idx, kv_idx);
  const int t1 = fj_iabs(t0);
  const float t2 = (float)t1;
  const float t3 = t2 + 1.0f;
  const float t4 = fj_log(t3);
  const float t5 = t4 * 4.0f;
  const float t6 = fj_floor(t5);
  const int t7 = fj_f2i(t6);
  const int t8 = fj_imin(t7, 31);
  return fj_ld_f32(mp.buf_rel_table, (fj_i64)h * mp.stride_rel_table[0] + (fj_i64)t8 * mp.stride_rel_table[1]);
}
__device__ __forceinline__ float fj_score_mod(const FjModParams& mp, float score, int b, int h, int q_idx, int kv_idx, float fj_dl) {
  (void)fj_dl;
  const int t0 = fj_isub(q_idx, kv_idx);
  const int t1 = fj_iabs(t0);
  const float t2 = (float)t1;
  const float t3 = t2 + 1.0f;
  const float t4 = fj_log(t3);
  const float t5 = t4 * 4.0f;
  const float t6 = fj_floor(t5);
  const int t7 = fj_f2i(t6);
  const int t8 = fj_imin(t7, 31);
  const float t9 = score + fj_dl;
  return t9;
}

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
