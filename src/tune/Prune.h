// Pruning a variant's config space before anything is compiled: every config that cannot work
// for this problem, these inputs and this device is dropped with the reason, which the tuning
// log (FLEXJIT_LOG=tune, FLEXJIT_PRINT_AUTOTUNING=1) and `flexjit tune` show.
//
// Works on the Variant interface alone (config_space, validate, resolve_config, specialize,
// smem_bytes), so a family that lands later is pruned the same way. A config is pruned when:
//   - it contradicts a value the caller fixed (a nonzero BlockConfig field);
//   - the variant rejects it (validate(): the variant's own limits, shared memory per arch);
//   - its dynamic shared memory exceeds the device's opt-in limit (when a device is known);
//   - a tile does not fit the block mask's sparse blocks: block_n must divide the kv block,
//     the variant's mask_q_unit (block_m, or 64 for forward/sm90a_wgmma's 192-row tiles read
//     through the union schedule) the q block;
//   - resolve_config() does not keep it as given (the variant would run another config);
//   - it repeats an earlier config.
#pragma once

#include "kernels/Variant.h"

#include <string>
#include <vector>

namespace flexjit::tune {

struct PrunedConfig {
  kernels::Params config;
  std::string reason;  // one sentence: "needs 229376 bytes of shared memory; sm_89 allows 101376"
};

struct CandidateSet {
  std::vector<kernels::Params> candidates;  // config_space order, the default first
  std::vector<PrunedConfig> pruned;
  kernels::Params default_config;  // what the call runs untuned (resolved with the caller's)
};

// `problem` has its variant set and no config. `device_smem_limit` is the device's opt-in
// shared memory per block (0: only the arch's limit, through validate()). `caller` holds the
// config values the caller fixed. Throws what resolve_config throws for the default config
// itself (the call could not run untuned either).
CandidateSet prune_configs(const kernels::Variant& variant, const kernels::KernelDesc& problem,
                           const kernels::InputFacts& facts, const kernels::Params& caller = {},
                           int device_smem_limit = 0);

}  // namespace flexjit::tune
