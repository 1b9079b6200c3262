#include "tune/Manifest.h"

#include <flexjit/error.h>
#include <flexjit/kernel.h>

#include "codegen/cuda/Arch.h"
#include "ir/Visitor.h"
#include "kernels/Family.h"
#include "kernels/Registry.h"
#include "passes/RuntimeDivision.h"
#include "tune/Prune.h"
#include "util/InputFiles.h"
#include "util/Suggest.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <set>

namespace flexjit::tune {

namespace {

using nlohmann::json;

const std::set<std::string> kWorkloadKeys = {"name",      "kind",   "mods",       "mods_file",
                                             "mods_text", "dtypes", "head_dims",  "gqa_ratios",
                                             "shapes",    "archs",  "block_size", "page_size"};

// Whether a workload of `kind` may run on a paged KV cache (FamilyInfo::kv_pages).
bool kind_takes_pages(const std::string& kind) {
  for (const kernels::FamilyInfo* f : kernels::Families::global().of_kind(kind)) {
    if (f->kv_pages) return true;
  }
  return false;
}

class EntryError {
 public:
  EntryError(const std::filesystem::path& file, size_t index, std::string name)
      : prefix_(fmt::format("{}: workload {}{}", file.string(), index,
                            name.empty() ? "" : fmt::format(" ('{}')", name))) {}
  [[noreturn]] void fail(const std::string& problem) const {
    throw Error(fmt::format("{}: {}", prefix_, problem));
  }

 private:
  std::string prefix_;
};

std::vector<std::string> arch_list(const json& j, const EntryError& err, const char* what) {
  std::vector<std::string> out;
  if (!j.is_array()) err.fail(fmt::format("'{}' must be a list of archs such as \"sm_90a\"", what));
  for (const json& a : j) {
    if (!a.is_string()) err.fail(fmt::format("'{}' holds {}, not an arch name", what, a.dump()));
    try {
      cuda::Arch::parse(a.get<std::string>());
    } catch (const UnsupportedError& e) {
      err.fail(e.what());
    }
    out.push_back(a.get<std::string>());
  }
  return out;
}

int64_t positive(const json& j, const char* key, const EntryError& err, int64_t fallback) {
  if (!j.contains(key)) {
    if (fallback > 0) return fallback;
    err.fail(fmt::format("a shape needs '{}'", key));
  }
  const json& v = j.at(key);
  // The kernels take batch, heads and sequence lengths as 32-bit ints.
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(kMax)) ||
      v.get<int64_t>() <= 0 || v.get<int64_t>() > kMax) {
    err.fail(
        fmt::format("shape field '{}' is {}; it must be a positive integer of at most {} "
                    "(2^31 - 1)",
                    key, v.dump(), kMax));
  }
  return v.get<int64_t>();
}

