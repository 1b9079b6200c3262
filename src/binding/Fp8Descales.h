// The descale factors of e4m3 q, k, v as kernels read them (checked by
// runtime::check_descales, binding/AttentionCall.h; passed on in kernels::ForwardInputs).
#pragma once

namespace flexjit::runtime {

// AttentionOptions::descale on the device (FjFp8Args): an f32 per tensor (stride 0) or per head
// (stride 1); null: 1.
struct Fp8Descales {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int q_stride = 0, k_stride = 0, v_stride = 0;
};

}  // namespace flexjit::runtime
