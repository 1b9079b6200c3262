// flexjit kernels: the registered kernel families and variants, in selection order.
#include <flexjit/kernel.h>

#include "flexjit/Commands.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <iostream>

namespace flexjit::cli {

void register_kernels(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "kernels",
      "List the kernel families and their variants, in the order they are selected\n\n"
      "Examples:\n"
      "  flexjit kernels\n"
      "  flexjit kernels --json\n"
      "  FLEXJIT_LOG=kernels flexjit compile --mods causal --arch sm_80   # why a variant");
  static bool json = false;
  cmd->add_flag("--json", json, "Print JSON");
  cmd->callback([] {
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
