#include "codegen/cuda/BlockMaskSource.h"

#include <flexjit/error.h>

#include "codegen/cuda/ModCodegen.h"
#include "codegen/cuda/SourceWriter.h"
#include "ir/IR.h"
#include "ir/Visitor.h"
#include "util/Embedded.h"
#include "util/Sha256.h"

#include <fmt/format.h>

#include <unordered_set>

namespace flexjit::cuda {

namespace {

// Text safe inside a `//` comment (see ForwardSource.cpp).
std::string comment_safe(std::string_view line) {
  std::string s(line);
  for (char& c : s) {
    if (c == '\\' || static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
      c = '?';
    }
  }
  return s;
}

void section(SourceWriter& w, std::string_view title, std::string_view text) {
  w.line(fmt::format("// ---- {} ----", title));
  w.raw(text);
  w.line("");
}

}  // namespace

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

  GeneratedSource out;
  out.kernel_name = kBlockMaskClassifyKernel;
  out.options = {"-std=c++17"};
  out.source_key = sha256_hex(body.str());

  // Parameter defaults are kernel arguments, not source: leave them out of the comment.
  Mods shown = m;
  for (Param& p : shown.params) {
    auto decl = std::make_shared<ir::ParamDecl>(*p.decl());
    decl->default_value.reset();
    p = Param(std::move(decl));
  }
  SourceWriter head;
  head.line(fmt::format("// flexjit {} block-mask builder `{}` + `{}`, generated for NVRTC {}",
                        FLEXJIT_VERSION, kBlockMaskClassifyKernel, kBlockMaskIndexKernel,
                        nvrtc_version_string()));
  head.line("// spec: " + spec.str());
  head.line("// mask (parameter values are kernel arguments):");
  const std::string text = shown.to_text();
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    head.line("//   " + comment_safe(std::string_view(text).substr(start, end - start)));
    start = end + 1;
  }
  head.line("// source key: " + out.source_key);
  out.source = head.str() + body.str();
  return out;
}

}  // namespace flexjit::cuda
