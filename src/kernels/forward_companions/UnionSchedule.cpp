#include "kernels/forward_companions/UnionSchedule.h"

#include <flexjit/error.h>

#include "codegen/cuda/SourceWriter.h"

#include <fmt/format.h>

namespace flexjit::kernels {

std::string_view UnionScheduleBlockPerTile::summary() const {
  return "one CTA per (b, h, query tile) merges the mask's q blocks that the tile's warpgroups "
         "lie in into one ordered list";
}

std::optional<std::string> UnionScheduleBlockPerTile::unsupported(const KernelDesc& problem,
                                                                  const InputFacts&) const {
  if (problem.arch.major < 8) {
    return fmt::format("the union schedule's kernel needs sm_80 or newer, not {}",
                       problem.arch.str());
  }
  return std::nullopt;
}

cuda::GeneratedSource UnionScheduleBlockPerTile::generate(const Mods& mods,
                                                          const KernelDesc& desc) const {
  validate(desc);
  cuda::SourceWriter w;
  w.line(fmt::format("// Compile-time configuration: {}", desc.str()));
  {
    auto s = w.block("struct FjScheduleConfig", ";");
    w.line(fmt::format("static constexpr int kThreads = {};", kThreads));
  }
  return assemble_variant_source(*this, desc, mods, w.str(),
                                 fmt::format("forward union schedule `{}`", kEntry));
}

std::vector<Launch> UnionScheduleBlockPerTile::launches(const KernelDesc&,
                                                        const UnionScheduleInputs& in,
                                                        void*) const {
  FJ_ASSERT(in.args.max_tiles >= 0 && in.args.max_tiles <= kFjUnionMaxTiles,
            "union schedule: more KV tiles than it takes");
  Launch l;
  l.entry_point = kEntry;
  l.grid = {static_cast<unsigned>(in.rows), 1, 1};
  l.block = {kThreads, 1, 1};
  l.smem_bytes = static_cast<unsigned>((kFjUnionSmemPerTile * in.args.max_tiles + 15) / 16 * 16);
  l.args.add(in.args);
  l.after = in.after;
  std::vector<Launch> out;
  out.push_back(std::move(l));
  return out;
}

KernelDesc union_schedule_problem(const cuda::Arch& arch) {
  KernelDesc d;
  d.family = Family::ForwardSchedule;
  d.arch = arch;
  return d;
}

KernelDesc union_schedule_desc(const cuda::Arch& arch) {
  KernelDesc d = union_schedule_problem(arch);
  d.variant = "block_per_tile";
  return d;
}

FamilyInfo forward_schedule_family() {
  FamilyInfo f;
  f.family = Family::ForwardSchedule;
  f.name = "forward_schedule";
  f.summary =
      "a block mask as the union schedule of the sm_90a forward's 192-row tiles (the forward's "
      "companion kernel)";
  f.problem = [](const KernelQuery&, const cuda::Arch& arch) {
    return union_schedule_problem(arch);
  };
  return f;
}

}  // namespace flexjit::kernels
