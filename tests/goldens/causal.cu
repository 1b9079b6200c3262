// Captured buffers (pointer, strides in elements) and runtime parameters: the by-value
// kernel argument. The host packs it by flexjit's ModParamLayout; the asserts below
// fail the compile if the two ever disagree.
struct alignas(8) FjModParams {
  int unused_;
};
#ifndef FJ_OFFSETOF
#if defined(__CUDACC_RTC__)
#define FJ_OFFSETOF(type, member) __INTADDR__(&((type*)0)->member)
#else
#define FJ_OFFSETOF(type, member) __builtin_offsetof(type, member)
#endif
#endif
static_assert(sizeof(FjModParams) == 8, "FjModParams size differs from ModParamLayout");

__device__ __forceinline__ float fj_score_mod(const FjModParams& mp, float score, int b, int h, int q_idx, int kv_idx) {
  return score;
}

// q_idx >= kv_idx
__device__ __forceinline__ bool fj_mask_mod(const FjModParams& mp, int b, int h, int q_idx, int kv_idx) {
  const bool t0 = q_idx >= kv_idx;
  return t0;
}
