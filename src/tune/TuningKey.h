// What a tuned config is stored under (docs/tuning.md, "Keys and buckets"): the device, the
// kernel without its config, the mods' structure, and a bucket of the shape. Two calls with the
// same key are expected to have the same fastest config.
#pragma once

#include <flexjit/types.h>

#include "kernels/Variant.h"

#include <cstdint>
#include <string>

namespace flexjit::tune {

struct DeviceIdentity {
  std::string name;  // "NVIDIA H100 80GB HBM3"
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  std::string str() const;  // "NVIDIA H100 80GB HBM3 (cc 9.0, 132 SMs)"
  bool operator==(const DeviceIdentity&) const = default;
};

// The shape bucket: each sequence length rounded up to a power of two (at least 16; "any" when
// the caller's length is unknown), and the block mask's sparse block size ("none" without a
// block mask). Batch and heads are not bucketed: they scale the grid, not the best tile.
//   "q4096 kv4096 mask128x128"
std::string shape_bucket(const kernels::InputFacts& facts);
// A sequence length's bucket: the next power of two, at least 16; -1 (unknown) stays -1.
int64_t length_bucket(int64_t seqlen);

struct TuningKey {
  DeviceIdentity device;
  // The kernel description without its config (variant chosen, problem flags as planned):
  // "forward/sm80_mma sm_90a bf16 d=128/128 gqa=1 divisible=0 full_blocks=1".
  std::string kernel;
  std::string mods_hash;  // Mods::hash() as 16 hex digits (structure only: values not included)
  DType dtype = DType::BF16;
  int head_dim_qk = 0, head_dim_v = 0, gqa_ratio = 1;
  std::string bucket;
  // The config values the caller fixed ("num_warps=4"; empty: none): a search under them
  // varies the rest only, so its winner is stored apart from an unconstrained one.
  std::string fixed;

  // One line, the record's identity in the tuning file:
  // "NVIDIA H100 80GB HBM3|9.0|132|forward/sm80_mma sm_90a ...|mods 5f1e...|bf16|128/128|gqa1|
  //  q4096 kv4096 mask128x128|fixed none"
  std::string str() const;
  bool operator==(const TuningKey&) const = default;
};

// The key of a planned step: `problem` with its variant set (its config is dropped).
TuningKey make_key(const DeviceIdentity& device, const kernels::KernelDesc& problem,
                   uint64_t mods_hash, const kernels::InputFacts& facts,
                   const kernels::Params& fixed = {});

}  // namespace flexjit::tune
