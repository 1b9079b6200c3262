// A kernel variant: one way to compute one kernel family (forward/sm80_mma, forward/reference,
// block_mask/warp_per_tile, ...). A variant states, in one class:
//   - its templates (the .cuh texts spliced after the generated mods) and entry points;
//   - what it supports: unsupported() with a precise reason, validate() for a full description;
//   - its config space and defaults (what the tuner searches, what a call uses untuned);
//   - its shared-memory formula and, in the family's subclass (FamilyVariant), its workspace
//     and launch formulas: grid, block and argument bytes for the family's inputs.
// Variants are registered in the Registry (kernels/Registry.h), which selects one per call;
// docs/kernels/README.md says how to add a variant or a family.
#pragma once

#include "codegen/cuda/SourceAssembly.h"
#include "device/ModuleCache.h"
#include "kernels/KernelDesc.h"

#include <flexjit/mods.h>
#include <flexjit/tensor.h>

#include <cstring>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flexjit::kernels {

// What selection knows about a call's inputs beyond the description: facts that decide whether
// a variant can serve the call but do not change its source. Defaults describe "anything
// goes" (emit / compile without inputs).
struct InputFacts {
  // Every data pointer and stride 16-byte aligned (vector loads, cp.async, TMA); otherwise
  // `alignment_blocker` says what is not.
  bool aligned16 = true;
  std::string alignment_blocker;
  // The block mask's sparse tile size; 0 without a block mask.
  int mask_q_block = 0, mask_kv_block = 0;
  // The sequence lengths of the call; -1 when unknown.
  int64_t seqlen_q = -1, seqlen_kv = -1;
  // Why the TMA tensor maps of the sm_90a kernels cannot describe q, k or v (a stride TMA cannot
  // express); empty when they can or when there are no inputs.
  std::string tma_blocker;
  // The call's mods have a mask_mod (false where unknown): forward/sm90a_wgmma takes a block
  // mask with 192-row tiles only then (its union schedule's loop is compiled with a mask_mod).
  bool mask_mod = false;
  // The mask_mod divides by a value known only at run time (passes/RuntimeDivision.h):
  // forward/sm90a_wgmma's defaults keep 128-row tiles for it.
  bool mask_mod_divides = false;
  // The call's score_mod reads kv_idx (alibi, relative biases; ir::reads_var): forward/
  // sm90a_wgmma's defaults keep 128-row tiles for it at head dims below the 128 tile.
  bool score_mod_reads_kv = false;
  // The call's mask_mod loads a buffer at kv_idx (a document mask; ir::loads_at): forward/
  // sm90a_wgmma's defaults keep 128-row tiles for it on a KV cache.
  bool mask_mod_loads_kv = false;
  // The call's softmax scale is positive (the default 1 / sqrt(head_dim_qk) is): the
  // forward/sm90a_wgmma kernel folds it into the exponent's factor after the row max, which only
  // a positive scale leaves in place, and serves no other.
  bool scale_positive = true;
};

// Clears `aligned16` (saying why in `blocker`) unless t's data pointer and its strides of the
// leading dims (those of extent > 1; the last dim is contiguous) are multiples of 16 bytes.
// Nothing once aligned16 is false: the first blocker is the one reported.
void check_aligned16(const TensorRef& t, const char* name, bool& aligned16, std::string& blocker);

// A template spliced into a variant's source, under its file name in templates/. Templates
// `before_mods` come ahead of the generated config struct and mods (the ABI and prelude every
// kernel shares); the rest follow them (the kernel bodies that call the mods).
struct TemplateText {
  std::string name;
  std::string_view text;
  bool before_mods = false;
};

// templates/flexjit_abi.h and templates/prelude.cuh, embedded, before the mods.
std::vector<TemplateText> common_templates();

