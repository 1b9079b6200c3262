// Parsing and validation of forward-kernel specifications.
#include "codegen/cuda/ForwardSpec.h"

#include <flexjit/error.h>

#include "flexjit_abi.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>

namespace flexjit::cuda {

namespace {

constexpr const char* kSupportedArchs = "sm_80, sm_86, sm_89, sm_90, sm_90a";

bool one_of(int v, std::initializer_list<int> allowed) {
  return std::find(allowed.begin(), allowed.end(), v) != allowed.end();
}

std::string list_text(std::initializer_list<int> allowed) {
  std::string s;
  for (int v : allowed)
    s += (s.empty() ? "" : ", ") + std::to_string(v);
  return s;
}

// The opt-in maximum of dynamic shared memory per block (CUDA Programming Guide, "Technical
// Specifications per Compute Capability"): 163 KB on sm_80, 99 KB on sm_86/89, 227 KB on sm_90.
int max_smem_per_block(const Arch& arch) {
  switch (arch.cc()) {
    case 80:
      return 163 * 1024;
    case 86:
    case 89:
      return 99 * 1024;
    case 90:
      return 227 * 1024;
    default:
      break;
  }
  FJ_ASSERT(false, "max_smem_per_block of an arch Arch::parse does not accept");
}

void require_in(const char* what, int v, std::initializer_list<int> allowed) {
  if (one_of(v, allowed)) return;
  throw UnsupportedError(fmt::format("the forward kernel does not support {} = {}; supported: {}",
                                     what, v, list_text(allowed)));
}

}  // namespace

Arch Arch::parse(const std::string& s) {
  const std::initializer_list<const char*> known = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"};
  for (const char* k : known) {
    if (s != k) continue;
    Arch a;
    a.major = k[3] - '0';
    a.minor = k[4] - '0';
    a.accelerated = k[5] == 'a';
    return a;
  }
  throw UnsupportedError(
      fmt::format("unsupported CUDA arch '{}': supported are {}", s, kSupportedArchs));
}

std::string Arch::str() const {
  return fmt::format("sm_{}{}{}", major, minor, accelerated ? "a" : "");
}

void ForwardSpec::validate() const {
  // Re-parse so that a hand-built Arch (fields set directly) is checked as strictly as text.
  Arch::parse(arch.str());
  switch (dtype) {
    case DType::BF16:
    case DType::F16:
      break;
    case DType::F32:  // computed on tf32 tensor cores (docs/kernels/forward_sm80.md)
      break;
    case DType::I32:
    case DType::Bool:
      throw UnsupportedError(
          fmt::format("attention inputs must be bf16, f16 or f32, not {}", to_string(dtype)));
  }
  require_in("head_dim_qk", head_dim_qk, {64, 128, 256});
  require_in("head_dim_v", head_dim_v, {64, 128, 256});
  if (gqa_ratio < 1) {
    throw UnsupportedError(
        fmt::format("gqa_ratio (heads_q / heads_kv) must be at least 1, not {}", gqa_ratio));
  }
  require_in("block_m", config.block_m, {64, 128});
  require_in("block_n", config.block_n, {32, 64, 128});
  require_in("num_warps", config.num_warps, {4, 8});
  require_in("num_stages", config.num_stages, {1, 2, 3});
  // Each warp owns whole m16 MMA row tiles of the Q block.
  if (config.block_m % (16 * config.num_warps) != 0) {
    throw UnsupportedError(fmt::format(
        "block_m = {} with num_warps = {} gives {} query rows per warp; each warp needs a "
        "multiple of 16 rows (block_m must be a multiple of 16 * num_warps = {})",
        config.block_m, config.num_warps, config.block_m / config.num_warps,
        16 * config.num_warps));
  }
  const int smem = fj_forward_smem_bytes(config.block_m, config.block_n, head_dim_qk, head_dim_v,
                                         dtype_size(dtype), config.num_stages);
  const int limit = max_smem_per_block(arch);
  if (smem > limit) {
    throw UnsupportedError(fmt::format(
        "config {}x{} with {} stages needs {} bytes of shared memory for head dims {}/{} in {}, "
        "more than the {} bytes a block may use on {}; lower num_stages, block_n or block_m{}",
        config.block_m, config.block_n, config.num_stages, smem, head_dim_qk, head_dim_v,
        to_string(dtype), limit, arch.str(),
        dtype == DType::F32 ? " (or convert q, k, v to bf16 or f16: f32 tiles take twice the bytes)"
                            : ""));
  }
}

std::string ForwardSpec::str() const {
  return fmt::format("{} d={}/{} gqa={} {} {}x{} w{} s{} divisible={} full_blocks={}",
                     to_string(dtype), head_dim_qk, head_dim_v, gqa_ratio, arch.str(),
                     config.block_m, config.block_n, config.num_warps, config.num_stages,
                     is_divisible ? 1 : 0, has_full_blocks ? 1 : 0);
}

}  // namespace flexjit::cuda
