#include "kernels/decode/DecodeCombine.h"

#include <flexjit/error.h>

#include "codegen/cuda/SourceWriter.h"
#include "kernels/HeadDims.h"
#include "kernels/forward/Forward.h"
#include "util/Embedded.h"

#include <flexjit_abi.h>
#include <fmt/format.h>

namespace flexjit::kernels {

namespace {

std::optional<std::string> problem_reason(const KernelDesc& p) {
  try {
    cuda::Arch::parse(p.arch.str());
  } catch (const UnsupportedError& e) {
    return e.what();
  }
  if (p.dtype != DType::BF16 && p.dtype != DType::F16 && p.dtype != DType::F32) {
    return fmt::format("the decode combine kernel writes bf16, f16 or f32, not {}",
                       to_string(p.dtype));
  }
  return head_dim_reason("decode_combine", "head_dim_v", p.head_dim_v, kDecodeCombineTileDims);
}

}  // namespace

std::string_view DecodeCombineWarpPerRow::summary() const {
  return split_lanes_
             ? "split-KV decoding: LSE-weighted sum of the splits, one warp per output "
               "row, its lanes divided among the splits (experimental)"
             : "split-KV decoding: LSE-weighted sum of the splits, one warp per output row";
}

std::optional<std::string> DecodeCombineWarpPerRow::unsupported(const KernelDesc& problem,
                                                                const InputFacts&) const {
  return problem_reason(problem);
}

void DecodeCombineWarpPerRow::validate(const KernelDesc& d) const {
  if (auto r = problem_reason(d)) throw UnsupportedError(*r);
  const auto warps = d.config.get("num_warps");
  if (!warps || d.config.items().size() != 1) {
    throw UnsupportedError(
        fmt::format("decode_combine/warp_per_row takes num_warps only; got {}", d.config.str()));
  }
  if (*warps != 1 && *warps != 2 && *warps != 4 && *warps != 8) {
    throw UnsupportedError(fmt::format(
        "the decode combine kernel does not support num_warps = {}; supported: 1, 2, 4, 8",
        *warps));
  }
}

Params DecodeCombineWarpPerRow::default_config(const KernelDesc&) const {
  return {{"num_warps", 4}};
}

std::vector<Params> DecodeCombineWarpPerRow::config_space(const KernelDesc&) const {
  return {{{"num_warps", 1}}, {{"num_warps", 2}}, {{"num_warps", 4}}, {{"num_warps", 8}}};
}

std::vector<TemplateText> DecodeCombineWarpPerRow::templates() const {
  std::vector<TemplateText> t = common_templates();
  t.push_back({"mma_sm80.cuh", embedded::template_text("mma_sm80.cuh"), false});
  t.push_back({"decode_combine.cuh", embedded::template_text("decode_combine.cuh"), false});
  t.push_back({"decode_check.cuh", embedded::template_text("decode_check.cuh"), false});
  return t;
}

cuda::GeneratedSource DecodeCombineWarpPerRow::generate(const Mods& mods,
                                                        const KernelDesc& desc) const {
  validate(desc);
  cuda::SourceWriter w;
  w.line(fmt::format("// Compile-time configuration: {}", desc.str()));
  {
    auto s = w.block("struct FjConfig", ";");
    // The tile dim (how a warp's lanes divide a row) and the rows' own length.
    w.line(fmt::format("static constexpr int kNumWarps = {}, kHeadDimV = {}, kRealDimV = {};",
                       desc.config.at("num_warps"),
                       *tile_head_dim(desc.head_dim_v, kDecodeCombineTileDims), desc.head_dim_v));
    w.line(fmt::format("static constexpr bool kSplitLanes = {};", split_lanes_));
    w.line(fmt::format("using Element = {};", element_type(desc.dtype)));
  }
  return assemble_variant_source(*this, desc, mods, w.str(),
                                 fmt::format("split-KV decoding combine kernel `{}`", kEntry));
}

std::vector<Launch> DecodeCombineWarpPerRow::launches(const KernelDesc& desc,
                                                      const DecodeInputs& in,
                                                      void* workspace) const {
  FJ_ASSERT(workspace != nullptr, "the decode combine step runs on the split step's workspace");
  FjDecodeCombineArgs a{};
  const size_t packed = static_cast<size_t>(in.batch * in.heads_q * in.seqlen_q);
  a.o_part = static_cast<const float*>(workspace);
  a.lse_part =
      a.o_part + packed * static_cast<size_t>(in.num_splits) * static_cast<size_t>(in.head_dim_v);
  a.out = in.out.data;
  a.lse = in.lse ? static_cast<float*>(in.lse->data) : nullptr;
  a.o_stride_b = in.out.strides[0], a.o_stride_h = in.out.strides[1],
  a.o_stride_s = in.out.strides[2];
  if (in.lse) a.lse_stride_b = in.lse->strides[0], a.lse_stride_h = in.lse->strides[1];
  a.batch = static_cast<int>(in.batch);
  a.heads_q = static_cast<int>(in.heads_q);
  a.seqlen_q = static_cast<int>(in.seqlen_q);
  a.num_splits = in.num_splits;
  const int64_t warps = desc.config.at("num_warps");
  Launch l;
  l.entry_point = kEntry;
  l.grid = {static_cast<unsigned>((static_cast<int64_t>(packed) + warps - 1) / warps), 1, 1};
  l.block = {static_cast<unsigned>(warps * 32), 1, 1};
  l.args.add(a);
  l.args.add_bytes(in.mod_params.data(), in.mod_params.size() * sizeof(uint64_t));  // sink_mod
  // sm_90+: launched while the split kernel finishes (its CTAs trigger after their main loop);
  // the kernel's griddepcontrol.wait orders its reads after every split write.
  l.programmatic = desc.arch.major >= 9;
  std::vector<Launch> out;
  out.push_back(std::move(l));
  return out;
}

}  // namespace flexjit::kernels
