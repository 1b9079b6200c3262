// flexjit kernels: the registered kernel families and variants, in selection order.
#include <flexjit/kernel.h>

#include "flexjit/Commands.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <iostream>

namespace flexjit::cli {

namespace {

// `flexjit kernels --families`: every registered family and the config keys it takes.
void print_families(bool json) {
  const std::vector<KernelFamilyInfo> all = kernel_families();
  if (json) {
    nlohmann::json j = nlohmann::json::array();
    for (const KernelFamilyInfo& f : all) {
      nlohmann::json keys = nlohmann::json::array();
      for (const KernelConfigKey& k : f.config_keys)
        keys.push_back({{"name", k.name}, {"doc", k.doc}, {"min", k.min}, {"max", k.max}});
      j.push_back({{"family", f.name},
                   {"summary", f.summary},
                   {"kind", f.kind},
                   {"math", f.math},
                   {"config_keys", keys}});
    }
    std::cout << j.dump(2) << "\n";
    return;
  }
  for (const KernelFamilyInfo& f : all) {
    fmt::print("{}\n  {}\n  workload kind: {}; math mode: {}\n", f.name, f.summary,
               f.kind.empty() ? "none (built for a mask_mod)" : f.kind,
               f.math ? "applies" : "does not apply");
    if (f.config_keys.empty()) fmt::print("  config keys: none\n");
    for (const KernelConfigKey& k : f.config_keys)
      fmt::print("  {} ({} to {}): {}\n", k.name, k.min, k.max, k.doc);
  }
}

}  // namespace

void register_kernels(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "kernels",
      "List the kernel families and their variants, in the order they are selected\n\n"
      "Examples:\n"
      "  flexjit kernels\n"
      "  flexjit kernels --json\n"
      "  flexjit kernels --families\n"
      "  FLEXJIT_LOG=kernels flexjit compile --mods causal --arch sm_80   # why a variant");
  static bool json = false;
  static bool families = false;
  cmd->add_flag("--json", json, "Print JSON");
  cmd->add_flag("--families", families,
                "List the families instead: workload kind, math mode, config keys (--param)");
  cmd->callback([] {
    if (families) {
      print_families(json);
      return;
    }
    const std::vector<KernelVariantInfo> all = kernel_variants();
    if (json) {
      nlohmann::json j = nlohmann::json::array();
      for (const KernelVariantInfo& v : all) {
        j.push_back({{"family", v.family},
                     {"variant", v.name},
                     {"summary", v.summary},
                     {"auto_select", v.auto_select},
                     {"priority", v.priority},
                     {"experimental", v.experimental},
                     {"templates", v.templates},
                     {"entry_points", v.entry_points}});
      }
      std::cout << j.dump(2) << "\n";
      return;
    }
    for (const KernelVariantInfo& v : all) {
      fmt::print("{}/{}{}\n  {}\n  templates: {}\n  kernels: {}\n", v.family, v.name,
                 !v.auto_select   ? "  (only when named)"
                 : v.experimental ? "  (experimental: FLEXJIT_ENABLE_VARIANTS)"
                                  : "",
                 v.summary, fmt::join(v.templates, ", "), fmt::join(v.entry_points, ", "));
    }
  });
}

}  // namespace flexjit::cli
