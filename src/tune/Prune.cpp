#include "tune/Prune.h"

#include <flexjit/error.h>

#include <fmt/format.h>

#include <algorithm>

namespace flexjit::tune {

namespace {

// Why `config` cannot run, or empty.
std::string prune_reason(const kernels::Variant& variant, const kernels::KernelDesc& problem,
                         const kernels::InputFacts& facts, const kernels::Params& caller,
                         int device_smem_limit, const kernels::Params& config) {
  for (const auto& [name, value] : caller.items()) {
    auto v = config.get(name);
    if (v && *v != value) {
      return fmt::format("the caller fixed {} = {} (this config has {})", name, value, *v);
    }
  }
  kernels::KernelDesc d = problem;
  d.config = config;
  variant.specialize(d, facts);
  try {
    variant.validate(d);
  } catch (const UnsupportedError& e) {
    return e.what();
  }
  const unsigned smem = variant.smem_bytes(d);
  if (device_smem_limit > 0 && smem > static_cast<unsigned>(device_smem_limit)) {
    return fmt::format("needs {} bytes of shared memory; the device allows {} per block", smem,
                       device_smem_limit);
  }
  // Each tile's rows inside one q block of the mask (the variant's unit: forward/sm90a_wgmma's
  // 192-row tiles need 64), its keys inside one kv block.
  const int64_t q_unit = variant.mask_q_unit(config);
  if (config.has("block_m") && facts.mask_q_block > 0 && q_unit > 0 &&
      facts.mask_q_block % q_unit != 0) {
    const int64_t bm = config.at("block_m");
    if (q_unit == bm) {
      return fmt::format("block_m = {} does not divide the block mask's sparse block of {}", bm,
                         facts.mask_q_block);
    }
    return fmt::format(
        "block_m = {} needs sparse blocks of a multiple of {} rows; the mask's are {}", bm, q_unit,
        facts.mask_q_block);
  }
  if (auto v = config.get("block_n"); v && facts.mask_kv_block > 0 && facts.mask_kv_block % *v) {
    return fmt::format("block_n = {} does not divide the block mask's sparse block of {}", *v,
                       facts.mask_kv_block);
  }
  try {
    const kernels::Params resolved = variant.resolve_config(problem, config, facts);
    if (!(resolved == config)) {
      return fmt::format("the variant resolves it to {} for these inputs", resolved.str());
    }
  } catch (const UnsupportedError& e) {
    return e.what();
  }
  return {};
}

}  // namespace

CandidateSet prune_configs(const kernels::Variant& variant, const kernels::KernelDesc& problem,
                           const kernels::InputFacts& facts, const kernels::Params& caller,
                           int device_smem_limit) {
  CandidateSet set;
  set.default_config = variant.resolve_config(problem, caller, facts);
  std::vector<kernels::Params> space = variant.config_space(problem);
  // The default first: it is the reference the others' outputs are compared with.
  space.insert(space.begin(), set.default_config);
  for (const kernels::Params& config : space) {
    if (std::find(set.candidates.begin(), set.candidates.end(), config) != set.candidates.end()) {
      if (!(config == set.default_config)) {
        set.pruned.push_back({config, "repeats an earlier candidate"});
      }
      continue;
    }
    std::string why = prune_reason(variant, problem, facts, caller, device_smem_limit, config);
    if (why.empty()) {
      set.candidates.push_back(config);
    } else if (config == set.default_config) {
      // The default runs whatever the limit says about it: the call would run it untuned.
      set.candidates.push_back(config);
    } else {
      set.pruned.push_back({config, std::move(why)});
    }
  }
  return set;
}

}  // namespace flexjit::tune
