// include/flexjit/kernel.h: queries -> complete kernel descriptions (through the registry, as
// a runtime call would select them) -> source or cubin.
#include <flexjit/error.h>
#include <flexjit/kernel.h>

#include "Pipeline.h"
#include "device/Device.h"
#include "kernels/Family.h"
#include "kernels/KernelQuery.h"
#include "kernels/Registry.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace flexjit {

namespace {

cuda::Arch target_of(const KernelQuery& q) {
  if (!q.arch.empty()) return cuda::Arch::parse(q.arch);
  std::string why;
  if (!runtime::cuda_available(&why)) {
    throw Error(
        fmt::format("no GPU to take the target from ({}); pass an arch such as sm_90a", why));
  }
  return cuda::Arch::parse(runtime::Device::get(0).arch());
}

}  // namespace

kernels::KernelDesc kernels::desc_for_query(const KernelQuery& q, kernels::Selection* sel) {
  const kernels::Families& families = kernels::Families::global();
  const kernels::FamilyInfo& family = families.get(q.family);
  const cuda::Arch arch = target_of(q);
  if (!family.math && q.math != MathMode::Auto) {
    std::string with_math;  // "forward, backward_dkdv and decode_split"
    std::vector<std::string> names;
    for (const kernels::FamilyInfo* f : families.all()) {
      if (f->math) names.push_back(f->name);
    }
    for (size_t i = 0; i < names.size(); ++i)
      with_math += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
    throw UnsupportedError(fmt::format(
        "math mode '{}' does not apply to the {} kernel, which evaluates no score_mod; it applies "
        "to {} (mask_mods are always exact)",
        to_string(q.math), family.name, with_math));
  }
  const kernels::Params overrides = kernels::config_overrides(q.config, family);
  const kernels::KernelDesc problem = family.problem(q, arch);
  if (kernels::Registry::global().variants(family.family).empty()) {
    throw UnsupportedError(
        fmt::format("the {} kernel family has no variants registered", family.name));
  }
  return kernels::Registry::global().complete(problem, {}, overrides, q.variant, sel);
}

namespace {

KernelSource source_of(const kernels::KernelDesc& desc, const kernels::Selection& sel,
                       const cuda::GeneratedSource& src) {
  KernelSource out;
  out.description = desc.str();
  out.description_json = desc.to_json().dump();
  out.selection = sel.str();
  out.kernel_name = src.kernel_name;
  out.source = src.source;
  out.source_key = src.source_key;
  out.dynamic_smem_bytes = variant_of(desc).smem_bytes(desc);
  return out;
}

KernelBuilder& process_builder() {
  static KernelBuilder* b = new KernelBuilder();  // lives until exit, like the module cache
  return *b;
}

}  // namespace

KernelSource emit_kernel(const Mods& mods, const KernelQuery& query) {
  kernels::Selection sel;
  const kernels::KernelDesc desc = kernels::desc_for_query(query, &sel);
  return source_of(desc, sel, emit_source(mods, desc));
}

KernelBinary compile_kernel(const Mods& mods, const KernelQuery& query) {
  kernels::Selection sel;
  const kernels::KernelDesc desc = kernels::desc_for_query(query, &sel);
  const BuiltKernel k = process_builder().build(mods, desc);
  const jit::CompiledKernel& ck = *k.compiled.kernel;
  KernelBinary out;
  out.source = source_of(desc, sel, *k.source);
  out.cache_key = ck.key;
  out.cache = jit::to_string(k.compiled.outcome);
  out.elapsed_ms = k.compiled.elapsed_ms;
  out.compile_ms = ck.compile_ms;
  out.cubin = ck.cubin;
  out.registers = ck.usage.registers;
  out.spill_store_bytes = ck.usage.spill_store_bytes;
  out.spill_load_bytes = ck.usage.spill_load_bytes;
  out.stack_frame_bytes = ck.usage.stack_frame_bytes;
  out.static_shared_bytes = ck.usage.static_shared_bytes;
  out.wgmma_serialized = ck.usage.wgmma_serialized;
  return out;
}

std::vector<KernelVariantInfo> kernel_variants() {
  std::vector<KernelVariantInfo> out;
  for (const kernels::Variant* v : kernels::Registry::global().all()) {
    KernelVariantInfo i;
    i.family = std::string(kernels::to_string(v->family()));
    i.name = std::string(v->name());
    i.summary = std::string(v->summary());
    i.auto_select = v->auto_select();
    i.priority = v->priority();
    i.experimental = v->experimental();
    for (const kernels::TemplateText& t : v->templates())
      i.templates.push_back(t.name);
    i.entry_points = v->entry_points();
    out.push_back(std::move(i));
  }
  return out;
}

std::vector<KernelFamilyInfo> kernel_families() {
  std::vector<KernelFamilyInfo> out;
  for (const kernels::FamilyInfo* f : kernels::Families::global().all()) {
    KernelFamilyInfo i;
    i.name = f->name;
    i.summary = f->summary;
    i.kind = f->kind;
    i.math = f->math;
    for (const kernels::ConfigKey& k : f->config_keys)
      i.config_keys.push_back({k.name, k.doc, k.min, k.max});
    out.push_back(std::move(i));
  }
  return out;
}

}  // namespace flexjit
