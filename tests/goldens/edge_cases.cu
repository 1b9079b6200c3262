// Captured buffers (pointer, strides in elements) and runtime parameters: the by-value
// kernel argument. The host packs it by flexjit's ModParamLayout; the asserts below
// fail the compile if the two ever disagree.
struct alignas(8) FjModParams {
  const unsigned char* buf_keep;  // keep: bool
  fj_i64 stride_keep[1];
  const unsigned short* buf_int;  // int: f16
  fj_i64 stride_int[1];
  int param_flag;  // bool
  float param_exp;
};
#ifndef FJ_OFFSETOF
#if defined(__CUDACC_RTC__)
#define FJ_OFFSETOF(type, member) __INTADDR__(&((type*)0)->member)
#else
#define FJ_OFFSETOF(type, member) __builtin_offsetof(type, member)
#endif
#endif
static_assert(sizeof(FjModParams) == 40, "FjModParams size differs from ModParamLayout");
static_assert(FJ_OFFSETOF(FjModParams, buf_keep) == 0, "FjModParams::buf_keep offset differs from ModParamLayout");
static_assert(FJ_OFFSETOF(FjModParams, stride_keep[0]) == 8, "FjModParams::stride_keep[0] offset differs from ModParamLayout");
static_assert(FJ_OFFSETOF(FjModParams, buf_int) == 16, "FjModParams::buf_int offset differs from ModParamLayout");
static_assert(FJ_OFFSETOF(FjModParams, stride_int[0]) == 24, "FjModParams::stride_int[0] offset differs from ModParamLayout");
static_assert(FJ_OFFSETOF(FjModParams, param_flag) == 32, "FjModParams::param_flag offset differs from ModParamLayout");
static_assert(FJ_OFFSETOF(FjModParams, param_exp) == 36, "FjModParams::param_exp offset differs from ModParamLayout");

// where(flag && keep[q_idx], where(float(b) % 2.5 > 1.0, ceil(sqrt(int[kv_idx] + pow(sigmoid(score), exp) + exp2(score) - log2(rsqrt(abs(score) + 1.0)))), -score) + float(q_idx > kv_idx) * max(score, -0.0) + float(-(q_idx - kv_idx) / 3 % (h - 2) + -2147483648), -inf) + float(max(-(q_idx - kv_idx) / 3 % (h - 2) + -2147483648, -7)) * 1e-30 + float(min(int(score), 3))
__device__ __forceinline__ float fj_score_mod(const FjModParams& mp, float score, int b, int h, int q_idx, int kv_idx) {
  const fj_i64 t0 = (fj_i64)q_idx * mp.stride_keep[0];
  const bool t1 = fj_ld_bool(mp.buf_keep, t0);
  const bool t2 = (mp.param_flag != 0) && t1;
  const float t3 = (float)b;
  const float t4 = fj_fmod_floor(t3, 2.5f);
  const bool t5 = t4 > 1.0f;
  const fj_i64 t6 = (fj_i64)kv_idx * mp.stride_int[0];
  const float t7 = fj_ld_f16(mp.buf_int, t6);
  const float t8 = fj_sigmoid(score);
  const float t9 = fj_pow(t8, mp.param_exp);
  const float t10 = t7 + t9;
  const float t11 = fj_exp2(score);
  const float t12 = t10 + t11;
  const float t13 = fj_fabs(score);
  const float t14 = t13 + 1.0f;
  const float t15 = fj_rsqrt(t14);
  const float t16 = fj_log2(t15);
  const float t17 = t12 - t16;
  const float t18 = fj_sqrt(t17);
  const float t19 = fj_ceil(t18);
  const float t20 = -score;
  const float t21 = t5 ? t19 : t20;
  const bool t22 = q_idx > kv_idx;
  const float t23 = (float)t22;
  const float t24 = fj_fmaxf(score, (-0.0f));
  const float t25 = t23 * t24;
  const float t26 = t21 + t25;
  const int t27 = fj_isub(q_idx, kv_idx);
  const int t28 = fj_neg_i(t27);
  const int t29 = fj_idiv_floor(t28, 3);
  const int t30 = fj_isub(h, 2);
  const int t31 = fj_imod_floor(t29, t30);
  const int t32 = fj_iadd(t31, (-2147483647 - 1));
  const float t33 = (float)t32;
  const float t34 = t26 + t33;
  const float t35 = t2 ? t34 : __int_as_float((int)0xff800000u);
  const int t36 = fj_imax(t32, (-7));
  const float t37 = (float)t36;
  const float t38 = t37 * 1e-30f;
  const float t39 = t35 + t38;
  const int t40 = fj_f2i(score);
  const int t41 = fj_imin(t40, 3);
  const float t42 = (float)t41;
  const float t43 = t39 + t42;
  return t43;
}

// !(q_idx < kv_idx) || keep[kv_idx] != true
__device__ __forceinline__ bool fj_mask_mod(const FjModParams& mp, int b, int h, int q_idx, int kv_idx) {
  const bool t0 = q_idx < kv_idx;
  const bool t1 = !t0;
  const fj_i64 t2 = (fj_i64)kv_idx * mp.stride_keep[0];
  const bool t3 = fj_ld_bool(mp.buf_keep, t2);
  const bool t4 = t3 != true;
  const bool t5 = t1 || t4;
  return t5;
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
