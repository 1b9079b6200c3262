// Per-mods setup for run_forward.cu: fills FjModParams from the slopes buffer and PARAM.
#pragma once
#if FJ_MODS_KIND == 2
inline void fj_test_set_mods(FjModParams& m, float* slopes, float) {
  m.slopes = slopes;
  m.slopes_stride0 = 1;
}
#elif FJ_MODS_KIND == 3
inline void fj_test_set_mods(FjModParams& m, float*, float p) {
  m.cap = 20.f;
  m.window = (int)p;
}
#else
inline void fj_test_set_mods(FjModParams&, float*, float) {}
#endif
