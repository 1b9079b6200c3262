#include "kernels/block_mask/BlockMaskBuild.h"

#include <flexjit/error.h>

#include "util/Embedded.h"

#include <fmt/format.h>

namespace flexjit::kernels {

namespace {
constexpr int kIndexWarpsPerBlock = 4;

std::optional<std::string> size_reason(const KernelDesc& d) {
  for (const char* f : {"q_block", "kv_block"}) {
    auto v = d.flags.get(f);
    if (!v || *v < 1 || *v > 4096) {
      return fmt::format("block mask block sizes must be in [1, 4096]; got {} = {}", f,
                         v ? std::to_string(*v) : "(unset)");
    }
  }
  return std::nullopt;
}
}  // namespace

KernelDesc block_mask_problem(const cuda::Arch& arch, int q_block, int kv_block) {
  KernelDesc d;
  d.family = Family::BlockMask;
  d.arch = arch;
  d.flags.set("q_block", q_block);
  d.flags.set("kv_block", kv_block);
  return d;
}

FamilyInfo block_mask_family() {
  FamilyInfo f;
  f.family = Family::BlockMask;
  f.name = "block_mask";
  f.summary = "kv_* / full_kv_* / q_* arrays from a mask_mod";
  f.for_mask_mod = true;
  f.problem = [](const KernelQuery& q, const cuda::Arch& arch) {
    return block_mask_problem(arch, q.block_size, q.block_size);
  };
  return f;
}

std::string_view BlockMaskWarpPerTile::summary() const {
  return "one warp per undecided tile evaluates the mask_mod; one warp per row / column writes "
         "kv_*, full_kv_* and the transposed q_* arrays";
}

std::optional<std::string> BlockMaskWarpPerTile::unsupported(const KernelDesc& problem,
                                                             const InputFacts&) const {
  return size_reason(problem);
}

void BlockMaskWarpPerTile::validate(const KernelDesc& d) const {
  if (auto r = size_reason(d)) throw UnsupportedError(*r);
  auto warps = d.config.get("num_warps");
  if (!warps || *warps < 1 || *warps > 32 || d.config.items().size() != 1) {
    throw UnsupportedError(fmt::format(
        "block_mask/warp_per_tile takes num_warps in [1, 32] and nothing else; got '{}'",
        d.config.str()));
  }
}

Params BlockMaskWarpPerTile::default_config(const KernelDesc&) const {
  return {{"num_warps", 8}};
}

std::vector<Params> BlockMaskWarpPerTile::config_space(const KernelDesc&) const {
  return {{{"num_warps", 4}}, {{"num_warps", 8}}, {{"num_warps", 16}}};
}

std::vector<TemplateText> BlockMaskWarpPerTile::templates() const {
  std::vector<TemplateText> t = common_templates();
  t.push_back({"block_mask.cuh", embedded::template_text("block_mask.cuh")});
  return t;
}

cuda::GeneratedSource BlockMaskWarpPerTile::generate(const Mods& mods, const KernelDesc& d) const {
  validate(d);
  const Mods m = mask_only(mods);
  m.check();
  const std::string config = fmt::format(
      "// Compile-time configuration: {}\nstruct FjBlockMaskConfig {{ static "
      "constexpr int kQBlock = {}, kKvBlock = {}, kNumWarps = {}; }};\n",
      d.str(), d.flags.at("q_block"), d.flags.at("kv_block"), d.config.at("num_warps"));
  return assemble_variant_source(*this, d, m, config,
                                 fmt::format("block-mask builder `{}` + `{}`", kClassify, kIndex),
                                 "mask");
}

std::vector<Launch> BlockMaskWarpPerTile::launches(const KernelDesc& d, const BlockMaskInputs& in,
                                                   void*) const {
  const FjBlockMaskBuildArgs& a = in.args;
  const int64_t bh = static_cast<int64_t>(a.batch) * a.heads;
  std::vector<Launch> out;
  if (in.num_unknown > 0) {
    const int64_t warps_per_block = d.config.at("num_warps");
    const int64_t warps = bh * in.num_unknown;
    Launch l;
    l.entry_point = kClassify;
    l.grid = {static_cast<unsigned>((warps + warps_per_block - 1) / warps_per_block), 1, 1};
    l.block = {static_cast<unsigned>(warps_per_block * 32), 1, 1};
    const int num_tiles = static_cast<int>(in.num_unknown);
    l.args.add(a);
    l.args.add_bytes(in.mod_params.data(), in.mod_params.size() * sizeof(uint64_t));
    l.args.add(in.tiles);
    l.args.add(num_tiles);
    l.args.add(in.hints);
    l.args.add(in.kinds);
    out.push_back(std::move(l));
  }
  const int64_t warps = bh * (a.num_q_blocks + a.num_kv_blocks);
  Launch l;
  l.entry_point = kIndex;
  l.grid = {static_cast<unsigned>((warps + kIndexWarpsPerBlock - 1) / kIndexWarpsPerBlock), 1, 1};
  l.block = {kIndexWarpsPerBlock * 32, 1, 1};
  l.args.add(a);
  l.args.add(in.hints);
  l.args.add(in.kinds);
  out.push_back(std::move(l));
  return out;
}

}  // namespace flexjit::kernels
