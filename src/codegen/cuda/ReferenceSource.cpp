#include "codegen/cuda/ReferenceSource.h"

#include <flexjit/error.h>

#include "codegen/cuda/ModCodegen.h"
#include "codegen/cuda/SourceAssembly.h"
#include "codegen/cuda/SourceWriter.h"
#include "util/Embedded.h"

#include <fmt/format.h>

namespace flexjit::cuda {

namespace {

constexpr const char* kKernelName = "flexjit_reference_forward";

int dtype_code(DType d) {
  switch (d) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::BF16:
      return 2;
    default:
      break;
  }
  throw UnsupportedError(
      fmt::format("the reference kernel takes f32, f16 or bf16 inputs, not {}", to_string(d)));
}

}  // namespace

std::string ReferenceSpec::str() const {
  return fmt::format("{} d={}/{} gqa={}", to_string(dtype), head_dim_qk, head_dim_v, gqa_ratio);
}

GeneratedSource generate_reference(const Mods& mods, const ReferenceSpec& spec,
                                   const std::string& arch) {
  const int code = dtype_code(spec.dtype);
  if (spec.head_dim_qk <= 0 || spec.head_dim_v <= 0 || spec.gqa_ratio <= 0) {
    throw UnsupportedError(
        fmt::format("reference kernel: head dims and GQA ratio must be "
                    "positive ({})",
                    spec.str()));
  }
  mods.check();

  SourceWriter config;
  {
    auto s = config.block("struct FjReferenceConfig", ";");
    config.line(fmt::format(
        "static constexpr int kDType = {}, kHeadDimQk = {}, kHeadDimV = {}, kGqaRatio = {};", code,
        spec.head_dim_qk, spec.head_dim_v, spec.gqa_ratio));
  }

  SourceWriter body;
  body.line("");
  section(body, "flexjit_abi.h", embedded::template_text("flexjit_abi.h"));
  section(body, "prelude.cuh", embedded::template_text("prelude.cuh"));
  section(body, "config", config.str());
  section(body, "mods", generate_mod_functions(mods));
  section(body, "reference.cuh", embedded::template_text("reference.cuh"));

  SourceHeader header;
  header.what = fmt::format("reference kernel `{}`", kKernelName);
  header.target = arch;
  header.spec = spec.str();
  return assemble_source(kKernelName, header, body.str());
}

}  // namespace flexjit::cuda
