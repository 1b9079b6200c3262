// flexjit: emit, compile, inspect, run and cache FlexAttention kernels.
#include <flexjit/error.h>

#include "flexjit/Commands.h"
#include "util/Suggest.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

namespace {

// The subcommands of `app`, by name.
std::vector<std::string> subcommand_names(CLI::App& app) {
  std::vector<std::string> names;
  for (CLI::App* s : app.get_subcommands([](CLI::App*) { return true; }))
    names.push_back(s->get_name());
  return names;
}

CLI::App* find_subcommand(CLI::App& app, const std::string& name) {
  for (CLI::App* s : app.get_subcommands([](CLI::App*) { return true; })) {
    if (s->get_name() == name) return s;
  }
  return nullptr;
}

// A mistyped subcommand or flag in the user's terms, with the closest match: "unknown
// subcommand 'emti' (did you mean 'emit'?); the subcommands are: ..." where CLI11 says only "A
// subcommand is required", and "unknown flag '--head-dm' for 'flexjit compile' (did you mean
// '--head-dim'?)" where it says "The following arguments were not expected". nullopt when the
// command line has no such mistake (CLI11's own message is then the right one).
std::optional<std::string> typo_message(CLI::App& app, int argc, char** argv) {
  CLI::App* cmd = &app;
  std::string path = "flexjit";
  bool expects_subcommand = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.rfind("--", 0) == 0) {
      const std::string flag = arg.substr(0, arg.find('='));
      if (cmd->get_option_no_throw(flag) != nullptr || flag == "--help") continue;
      std::vector<std::string> flags = {"--help"};
      for (CLI::Option* o : cmd->get_options()) {
        for (const std::string& l : o->get_lnames())
          flags.push_back("--" + l);
      }
      return fmt::format("unknown flag '{}' for '{}'{}; '{} --help' lists its flags", flag, path,
                         flexjit::did_you_mean(flag, flags), path);
    }
    if (arg[0] == '-') continue;  // a short flag or a negative number: CLI11 judges those
    if (CLI::App* sub = find_subcommand(*cmd, arg)) {
      cmd = sub;
      path += " " + arg;
      expects_subcommand = !sub->get_subcommands([](CLI::App*) { return true; }).empty();
      continue;
    }
    if (expects_subcommand) {
      const std::vector<std::string> names = subcommand_names(*cmd);
      return fmt::format("unknown subcommand '{}' for '{}'{}; the subcommands are: {}", arg, path,
                         flexjit::did_you_mean(arg, names), fmt::join(names, ", "));
    }
  }
  if (expects_subcommand) {  // CLI11: "A subcommand is required"
    return fmt::format("'{}' needs a subcommand: {}", path,
                       fmt::join(subcommand_names(*cmd), ", "));
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "flexjit: a JIT compiler for FlexAttention-style attention kernels.\n\n"
      "Examples:\n"
      "  flexjit mods list\n"
      "  flexjit emit --score-mod alibi --mask-mod causal --arch sm_90a -o fwd.cu\n"
      "  flexjit compile --mods softcap_causal --dtype f16 --head-dim 64 --arch sm_80\n"
      "  flexjit kernels\n"
      "  flexjit cache stats --json\n"
      "  flexjit bench --compile --arch sm_90a\n"
      "  flexjit mask show --mask-mod causal --seqlen 4096\n"
      "  flexjit tune --manifest examples/tune/standard_manifest.json --arch sm_90a\n",
      "flexjit"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("flexjit ") + FLEXJIT_VERSION_STRING);
  flexjit::cli::register_mods(app);
  flexjit::cli::register_emit(app);
  flexjit::cli::register_compile(app);
  flexjit::cli::register_kernels(app);
  flexjit::cli::register_cache(app);
  flexjit::cli::register_bench(app);
  flexjit::cli::register_mask(app);
  flexjit::cli::register_run(app);
  flexjit::cli::register_tune(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0) {
      if (const std::optional<std::string> typo = typo_message(app, argc, argv)) {
        std::fprintf(stderr, "flexjit: %s\n", typo->c_str());
        return 1;
      }
    }
    int code = app.exit(e);
    return code == 0 ? 0 : 1;
  } catch (const flexjit::Error& e) {
    std::fprintf(stderr, "flexjit: %s\n", e.what());
    return 1;
  } catch (const flexjit::InternalError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flexjit: unexpected error: %s\n", e.what());
    return 2;
  }
  return 0;
}
