// The registry of kernel variants and the one place where a variant is selected.
//
// Selection, for a problem (a KernelDesc without variant and config) and the call's InputFacts:
//   - a variant named by the caller is used if it exists and supports the problem, else
//     UnsupportedError says why (unknown: the list of the family's variants);
//   - otherwise the auto-selected variants of the family are tried by priority, and the first
//     that supports the problem wins (excluded variants and experimental ones not enabled are
//     passed over); the reasons of those passed over are kept
//     (Selection::skipped) and logged under FLEXJIT_LOG=kernels, so a fallback is never silent;
//   - none: UnsupportedError listing every variant's reason.
//
// The built-in variants (kernels/builtins/Builtins.cpp) are registered when the registry is first
// used; anyone may add more (the test suite registers the naive reference kernel this way).
#pragma once

#include "kernels/Variant.h"

#include <flexjit/error.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace flexjit::kernels {

struct Selection {
  const Variant* variant = nullptr;
  // Variants passed over, with why: "forward/sm90a_wgmma: needs sm_90a; the target is sm_80".
  std::vector<std::string> skipped;
  bool forced = false;      // named by the caller
  std::string str() const;  // "forward/sm80_mma (passed over: ...)" for logs and the CLI
};

class Registry {
 public:
  // The process-wide registry, holding the built-in variants.
  static Registry& global();

  // Adds a variant; UnsupportedError if its family already has one of that name. Variants live
  // as long as the registry.
  const Variant& add(std::unique_ptr<Variant> variant);
  // The variant of `family` named `name`, or null.
  const Variant* find(Family family, std::string_view name) const;
  // The same, or UnsupportedError listing the family's variants.
  const Variant& get(Family family, std::string_view name) const;
  // A family's variants, highest priority first (auto-selected before the others).
  std::vector<const Variant*> variants(Family family) const;
  std::vector<const Variant*> all() const;

  // Variants that automatic selection passes over ("forward/sm90a_wgmma"), e.g. to compare
  // families or to step around a variant that misbehaves; a caller may still name one. The
  // global registry starts with FLEXJIT_EXCLUDE_VARIANTS (a comma-separated list). An unknown
  // name is an UnsupportedError listing the registered variants.
  void set_excluded(const std::vector<std::string>& family_variants);
  std::vector<std::string> excluded() const;
  // Experimental variants that automatic selection may take (Variant::experimental); the global
  // registry starts with FLEXJIT_ENABLE_VARIANTS. Unknown names as for set_excluded.
  void set_enabled(const std::vector<std::string>& family_variants);
  std::vector<std::string> enabled() const;

  // Automatic selection also passes over a variant whose config has no parameter named in
  // `config_overrides` (e.g. num_warps, which sm80_mma has and sm90a_wgmma has not), saying so.
  Selection select(const KernelDesc& problem, const InputFacts& facts, std::string_view forced = {},
                   const Params& config_overrides = {}) const;

  // select(), then resolve(): the description a kernel is built from.
  KernelDesc complete(const KernelDesc& problem, const InputFacts& facts,
                      const Params& config_overrides = {}, std::string_view forced = {},
                      Selection* selection = nullptr) const;
  // `problem` completed by the variant that `selection` (select() of the same problem and
  // facts) chose: its config resolved with `config_overrides`, specialized to `facts` and
  // validated (UnsupportedError for a value the variant refuses or a key it does not have). What
  // completes a description once its variant is chosen: the autotuner selects a step's variant
  // once and completes its candidates and the step itself with it (tune/StepTuner.h).
  KernelDesc resolve(const Selection& selection, const KernelDesc& problem, const InputFacts& facts,
                     const Params& config_overrides = {}) const;

  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Variant>> variants_;
  std::vector<std::string> excluded_;
  std::vector<std::string> enabled_;
};

// The variant of `desc` (by family and name) as its family's class; InternalError if it is not
// registered or not of that family.
template <typename V>
const V& variant_as(const Registry& registry, const KernelDesc& desc) {
  const Variant* v = registry.find(desc.family, desc.variant);
  FJ_ASSERT(v != nullptr, "no registered variant " + desc.family_variant());
  const V* typed = dynamic_cast<const V*>(v);
  FJ_ASSERT(typed != nullptr, desc.family_variant() + " is not of the family's variant class");
  return *typed;
}

// Registers flexjit's own variants (kernels/builtins/Builtins.cpp); called once by
// Registry::global().
void register_builtin_variants(Registry& registry);

}  // namespace flexjit::kernels