// Kernel parameters as cuLaunchKernel takes them: one pointer per parameter, each to a copy of
// the argument's bytes that lives as long as this object.
class KernelArgs {
 public:
  template <typename T>
  void add(const T& value) {
    add_bytes(&value, sizeof(T));
  }
  void add_bytes(const void* data, size_t bytes);
  void** pointers();
  size_t size() const { return storage_.size(); }

 private:
  std::vector<std::vector<uint64_t>> storage_;  // 8-byte aligned copies
  std::vector<void*> pointers_;
};

// One kernel launch of a plan step.
struct Launch {
  // One of Variant::entry_points(), or with `companion` >= 0 one of that companion's.
  std::string entry_point;
  // -1: a kernel of the step's own module; k: of the k-th kernel of Variant::companions().
  int companion = -1;
  runtime::Dim3 grid, block;
  unsigned smem_bytes = 0;
  KernelArgs args;
  // Programmatic dependent launch (sm_90+; runtime::launch): the kernel may start while the
  // previous one on the stream is still running, and executes griddepcontrol.wait before it
  // reads anything that kernel wrote.
  bool programmatic = false;
  // Bytes of the step's workspace set to zero on the stream right before the kernel (a counter
  // the kernel's CTAs take work from: the persistent forward's); none when zero_bytes is 0.
  void* zero_first = nullptr;
  size_t zero_bytes = 0;
  // Host steps on the call's stream around the launch (runtime::launch_plan): `before` right
  // before it is enqueued (a wait for another stream's work), `after` right after (recording
  // that it was: device/MaskScheduleCache.h). Empty: none.
  std::function<void(runtime::CuStream)> before, after;
};

class Variant {
 public:
  virtual ~Variant() = default;

  virtual Family family() const = 0;
  virtual std::string_view name() const = 0;     // "sm80_mma": [a-z0-9_]+
  virtual std::string_view summary() const = 0;  // one line for `flexjit kernels`
  // Auto-selected variants compete by priority (higher first); the others run only when a
  // caller names them (AttentionOptions::variant, `--variant`).
  virtual bool auto_select() const { return true; }
  virtual int priority() const { return 0; }
  // An experimental variant is not yet verified on the hardware it targets: automatic selection
  // passes over it (saying so) unless it is enabled (FLEXJIT_ENABLE_VARIANTS,
  // Registry::set_enabled); a caller may always name it.
  virtual bool experimental() const { return false; }

  // Why this variant cannot serve `problem` (config ignored) with these inputs: a sentence that
  // names the value and what would be accepted. nullopt when it can.
  virtual std::optional<std::string> unsupported(const KernelDesc& problem,
                                                 const InputFacts& facts) const = 0;
  // Throws UnsupportedError for a full description (config included) this variant cannot
  // compile, naming the offending value and the limits.
  virtual void validate(const KernelDesc& desc) const = 0;

  // The config a call uses untuned (the defaults table), and every config worth timing.
  virtual Params default_config(const KernelDesc& problem) const = 0;
  virtual std::vector<Params> config_space(const KernelDesc& problem) const = 0;
  // The defaults with a caller's `overrides` applied, adjusted to the inputs where the caller
  // left a value open (e.g. tiles that divide the block mask's). The one place a config is
  // resolved; UnsupportedError for an override name the variant does not have.
  virtual Params resolve_config(const KernelDesc& problem, const Params& overrides,
                                const InputFacts& facts) const;
  // The query rows of a `config` tile that must lie inside one sparse block of a block mask
  // (the autotuner prunes configs whose unit does not divide the mask's q block): block_m by
  // default; less where the kernel splits its tile over the mask's blocks.
  virtual int64_t mask_q_unit(const Params& config) const {
    return config.get("block_m").value_or(0);
  }
  // Sets the flags that follow from the resolved config and the inputs (e.g. `divisible` from
  // the tile sizes and the lengths). The default sets none.
  virtual void specialize(KernelDesc& desc, const InputFacts& facts) const {}

