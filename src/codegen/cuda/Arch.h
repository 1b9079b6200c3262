// A CUDA compilation target and the per-arch limits that kernel variants check against.
#pragma once

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

// "sm_80, sm_86, sm_89, sm_90, sm_90a"
const char* supported_archs();

// The opt-in maximum of dynamic shared memory per block in bytes (CUDA Programming Guide,
// "Technical Specifications per Compute Capability"): 163 KB on sm_80, 99 KB on sm_86/89,
// 227 KB on sm_90.
int max_smem_per_block(const Arch& arch);

}  // namespace flexjit::cuda
