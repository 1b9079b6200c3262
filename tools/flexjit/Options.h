// Options shared by the subcommands that build a kernel: which kernel family and variant, which
// mods, dtype, head dims, GQA, block configuration and target arch — turned into a
// flexjit::KernelQuery (include/flexjit/kernel.h), which the library resolves to a complete
// kernel description the same way a runtime call does.
#pragma once

#include <flexjit/kernel.h>
#include <flexjit/mods.h>

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace flexjit::cli {

struct KernelOptions {
  std::string kernel = "forward";  // --kernel: forward | block_mask | decode_split | ...
  std::string variant;             // --variant: empty = chosen by the arch
  std::string mods;                // --mods: standard name, .fx file or inline text
  std::string score_mod;           // --score-mod: same forms; must define a score_mod
  std::string mask_mod;            // --mask-mod: same forms; must define a mask_mod
  std::string dtype = "bf16";
  int head_dim = 128;
  int head_dim_v = 0;  // 0: same as head_dim
  int gqa = 1;
  std::string arch;                                     // empty: from the GPU, else an error
  int block_m = 0, block_n = 0, warps = 0, stages = 0;  // 0: the default for the shape
  int block_size = 128;                                 // --kernel block_mask: tile size
  bool divisible = false;
  bool no_full_blocks = false;
  bool deterministic = false;  // backward_dkdv (and bench --backward): ordered buffer gradients
  int queries = 1;             // --kernel decode_split: query tokens per sequence
  int page_size = 0;           // --kernel decode_split: 0 contiguous K / V, else the page size
  bool kv_e4m3 = false;        // --kernel decode_split | forward: an e4m3 KV cache
  int splits = 0;              // --kernel decode_split: 0 = from the SM count and the KV length
  int q_tiles = 0;             // forward/sm90a_wgmma: query tiles per CTA (0: the default)
  int persistent = -1;         // forward/sm90a_wgmma: 1 persistent CTAs, 0 not (-1: the default)
  std::vector<std::string> params;  // --param KEY=VALUE: BlockConfig::params (kernel_families())
  std::string math = "auto";        // --math: auto | exact | approx (docs/math.md)
};

// Registers the options on a subcommand (`with_kernel`: also --kernel, --variant and
// --block-size, for the subcommands that emit or compile any family).
void add_kernel_options(CLI::App& app, KernelOptions& o, bool with_kernel = true);

// --math (auto | exact | approx; anything else is a parse error naming the three) into `value`,
// and its MathMode.
void add_math_option(CLI::App& app, std::string& value);
MathMode math_mode(const std::string& value);

// Resolves --mods / --score-mod / --mask-mod into one Mods (combined); defaults to noop.
Mods resolve(const KernelOptions& o);

// The query the options describe (checked by emit_kernel / compile_kernel).
KernelQuery make_query(const KernelOptions& o);
// The block config the options ask for: the tile fields (zeros for the defaults) and params from
// --splits, --q-tiles, --persistent and --param (Error for a --param that is not KEY=INT or names
// a key twice; the library checks the keys themselves).
BlockConfig block_config(const KernelOptions& o);

// User + system CPU time of this process so far, every thread (getrusage): what `compile` and
// `bench --first-call` report beside wall times, which another process's load inflates.
double process_cpu_seconds();

}  // namespace flexjit::cli
