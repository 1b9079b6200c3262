// Stand-in for generated mods: param cap: f32, param window: i32;
// score_mod = cap * tanh(score / cap); mask_mod = q_idx >= kv_idx && q_idx - kv_idx <= window.
struct FjModParams {
  float cap;
  int window;
};
__device__ __forceinline__ float fj_score_mod(const FjModParams& mp, float score, int b, int h,
                                              int q_idx, int kv_idx) {
  return mp.cap * fj_tanh(score / mp.cap);
}
__device__ __forceinline__ bool fj_mask_mod(const FjModParams& mp, int b, int h, int q_idx,
                                            int kv_idx) {
  return q_idx >= kv_idx && fj_isub(q_idx, kv_idx) <= mp.window;
}
// No attention sink (the sink_mod hook the epilogue calls; -inf would be no sink either).
static constexpr bool kFjHasSinkMod = false;
__device__ __forceinline__ float fj_sink_mod(const FjModParams&, int, int, int) {
  return __int_as_float((int)0xff800000u);
}
