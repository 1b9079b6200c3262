#include "tune/Defaults.h"

#include <algorithm>

namespace flexjit::tune {

cuda::ForwardConfig default_forward_config(const cuda::ForwardSpec& spec) {
  // FlashAttention-2's choices for mma.sync kernels: wide KV tiles where registers allow,
  // narrower ones as the head dim grows. sm_86/sm_89 have 99 KB of shared memory per block.
  int d = std::max(spec.head_dim_qk, spec.head_dim_v);
  bool small_smem = spec.arch.cc() == 86 || spec.arch.cc() == 89;
  cuda::ForwardConfig c;
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
