// flexjit mods list | show NAME | check SPEC
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "flexjit/Commands.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <iostream>

namespace flexjit::cli {

void register_mods(CLI::App& app) {
  auto* cmd = app.add_subcommand("mods",
                                 "List, show and check mods\n\nExamples:\n"
                                 "  flexjit mods list --json\n"
                                 "  flexjit mods show alibi\n"
                                 "  flexjit mods check my.fx\n"
                                 "  flexjit mods check 'mask_mod = q_idx >= kv_idx'");
  cmd->require_subcommand(1);

  auto* list = cmd->add_subcommand("list", "The standard mods shipped with flexjit");
  static bool list_json = false;
  list->add_flag("--json", list_json, "Print JSON");
  list->callback([] {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& name : standard_mod_names()) {
      Mods m = standard_mods(name);
      if (list_json) {
        j.push_back({{"name", name},
                     {"score_mod", m.score_mod.defined() ? m.score_mod.str() : ""},
                     {"mask_mod", m.mask_mod.defined() ? m.mask_mod.str() : ""},
                     {"sink_mod", m.sink_mod.defined() ? m.sink_mod.str() : ""}});
        continue;
      }
      fmt::print("{:<22} {}{}{}{}\n", name, m.score_mod.defined() ? "score_mod " : "",
                 m.mask_mod.defined() ? "mask_mod " : "", m.sink_mod.defined() ? "sink_mod " : "",
                 m.buffers.empty() && m.params.empty() ? "" : "(captures)");
    }
    if (list_json) std::cout << j.dump(2) << "\n";
  });

  auto* show = cmd->add_subcommand("show", "Print a standard mod's source");
  static std::string show_name;
  show->add_option("name", show_name, "Standard mod name")->required();
  show->callback([] { std::cout << standard_mod_source(show_name); });

  auto* check = cmd->add_subcommand("check", "Parse and type-check mods; print them normalized");
  static std::string check_spec;
  check->add_option("mods", check_spec, "Standard name, .fx file or inline text")->required();
  check->callback([] {
    Mods m = resolve_mods(check_spec);
    std::cout << m.to_text();
    fmt::print("// ok: structural hash {:016x}\n", m.hash());
  });
}

}  // namespace flexjit::cli