Workload parse_workload(const json& j, size_t index, const std::filesystem::path& file,
                        const std::filesystem::path& base_dir,
                        const std::vector<std::string>& default_archs) {
  Workload w;
  w.index = index;
  const std::string name = j.is_object() && j.contains("name") && j.at("name").is_string()
                               ? j.at("name").get<std::string>()
                               : "";
  const EntryError err(file, index, name);
  if (!j.is_object()) err.fail("a workload must be a JSON object");
  for (const auto& [key, _] : j.items()) {
    if (!kWorkloadKeys.count(key)) {
      err.fail(fmt::format("unknown field '{}'; the fields are: {}", key,
                           fmt::join(kWorkloadKeys, ", ")));
    }
  }
  w.name = name.empty() ? fmt::format("workload {}", index) : name;
  w.named = !name.empty();
  // The kinds are the registered families' (kernels/Family.h).
  const std::vector<std::string> kinds = kernels::Families::global().kinds();
  if (j.contains("kind") && !j.at("kind").is_string()) {
    err.fail(fmt::format("'kind' must be one of {}", fmt::join(kinds, ", ")));
  }
  // The manifest format's default (docs/tuning.md), not a family's switch.
  w.kind = j.value("kind", "forward");
  if (std::find(kinds.begin(), kinds.end(), w.kind) == kinds.end()) {
    err.fail(fmt::format("kind '{}' is not one of {}{}", w.kind, fmt::join(kinds, ", "),
                         did_you_mean(w.kind, kinds)));
  }
  const int sources = j.contains("mods") + j.contains("mods_file") + j.contains("mods_text");
  if (sources != 1) {
    err.fail(
        "give the mods as exactly one of \"mods\" (a standard name), \"mods_file\" (a .fx "
        "file) or \"mods_text\" (inline .fx text)");
  }
  try {
    if (j.contains("mods")) {
      if (!j.at("mods").is_string()) err.fail("'mods' must be a standard mods name");
      w.mods_spec = j.at("mods").get<std::string>();
      const std::vector<std::string> names = standard_mod_names();
      if (std::find(names.begin(), names.end(), w.mods_spec) == names.end()) {
        err.fail(fmt::format("unknown mod '{}'; the standard mods are: {}", w.mods_spec,
                             fmt::join(names, ", ")));
      }
      w.mods = standard_mods(w.mods_spec);
      w.standard_mods = true;
    } else if (j.contains("mods_file")) {
      if (!j.at("mods_file").is_string()) err.fail("'mods_file' must be a path");
      std::filesystem::path p = j.at("mods_file").get<std::string>();
      if (p.is_relative()) p = base_dir / p;
      w.mods_spec = p.string();
      w.mods = load_mods_file(p.string());
    } else {
      if (!j.at("mods_text").is_string()) err.fail("'mods_text' must be .fx text");
      w.mods_spec = "<inline>";
      w.mods = parse_mods(j.at("mods_text").get<std::string>(), "<manifest>");
    }
    w.mods.check();
  } catch (const Error& e) {
    if (std::string(e.what()).rfind(file.string(), 0) == 0) throw;
    err.fail(fmt::format("mods: {}", e.what()));
  }

  if (j.contains("dtypes")) {
    if (!j.at("dtypes").is_array() || j.at("dtypes").empty())
      err.fail("'dtypes' must be a non-empty list");
    for (const json& d : j.at("dtypes")) {
      auto dt = d.is_string() ? parse_dtype(d.get<std::string>()) : std::nullopt;
      if (!dt || (*dt != DType::BF16 && *dt != DType::F16 && *dt != DType::F32)) {
        err.fail(fmt::format("dtype {} is not one of bf16, f16, f32", d.dump()));
      }
      w.dtypes.push_back(*dt);
    }
  } else {
    w.dtypes = {DType::BF16};
  }
  if (j.contains("head_dims")) {
    if (!j.at("head_dims").is_array() || j.at("head_dims").empty()) {
      err.fail("'head_dims' must be a non-empty list of head dims (128) or pairs ([192, 128])");
    }
    for (const json& h : j.at("head_dims")) {
      int qk = 0, v = 0;
      if (h.is_number_integer()) {
        qk = v = h.get<int>();
      } else if (h.is_array() && h.size() == 2 && h[0].is_number_integer() &&
                 h[1].is_number_integer()) {
        qk = h[0].get<int>();
        v = h[1].get<int>();
      } else {
        err.fail(fmt::format("head dim {} is neither an integer nor a [qk, v] pair", h.dump()));
      }
      if (qk <= 0 || v <= 0 || qk > 1024 || v > 1024) {
        err.fail(fmt::format("head dim {} is out of range (1 to 1024)", h.dump()));
      }
      w.head_dims.emplace_back(qk, v);
    }
  } else {
    w.head_dims = {{128, 128}};
  }
  if (j.contains("gqa_ratios")) {
    if (!j.at("gqa_ratios").is_array() || j.at("gqa_ratios").empty()) {
      err.fail("'gqa_ratios' must be a non-empty list of positive integers");
    }
    for (const json& g : j.at("gqa_ratios")) {
      if (!g.is_number_integer() || g.get<int>() < 1) {
        err.fail(fmt::format("gqa ratio {} is not a positive integer", g.dump()));
      }
      w.gqa_ratios.push_back(g.get<int>());
    }
  } else {
    w.gqa_ratios = {1};
  }
  if (!j.contains("shapes") || !j.at("shapes").is_array() || j.at("shapes").empty()) {
    err.fail(
        "'shapes' must be a non-empty list of {\"batch\", \"heads\", \"seqlen\"} objects "
        "(or seqlen_q / seqlen_kv)");
  }
  for (const json& s : j.at("shapes")) {
    if (!s.is_object()) err.fail(fmt::format("shape {} is not an object", s.dump()));
    WorkloadShape sh;
    sh.batch = positive(s, "batch", err, 1);
    sh.heads_q = positive(s, "heads", err, 0);
    const int64_t seqlen = s.contains("seqlen") ? positive(s, "seqlen", err, 0) : 0;
    sh.seqlen_q = positive(s, "seqlen_q", err, seqlen);
    sh.seqlen_kv = positive(s, "seqlen_kv", err, seqlen);
    w.shapes.push_back(sh);
  }
  for (int g : w.gqa_ratios) {
    for (const WorkloadShape& s : w.shapes) {
      if (s.heads_q % g != 0) {
        err.fail(fmt::format("heads {} is not a multiple of gqa ratio {}", s.heads_q, g));
      }
    }
  }
  w.archs = j.contains("archs") ? arch_list(j.at("archs"), err, "archs") : default_archs;
  if (j.contains("block_size")) {
    const json& b = j.at("block_size");
    if (!b.is_number_integer() || b.get<int>() < 0 || b.get<int>() % 16 != 0) {
      err.fail(
          fmt::format("block_size {} must be 0 (no block mask) or a multiple of 16", b.dump()));
    }
    w.block_size = b.get<int>();
  }
  if (j.contains("page_size")) {
    const json& p = j.at("page_size");
    if (!kind_takes_pages(w.kind)) {
      std::vector<std::string> paged;
      for (const std::string& k : kinds) {
        if (kind_takes_pages(k)) paged.push_back(k);
      }
      err.fail(
          fmt::format("'page_size' applies to {} workloads (a paged KV cache); this one "
                      "is a {} workload",
                      fmt::join(paged, ", "), w.kind));
    }
    const int64_t v = p.is_number_integer() ? p.get<int64_t>() : -1;
    if (v < 0 || v > 256 || (v & (v - 1)) != 0) {
      err.fail(fmt::format(
          "page_size {} must be 0 (contiguous K / V) or a power of two from 1 to 256", p.dump()));
    }
    w.page_size = static_cast<int>(v);
  }
  return w;
}

}  // namespace

