#include "kernels/Family.h"

#include <flexjit/error.h>

#include "util/Suggest.h"

#include <fmt/format.h>

#include <algorithm>

namespace flexjit::kernels {

namespace {

bool valid_name(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

}  // namespace

ConfigKey block_m_key() {
  return {"block_m", "query rows per tile", 1, INT32_MAX};
}
ConfigKey block_n_key() {
  return {"block_n", "KV rows per tile", 1, INT32_MAX};
}
ConfigKey num_warps_key() {
  return {"num_warps", "warps per CTA", 1, INT32_MAX};
}
ConfigKey num_stages_key() {
  return {"num_stages", "KV tiles in flight (cp.async / TMA pipeline depth)", 1, INT32_MAX};
}

bool FamilyInfo::takes(std::string_view key_name) const {
  return key(key_name) != nullptr;
}

const ConfigKey* FamilyInfo::key(std::string_view key_name) const {
  for (const ConfigKey& k : config_keys) {
    if (k.name == key_name) return &k;
  }
  return nullptr;
}

// ---- Families ----------------------------------------------------------------------------------

Families& Families::global() {
  static Families* f = [] {
    auto* families = new Families();  // never destroyed: descriptions may be printed at exit
    register_builtin_families(*families);
    return families;
  }();
  return *f;
}

const FamilyInfo& Families::add(FamilyInfo info) {
  if (!valid_name(info.name)) {
    throw UnsupportedError(
        fmt::format("kernel family name '{}' is not [a-z0-9_]+ (it is a word of the kernel "
                    "descriptions' text form)",
                    info.name));
  }
  if (!info.problem) {
    throw UnsupportedError(
        fmt::format("kernel family {} has no problem function (FamilyInfo::problem)", info.name));
  }
  for (const ConfigKey& k : info.config_keys) {
    if (!valid_name(k.name) || k.min > k.max) {
      throw UnsupportedError(fmt::format(
          "kernel family {}: config key '{}' needs a [a-z0-9_]+ name and min <= max ({} > {})",
          info.name, k.name, k.min, k.max));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const FamilyInfo& f : families_) {
    if (f.family == info.family || f.name == info.name) {
      throw UnsupportedError(fmt::format(
          "cannot register kernel family {} (id {}): {} (id {}) is registered already", info.name,
          static_cast<int>(info.family), f.name, static_cast<int>(f.family)));
    }
  }
  families_.push_back(std::move(info));
  return families_.back();
}

const FamilyInfo* Families::find(Family family) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const FamilyInfo& f : families_) {
    if (f.family == family) return &f;
  }
  return nullptr;
}

const FamilyInfo* Families::find(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const FamilyInfo& f : families_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

const FamilyInfo& Families::get(Family family) const {
  const FamilyInfo* f = find(family);
  FJ_ASSERT(f != nullptr,
            fmt::format("kernel family id {} is not registered", static_cast<int>(family)));
  return *f;
}

const FamilyInfo& Families::get(std::string_view name) const {
  if (const FamilyInfo* f = find(name)) return *f;
  const std::vector<std::string> known = names();
  throw UnsupportedError(fmt::format("unknown kernel family '{}'{}; the families are: {}", name,
                                     did_you_mean(name, known), fmt::join(known, ", ")));
}

std::vector<const FamilyInfo*> Families::all() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const FamilyInfo*> out;
  for (const FamilyInfo& f : families_)
    out.push_back(&f);
  return out;
}

std::vector<const FamilyInfo*> Families::of_kind(std::string_view kind) const {
  std::vector<const FamilyInfo*> out;
  for (const FamilyInfo* f : all()) {
    if (!kind.empty() && f->kind == kind) out.push_back(f);
  }
  return out;
}

std::vector<std::string> Families::kinds() const {
  std::vector<std::string> out;
  for (const FamilyInfo* f : all()) {
    if (!f->kind.empty() && std::find(out.begin(), out.end(), f->kind) == out.end()) {
      out.push_back(f->kind);
    }
  }
  return out;
}

std::vector<std::string> Families::names() const {
  std::vector<std::string> out;
  for (const FamilyInfo* f : all())
    out.push_back(f->name);
  return out;
}

std::vector<ConfigKey> Families::config_keys() const {
  std::vector<ConfigKey> out;
  for (const FamilyInfo* f : all()) {
    for (const ConfigKey& k : f->config_keys) {
      const bool seen =
          std::any_of(out.begin(), out.end(), [&](const ConfigKey& o) { return o.name == k.name; });
      if (!seen) out.push_back(k);
    }
  }
  return out;
}

// ---- the family names of KernelDesc.h ----------------------------------------------------------

std::string_view to_string(Family f) {
  return Families::global().get(f).name;
}

std::optional<Family> parse_family(std::string_view s) {
  if (const FamilyInfo* f = Families::global().find(s)) return f->family;
  return std::nullopt;
}

std::vector<Family> all_families() {
  std::vector<Family> out;
  for (const FamilyInfo* f : Families::global().all())
    out.push_back(f->family);
  return out;
}

// ---- the public config -------------------------------------------------------------------------

Params config_overrides(const BlockConfig& c, const FamilyInfo& family) {
  // Every knob the caller set, by name: the fields' nonzero values, then `params`.
  Params set;
  for (auto [name, v] :
       {std::pair{"block_m", c.block_m}, std::pair{"block_n", c.block_n},
        std::pair{"num_warps", c.num_warps}, std::pair{"num_stages", c.num_stages}}) {
    if (v < 0) {
      throw UnsupportedError(
          fmt::format("{} must not be negative ({}); 0 takes the default", name, v));
    }
    if (v > 0) set.set(name, v);
  }
  if (!c.params.empty()) {
    const std::vector<ConfigKey> keys = Families::global().config_keys();
    std::vector<std::string> names;
    for (const ConfigKey& k : keys)
      names.push_back(k.name);
    for (const auto& [name, v] : c.params) {
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        throw UnsupportedError(fmt::format("unknown config key '{}'{}; the keys are: {}", name,
                                           did_you_mean(name, names), fmt::join(names, ", ")));
      }
      if (auto field = set.get(name); field && *field != v) {
        throw UnsupportedError(
            fmt::format("config key '{}' is set twice: {} as the BlockConfig field, {} in params",
                        name, *field, v));
      }
      set.set(name, v);
    }
  }
  Params out;
  for (const auto& [name, v] : set.items()) {
    const ConfigKey* k = family.key(name);
    if (k == nullptr) continue;  // another family's key (block_m of a decoding call)
    if (v < k->min || v > k->max) {
      throw UnsupportedError(
          fmt::format("config key {} = {} is out of range for {} kernels: {} "
                      "to {} ({})",
                      name, v, family.name, k->min, k->max, k->doc));
    }
    out.set(name, v);
  }
  return out;
}

Params config_overrides(const BlockConfig& config, Family family) {
  return config_overrides(config, Families::global().get(family));
}

}  // namespace flexjit::kernels
