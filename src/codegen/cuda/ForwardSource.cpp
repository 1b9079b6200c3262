#include "codegen/cuda/ForwardSource.h"

#include "codegen/cuda/ModCodegen.h"
#include "codegen/cuda/SourceAssembly.h"
#include "codegen/cuda/SourceWriter.h"
#include "ir/IR.h"
#include "util/Embedded.h"

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

  SourceHeader header;
  header.what = fmt::format("forward kernel `{}`", kKernelName);
  header.target = spec.arch.str();
  header.spec = spec.str();
  header.mods = &mods;
  return assemble_source(kKernelName, header, body.str());
}

}  // namespace flexjit::cuda
