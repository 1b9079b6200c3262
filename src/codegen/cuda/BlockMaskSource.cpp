#include "codegen/cuda/BlockMaskSource.h"

#include <flexjit/error.h>

#include "codegen/cuda/ModCodegen.h"
#include "codegen/cuda/SourceAssembly.h"
#include "codegen/cuda/SourceWriter.h"
#include "ir/IR.h"
#include "ir/Visitor.h"
#include "util/Embedded.h"

#include <fmt/format.h>

#include <unordered_set>

namespace flexjit::cuda {

std::string BlockMaskSpec::str() const {
  return fmt::format("blocks {}x{}, {} warps", q_block, kv_block, num_warps);
}

Mods mask_only(const Mods& mods) {
  if (!mods.mask_mod.defined()) {
    throw CompileError(fmt::format("create_block_mask needs a mask_mod; mods '{}' have none",
                                   mods.name.empty() ? "<inline>" : mods.name));
  }
  std::unordered_set<const ir::BufferDecl*> buffers;
  std::unordered_set<const ir::ParamDecl*> params;
  ir::for_each_node(mods.mask_mod, [&](const Expr& e) {
    if (e->buffer) buffers.insert(e->buffer.get());
    if (e->param) params.insert(e->param.get());
  });
  Mods m;
  m.mask_mod = mods.mask_mod;
  m.name = mods.name;
  for (const Buffer& b : mods.buffers) {
    if (buffers.count(b.decl().get())) m.buffers.push_back(b);
  }
  for (const Param& p : mods.params) {
    if (params.count(p.decl().get())) m.params.push_back(p);
  }
  return m;
}

GeneratedSource generate_block_mask(const Mods& mods, const BlockMaskSpec& spec) {
  if (spec.q_block < 1 || spec.q_block > 4096 || spec.kv_block < 1 || spec.kv_block > 4096) {
    throw RuntimeError(fmt::format("block mask block sizes must be in [1, 4096]; got {}x{}",
                                   spec.q_block, spec.kv_block));
  }
  if (spec.num_warps < 1 || spec.num_warps > 32) {
    throw RuntimeError(fmt::format("block mask warps must be in [1, 32]; got {}", spec.num_warps));
  }
  const Mods m = mask_only(mods);
  m.check();

  SourceWriter config;
  config.line(fmt::format("// Compile-time configuration: {}", spec.str()));
  config.line(
      fmt::format("struct FjBlockMaskConfig {{ static constexpr int kQBlock = {}, kKvBlock = {}, "
                  "kNumWarps = {}; }};",
                  spec.q_block, spec.kv_block, spec.num_warps));

  SourceWriter body;
  body.line("");
  section(body, "flexjit_abi.h", embedded::template_text("flexjit_abi.h"));
  section(body, "prelude.cuh", embedded::template_text("prelude.cuh"));
  section(body, "config", config.str());
  section(body, "mods", generate_mod_functions(m));
  section(body, "block_mask.cuh", embedded::template_text("block_mask.cuh"));

  SourceHeader header;
  header.what = fmt::format("block-mask builder `{}` + `{}`", kBlockMaskClassifyKernel,
                            kBlockMaskIndexKernel);
  header.spec = spec.str();
  header.mods = &m;
  header.mods_label = "mask";
  return assemble_source(kBlockMaskClassifyKernel, header, body.str());
}

}  // namespace flexjit::cuda
