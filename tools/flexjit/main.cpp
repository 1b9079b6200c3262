// flexjit: emit, compile, inspect, run and cache FlexAttention kernels.
#include <flexjit/error.h>

#include "flexjit/Commands.h"

#include <fmt/format.h>

#include <cstdio>
#include <exception>

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