  // Every template the source splices, in order (usually common_templates() first).
  virtual std::vector<TemplateText> templates() const = 0;
  // The kernels of the module; the first is GeneratedSource::kernel_name.
  virtual std::vector<std::string> entry_points() const = 0;
  // The mods the source is generated from (a block-mask kernel keeps the mask_mod only).
  virtual Mods kernel_mods(const Mods& mods) const { return mods; }
  // Complete descriptions of the kernels of other families (each built with no mods) whose entry
  // points this variant's launches also use (Launch::companion): kernels that no mods shape, kept
  // out of the variant's own module so that one build serves every mods and a cold build
  // compiles them beside it rather than inside it (the sm_90a forward's union schedule:
  // kernels/forward_companions/UnionSchedule.h). KernelBuilder builds them with the kernel and
  // BuiltKernel::companions holds them in this order. None by default.
  virtual std::vector<KernelDesc> companions(const KernelDesc& desc, const Mods& mods) const {
    return {};
  }
  // The source of `desc` (validated first) with `mods` already lowered (lower_mods).
  virtual cuda::GeneratedSource generate(const Mods& mods, const KernelDesc& desc) const = 0;
  // Dynamic shared memory of the main entry point.
  virtual unsigned smem_bytes(const KernelDesc& desc) const = 0;
};

// The variants of one family share its inputs type: what the runtime validated for a call.
template <Family F, typename Inputs>
class FamilyVariant : public Variant {
 public:
  using InputsType = Inputs;
  static constexpr Family kFamily = F;
  Family family() const final { return F; }
  // Device scratch memory the launches need (0: none).
  virtual size_t workspace_bytes(const KernelDesc& desc, const Inputs& in) const { return 0; }
  // The launches, in order, on a workspace of workspace_bytes() (null when 0).
  virtual std::vector<Launch> launches(const KernelDesc& desc, const Inputs& in,
                                       void* workspace) const = 0;
};

// A block mask's sparse blocks must be multiples of a kernel's tiles: when config[name] does
// not divide `block` and the caller left it open (not in `overrides`), sets it to the largest
// of `sizes` (descending) that is not above it and divides `block`, if any. Returns whether
// the tile needed fitting (the caller may then adjust what depends on it).
bool fit_tile_to_block(Params& config, const char* name, int64_t block, const Params& overrides,
                       std::initializer_list<int> sizes);

// UnsupportedError unless desc's config has exactly the keys `names` (naming the missing one, or
// the count it takes).
void require_keys(const KernelDesc& desc, std::initializer_list<const char*> names);

// Applies `overrides` on `config`: UnsupportedError naming `variant` for unknown names.
Params apply_overrides(const Variant& variant, Params config, const Params& overrides);

// The `divisible` flag of a kernel tiled by config block_m x block_n: set when every tile is
// full (the bounds checks compile out); left alone while the lengths are unknown (< 0).
void specialize_divisible(KernelDesc& desc, const InputFacts& facts);

// The configs among `candidates` that `variant` validates for `problem` (missing divisible /
// full_blocks flags taken as 0): a config_space() from a grid of candidates.
std::vector<Params> valid_configs(const Variant& variant, const KernelDesc& problem,
                                  const std::vector<Params>& candidates);

// A variant's translation unit: the comment block (flexjit and NVRTC versions, desc.str(), the
// mods as text, `// source key: <sha256>`), then one `// ---- name ----` section each for the
// templates before the mods, the config struct, the mods (generate_mod_functions, with the
// math functions of desc's fast_math flag: kernels/MathMode.h) and the
// templates after them (with `mod_grads`, the backward's generated gradient functions follow the
// mods in a section of their own). No #include anywhere: NVRTC needs no headers. `what` describes
// the kernel in the comment block ("forward kernel `flexjit_forward`").
cuda::GeneratedSource assemble_variant_source(const Variant& variant, const KernelDesc& desc,
                                              const Mods& mods, const std::string& config_struct,
                                              const std::string& what,
                                              const std::string& mods_label = "mods",
                                              const std::string& mod_grads = {});

}  // namespace flexjit::kernels
