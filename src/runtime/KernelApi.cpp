// include/flexjit/kernel.h: queries -> complete kernel descriptions (through the registry, as
// a runtime call would select them) -> source or cubin.
#include <flexjit/error.h>
#include <flexjit/kernel.h>

#include "Pipeline.h"
#include "device/Device.h"
#include "kernels/KernelQuery.h"
#include "kernels/MathMode.h"
#include "kernels/Registry.h"
#include "kernels/backward/Backward.h"
#include "kernels/block_mask/BlockMaskBuild.h"
#include "kernels/decode/Decode.h"
#include "kernels/forward/Forward.h"

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
  const auto family = kernels::parse_family(q.family);
  if (!family) {
    std::vector<std::string> names;
    for (kernels::Family f : kernels::all_families())
      names.emplace_back(kernels::to_string(f));
    throw UnsupportedError(fmt::format("unknown kernel family '{}'; the families are: {}", q.family,
                                       fmt::join(names, ", ")));
  }
  const cuda::Arch arch = target_of(q);
  const bool has_math =
      *family == kernels::Family::Forward || *family == kernels::Family::BackwardDkDv ||
      *family == kernels::Family::BackwardDq || *family == kernels::Family::DecodeSplit;
  if (!has_math && q.math != MathMode::Auto) {
    throw UnsupportedError(fmt::format(
        "math mode '{}' does not apply to the {} kernel, which evaluates no score_mod; it applies "
        "to forward, backward_dkdv, backward_dq and decode_split (mask_mods are always exact)",
        to_string(q.math), q.family));
  }
  kernels::Params overrides;
  switch (*family) {
    case kernels::Family::Forward: {
      overrides = kernels::config_overrides(q.config);
      kernels::KernelDesc problem = kernels::forward_problem(
          arch, q.dtype, q.head_dim_qk, q.head_dim_v ? q.head_dim_v : q.head_dim_qk, q.gqa_ratio,
          q.divisible, q.full_blocks);
      kernels::set_math_mode(problem, q.math);
      if (q.page_size != 0) kernels::set_kv_cache_flags(problem, q.page_size);
      return kernels::Registry::global().complete(problem, {}, overrides, q.variant, sel);
    }
    case kernels::Family::BlockMask:
      return kernels::Registry::global().complete(
          kernels::block_mask_problem(arch, q.block_size, q.block_size), {}, overrides, q.variant,
          sel);
    case kernels::Family::BackwardPreprocess:
    case kernels::Family::BackwardDkDv:
    case kernels::Family::BackwardDq: {
      if (*family != kernels::Family::BackwardPreprocess) {
        overrides = kernels::config_overrides(q.config);
      }
      kernels::KernelDesc problem = kernels::backward_problem(
          *family, arch, q.dtype, q.head_dim_qk, q.head_dim_v ? q.head_dim_v : q.head_dim_qk,
          q.gqa_ratio, q.full_blocks, q.deterministic);
      if (*family != kernels::Family::BackwardPreprocess) {
        problem.flags.set("divisible", q.divisible ? 1 : 0);
        kernels::set_math_mode(problem, q.math);
      }
      return kernels::Registry::global().complete(problem, {}, overrides, q.variant, sel);
    }
    case kernels::Family::DecodeSplit: {
      for (auto [name, v] :
           {std::pair{"block_n", q.config.block_n}, std::pair{"num_warps", q.config.num_warps},
            std::pair{"num_stages", q.config.num_stages},
            std::pair{"num_splits", q.config.num_splits}}) {
        if (v < 0) throw UnsupportedError(fmt::format("{} must not be negative ({})", name, v));
        if (v > 0) overrides.set(name, v);
      }
      if (q.seqlen_q < 1) {
        throw UnsupportedError(fmt::format("seqlen_q must be at least 1, not {}", q.seqlen_q));
      }
      kernels::KernelDesc problem = kernels::decode_split_problem(
          arch, q.dtype, q.head_dim_qk, q.head_dim_v ? q.head_dim_v : q.head_dim_qk, q.gqa_ratio,
          kernels::decode_rows(q.gqa_ratio, q.seqlen_q), q.page_size, q.full_blocks);
      kernels::set_math_mode(problem, q.math);
      return kernels::Registry::global().complete(problem, {}, overrides, q.variant, sel);
    }
    case kernels::Family::DecodeCombine:
      if (q.config.num_warps > 0) overrides.set("num_warps", q.config.num_warps);
      return kernels::Registry::global().complete(
          kernels::decode_combine_problem(arch, q.dtype,
                                          q.head_dim_v ? q.head_dim_v : q.head_dim_qk),
          {}, overrides, q.variant, sel);
    default:
      break;
  }
  throw UnsupportedError(fmt::format(
      "the {} kernel family has no variants yet; the families with variants are forward, "
      "block_mask, backward_* and decode_*",
      q.family));
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

}  // namespace flexjit
