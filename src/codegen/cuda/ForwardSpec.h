// What forward kernel to generate: everything that shapes its source apart from the mods.
#pragma once

#include <flexjit/types.h>

#include <string>

namespace flexjit::cuda {

// A CUDA target: sm_80, sm_86, sm_89, sm_90, sm_90a ("a": arch-specific features, wgmma).
struct Arch {
  int major = 8;
  int minor = 0;
  bool accelerated = false;  // the 'a' suffix
  // Parses "sm_90a" / "sm_80"; throws UnsupportedError naming the supported list otherwise.
  static Arch parse(const std::string& s);
  std::string str() const;  // "sm_90a"
  int cc() const { return major * 10 + minor; }
  bool operator==(const Arch&) const = default;
};

// The tunable block configuration (what Inductor's flex_attention autotunes).
struct ForwardConfig {
  int block_m = 128;   // query rows per CTA
  int block_n = 64;    // keys per inner iteration
  int num_warps = 4;   // block_m / num_warps rows per warp; a multiple of 16
  int num_stages = 2;  // K/V shared-memory pipeline depth (cp.async)
  bool operator==(const ForwardConfig&) const = default;
};

struct ForwardSpec {
  DType dtype = DType::BF16;  // of q, k, v and out
  int head_dim_qk = 128;
  int head_dim_v = 128;
  int gqa_ratio = 1;            // heads_q / heads_kv
  bool is_divisible = false;    // seqlen_q % block_m == 0 and seqlen_kv % block_n == 0
  bool has_full_blocks = true;  // the block mask carries full_* arrays
  Arch arch;
  ForwardConfig config;

  // Throws UnsupportedError with a precise message for a head dim, dtype, arch or config the
  // forward template does not support.
  void validate() const;
  bool operator==(const ForwardSpec&) const = default;
  std::string str() const;  // "bf16 d=128/128 gqa=1 sm_90a 128x64 w4 s2 ..." for logs and comments
};

}  // namespace flexjit::cuda
