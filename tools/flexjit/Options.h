// Options shared by the subcommands that build a kernel: which mods, dtype, head dims, GQA,
// block configuration and target arch.
#pragma once

#include <flexjit/mods.h>

#include "codegen/cuda/ForwardSpec.h"

#include <CLI/CLI.hpp>

#include <string>

namespace flexjit::cli {

struct KernelOptions {
  std::string mods;       // --mods: standard name, .fx file or inline text
  std::string score_mod;  // --score-mod: same forms; must define a score_mod
  std::string mask_mod;   // --mask-mod: same forms; must define a mask_mod
  std::string dtype = "bf16";
  int head_dim = 128;
  int head_dim_v = 0;  // 0: same as head_dim
  int gqa = 1;
  std::string arch;                                     // empty: from the GPU, else an error
  int block_m = 0, block_n = 0, warps = 0, stages = 0;  // 0: the default for the shape
  bool divisible = false;
  bool no_full_blocks = false;
};

// Registers the options on a subcommand.
void add_kernel_options(CLI::App& app, KernelOptions& o);

// Resolves --mods / --score-mod / --mask-mod into one Mods (combined); defaults to noop.
Mods resolve(const KernelOptions& o);

// Builds and validates the spec; the arch comes from --arch or the current GPU.
cuda::ForwardSpec make_spec(const KernelOptions& o);

}  // namespace flexjit::cli
