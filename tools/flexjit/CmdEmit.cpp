// flexjit emit: print or write the CUDA source of a kernel (forward by default).
#include <flexjit/error.h>
#include <flexjit/kernel.h>

#include "flexjit/Commands.h"
#include "flexjit/Options.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iostream>

namespace flexjit::cli {

void register_emit(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "emit",
      "Emit the CUDA source of a kernel (no compilation)\n\nExamples:\n"
      "  flexjit emit --score-mod alibi --mask-mod causal --arch sm_90a -o fwd.cu\n"
      "  flexjit emit --mods 'param cap: f32 = 20.0; score_mod = cap * tanh(score / cap)' "
      "--arch sm_80\n"
      "  flexjit emit --mods my.fx --dtype f16 --head-dim 64 --arch sm_86\n"
      "  flexjit emit --kernel block_mask --mask-mod sliding_window --arch sm_90a");
  static KernelOptions opts;
  static std::string out;
  add_kernel_options(*cmd, opts);
  cmd->add_option("-o,--output", out, "Write the source here instead of stdout");
  cmd->callback([] {
    const KernelSource src = emit_kernel(resolve(opts), make_query(opts));
    if (out.empty()) {
      std::cout << src.source;
      return;
    }
    std::ofstream f(out, std::ios::binary);
    if (!f) throw Error(fmt::format("cannot write '{}'", out));
    f << src.source;
    if (!f.flush()) throw Error(fmt::format("cannot write '{}'", out));
    fmt::print(stderr, "wrote {} ({} lines, source key {}): {}\n", out,
               std::count(src.source.begin(), src.source.end(), '\n'), src.source_key.substr(0, 16),
               src.selection);
  });
}

}  // namespace flexjit::cli