Manifest parse_manifest(const std::string& text, const std::filesystem::path& file,
                        const std::filesystem::path& base_dir) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number overflow
    throw Error(fmt::format("{}: not valid JSON: {}", file.string(), e.what()));
  }
  Manifest m;
  m.file = file;
  const json* list = &j;
  if (j.is_object()) {
    for (const auto& [key, _] : j.items()) {
      if (key != "archs" && key != "workloads") {
        throw Error(
            fmt::format("{}: unknown top-level field '{}'; a manifest has \"archs\" and "
                        "\"workloads\"",
                        file.string(), key));
      }
    }
    if (j.contains("archs")) m.archs = arch_list(j.at("archs"), EntryError(file, 0, ""), "archs");
    if (!j.contains("workloads")) {
      throw Error(fmt::format("{}: no \"workloads\" list", file.string()));
    }
    list = &j.at("workloads");
  }
  if (!list->is_array()) {
    throw Error(fmt::format("{}: the workloads must be a JSON list", file.string()));
  }
  if (list->empty()) throw Error(fmt::format("{}: the workload list is empty", file.string()));
  for (size_t i = 0; i < list->size(); ++i) {
    try {
      m.workloads.push_back(parse_workload((*list)[i], i, file, base_dir, m.archs));
    } catch (const json::exception& e) {
      // A value of an unexpected JSON type that the checks above did not name.
      throw Error(fmt::format("{}: workload {}: {}", file.string(), i, e.what()));
    }
  }
  return m;
}

Manifest load_manifest(const std::filesystem::path& file) {
  // A regular file of at most 16 MiB: a FIFO, a device or a directory is refused before reading.
  const std::string text = files::read_text_file(
      file.string(), fmt::format("{}: cannot read the manifest", file.string()), "a manifest",
      files::kMaxManifestBytes);
  return parse_manifest(text, file, file.parent_path());
}

