// What every companion kernel's variant states alike (kernels::Variant::companions;
// docs/kernels/README.md "Companion kernels"): no mods reach it, it has no config keys (one
// kernel per description), its source is the common templates and one template of its own, and
// its validate() is its unsupported() plus the empty config. A variant adds its name, summary,
// problem checks, entry points, generate() and launches().
#pragma once

#include <flexjit/error.h>

#include "kernels/Variant.h"
#include "util/Embedded.h"

#include <fmt/format.h>

#include <string>
#include <vector>

namespace flexjit::kernels {

template <Family F, typename Inputs>
class CompanionVariant : public FamilyVariant<F, Inputs> {
 public:
  // `template_name`: its template in templates/, spliced after the mods (none reach it).
  explicit CompanionVariant(const char* template_name) : template_name_(template_name) {}

  void validate(const KernelDesc& desc) const final {
    if (auto r = this->unsupported(desc, {})) throw UnsupportedError(*r);
    if (!desc.config.empty()) {
      throw UnsupportedError(fmt::format("{} takes no config values; got '{}'",
                                         desc.family_variant(), desc.config.str()));
    }
  }
  Params default_config(const KernelDesc&) const final { return {}; }
  std::vector<Params> config_space(const KernelDesc&) const final { return {Params{}}; }
  std::vector<TemplateText> templates() const final {
    std::vector<TemplateText> t = common_templates();
    t.push_back({template_name_, embedded::template_text(template_name_), false});
    return t;
  }
  Mods kernel_mods(const Mods&) const final { return Mods{}; }
  unsigned smem_bytes(const KernelDesc&) const override { return 0; }

 private:
  const char* template_name_;
};

}  // namespace flexjit::kernels
