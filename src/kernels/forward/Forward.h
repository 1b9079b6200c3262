// The forward family: out = softmax(score_mod(scale · Q Kᵀ) masked by mask_mod) · V and the
// log-sum-exp, per (batch, query head). Its variants (sm80_mma here; the test suite's naive
// reference; later sm90a_wgmma) share the problem description, the inputs and the kernel ABI
// (FjFwdArgs in templates/flexjit_abi.h).
//
// Problem flags (KernelDesc::flags):
//   divisible    1 when Sq % block_m == 0 and Skv % block_n == 0 (bounds checks compiled out)
//   full_blocks  1 when the block mask carries full_* arrays (full tiles skip the mask_mod)
//   fast_math    1: the score_mod's transcendentals use hardware approximations (MathMode.h)
// and, on a KV cache only (chunked prefill; absent otherwise, so contiguous descriptions keep
// their text and tuning keys):
//   page_size    the page size of K / V pools read through a page table (1..256, 2^k)
//   seq_lens     1: per-sequence KV lengths bound each sequence's keys (include/flexjit/paged_kv.h)
//   kv_e4m3      1: K / V are e4m3 with per-kv-head f32 scales (an e4m3 KV cache; `dtype` stays
//                q's; forward/sm90a_wgmma only, docs/kernels/forward_sm90.md "e4m3 KV caches")
#pragma once

#include <flexjit/attention.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/tensor.h>

#include "binding/Fp8Descales.h"
#include "kernels/Family.h"
#include "kernels/TuningOutputs.h"
#include "kernels/Variant.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace flexjit::kernels {

// The descale factors of e4m3 q, k, v (AttentionOptions::descale; FjFp8Args).
using Fp8Descales = runtime::Fp8Descales;

// What a forward launch reads and writes, as the runtime validated it.
struct ForwardInputs {
  TensorRef q, k, v, out;
  std::optional<TensorRef> lse;
  QkvShape shape;
  std::optional<float> scale;                   // default 1 / sqrt(head_dim_qk)
  const DeviceBlockMask* block_mask = nullptr;  // null: every tile, mask_mod everywhere
  std::vector<uint64_t> mod_params;             // the FjModParams bytes (binding/ModArgs.h)
  // A KV cache (flags page_size / seq_lens): with page_size > 0, k and v are pools [num_pages,
  // page_size, Hkv, D] read through page_table [B, max_pages] and shape.seqlen_kv is the table's
  // capacity; seq_lens [B] (device int32) bounds each sequence's keys.
  const int* page_table = nullptr;
  int64_t page_table_stride_b = 0;
  int page_size = 0;
  const int* seq_lens = nullptr;
  // An e4m3 KV cache (flag kv_e4m3; k and v of dtype E4M3): the [heads_kv] f32 scales
  // (KvCache::k_scale / v_scale) on the device.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  // The device's SM count (0: unknown): persistent kernels launch about one CTA per SM.
  int sm_count = 0;
  // The call's mods have a mask_mod (known where the runtime planned the call): sm90a_wgmma's
  // 192-row tiles read a block mask only then (InputFacts::mask_mod).
  bool mask_mod = false;
  // The mask_mod divides by a run-time value (InputFacts::mask_mod_divides).
  bool mask_mod_divides = false;
  // The score_mod reads kv_idx (InputFacts::score_mod_reads_kv).
  bool score_mod_reads_kv = false;
  // The mask_mod loads a buffer at kv_idx (InputFacts::mask_mod_loads_kv).
  bool mask_mod_loads_kv = false;
  // The call's stream (null: the legacy default stream): sm90a_wgmma keeps a block mask's union
  // schedule with the mask only where this stream is not capturing a graph (an allocation
  // there would break the capture).
  runtime::CuStream stream = nullptr;
  // e4m3 q, k, v: their descale factors (out is bf16).
  Fp8Descales descale;
};

using ForwardVariant = FamilyVariant<Family::Forward, ForwardInputs>;

}  // namespace flexjit::kernels

// The autotuner compares out and lse of a candidate config with the default's.
template <>
struct flexjit::kernels::TuningOutputs<flexjit::kernels::ForwardInputs> {
  static constexpr bool kCompared = true;
  static std::vector<TensorRef> of(const kernels::ForwardInputs& in, kernels::Family) {
    std::vector<TensorRef> v = {in.out};
    if (in.lse) v.push_back(*in.lse);
    return v;
  }
  static std::vector<TensorRef> accumulated(const kernels::ForwardInputs&, kernels::Family) {
    return {};
  }
};

namespace flexjit::kernels {

// The forward problem of a call (no variant, no config yet); fast_math as MathMode::Auto resolves
// it (set_math_mode changes it).
KernelDesc forward_problem(const cuda::Arch& arch, DType dtype, int head_dim_qk, int head_dim_v,
                           int gqa_ratio, bool divisible, bool full_blocks);

// Marks a forward problem as one on a KV cache: page_size (0: contiguous K / V) and seq_lens = 1.
void set_kv_cache_flags(KernelDesc& desc, int page_size);
// The flags back: the page size (0 when absent) and whether the kernel runs on a KV cache.
int64_t kv_page_size(const KernelDesc& desc);
bool on_kv_cache(const KernelDesc& desc);
// Marks a KV cache problem as one on an e4m3 cache (flag kv_e4m3 = 1), and reads it back.
void set_kv_e4m3_flag(KernelDesc& desc);
bool on_kv_e4m3(const KernelDesc& desc);

// The input facts of a call: alignment, the block mask's tile size, the lengths.
InputFacts forward_facts(const ForwardInputs& in);

// The forward family's record (kernels/Family.h): kind "forward", math, config keys block_m,
// block_n, num_warps, num_stages, q_tiles, persistent; a query's problem is forward_problem with
// its math mode and, with a page size, set_kv_cache_flags.
FamilyInfo forward_family();

// "fj_bf16", "fj_f16", "float": the template's Element type (e4m3: "fj_bf16", its output's);
// InternalError for other dtypes.
const char* element_type(DType dtype);

}  // namespace flexjit::kernels
