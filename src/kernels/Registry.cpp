#include "kernels/Registry.h"

#include "kernels/Family.h"
#include "util/Env.h"
#include "util/Log.h"

#include <fmt/format.h>

#include <algorithm>

namespace flexjit::kernels {

std::string Selection::str() const {
  std::string s = fmt::format("{}/{}", to_string(variant->family()), variant->name());
  if (forced) s += " (as asked)";
  if (!skipped.empty()) s += fmt::format(" (passed over: {})", fmt::join(skipped, "; "));
  return s;
}

Registry& Registry::global() {
  static Registry* r = [] {
    auto* reg = new Registry();  // never destroyed: variants may be used at exit
    register_builtin_variants(*reg);
    reg->set_excluded(env::list("FLEXJIT_EXCLUDE_VARIANTS"));
    reg->set_enabled(env::list("FLEXJIT_ENABLE_VARIANTS"));
    return reg;
  }();
  return *r;
}

const Variant& Registry::add(std::unique_ptr<Variant> variant) {
  FJ_ASSERT(variant != nullptr, "Registry::add of a null variant");
  if (Families::global().find(variant->family()) == nullptr) {
    throw UnsupportedError(fmt::format(
        "cannot register kernel variant '{}': its family (id {}) is not registered; add its "
        "FamilyInfo to Families::global() first (kernels/Family.h)",
        variant->name(), static_cast<int>(variant->family())));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& v : variants_) {
    if (v->family() == variant->family() && v->name() == variant->name()) {
      throw UnsupportedError(fmt::format("a kernel variant {}/{} is already registered",
                                         to_string(v->family()), v->name()));
    }
  }
  variants_.push_back(std::move(variant));
  return *variants_.back();
}

namespace {

// UnsupportedError unless every name is a registered "family/variant"; `what` names the setting.
void check_names(const std::vector<const Variant*>& all, const std::vector<std::string>& names,
                 const char* verb, const char* what) {
  std::vector<std::string> known;
  for (const Variant* v : all)
    known.push_back(fmt::format("{}/{}", to_string(v->family()), v->name()));
  for (const std::string& fv : names) {
    if (std::find(known.begin(), known.end(), fv) == known.end()) {
      throw UnsupportedError(
          fmt::format("cannot {} kernel variant '{}' ({}): no such variant; the registered ones "
                      "are {}",
                      verb, fv, what, fmt::join(known, ", ")));
    }
  }
}

}  // namespace

void Registry::set_excluded(const std::vector<std::string>& family_variants) {
  check_names(all(), family_variants, "exclude", "FLEXJIT_EXCLUDE_VARIANTS");
  std::lock_guard<std::mutex> lock(mu_);
  excluded_ = family_variants;
}

void Registry::set_enabled(const std::vector<std::string>& family_variants) {
  check_names(all(), family_variants, "enable", "FLEXJIT_ENABLE_VARIANTS");
  std::lock_guard<std::mutex> lock(mu_);
  enabled_ = family_variants;
}

std::vector<std::string> Registry::enabled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return enabled_;
}

std::vector<std::string> Registry::excluded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return excluded_;
}

const Variant* Registry::find(Family family, std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& v : variants_) {
    if (v->family() == family && v->name() == name) return v.get();
  }
  return nullptr;
}

const Variant& Registry::get(Family family, std::string_view name) const {
  if (const Variant* v = find(family, name)) return *v;
  std::vector<std::string> names;
  for (const Variant* c : variants(family))
    names.emplace_back(c->name());
  const std::string_view f = to_string(family);
  throw UnsupportedError(
      fmt::format("no {} kernel variant '{}'; the {} variants are: {}", f, name, f,
                  names.empty() ? "(none)" : fmt::format("{}", fmt::join(names, ", "))));
}

std::vector<const Variant*> Registry::variants(Family family) const {
  std::vector<const Variant*> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& v : variants_) {
      if (v->family() == family) out.push_back(v.get());
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Variant* a, const Variant* b) {
    if (a->auto_select() != b->auto_select()) return a->auto_select();
    return a->priority() > b->priority();
  });
  return out;
}

