#include "tune/TuningKey.h"

#include <fmt/format.h>

namespace flexjit::tune {

std::string DeviceIdentity::str() const {
  return fmt::format("{} (cc {}.{}, {} SMs)", name, cc_major, cc_minor, sm_count);
}

int64_t length_bucket(int64_t seqlen) {
  if (seqlen < 0) return -1;
  int64_t b = 16;
  while (b < seqlen)
    b *= 2;
  return b;
}

std::string shape_bucket(const kernels::InputFacts& facts) {
  auto len = [](int64_t s) {
    const int64_t b = length_bucket(s);
    return b < 0 ? std::string("any") : std::to_string(b);
  };
  const std::string mask = facts.mask_q_block > 0 || facts.mask_kv_block > 0
                               ? fmt::format("{}x{}", facts.mask_q_block, facts.mask_kv_block)
                               : std::string("none");
  return fmt::format("q{} kv{} mask{}", len(facts.seqlen_q), len(facts.seqlen_kv), mask);
}

std::string TuningKey::str() const {
  return fmt::format("{}|{}.{}|{}|{}|mods {}|{}|{}/{}|gqa{}|{}|fixed {}", device.name,
                     device.cc_major, device.cc_minor, device.sm_count, kernel, mods_hash,
                     to_string(dtype), head_dim_qk, head_dim_v, gqa_ratio, bucket,
                     fixed.empty() ? "none" : fixed);
}

TuningKey make_key(const DeviceIdentity& device, const kernels::KernelDesc& problem,
                   uint64_t mods_hash, const kernels::InputFacts& facts,
                   const kernels::Params& fixed) {
  kernels::KernelDesc d = problem;
  d.config = {};
  TuningKey k;
  k.device = device;
  k.kernel = d.str();
  // The text form ends with " | " and the config; without one, drop the separator.
  while (!k.kernel.empty() && (k.kernel.back() == ' ' || k.kernel.back() == '|'))
    k.kernel.pop_back();
  k.mods_hash = fmt::format("{:016x}", mods_hash);
  k.dtype = problem.dtype;
  k.head_dim_qk = problem.head_dim_qk;
  k.head_dim_v = problem.head_dim_v;
  k.gqa_ratio = problem.gqa_ratio;
  k.bucket = shape_bucket(facts);
  k.fixed = fixed.str();
  return k;
}

}  // namespace flexjit::tune
