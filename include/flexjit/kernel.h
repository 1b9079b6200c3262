// Kernels as data: emit or compile the kernel flexjit would build for a problem, without running
// it — what `flexjit emit`, `flexjit compile` and `flexjit inspect` show, and what a deployment
// uses to warm the kernel caches.
//
//   KernelQuery q;
//   q.arch = "sm_90a";
//   q.head_dim_qk = 64;
//   KernelSource src = emit_kernel(standard_mods("alibi_causal"), q);   // CUDA text
//   KernelBinary bin = compile_kernel(standard_mods("alibi_causal"), q); // cubin + resources
//
// Kernels come in families (what they compute: forward, block_mask, ...) and variants (how: the
// sm_80 mma.sync forward, ...); docs/kernels/README.md describes them. A query names a family;
// the variant is chosen by the target arch unless the query names one.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/export.h>
#include <flexjit/mods.h>
#include <flexjit/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace flexjit {

struct KernelQuery {
  // A registered family (kernel_families()): "forward" | "block_mask" | "backward_preprocess" |
  // "backward_dkdv" | "backward_dq" | "decode_split" | "decode_combine" | "cp_merge"
  std::string family = "forward";
  std::string variant;        // empty: chosen by the arch ("sm80_mma", ...)
  std::string arch;           // "sm_80" ... "sm_90a"; empty: the current GPU's
  DType dtype = DType::BF16;  // forward: of q, k, v
  int head_dim_qk = 128;
  int head_dim_v = 0;  // 0: head_dim_qk
  int gqa_ratio = 1;
  bool divisible = false;          // forward, backward: Sq and Skv are multiples of the tiles
  bool full_blocks = true;         // forward, backward: the block mask has full_* arrays
  int block_size = 128;            // block_mask: the sparse tile size
  BlockConfig config;              // the keys the family takes (kernel_families()) apply;
                                   // another family's are ignored
  int seqlen_q = 1;                // decode_split: query tokens (with gqa_ratio: the packed rows)
  int page_size = 0;               // decode_split, forward: 0 contiguous K / V, else the page
                                   // size (forward: a paged KV cache, chunked prefill)
  bool kv_e4m3 = false;            // decode_split, forward: K / V of an e4m3 KV cache with
                                   // per-kv-head scales (forward: on the cache, page_size 0
                                   // its contiguous ragged layout; docs/kernels/decode.md)
  MathMode math = MathMode::Auto;  // forward, backward_dkdv / dq, decode_split (docs/math.md)
  bool deterministic = false;      // backward_dkdv: ordered buffer gradients (docs/backward.md)
};

struct KernelSource {
  // The kernel description (docs/kernels/README.md), as text and JSON:
  // "forward/sm80_mma sm_90a bf16 d=128/128 gqa=1 divisible=0 full_blocks=1 | block_m=128 ..."
  std::string description;
  std::string description_json;
  // Which variant was chosen and why the others were passed over.
  std::string selection;
  std::string kernel_name;  // the main entry point
  std::string source;       // the whole CUDA translation unit
  std::string source_key;   // SHA-256 of the source body
  unsigned dynamic_smem_bytes = 0;
};

struct KernelBinary {
  KernelSource source;
  std::string cache_key;
  std::string cache;        // "compiled", "memory hit" or "disk hit"
  double elapsed_ms = 0;    // of this call
  double compile_ms = 0;    // of the NVRTC compile that produced the cubin
  std::vector<char> cubin;  // -1 below: not reported
  int registers = -1, spill_store_bytes = -1, spill_load_bytes = -1, stack_frame_bytes = -1,
      static_shared_bytes = -1;
  // Non-empty when ptxas serialized the kernel's wgmma instructions (its remark, e.g. "C7512:
  // insufficient register resources"): a Hopper kernel that runs far below its speed.
  std::string wgmma_serialized;
};

// The source of the kernel `query` describes for `mods` (no compilation; no GPU needed when
// query.arch is set). Throws UnsupportedError for a family, variant, head dim, dtype, arch or
// config no variant supports (the message says why), CompileError for mods that do not type
// check, Error when no arch is given and there is no GPU to take it from.
FLEXJIT_API KernelSource emit_kernel(const Mods& mods, const KernelQuery& query);

// emit_kernel, then NVRTC through the process-wide kernel caches ($FLEXJIT_CACHE_DIR, ...).
// Throws JitError when NVRTC rejects the source.
FLEXJIT_API KernelBinary compile_kernel(const Mods& mods, const KernelQuery& query);

struct KernelVariantInfo {
  std::string family;   // "forward"
  std::string name;     // "sm80_mma"
  std::string summary;  // one line
  bool auto_select = true;
  int priority = 0;
  // Not yet verified on its hardware: selected automatically only when FLEXJIT_ENABLE_VARIANTS
  // names it.
  bool experimental = false;
  std::vector<std::string> templates;     // spliced template files
  std::vector<std::string> entry_points;  // kernel names
};

// Every registered variant, family by family, in selection order.
FLEXJIT_API std::vector<KernelVariantInfo> kernel_variants();

// A config key a family takes: BlockConfig's field of that name, or BlockConfig::params[name].
struct KernelConfigKey {
  std::string name;                  // "num_splits"
  std::string doc;                   // one line
  int64_t min = 1, max = INT32_MAX;  // the values the family accepts
};

struct KernelFamilyInfo {
  std::string name;     // "decode_split"
  std::string summary;  // one line
  // The workload kind whose plan runs it (a tuning manifest's "kind": "forward", "backward",
  // "decode"); empty: none of its own (block_mask).
  std::string kind;
  bool math = false;  // evaluates a score_mod: KernelQuery::math / AttentionOptions::math apply
  std::vector<KernelConfigKey> config_keys;
};

// Every registered family, in registration order (docs/kernels/README.md).
FLEXJIT_API std::vector<KernelFamilyInfo> kernel_families();

}  // namespace flexjit
