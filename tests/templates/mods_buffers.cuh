// Stand-in for generated mods exercising every prelude function and buffer load once (compile
// coverage for the prelude; not a meaningful attention variant).
struct FjModParams {
  const unsigned short* bias_bf16;
  const unsigned short* bias_f16;
  const int* doc_id;
  const unsigned char* keep;
  float p;
};
__device__ __forceinline__ float fj_score_mod(const FjModParams& mp, float score, int b, int h,
                                              int q_idx, int kv_idx) {
  float t = fj_ld_bf16(mp.bias_bf16, (fj_i64)q_idx) + fj_ld_f16(mp.bias_f16, (fj_i64)kv_idx);
  t = t + fj_exp(score) * fj_exp2(score) + fj_log(fj_fabs(t) + 1.0f) + fj_log2(2.0f + score);
  t = t + fj_sigmoid(t) + fj_sqrt(fj_fabs(t)) * fj_rsqrt(1.0f + fj_fabs(t));
  t = fj_fminf(fj_fmaxf(t, -100.0f), fj_pow(2.0f, fj_floor(score) + fj_ceil(score)));
  const int i = fj_idiv_floor(fj_imul(q_idx, 3), fj_iadd(kv_idx, 1)) +
                fj_imod_floor(fj_neg_i(q_idx), fj_imax(kv_idx, 1)) + fj_iabs(fj_imin(b, h));
  return fj_tanh(t) + fj_fmod_floor(score, mp.p) + (float)fj_f2i(t) + (float)i;
}
__device__ __forceinline__ bool fj_mask_mod(const FjModParams& mp, int b, int h, int q_idx,
                                            int kv_idx) {
  return fj_ld_bool(mp.keep, (fj_i64)kv_idx) &&
         fj_ld_i32(mp.doc_id, (fj_i64)q_idx) == fj_ld_i32(mp.doc_id, (fj_i64)kv_idx);
}
// No attention sink (the sink_mod hook the epilogue calls; -inf would be no sink either).
static constexpr bool kFjHasSinkMod = false;
__device__ __forceinline__ float fj_sink_mod(const FjModParams&, int, int, int) {
  return __int_as_float((int)0xff800000u);
}
