#include "kernels/Variant.h"

#include <flexjit/error.h>

#include "codegen/cuda/ModCodegen.h"
#include "codegen/cuda/SourceWriter.h"
#include "kernels/BufferChecks.h"
#include "kernels/MathMode.h"
#include "util/Embedded.h"

#include <fmt/format.h>

namespace flexjit::kernels {

void KernelArgs::add_bytes(const void* data, size_t bytes) {
  std::vector<uint64_t> copy((bytes + 7) / 8 + (bytes == 0 ? 1 : 0), 0);
  if (bytes > 0) std::memcpy(copy.data(), data, bytes);
  storage_.push_back(std::move(copy));
  pointers_.clear();
}

void** KernelArgs::pointers() {
  if (pointers_.size() != storage_.size()) {
    pointers_.clear();
    for (auto& s : storage_)
      pointers_.push_back(s.data());
  }
  return pointers_.data();
}

void check_aligned16(const TensorRef& t, const char* name, bool& aligned16, std::string& blocker) {
  if (!aligned16) return;
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) {
    aligned16 = false;
    blocker = fmt::format("data pointer of {} is not 16-byte aligned", name);
    return;
  }
  const int es = dtype_size(t.dtype);
  for (size_t d = 0; d + 1 < t.shape.size(); ++d) {
    if (t.shape[d] > 1 && (t.strides[d] * es) % 16 != 0) {
      aligned16 = false;
      blocker = fmt::format(
          "stride of {} in dim {} ({} elements = {} bytes) is not a multiple of 16 bytes", name, d,
          t.strides[d], t.strides[d] * es);
      return;
    }
  }
}

std::vector<TemplateText> common_templates() {
  return {{"flexjit_abi.h", embedded::template_text("flexjit_abi.h"), true},
          {"prelude.cuh", embedded::template_text("prelude.cuh"), true}};
}

Params Variant::resolve_config(const KernelDesc& problem, const Params& overrides,
                               const InputFacts&) const {
  return apply_overrides(*this, default_config(problem), overrides);
}

void require_keys(const KernelDesc& d, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (!d.config.has(name)) {
      throw UnsupportedError(
          fmt::format("{} needs config '{}' ({})", d.family_variant(), name, d.str()));
    }
  }
  if (d.config.items().size() != names.size()) {
    throw UnsupportedError(fmt::format("{} takes {} config values; got {}", d.family_variant(),
                                       names.size(), d.config.str()));
  }
}

bool fit_tile_to_block(Params& config, const char* name, int64_t block, const Params& overrides,
                       std::initializer_list<int> sizes) {
  if (block % config.at(name) == 0 || overrides.has(name)) return false;
  for (int t : sizes) {
    if (t <= config.at(name) && block % t == 0) {
      config.set(name, t);
      break;
    }
  }
  return true;
}

void specialize_divisible(KernelDesc& desc, const InputFacts& facts) {
  if (facts.seqlen_q < 0 || facts.seqlen_kv < 0) return;
  const bool divisible = facts.seqlen_q % desc.config.at("block_m") == 0 &&
                         facts.seqlen_kv % desc.config.at("block_n") == 0;
  desc.flags.set("divisible", divisible ? 1 : 0);
}

std::vector<Params> valid_configs(const Variant& variant, const KernelDesc& problem,
                                  const std::vector<Params>& candidates) {
  std::vector<Params> out;
  for (const Params& c : candidates) {
    KernelDesc d = problem;
    d.config = c;
    if (!d.flags.has("divisible")) d.flags.set("divisible", 0);
    if (!d.flags.has("full_blocks")) d.flags.set("full_blocks", 0);
    try {
      variant.validate(d);
    } catch (const UnsupportedError&) {
      continue;
    }
    out.push_back(c);
  }
  return out;
}

Params apply_overrides(const Variant& variant, Params config, const Params& overrides) {
  for (const auto& [name, value] : overrides.items()) {
    if (!config.has(name)) {
      throw UnsupportedError(fmt::format("{}/{} has no config parameter '{}'; it has: {}",
                                         to_string(variant.family()), variant.name(), name,
                                         config.str()));
    }
    config.set(name, value);
  }
  return config;
}

cuda::GeneratedSource assemble_variant_source(const Variant& variant, const KernelDesc& desc,
                                              const Mods& mods, const std::string& config_struct,
                                              const std::string& what,
                                              const std::string& mods_label,
                                              const std::string& mod_grads) {
  const std::vector<TemplateText> templates = variant.templates();
  cuda::SourceWriter body;
  body.line("");
  for (const TemplateText& t : templates) {
    if (t.before_mods && !t.text.empty()) cuda::section(body, t.name, t.text);
  }
  cuda::section(body, "config", config_struct);
  cuda::section(body, "mods",
                cuda::generate_mod_functions(mods, math_functions(desc), buffer_checks(desc)));
  if (!mod_grads.empty()) cuda::section(body, "mod gradients", mod_grads);
  for (const TemplateText& t : templates) {
    if (!t.before_mods && !t.text.empty()) cuda::section(body, t.name, t.text);
  }
  cuda::SourceHeader header;
  header.what = what;
  header.target = desc.arch.str();
  header.spec = desc.str();
  header.mods = &mods;
  header.mods_label = mods_label;
  return cuda::assemble_source(variant.entry_points().front(), header, body.str());
}

}  // namespace flexjit::kernels
