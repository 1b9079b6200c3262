#include "tune/Defaults.h"

#include <algorithm>

namespace flexjit::tune {

cuda::ForwardConfig default_forward_config(const cuda::ForwardSpec& spec) {
  // FlashAttention-2's choices for mma.sync kernels: wide KV tiles where registers allow,
  // narrower ones as the head dim grows. sm_86/sm_89 have 99 KB of shared memory per block.
  int d = std::max(spec.head_dim_qk, spec.head_dim_v);
  bool small_smem = spec.arch.cc() == 86 || spec.arch.cc() == 89;
  cuda::ForwardConfig c;
  if (spec.dtype == DType::F32) {
    // tf32 path: fp32 tiles take twice the shared memory (fj_forward_smem_bytes with 4-byte
    // elements), so the tiles shrink. nvcc 13.0 ptxas, sm_80 / sm_90a, causal mask: d=64 128x64
    // w4 s2 (96 KiB) 218 / 225 registers; d=128 64x64 w4 s2 (160 KiB) 207 / 212, s1 (96 KiB, for
    // sm_86/89) 200 / 225; d=256 64x32 w4 s1 (128 KiB) 255 / 254, s2 (192 KiB, sm_90 only) 255;
    // no spills. d=256 has no config within the 99 KiB of sm_86/89: validate() says so.
    if (d <= 64) return {128, 64, 4, 2};
    if (d <= 128) return {64, 64, 4, small_smem ? 1 : 2};
    return {64, 32, 4, spec.arch.cc() >= 90 ? 2 : 1};
  }
  if (d <= 64) {
    c = {128, 64, 4, 2};
  } else if (d <= 128) {
    // Measured on an H200 (docs/perf/NOTES.md, v1): 128x64 w4 343 TFLOP/s noop against 325 for
    // 128x128 w8; causal 281 against 285. 96 KiB of shared memory also fits sm_86/89.
    c = {128, 64, 4, 2};
  } else {
    c = {64, 64, 4, small_smem ? 1 : 2};
  }
  return c;
}

}  // namespace flexjit::tune