std::vector<kernels::Family> families_of_kind(const std::string& kind) {
  std::vector<kernels::Family> out;
  for (const kernels::FamilyInfo* f : kernels::Families::global().of_kind(kind))
    out.push_back(f->family);
  return out;
}

KernelQuery workload_query(const Workload& w, const std::string& arch, DType dtype,
                           std::pair<int, int> hd, int gqa, const WorkloadShape& s) {
  KernelQuery q;
  q.arch = arch;
  q.dtype = dtype;
  q.head_dim_qk = hd.first;
  q.head_dim_v = hd.second;
  q.gqa_ratio = gqa;
  q.divisible = false;  // the lengths are the calls', unknown here
  q.full_blocks = w.block_size > 0 && w.mods.mask_mod.defined();
  q.block_size = w.block_size;
  q.seqlen_q = static_cast<int>(s.seqlen_q);
  q.page_size = w.page_size;
  return q;
}

kernels::InputFacts workload_forward_facts(const Workload& w, const WorkloadShape& s) {
  kernels::InputFacts f;
  f.seqlen_q = s.seqlen_q;
  f.seqlen_kv = s.seqlen_kv;
  if (w.block_size > 0 && w.mods.mask_mod.defined())
    f.mask_q_block = f.mask_kv_block = w.block_size;
  // As the runtime sets them from the call's mods (runtime/Attention.cpp), so that a warmed
  // workload compiles the config the call will run.
  f.mask_mod = w.mods.mask_mod.defined();
  f.mask_mod_divides = passes::divides_by_runtime_value(w.mods.mask_mod);
  f.score_mod_reads_kv = ir::reads_var(w.mods.score_mod, ir::VarKind::KvIdx);
  f.mask_mod_loads_kv = ir::loads_at(w.mods.mask_mod, ir::VarKind::KvIdx);
  return f;
}

std::vector<WarmStep> workload_steps(const Workload& w, const std::string& arch_name, DType dtype,
                                     std::pair<int, int> hd, int gqa, const WorkloadShape& s) {
  const cuda::Arch arch = cuda::Arch::parse(arch_name);
  const KernelQuery query = workload_query(w, arch_name, dtype, hd, gqa, s);
  kernels::InputFacts facts = workload_forward_facts(w, s);
  // A paged call's KV length is the page table's capacity: whole pages.
  if (w.page_size > 0)
    facts.seqlen_kv = (s.seqlen_kv + w.page_size - 1) / w.page_size * w.page_size;
  std::vector<WarmStep> steps;
  for (const kernels::FamilyInfo* f : kernels::Families::global().of_kind(w.kind))
    steps.push_back({f->problem(query, arch), facts, ""});
  return steps;
}

