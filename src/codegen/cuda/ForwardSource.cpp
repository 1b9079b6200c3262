#include "codegen/cuda/ForwardSource.h"

#include "codegen/cuda/ModCodegen.h"
#include "codegen/cuda/SourceWriter.h"
#include "ir/IR.h"
#include "util/Embedded.h"
#include "util/Sha256.h"

#include <fmt/format.h>
#include <nvrtc.h>

namespace flexjit::cuda {

namespace {

constexpr const char* kKernelName = "flexjit_forward";

std::string_view element_type(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return "fj_bf16";
    case DType::F16:
      return "fj_f16";
    case DType::F32:
      return "float";
    default:
      break;
  }
  FJ_ASSERT(false, "element_type of a dtype ForwardSpec::validate rejects");
}

// The mods as `.fx` text for the comment block, without parameter default values: a default is
// a kernel argument, and the source (hence the cache key) must not change with it.
std::string mods_text_without_defaults(const Mods& mods) {
  Mods m = mods;
  for (Param& p : m.params) {
    auto decl = std::make_shared<ir::ParamDecl>(*p.decl());
    decl->default_value.reset();
    p = Param(std::move(decl));
  }
  return m.to_text();
}

// Text safe inside a `//` comment: no control characters, and no backslash that could splice
// the next source line into the comment.
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

std::string nvrtc_version_string() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return fmt::format("{}.{}", major, minor);
}

ForwardTemplates embedded_forward_templates() {
  return {embedded::template_text("flexjit_abi.h"), embedded::template_text("prelude.cuh"),
          embedded::template_text("forward_sm80.cuh"), embedded::template_text("mma_sm80.cuh")};
}

std::string generate_config(const Mods& mods, const ForwardSpec& spec) {
  SourceWriter w;
  w.line(fmt::format("// Compile-time configuration: {}", spec.str()));
  {
    auto s = w.block("struct FjConfig", ";");
    w.line(fmt::format(
        "static constexpr int kBlockM = {}, kBlockN = {}, kNumWarps = {}, "
        "kNumStages = {};",
        spec.config.block_m, spec.config.block_n, spec.config.num_warps, spec.config.num_stages));
    w.line(fmt::format("static constexpr int kHeadDimQK = {}, kHeadDimV = {}, kGqaRatio = {};",
                       spec.head_dim_qk, spec.head_dim_v, spec.gqa_ratio));
    auto b = [](bool v) { return v ? "true" : "false"; };
    w.line(fmt::format("static constexpr bool kIsDivisible = {}, kHasFullBlocks = {};",
                       b(spec.is_divisible), b(spec.has_full_blocks)));
    w.line(fmt::format("static constexpr bool kHasScoreMod = {}, kHasMaskMod = {};",
                       b(has_score_mod(mods)), b(has_mask_mod(mods))));
    w.line(fmt::format("using Element = {};", element_type(spec.dtype)));
  }
  return w.str();
}

GeneratedSource generate_forward(const Mods& mods, const ForwardSpec& spec) {
  return generate_forward(mods, spec, embedded_forward_templates());
}

GeneratedSource generate_forward(const Mods& mods, const ForwardSpec& spec,
                                 const ForwardTemplates& templates) {
  spec.validate();
  mods.check();

  SourceWriter body;
  body.line("");
  section(body, "flexjit_abi.h", templates.abi);
  section(body, "prelude.cuh", templates.prelude);
  section(body, "config", generate_config(mods, spec));
  section(body, "mods", generate_mod_functions(mods));
  if (!templates.mma.empty()) section(body, "mma_sm80.cuh", templates.mma);
  section(body, "forward_sm80.cuh", templates.kernel);

  GeneratedSource out;
  out.kernel_name = kKernelName;
  out.options = {"-std=c++17"};
  out.source_key = sha256_hex(body.str());

  SourceWriter head;
  head.line(fmt::format("// flexjit {} forward kernel `{}`, generated for NVRTC {}, {}",
                        FLEXJIT_VERSION, kKernelName, nvrtc_version_string(), spec.arch.str()));
  head.line("// spec: " + spec.str());
  head.line("// mods (parameter values are kernel arguments):");
  const std::string text = mods_text_without_defaults(mods);
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    head.line("//   " + comment_safe(std::string_view(text).substr(start, end - start)));
    start = end + 1;
  }
  if (text.empty()) head.line("//   (none)");
  head.line("// source key: " + out.source_key);
  out.source = head.str() + body.str();
  return out;
}

}  // namespace flexjit::cuda
