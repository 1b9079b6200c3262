#include "kernels/forward/Forward.h"

#include "device/TensorMap.h"
#include "kernels/MathMode.h"

#include <flexjit/error.h>

#include <fmt/format.h>

#include <utility>

namespace flexjit::kernels {

KernelDesc forward_problem(const cuda::Arch& arch, DType dtype, int head_dim_qk, int head_dim_v,
                           int gqa_ratio, bool divisible, bool full_blocks) {
  KernelDesc d;
  d.family = Family::Forward;
  d.arch = arch;
  d.dtype = dtype;
  d.head_dim_qk = head_dim_qk;
  d.head_dim_v = head_dim_v;
  d.gqa_ratio = gqa_ratio;
  d.flags.set("divisible", divisible ? 1 : 0);
  d.flags.set("full_blocks", full_blocks ? 1 : 0);
  set_math_mode(d, MathMode::Auto);
  return d;
}

void set_kv_cache_flags(KernelDesc& d, int page_size) {
  if (page_size != 0) d.flags.set("page_size", page_size);
  d.flags.set("seq_lens", 1);
}

int64_t kv_page_size(const KernelDesc& d) {
  return d.flags.get("page_size").value_or(0);
}

bool on_kv_cache(const KernelDesc& d) {
  return kv_page_size(d) != 0 || d.flags.get("seq_lens").value_or(0) != 0;
}

void set_kv_e4m3_flag(KernelDesc& d) {
  d.flags.set("kv_e4m3", 1);
}

bool on_kv_e4m3(const KernelDesc& d) {
  return d.flags.get("kv_e4m3").value_or(0) != 0;
}

InputFacts forward_facts(const ForwardInputs& in) {
  InputFacts f;
  f.aligned16 = in.shape.fast_path;
  f.alignment_blocker = in.shape.fast_path_blocker;
  check_aligned16(in.out, "out", f.aligned16, f.alignment_blocker);
  if (in.block_mask != nullptr) {
    f.mask_q_block = in.block_mask->meta().q_block_size;
    f.mask_kv_block = in.block_mask->meta().kv_block_size;
  }
  for (auto [t, name] : {std::pair{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}}) {
    if (auto why = runtime::bhsd_tma_blocker(*t, name); why && f.tma_blocker.empty()) {
      f.tma_blocker = *why;
    }
  }
  f.seqlen_q = in.shape.seqlen_q;
  f.seqlen_kv = in.shape.seqlen_kv;
  f.mask_mod = in.mask_mod;
  f.mask_mod_divides = in.mask_mod_divides;
  f.score_mod_reads_kv = in.score_mod_reads_kv;
  f.mask_mod_loads_kv = in.mask_mod_loads_kv;
  f.scale_positive = !in.scale.has_value() || *in.scale > 0.0f;  // NaN: false
  return f;
}

FamilyInfo forward_family() {
  FamilyInfo f;
  f.family = Family::Forward;
  f.name = "forward";
  f.summary = "out (and LSE) from q, k, v";
  f.kind = "forward";
  f.math = true;
  f.config_keys = {
      block_m_key(),
      block_n_key(),
      num_warps_key(),
      num_stages_key(),
      {"q_tiles", "query tiles per CTA (sm90a_wgmma: 1 or 2)", 1, INT32_MAX},
      {"persistent", "1: persistent CTAs, 0: one CTA per query tile (sm90a_wgmma)", 0, 1}};
  f.problem = [](const KernelQuery& q, const cuda::Arch& arch) {
    KernelDesc problem =
        forward_problem(arch, q.dtype, q.head_dim_qk, q.head_dim_v ? q.head_dim_v : q.head_dim_qk,
                        q.gqa_ratio, q.divisible, q.full_blocks);
    set_math_mode(problem, q.math);
    if (q.page_size != 0 || q.kv_e4m3) set_kv_cache_flags(problem, q.page_size);
    if (q.kv_e4m3) set_kv_e4m3_flag(problem);
    return problem;
  };
  return f;
}

const char* element_type(DType dtype) {
  switch (dtype) {
    case DType::BF16:
    case DType::E4M3:  // the e4m3 forward's output (forward_sm90.cuh, FJ_FWD_FP8)
      return "fj_bf16";
    case DType::F16:
      return "fj_f16";
    case DType::F32:
      return "float";
    default:
      break;
  }
  FJ_ASSERT(false, "element_type of a dtype the forward variants reject");
}

}  // namespace flexjit::kernels
