#include "kernels/forward_companions/Fp8Transpose.h"

#include <flexjit/error.h>

#include "codegen/cuda/SourceWriter.h"

#include <fmt/format.h>

namespace flexjit::kernels {

std::string_view Fp8VtBlockPer64Keys::summary() const {
  return "one CTA per 64 keys of a (b, kv head) writes their V^T rows, each 32-key group "
         "permuted for P V's e4m3 fragments";
}

std::optional<std::string> Fp8VtBlockPer64Keys::unsupported(const KernelDesc& problem,
                                                            const InputFacts&) const {
  if (problem.arch.major < 8) {
    return fmt::format("the e4m3 V^T kernel needs sm_80 or newer, not {}", problem.arch.str());
  }
  if (problem.dtype != DType::E4M3) {
    return fmt::format("the V^T kernel transposes e4m3 v, not {}", to_string(problem.dtype));
  }
  if (problem.head_dim_v < 16 || problem.head_dim_v > 256 || problem.head_dim_v % 16 != 0) {
    return fmt::format(
        "the e4m3 V^T kernel takes v's head dim as a multiple of 16 up to 256, not {}",
        problem.head_dim_v);
  }
  return std::nullopt;
}

cuda::GeneratedSource Fp8VtBlockPer64Keys::generate(const Mods& mods,
                                                    const KernelDesc& desc) const {
  validate(desc);
  cuda::SourceWriter w;
  w.line(fmt::format("// Compile-time configuration: {}", desc.str()));
  {
    auto s = w.block("struct FjVtConfig", ";");
    w.line(fmt::format("static constexpr int kRealDimV = {};", desc.head_dim_v));
  }
  return assemble_variant_source(*this, desc, mods, w.str(),
                                 fmt::format("e4m3 V^T pre-pass `{}`", kEntry));
}

std::vector<Launch> Fp8VtBlockPer64Keys::launches(const KernelDesc&, const Fp8VtInputs& in,
                                                  void*) const {
  Launch l;
  l.entry_point = kEntry;
  l.grid = {static_cast<unsigned>(in.args.skv_pad / kKeys), static_cast<unsigned>(in.args.heads_kv),
            static_cast<unsigned>(in.batch)};
  l.block = {kThreads, 1, 1};
  l.args.add(in.args);
  std::vector<Launch> out;
  out.push_back(std::move(l));
  return out;
}

KernelDesc fp8_vt_problem(const cuda::Arch& arch, int head_dim_v) {
  KernelDesc d;
  d.family = Family::ForwardFp8Vt;
  d.arch = arch;
  d.dtype = DType::E4M3;
  d.head_dim_qk = head_dim_v;
  d.head_dim_v = head_dim_v;
  return d;
}

KernelDesc fp8_vt_desc(const cuda::Arch& arch, int head_dim_v) {
  KernelDesc d = fp8_vt_problem(arch, head_dim_v);
  d.variant = "block_per_64_keys";
  return d;
}

FamilyInfo forward_fp8_vt_family() {
  FamilyInfo f;
  f.family = Family::ForwardFp8Vt;
  f.name = "forward_fp8_vt";
  f.summary = "V^T of e4m3 v for the sm_90a e4m3 forward's P V (the forward's companion kernel)";
  f.problem = [](const KernelQuery& q, const cuda::Arch& arch) {
    return fp8_vt_problem(arch, q.head_dim_v ? q.head_dim_v : q.head_dim_qk);
  };
  return f;
}

}  // namespace flexjit::kernels
