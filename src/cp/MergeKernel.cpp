#include "cp/MergeKernel.h"

#include <flexjit/error.h>

#include "codegen/cuda/SourceWriter.h"
#include "kernels/forward/Forward.h"
#include "util/Embedded.h"

#include <flexjit_abi.h>
#include <fmt/format.h>

namespace flexjit::cp {

namespace {

std::optional<std::string> problem_reason(const kernels::KernelDesc& p) {
  try {
    cuda::Arch::parse(p.arch.str());
  } catch (const UnsupportedError& e) {
    return e.what();
  }
  if (p.dtype != DType::BF16 && p.dtype != DType::F16 && p.dtype != DType::F32) {
    return fmt::format(
        "the context-parallel merge kernel reads and writes bf16, f16 or f32, not {}",
        to_string(p.dtype));
  }
  if (p.head_dim_v < 1) {
    return fmt::format("the context-parallel merge kernel needs a head dim v of at least 1, not {}",
                       p.head_dim_v);
  }
  return std::nullopt;
}

}  // namespace

std::string_view MergeWarpPerRow::summary() const {
  return "context parallelism: lse-weighted merge of partial results, one warp per row";
}

std::optional<std::string> MergeWarpPerRow::unsupported(const kernels::KernelDesc& problem,
                                                        const kernels::InputFacts&) const {
  return problem_reason(problem);
}

void MergeWarpPerRow::validate(const kernels::KernelDesc& d) const {
  if (auto r = problem_reason(d)) throw UnsupportedError(*r);
  kernels::require_keys(d, {"num_warps"});
  const int64_t warps = d.config.at("num_warps");
  if (warps != 1 && warps != 2 && warps != 4 && warps != 8) {
    throw UnsupportedError(fmt::format(
        "cp_merge/warp_per_row does not support num_warps = {}; supported: 1, 2, 4, 8", warps));
  }
}

kernels::Params MergeWarpPerRow::default_config(const kernels::KernelDesc&) const {
  return {{"num_warps", 4}};
}

std::vector<kernels::Params> MergeWarpPerRow::config_space(const kernels::KernelDesc&) const {
  return {{{"num_warps", 1}}, {{"num_warps", 2}}, {{"num_warps", 4}}, {{"num_warps", 8}}};
}

std::vector<kernels::TemplateText> MergeWarpPerRow::templates() const {
  std::vector<kernels::TemplateText> t = kernels::common_templates();
  t.push_back({"cp_merge.cuh", embedded::template_text("cp_merge.cuh"), false});
  return t;
}

cuda::GeneratedSource MergeWarpPerRow::generate(const Mods& mods,
                                                const kernels::KernelDesc& desc) const {
  validate(desc);
  cuda::SourceWriter w;
  w.line(fmt::format("// Compile-time configuration: {}", desc.str()));
  {
    auto s = w.block("struct FjConfig", ";");
    w.line(fmt::format("static constexpr int kNumWarps = {};", desc.config.at("num_warps")));
    w.line(fmt::format("using Element = {};", kernels::element_type(desc.dtype)));
  }
  return kernels::assemble_variant_source(
      *this, desc, mods, w.str(), fmt::format("context-parallel merge kernel `{}`", kMerge));
}

std::vector<kernels::Launch> MergeWarpPerRow::launches(const kernels::KernelDesc& desc,
                                                       const MergeInputs& in, void*) const {
  FjCpMergeArgs a{};
  a.acc = in.acc;
  a.acc_lse = in.acc_lse;
  const bool finalize = in.mode == MergeInputs::Mode::Finalize;
  if (finalize) {
    a.out = in.out.data;
    a.out_stride_b = in.out.strides[0], a.out_stride_h = in.out.strides[1],
    a.out_stride_s = in.out.strides[2];
    if (in.out_lse != nullptr) {
      a.out_lse = static_cast<float*>(in.out_lse->data);
      a.out_lse_stride_b = in.out_lse->strides[0], a.out_lse_stride_h = in.out_lse->strides[1];
    }
  } else {
    a.part = in.part.data;
    a.part_stride_b = in.part.strides[0], a.part_stride_h = in.part.strides[1],
    a.part_stride_s = in.part.strides[2];
    if (in.mode == MergeInputs::Mode::Merge) {
      a.part_lse = static_cast<const float*>(in.part_lse.data);
      a.part_lse_stride_b = in.part_lse.strides[0], a.part_lse_stride_h = in.part_lse.strides[1];
    }
  }
  const bool accumulate = in.mode == MergeInputs::Mode::Accumulate;
  a.acc_seqlen = static_cast<int>(accumulate ? in.acc_seqlen : in.seqlen);
  a.acc_row0 = static_cast<int>(accumulate ? in.acc_row0 : 0);
  a.batch = static_cast<int>(in.batch);
  a.heads = static_cast<int>(in.heads);
  a.seqlen = static_cast<int>(in.seqlen);
  a.dv = static_cast<int>(in.dv);
  const int64_t rows = in.batch * in.heads * in.seqlen;
  const int64_t warps = desc.config.at("num_warps");
  kernels::Launch l;
  l.entry_point = finalize ? kFinalize : accumulate ? kAccumulate : kMerge;
  l.grid = {static_cast<unsigned>((rows + warps - 1) / warps), 1, 1};
  l.block = {static_cast<unsigned>(warps * 32), 1, 1};
  l.args.add(a);
  std::vector<kernels::Launch> out;
  out.push_back(std::move(l));
  return out;
}

kernels::KernelDesc merge_problem(const cuda::Arch& arch, DType dtype, int dv) {
  kernels::KernelDesc d;
  d.family = kernels::Family::CpMerge;
  d.arch = arch;
  d.dtype = dtype;
  d.head_dim_qk = dv;
  d.head_dim_v = dv;
  return d;
}

kernels::FamilyInfo cp_merge_family() {
  kernels::FamilyInfo f;
  f.family = kernels::Family::CpMerge;
  f.name = "cp_merge";
  f.summary = "context parallelism: the lse-weighted merge of partial attention results";
  f.config_keys = {kernels::num_warps_key()};
  f.problem = [](const KernelQuery& q, const cuda::Arch& arch) {
    return merge_problem(arch, q.dtype, q.head_dim_v ? q.head_dim_v : q.head_dim_qk);
  };
  return f;
}

}  // namespace flexjit::cp
