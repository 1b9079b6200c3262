// Stand-in for generated mods: no score_mod, no mask_mod (FjConfig: kHasScoreMod = false,
// kHasMaskMod = false). The functions still exist, as the codegen always emits both.
struct FjModParams {
  int unused;
};
__device__ __forceinline__ float fj_score_mod(const FjModParams& mp, float score, int b, int h,
                                              int q_idx, int kv_idx) {
  return score;
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