WarmPlan plan_warmup(const Manifest& manifest, const std::vector<std::string>& arch_override,
                     bool all_configs) {
  const kernels::Registry& reg = kernels::Registry::global();
  WarmPlan plan;
  std::set<std::string> seen;
  auto add = [&](const Workload& w, kernels::KernelDesc d, bool is_default) {
    // One kernel serves every value of a launch-only key (decode_split's num_splits: the source
    // is the one of 0), so the candidates that differ only in it are one kernel.
    for (const kernels::ConfigKey& k : kernels::Families::global().get(d.family).config_keys) {
      if (k.launch_only && d.config.has(k.name)) d.config.set(k.name, 0);
    }
    // Keyed by the mods the kernel is generated from (a block-mask kernel keeps the mask_mod).
    const Mods kernel_mods = reg.get(d.family, d.variant).kernel_mods(w.mods);
    const std::string id = fmt::format("{}|{:016x}", d.str(), kernel_mods.hash());
    if (!seen.insert(id).second) return;
    plan.kernels.push_back({w.index, d, w.mods, is_default});
  };
  // The default of a step and, with --all-configs, every pruned candidate; then the kernels of
  // the later steps they change (FamilyInfo::changes_later: a dK/dV config that adds dQ makes the
  // dQ step its convert), each completed as the plan completes it. The change of the default, if
  // any (the untuned plan runs it in place of the changed family's own step). `current` is set
  // to the family being completed, for the error of one that cannot be.
  auto add_step = [&](const Workload& w, const WarmStep& st,
                      const std::function<kernels::KernelDesc(kernels::Family)>& problem_of,
                      kernels::Family& current) {
    current = st.problem.family;
    const kernels::FamilyInfo& info = kernels::Families::global().get(st.problem.family);
    const kernels::KernelDesc d = reg.complete(st.problem, st.facts, {}, st.forced);
    add(w, d, true);
    // The changes of the default and the candidates, in that order, each with whether the
    // untuned plan runs it.
    std::vector<std::pair<kernels::StepChange, bool>> changes;
    std::optional<kernels::StepChange> default_change;
    if (info.changes_later) {
      default_change = info.changes_later(d);
      if (default_change) changes.emplace_back(*default_change, true);
    }
    if (all_configs) {
      const kernels::Selection sel = reg.select(st.problem, st.facts, st.forced);
      kernels::KernelDesc keyed = st.problem;
      keyed.variant = std::string(sel.variant->name());
      const CandidateSet set = prune_configs(*sel.variant, keyed, st.facts);
      plan.pruned += set.pruned.size();
      for (const kernels::Params& c : set.candidates) {
        const kernels::KernelDesc cd = reg.resolve(sel, st.problem, st.facts, c);
        add(w, cd, c == set.default_config);
        if (!info.changes_later) continue;
        if (auto change = info.changes_later(cd)) changes.emplace_back(*change, false);
      }
    }
    for (const auto& [change, is_default] : changes) {
      current = change.family;
      add(w, reg.complete(problem_of(change.family), st.facts, change.overrides, change.variant),
          is_default);
    }
    return default_change;
  };
  for (const Workload& w : manifest.workloads) {
    const EntryError err(manifest.file, w.index, w.named ? w.name : "");
    const std::vector<std::string>& archs = arch_override.empty() ? w.archs : arch_override;
    if (archs.empty()) {
      err.fail("no archs: give \"archs\" in the manifest or --arch on the command line");
    }
    bool registered = true;
    for (kernels::Family fam : families_of_kind(w.kind)) {
      if (!reg.variants(fam).empty()) continue;
      registered = false;
      plan.notes.push_back(fmt::format(
          "{}: workload {}{}: no variant registered for "
          "family {} (kind {}); nothing to compile for it",
          manifest.file.string(), w.index, w.named ? fmt::format(" ('{}')", w.name) : "",
          kernels::to_string(fam), w.kind));
    }
    if (!registered) continue;
    const bool mask = w.block_size > 0 && w.mods.mask_mod.defined();
    for (const std::string& arch : archs) {
      for (DType dt : w.dtypes) {
        for (auto hd : w.head_dims) {
          for (int gqa : w.gqa_ratios) {
            for (const WorkloadShape& s : w.shapes) {
              kernels::Family fam = families_of_kind(w.kind).front();
              const KernelQuery query = workload_query(w, arch, dt, hd, gqa, s);
              // A family's problem for this workload shape (kernels/Family.h).
              auto problem_of = [&](kernels::Family f) {
                return kernels::Families::global().get(f).problem(query, cuda::Arch::parse(arch));
              };
              try {
                // The families whose own step the default plan does not run: an earlier step
                // changed it (only the change's kernel runs, unless --all-configs warms both).
                std::set<kernels::Family> changed;
                for (const WarmStep& st : workload_steps(w, arch, dt, hd, gqa, s)) {
                  if (changed.count(st.problem.family) && !all_configs) continue;
                  if (auto change = add_step(w, st, problem_of, fam)) {
                    changed.insert(change->family);
                  }
                }
                // The kernels built for any workload with a mask_mod (the block mask).
                for (const kernels::FamilyInfo* f : kernels::Families::global().all()) {
                  if (!mask || !f->for_mask_mod) continue;
                  fam = f->family;
                  add(w, reg.complete(problem_of(f->family), {}), true);
                }
              } catch (const UnsupportedError& e) {
                err.fail(fmt::format("{} {} d={}/{} gqa={} for {}: {}", kernels::to_string(fam),
                                     to_string(dt), hd.first, hd.second, gqa, arch, e.what()));
              }
            }
          }
        }
      }
    }
  }
  return plan;
}

}  // namespace flexjit::tune
