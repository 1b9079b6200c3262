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
    // 128x128 with 8 warps needs 160 KiB of shared memory; sm_86/89 have 99 KiB.
    c = small_smem ? cuda::ForwardConfig{128, 64, 4, 2} : cuda::ForwardConfig{128, 128, 8, 2};
  } else {
    c = {64, 64, 4, small_smem ? 1 : 2};
  }
  return c;
}

}  // namespace flexjit::tune