std::vector<const Variant*> Registry::all() const {
  std::vector<const Variant*> out;
  for (Family f : all_families()) {
    for (const Variant* v : variants(f))
      out.push_back(v);
  }
  return out;
}

namespace {

// Why a variant cannot take the caller's config overrides: a name its config does not have.
std::optional<std::string> foreign_override(const Variant& v, const KernelDesc& problem,
                                            const Params& overrides) {
  if (overrides.items().empty()) return std::nullopt;
  const Params own = v.default_config(problem);
  for (const auto& item : overrides.items()) {
    if (own.has(item.first)) continue;
    std::vector<std::string> names;
    for (const auto& o : own.items())
      names.push_back(o.first);
    return fmt::format("has no config parameter '{}' (its parameters: {})", item.first,
                       fmt::join(names, ", "));
  }
  return std::nullopt;
}

}  // namespace

Selection Registry::select(const KernelDesc& problem, const InputFacts& facts,
                           std::string_view forced, const Params& config_overrides) const {
  const std::vector<const Variant*> candidates = variants(problem.family);
  const std::string_view family = to_string(problem.family);
  Selection sel;
  if (!forced.empty()) {
    const Variant* v = &get(problem.family, forced);
    if (auto why = v->unsupported(problem, facts)) {
      throw UnsupportedError(fmt::format("{}/{} cannot run this call: {}", family, forced, *why));
    }
    sel.variant = v;
    sel.forced = true;
  } else {
    const std::vector<std::string> excluded_list = excluded();
    const std::vector<std::string> enabled_list = enabled();
    for (const Variant* v : candidates) {
      if (!v->auto_select()) continue;
      const std::string fv = fmt::format("{}/{}", family, v->name());
      if (std::find(excluded_list.begin(), excluded_list.end(), fv) != excluded_list.end()) {
        sel.skipped.push_back(fv + ": excluded (FLEXJIT_EXCLUDE_VARIANTS)");
        continue;
      }
      if (auto why = v->unsupported(problem, facts)) {
        sel.skipped.push_back(fmt::format("{}/{}: {}", family, v->name(), *why));
        continue;
      }
      if (auto why = foreign_override(*v, problem, config_overrides)) {
        sel.skipped.push_back(fmt::format("{}/{}: {}", family, v->name(), *why));
        continue;
      }
      if (v->experimental() &&
          std::find(enabled_list.begin(), enabled_list.end(), fv) == enabled_list.end()) {
        sel.skipped.push_back(
            fv +
            ": experimental, not yet verified on the GPU it targets (FLEXJIT_ENABLE_VARIANTS=" +
            fv + " selects it)");
        continue;
      }
      sel.variant = v;
      break;
    }
    if (sel.variant == nullptr) {
      throw UnsupportedError(fmt::format(
          "no {} kernel variant supports {} {} d={}/{} gqa={}: {}", family, problem.arch.str(),
          to_string(problem.dtype), problem.head_dim_qk, problem.head_dim_v, problem.gqa_ratio,
          sel.skipped.empty() ? std::string("none is registered")
                              : fmt::format("{}", fmt::join(sel.skipped, "; "))));
    }
  }
  FJ_LOG("kernels", "selected {} for {}", sel.str(), problem.str());
  return sel;
}

KernelDesc Registry::complete(const KernelDesc& problem, const InputFacts& facts,
                              const Params& config_overrides, std::string_view forced,
                              Selection* selection) const {
  Selection sel = select(problem, facts, forced, config_overrides);
  KernelDesc d = resolve(sel, problem, facts, config_overrides);
  if (selection != nullptr) *selection = std::move(sel);
  return d;
}

KernelDesc Registry::resolve(const Selection& selection, const KernelDesc& problem,
                             const InputFacts& facts, const Params& config_overrides) const {
  const Variant* v = selection.variant;
  FJ_ASSERT(v != nullptr && v->family() == problem.family,
            "Registry::resolve with a selection of another family than " + problem.str());
  KernelDesc d = problem;
  d.variant = std::string(v->name());
  d.config = v->resolve_config(d, config_overrides, facts);
  v->specialize(d, facts);
  v->validate(d);
  return d;
}

}  // namespace flexjit::kernels
