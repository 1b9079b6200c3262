// Kernel families as data: each family registers one FamilyInfo, declared in its own folder
// (kernels/<family>/), that says everything the layers above need to know about it — its name,
// the workload kind whose plan runs it, whether a math mode applies, the config keys a caller
// may set, and how a kernel query becomes its problem. The kernel API (emit_kernel,
// compile_kernel), the tuner's manifests, the CLI and the Python module read these records and
// hold no per-family switch (docs/kernels/README.md, "How to add a family").
//
//   FamilyInfo f;
//   f.family = Family::DecodeCombine;
//   f.name = "decode_combine";
//   f.kind = "decode";
//   f.config_keys = {{"num_warps", "warps per CTA", 1, 32}};
//   f.problem = [](const KernelQuery& q, const cuda::Arch& arch) { return ...; };
//   Families::global().add(std::move(f));  // built-ins: kernels/builtins/Builtins.cpp
#pragma once

#include <flexjit/attention.h>
#include <flexjit/kernel.h>

#include "kernels/KernelDesc.h"

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flexjit::kernels {

// One config key of a family that a caller may set (BlockConfig, `--param`, Python's config
// dict): the name its variants' configs use, a line for listings and errors, and the values
// the family accepts (a variant narrows them further in its validate()).
struct ConfigKey {
  std::string name;  // "num_splits": [a-z0-9_]+
  std::string doc;   // "KV splits (0: from the SM count and the KV length)"
  int64_t min = 1;
  int64_t max = INT32_MAX;
  // A launch parameter only: the source is the same for every value (the one of 0), so one
  // kernel serves them all (decode_split's num_splits; a manifest warms it once).
  bool launch_only = false;
};

// The config keys every tiled family shares, which BlockConfig has as fields.
ConfigKey block_m_key();
ConfigKey block_n_key();
ConfigKey num_warps_key();
ConfigKey num_stages_key();

// A later step of a plan that an earlier step's complete description changes
// (FamilyInfo::changes_later): the step of `family` runs `variant` with `overrides` instead of its
// own selection and config.
struct StepChange {
  Family family = Family::Forward;
  std::string variant;
  Params overrides;
};

struct FamilyInfo {
  Family family = Family::Forward;
  std::string name;     // "decode_split": [a-z0-9_]+, the family's name in descriptions
  std::string summary;  // one line: what its kernels compute
  // The workload kind whose plan runs this family ("forward", "backward", "decode": a manifest
  // entry's "kind", docs/tuning.md); the families of one kind run in registration order. Empty:
  // no kind of its own (block_mask: built for any workload whose mods have a mask_mod).
  std::string kind;
  // Whether its kernels evaluate a score_mod, so that a MathMode applies (the problem flag
  // fast_math, kernels/MathMode.h). KernelQuery::math != Auto is refused for the others.
  bool math = false;
  // What a caller's BlockConfig may set for it; config_overrides() keeps these and drops the
  // rest. Empty: nothing (its variants' defaults always).
  std::vector<ConfigKey> config_keys;
  // A manifest workload of its kind may give "page_size": it runs on a paged KV cache
  // (KernelQuery::page_size; decode_split).
  bool kv_pages = false;
  // Built for every workload whose mods have a mask_mod, whatever its kind (block_mask: the
  // block mask such calls take, made by create_block_mask); its problem reads the query's
  // block_size. A manifest warms it for such workloads.
  bool for_mask_mod = false;
  // How a complete step of this family changes a later step of its kind's plan (nullopt: it
  // does not; null: never): backward_dkdv with dq_atomic = 1 adds dQ itself, and the plan's
  // backward_dq step becomes the convert of its fp32 accumulator. The backward plan
  // (runtime/Backward.cpp) and a manifest's warm-up read it.
  std::function<std::optional<StepChange>(const KernelDesc& done)> changes_later;
  // The problem (a description without variant and config) of a kernel query (include/flexjit/
  // kernel.h) for `arch`: what emit_kernel / compile_kernel complete, and what a manifest's
  // workload asks of the family (its query: divisible = false, full_blocks = the mask's, the
  // shape's seqlen_q, the workload's page_size). UnsupportedError for a query value out of range.
  std::function<KernelDesc(const KernelQuery&, const cuda::Arch&)> problem;

  bool takes(std::string_view key_name) const;
  const ConfigKey* key(std::string_view key_name) const;
};

// The registered families. Built-in ones are registered on first use
// (register_builtin_families); anyone may add more before the first call that should see them.
// Records live as long as the process (pointers to them stay valid).
class Families {
 public:
  static Families& global();

  // UnsupportedError for a name that is not [a-z0-9_]+, an id or name already registered, or a
  // record without a problem function.
  const FamilyInfo& add(FamilyInfo info);
  const FamilyInfo* find(Family family) const;
  const FamilyInfo* find(std::string_view name) const;
  // The record of a registered family; InternalError otherwise (an id made up in the code).
  const FamilyInfo& get(Family family) const;
  // The record named `name`, or UnsupportedError listing the families (and the closest name).
  const FamilyInfo& get(std::string_view name) const;
  std::vector<const FamilyInfo*> all() const;  // registration order
  // The families of a workload kind, in registration (plan) order; empty for an unknown kind.
  std::vector<const FamilyInfo*> of_kind(std::string_view kind) const;
  std::vector<std::string> kinds() const;  // the distinct non-empty kinds, registration order
  std::vector<std::string> names() const;
  // Every config key some family takes, each once, in registration order.
  std::vector<ConfigKey> config_keys() const;

  Families() = default;
  Families(const Families&) = delete;
  Families& operator=(const Families&) = delete;

 private:
  mutable std::mutex mu_;
  std::deque<FamilyInfo> families_;  // a deque: records never move
};

// Registers flexjit's own families (kernels/builtins/Builtins.cpp); called once by
// Families::global().
void register_builtin_families(Families& families);

// The config overrides a caller's public BlockConfig asks of `family` — the one conversion from
// the public config to a kernel config (the runtime, the kernel API and the CLI all use it):
//   - the fields block_m, block_n, num_warps, num_stages: nonzero ones (zero: the default);
//   - `params`, by name, as given (a key no registered family takes is an UnsupportedError with
//     the keys there are; a key also set through a field, with another value, is one too);
//   - the deprecated fields num_splits, q_tiles (nonzero ones) and persistent (1: on, -1: off).
// Kept: the keys `family` takes (config_keys), range-checked (UnsupportedError naming the key,
// the value, the family and the range); the others are left to the call's other families.
// Negative fields are an UnsupportedError.
Params config_overrides(const BlockConfig& config, const FamilyInfo& family);
Params config_overrides(const BlockConfig& config, Family family);

}  // namespace flexjit::kernels
