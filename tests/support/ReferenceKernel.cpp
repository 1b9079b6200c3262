#include "support/ReferenceKernel.h"

#include <flexjit/error.h>

#include "kernels/Registry.h"
#include "kernels/forward/ForwardArgs.h"
#include "util/Embedded.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

namespace flexjit::embedded {
// tests/support/*.cuh, embedded into the test binary (CMakeLists.txt, cmake/Embed.cmake).
const std::vector<File>& test_templates();
}  // namespace flexjit::embedded

namespace flexjit::test {

namespace {

std::string_view reference_template() {
  for (const auto& f : embedded::test_templates()) {
    if (std::string_view(f.name) == "reference.cuh") return f.text();
  }
  FJ_ASSERT(false, "tests/support/reference.cuh is not embedded in the test binary");
}

int dtype_code(DType d) {
  switch (d) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::BF16:
      return 2;
    default:
      return -1;
  }
}

}  // namespace

std::string_view ForwardReference::summary() const {
  return "naive fp32 reference for tests: scores materialized in the workspace, no tiling";
}

std::optional<std::string> ForwardReference::unsupported(const kernels::KernelDesc& p,
                                                         const kernels::InputFacts&) const {
  if (dtype_code(p.dtype) < 0) {
    return fmt::format("the reference kernel takes f32, f16 or bf16 inputs, not {}",
                       to_string(p.dtype));
  }
  if (p.head_dim_qk <= 0 || p.head_dim_v <= 0 || p.gqa_ratio <= 0) {
    return fmt::format("reference kernel: head dims and GQA ratio must be positive ({})", p.str());
  }
  return std::nullopt;
}

void ForwardReference::validate(const kernels::KernelDesc& d) const {
  if (auto r = unsupported(d, {})) throw UnsupportedError(*r);
  if (!d.config.empty()) {
    throw UnsupportedError(
        fmt::format("forward/reference has no config parameters; got '{}'", d.config.str()));
  }
}

std::vector<kernels::TemplateText> ForwardReference::templates() const {
  std::vector<kernels::TemplateText> t = kernels::common_templates();
  t.push_back({"reference.cuh", reference_template()});
  return t;
}

cuda::GeneratedSource ForwardReference::generate(const Mods& mods,
                                                 const kernels::KernelDesc& d) const {
  validate(d);
  mods.check();
  const std::string config = fmt::format(
      "struct FjReferenceConfig {{\n  static constexpr int kDType = {}, kHeadDimQk = {}, "
      "kHeadDimV = {}, kGqaRatio = {};\n}};\n",
      dtype_code(d.dtype), d.head_dim_qk, d.head_dim_v, d.gqa_ratio);
  return kernels::assemble_variant_source(*this, d, mods, config,
                                          "reference kernel `flexjit_reference_forward`");
}

size_t ForwardReference::workspace_bytes(const kernels::KernelDesc&,
                                         const kernels::ForwardInputs& in) const {
  // Every score; a zero-length KV still gets one float per row so that the pointer is valid.
  const QkvShape& s = in.shape;
  return static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q) *
         static_cast<size_t>(std::max<int64_t>(s.seqlen_kv, 1)) * sizeof(float);
}

std::vector<kernels::Launch> ForwardReference::launches(const kernels::KernelDesc&,
                                                        const kernels::ForwardInputs& in,
                                                        void* workspace) const {
  const QkvShape& s = in.shape;
  kernels::Launch l;
  l.entry_point = entry_points().front();
  l.grid = {static_cast<unsigned>(s.seqlen_q), static_cast<unsigned>(s.heads_q),
            static_cast<unsigned>(s.batch)};
  l.block = {128, 1, 1};
  l.args.add(
      kernels::make_fwd_args(in.q, in.k, in.v, in.out, in.lse ? &*in.lse : nullptr, s, in.scale));
  l.args.add_bytes(in.mod_params.data(), in.mod_params.size() * sizeof(uint64_t));
  l.args.add(static_cast<float*>(workspace));
  std::vector<kernels::Launch> out;
  out.push_back(std::move(l));
  return out;
}

void register_reference_variant() {
  static std::once_flag once;
  std::call_once(once,
                 [] { kernels::Registry::global().add(std::make_unique<ForwardReference>()); });
}

void reference_attention_into(Context& ctx, const TensorRef& q, const TensorRef& k,
                              const TensorRef& v, const TensorRef& out, const TensorRef* lse,
                              const Mods& mods, const ModBindings& bindings,
                              std::optional<float> scale) {
  register_reference_variant();
  AttentionOptions o;
  o.mods = mods;
  o.bindings = bindings;
  o.scale = scale;
  o.variant = ForwardReference::kName;
  o.math = MathMode::Exact;  // a reference, whatever the inputs' dtype or FLEXJIT_MATH
  flex_attention_into(ctx, q, k, v, out, lse, o);
  ctx.synchronize();
}

}  // namespace flexjit::test
