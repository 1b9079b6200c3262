// `flexjit tune --manifest FILE`: the workloads a deployment will run (docs/tuning.md,
// "Manifests"), and the kernels they need.
//
//   {"archs": ["sm_80", "sm_90a"],
//    "workloads": [
//      {"name": "llama-causal", "kind": "forward", "mods": "causal",
//       "dtypes": ["bf16"], "head_dims": [128, [192, 128]], "gqa_ratios": [1, 4],
//       "shapes": [{"batch": 4, "heads": 16, "seqlen": 4096}], "block_size": 128}]}
//
// A top-level list is the workloads alone. Mods come from exactly one of "mods" (a standard
// name), "mods_file" (a .fx file, relative to the manifest) or "mods_text" (inline .fx text).
// Everything is checked before any work: a bad entry is an Error naming the file, the entry's
// index and the problem.
#pragma once

#include <flexjit/kernel.h>
#include <flexjit/mods.h>
#include <flexjit/types.h>

#include "kernels/Variant.h"

#include <filesystem>
#include <string>
#include <vector>

namespace flexjit::tune {

struct WorkloadShape {
  int64_t batch = 1, heads_q = 1, seqlen_q = 0, seqlen_kv = 0;
};

struct Workload {
  size_t index = 0;
  std::string name;            // "workload 3" when not given
  bool named = false;          // the manifest gave the name
  std::string kind;            // a registered family's kind (FamilyInfo::kind): "forward", ...
  std::string mods_spec;       // the standard name, the file, or "<inline>"
  bool standard_mods = false;  // mods_spec is a standard name
  Mods mods;
  std::vector<DType> dtypes;                   // default: bf16
  std::vector<std::pair<int, int>> head_dims;  // (qk, v); default: (128, 128)
  std::vector<int> gqa_ratios;                 // default: 1
  std::vector<WorkloadShape> shapes;           // at least one
  std::vector<std::string> archs;              // default: the manifest's
  int block_size = 128;  // the block mask's sparse block when the mods have a mask_mod (0: none)
  int page_size = 0;  // a kind with FamilyInfo::kv_pages: the KV cache's page size (0: contiguous)
};

struct Manifest {
  std::filesystem::path file;
  std::vector<std::string> archs;
  std::vector<Workload> workloads;
};

// Reads and checks a manifest; Error "FILE: workload 2 ('name'): problem" on a bad one.
Manifest load_manifest(const std::filesystem::path& file);
// The same for text (`file` names it in errors; relative mods files resolve against base_dir).
Manifest parse_manifest(const std::string& text, const std::filesystem::path& file,
                        const std::filesystem::path& base_dir);

// The kernel families a workload kind needs, in plan order.
std::vector<kernels::Family> families_of_kind(const std::string& kind);

// One kernel to compile for a manifest.
struct WarmKernel {
  size_t workload = 0;  // index
  kernels::KernelDesc desc;
  Mods mods;
  bool is_default = true;  // the config the call runs untuned (else a tuning candidate)
};

struct WarmPlan {
  std::vector<WarmKernel> kernels;  // deduplicated
  // What cannot be warmed, one line each: "workload 2 ('x'): no variant registered for family
  // backward_dkdv (kind backward)".
  std::vector<std::string> notes;
  size_t pruned = 0;  // configs pruned with --all-configs
};

// The kernels `manifest` needs for `archs` (empty: each workload's), defaults only or every
// pruned candidate: per workload shape, its plan's kernels as the runtime completes them (the
// later steps that a step's config changes, FamilyInfo::changes_later: a backward's dQ convert
// where a dK/dV config adds dQ with atomics; a launch-only key's kernel once: decode_split for
// every split count) and, for mods with a mask_mod, the FamilyInfo::for_mask_mod families' (the
// block mask). Errors (a head dim or dtype no variant
// supports for an arch) name the file, the workload and the problem, before anything is compiled.
WarmPlan plan_warmup(const Manifest& manifest, const std::vector<std::string>& archs,
                     bool all_configs);

// One step of a workload's plan: its problem and input facts as the runtime plans them for a
// shape (the backward: preprocess, dK/dV, dQ; decoding: split, combine), and a variant it names.
struct WarmStep {
  kernels::KernelDesc problem;
  kernels::InputFacts facts;
  std::string forced;
};
std::vector<WarmStep> workload_steps(const Workload& w, const std::string& arch, DType dtype,
                                     std::pair<int, int> head_dims, int gqa,
                                     const WorkloadShape& shape);

// The kernel query of a workload shape: what each family of its kind makes its problem of
// (FamilyInfo::problem): divisible = false, full_blocks and block_size from the workload's mask,
// the shape's seqlen_q, the workload's page_size.
KernelQuery workload_query(const Workload& w, const std::string& arch, DType dtype,
                           std::pair<int, int> head_dims, int gqa, const WorkloadShape& shape);
// The input facts of a workload shape as flex_attention plans them.
kernels::InputFacts workload_forward_facts(const Workload& w, const WorkloadShape& s);

}  // namespace flexjit::tune
