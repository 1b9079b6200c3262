// Stand-in for generated mods: buffer slopes: f32[H]; score_mod = score + slopes[h] * (kv_idx -
// q_idx) (kHasScoreMod = true), no mask.
struct FjModParams {
  const float* slopes;
  fj_i64 slopes_stride0;
};
__device__ __forceinline__ float fj_score_mod(const FjModParams& mp, float score, int b, int h,
                                              int q_idx, int kv_idx) {
  const float t0 = fj_ld_f32(mp.slopes, (fj_i64)h * mp.slopes_stride0);
  return score + t0 * (float)fj_isub(kv_idx, q_idx);
}
__device__ __forceinline__ bool fj_mask_mod(const FjModParams& mp, int b, int h, int q_idx,
                                            int kv_idx) {
  return true;
}
// No attention sink (the sink_mod hook the epilogue calls; -inf would be no sink either).
static constexpr bool kFjHasSinkMod = false;
__device__ __forceinline__ float fj_sink_mod(const FjModParams&, int, int, int) {
  return __int_as_float((int)0xff800000u);
}
