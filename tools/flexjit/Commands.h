// The subcommands of the flexjit CLI. Each registers itself on the app; its callback runs the
// command and throws flexjit::Error for user errors (main prints them and exits with 1).
#pragma once

#include <CLI/CLI.hpp>

namespace flexjit::cli {

void register_emit(CLI::App& app);
void register_compile(CLI::App& app);  // compile and inspect
void register_kernels(CLI::App& app);
void register_cache(CLI::App& app);
void register_bench(CLI::App& app);
void register_mods(CLI::App& app);
void register_mask(CLI::App& app);  // mask show | bench
void register_run(CLI::App& app);
void register_tune(CLI::App& app);

}  // namespace flexjit::cli
