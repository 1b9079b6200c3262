// flex_attention's decode path (docs/kernels/decode.md): the split-KV plan (decode_split then
// decode_combine on one workspace), chosen automatically for short queries on contiguous K / V
// and always for a KV cache (ragged lengths, pages: include/flexjit/paged_kv.h).
#pragma once

#include <flexjit/attention.h>
#include <flexjit/paged_kv.h>

#include "kernels/decode/Decode.h"
#include "plan/Plan.h"
#include "tune/StepTuner.h"

#include <optional>
#include <string>

namespace flexjit::runtime {

// Queries up to this many tokens take the decode plan on contiguous K / V (when it supports the
// call): one CTA per (b, kv head) then holds every q head of the group and every token, and the
// splits fill the GPU where the forward's one CTA per 128-row query tile would leave it idle.
inline constexpr int64_t kDecodeMaxQueries = 16;

// Why the decode plan cannot serve a call with these inputs on `arch`; nullopt when it can.
// `auto_dispatch`: the call did not ask for a KV cache, so the forward is the alternative (the
// query length and a named forward variant are then reasons too).
std::optional<std::string> decode_unsupported(const cuda::Arch& arch,
                                              const kernels::DecodeInputs& in,
                                              const AttentionOptions& options, bool auto_dispatch);

// Which plan a call on a KV cache takes (docs/kernels/decode.md, "When flex_attention takes
// it"): decode for up to kDecodeMaxQueries query tokens, the forward on the cache (chunked
// prefill) for more; either one when the other cannot serve the call (`decode_why` /
// `forward_why`: their reasons, nullopt when they can). `why` says why for FLEXJIT_LOG=kernels
// (empty when decode serves a short query). UnsupportedError with both reasons if neither can.
struct KvCachePlanChoice {
  bool forward = false;
  std::string why;
};
KvCachePlanChoice choose_kv_cache_plan(int64_t seqlen_q,
                                       const std::optional<std::string>& decode_why,
                                       const std::optional<std::string>& forward_why);

// The two-step plan: decode_split (its workspace: the partials) then decode_combine on the same
// slice. `in.num_splits` is resolved here (config num_splits or the heuristic). With `tuning`
// active both steps are tuned (docs/tuning.md): the split's candidates with the combine after
// each (their split counts differ), keyed also by the CTAs of one split; the combine's after the
// planned split.
Plan plan_decode(const cuda::Arch& arch, kernels::DecodeInputs in, const Mods& mods,
                 const AttentionOptions& options, const tune::StepTuning& tuning = {});

// The decode inputs of a contiguous call validated for the forward.
kernels::DecodeInputs decode_inputs(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                                    const TensorRef& out, const TensorRef* lse, const QkvShape& s,
                                    const AttentionOptions& options,
                                    std::vector<uint64_t> mod_params, int sm_count);

// flex_attention_into / flex_attention_workspace_bytes with options.kv_cache set.
void flex_attention_kv_cache_into(Context& ctx, const TensorRef& q, const TensorRef& k,
                                  const TensorRef& v, const TensorRef& out, const TensorRef* lse,
                                  const AttentionOptions& options);
size_t flex_attention_kv_cache_workspace_bytes(Context& ctx, const TensorRef& q, const TensorRef& k,
                                               const TensorRef& v, const AttentionOptions& options);
// describe_forward_plan (runtime/ForwardPlan.h) with options.kv_cache set.
std::string describe_kv_cache_plan(Context& ctx, const TensorRef& q, const TensorRef& k,
                                   const TensorRef& v, const AttentionOptions& options);

// KvCache::check_pages on the device: the decode_combine module's check kernels
// (templates/decode_check.cuh) find the first bad length or page entry on the call's stream, the
// stream is synchronized and the host reads the result (and that entry) back: RuntimeError
// naming it, as check_kv_cache_entries (binding/KvCache.h) words it.
void check_kv_cache_on_device(Context& ctx, const KvCache& cache, const KvCacheShape& shape,
                              DType dtype, void* stream);

}  // namespace flexjit::runtime
