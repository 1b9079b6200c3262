#include "kernels/backward/Backward.h"

#include <flexjit/error.h>

#include "codegen/cuda/Arch.h"
#include "device/TensorMap.h"
#include "kernels/MathMode.h"
#include "kernels/forward/ForwardArgs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace flexjit::kernels {

bool is_deterministic(const KernelDesc& desc) {
  return desc.flags.get(kDeterministicFlag).value_or(0) == 1;
}

int bufgrad_smem_floats(const KernelDesc& desc) {
  return static_cast<int>(desc.flags.get(kBufGradSmemFlag).value_or(0));
}

int64_t bufgrad_smem_request(int64_t slice_elems, bool element_sites, bool deterministic) {
  if (!element_sites || deterministic || slice_elems <= 0 || slice_elems > kBufGradSmemMaxFloats) {
    return 0;
  }
  int64_t n = 32;
  while (n < slice_elems)
    n *= 2;
  return n;
}

void check_bufgrad_smem_flag(const KernelDesc& desc) {
  const auto v = desc.flags.get(kBufGradSmemFlag);
  if (!v) return;
  const int64_t n = *v;
  if (desc.family != Family::BackwardDkDv) {
    throw UnsupportedError(fmt::format("{}: flag '{}' = {}: only backward_dkdv takes it",
                                       desc.family_variant(), kBufGradSmemFlag, n));
  }
  if (n < 32 || n > kBufGradSmemMaxFloats || (n & (n - 1)) != 0) {
    throw UnsupportedError(fmt::format(
        "{}: flag '{}' = {}: the private buffer-gradient copy's size in floats must be a power "
        "of two from 32 to {}",
        desc.family_variant(), kBufGradSmemFlag, n, kBufGradSmemMaxFloats));
  }
  if (is_deterministic(desc)) {
    throw UnsupportedError(fmt::format(
        "{}: flags '{}' and '{}' = 1 exclude each other: deterministic buffer gradients go "
        "into ordered per-warp slices, not through shared-memory atomics",
        desc.family_variant(), kBufGradSmemFlag, kDeterministicFlag));
  }
}

void fit_bufgrad_smem(KernelDesc& desc, int other_smem_bytes) {
  const int n = bufgrad_smem_floats(desc);
  if (n == 0) return;
  check_bufgrad_smem_flag(desc);
  if (other_smem_bytes + 4 * n <= cuda::max_smem_per_block(desc.arch)) return;
  Params kept;  // the flags without it: the description of the global-atomic kernel
  for (const auto& [name, value] : desc.flags.items())
    if (name != kBufGradSmemFlag) kept.set(name, value);
  desc.flags = std::move(kept);
}

KernelDesc backward_problem(Family family, const cuda::Arch& arch, DType dtype, int head_dim_qk,
                            int head_dim_v, int gqa_ratio, bool full_blocks, bool deterministic) {
  KernelDesc d;
  d.family = family;
  d.arch = arch;
  d.dtype = dtype;
  d.head_dim_qk = head_dim_qk;
  d.head_dim_v = head_dim_v;
  d.gqa_ratio = gqa_ratio;
  if (family != Family::BackwardPreprocess) {
    d.flags.set("divisible", 0);
    d.flags.set("full_blocks", full_blocks ? 1 : 0);
    set_math_mode(d, MathMode::Auto);
  }
  if (family == Family::BackwardDkDv && deterministic) d.flags.set(kDeterministicFlag, 1);
  return d;
}

namespace {

FamilyInfo backward_family(Family family, const char* name, const char* summary) {
  FamilyInfo f;
  f.family = family;
  f.name = name;
  f.summary = summary;
  f.kind = "backward";
  f.math = family != Family::BackwardPreprocess;
  if (f.math) f.config_keys = {block_m_key(), block_n_key(), num_warps_key(), num_stages_key()};
  f.problem = [family](const KernelQuery& q, const cuda::Arch& arch) {
    KernelDesc problem = backward_problem(family, arch, q.dtype, q.head_dim_qk,
                                          q.head_dim_v ? q.head_dim_v : q.head_dim_qk, q.gqa_ratio,
                                          q.full_blocks, q.deterministic);
    if (family != Family::BackwardPreprocess) {
      problem.flags.set("divisible", q.divisible ? 1 : 0);
      set_math_mode(problem, q.math);
    }
    return problem;
  };
  return f;
}

}  // namespace

FamilyInfo backward_preprocess_family() {
  return backward_family(Family::BackwardPreprocess, "backward_preprocess",
                         "lse2 and delta per query row (the backward's first step)");
}

FamilyInfo backward_dkdv_family() {
  FamilyInfo f = backward_family(Family::BackwardDkDv, "backward_dkdv",
                                 "dK, dV and buffer gradients (with dq_atomic = 1 also dQ)");
  // A dK/dV kernel that adds dQ by atomics leaves it in an fp32 accumulator of its variant's
  // layout: the dQ step converts it instead of running the second pass.
  f.changes_later = [](const KernelDesc& dkdv) -> std::optional<StepChange> {
    if (dkdv.config.get("dq_atomic").value_or(0) != 1) return std::nullopt;
    return StepChange{Family::BackwardDq, "atomic_convert", {{"dq_layout", dq_accum_layout(dkdv)}}};
  };
  return f;
}

FamilyInfo backward_dq_family() {
  return backward_family(Family::BackwardDq, "backward_dq", "dQ");
}

InputFacts backward_facts(const BackwardInputs& in) {
  InputFacts f;
  f.aligned16 = in.shape.fast_path;
  f.alignment_blocker = in.shape.fast_path_blocker;
  for (auto [t, name] : {std::pair{&in.out, "out"}, std::pair{&in.dout, "dout"},
                         std::pair{&in.dq, "dq"}, std::pair{&in.dk, "dk"}, std::pair{&in.dv, "dv"}})
    check_aligned16(*t, name, f.aligned16, f.alignment_blocker);
  if (in.block_mask != nullptr) {
    f.mask_q_block = in.block_mask->meta().q_block_size;
    f.mask_kv_block = in.block_mask->meta().kv_block_size;
  }
  // The sm_90a kernels read q, k, v and dout through TMA tensor maps.
  for (auto [t, name] : {std::pair{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}, {&in.dout, "dout"}}) {
    if (auto why = runtime::bhsd_tma_blocker(*t, name); why && f.tma_blocker.empty()) {
      f.tma_blocker = *why;
    }
  }
  f.seqlen_q = in.shape.seqlen_q;
  f.seqlen_kv = in.shape.seqlen_kv;
  return f;
}

int64_t backward_padded_seqlen_q(int64_t seqlen_q) {
  return (seqlen_q + 127) / 128 * 128;
}

int64_t backward_bufgrad_slices(const QkvShape& s) {
  return s.batch * s.heads_kv * ((s.seqlen_kv + 127) / 128 * 8);
}

int64_t backward_bufgrad_slice_elems(const std::vector<std::vector<int64_t>>& buffer_shapes) {
  int64_t n = 0;
  for (const std::vector<int64_t>& shape : buffer_shapes) {
    int64_t count = 1;
    for (int64_t e : shape)
      count *= e;
    n += count;
  }
  return (n + 3) / 4 * 4;
}

namespace {

// Floats before the partial slices: lse2, delta and the dQ accumulator.
size_t floats_before_partials(const QkvShape& s, bool dq_atomic) {
  const size_t rows = static_cast<size_t>(s.batch * s.heads_q) *
                      static_cast<size_t>(backward_padded_seqlen_q(s.seqlen_q));
  return rows *
         (2 + (dq_atomic ? static_cast<size_t>(dq_accum_dim(static_cast<int>(s.head_dim_qk))) : 0));
}

}  // namespace

int dq_accum_layout(const KernelDesc& dkdv) {
  return dkdv.variant == "sm90a_wgmma" ? 1 : 0;
}

int dq_accum_dim(int head_dim_qk) {
  return (head_dim_qk + 63) / 64 * 64;
}

size_t backward_scratch_bytes(const QkvShape& s, bool dq_atomic, int64_t bufgrad_slice_elems) {
  return sizeof(float) *
         (floats_before_partials(s, dq_atomic) + static_cast<size_t>(backward_bufgrad_slices(s)) *
                                                     static_cast<size_t>(bufgrad_slice_elems));
}

float* backward_bufgrad_partials(const BackwardInputs& in, void* scratch) {
  if (scratch == nullptr || !in.deterministic || in.bufgrad_slice_elems == 0) return nullptr;
  return static_cast<float*>(scratch) + floats_before_partials(in.shape, in.dq_atomic);
}

Launch backward_sink_grad_launch(const BackwardInputs& in, void* scratch, bool full_blocks,
                                 const std::vector<uint64_t>& grad_params, bool deterministic) {
  const QkvShape& s = in.shape;
  const int64_t rows = s.batch * s.heads_q * s.seqlen_q;
  Launch l;
  l.entry_point = "flexjit_bwd_sink_grad";
  l.block = {deterministic ? 32u : 256u, 1, 1};
  l.grid = {
      deterministic ? 1u : static_cast<unsigned>(std::clamp<int64_t>((rows + 255) / 256, 1, 1024)),
      1, 1};
  l.args.add(make_bwd_args(in, scratch, full_blocks));
  l.args.add_bytes(in.mod_params.data(), in.mod_params.size() * sizeof(uint64_t));
  l.args.add_bytes(grad_params.data(), grad_params.size() * sizeof(uint64_t));
  return l;
}

FjBwdArgs make_bwd_args(const BackwardInputs& in, void* scratch, bool full_blocks) {
  const QkvShape& s = in.shape;
  FjBwdArgs a{};
  a.q = in.q.data;
  a.k = in.k.data;
  a.v = in.v.data;
  a.out = in.out.data;
  a.dout = in.dout.data;
  a.lse = static_cast<const float*>(in.lse.data);
  a.dlse = in.dlse ? static_cast<const float*>(in.dlse->data) : nullptr;
  a.dq = in.dq.data;
  a.dk = in.dk.data;
  a.dv = in.dv.data;
  const size_t rows = static_cast<size_t>(s.batch * s.heads_q) *
                      static_cast<size_t>(backward_padded_seqlen_q(s.seqlen_q));
  a.lse2 = static_cast<float*>(scratch);
  a.delta = scratch != nullptr ? static_cast<float*>(scratch) + rows : nullptr;
  a.dq_accum =
      scratch != nullptr && in.dq_atomic ? static_cast<float*>(scratch) + 2 * rows : nullptr;
  auto strides3 = [](const TensorRef& t, fj_i64& b, fj_i64& h, fj_i64& sq) {
    b = t.strides[0], h = t.strides[1], sq = t.strides[2];
  };
  strides3(in.q, a.q_stride_b, a.q_stride_h, a.q_stride_s);
  strides3(in.k, a.k_stride_b, a.k_stride_h, a.k_stride_s);
  strides3(in.v, a.v_stride_b, a.v_stride_h, a.v_stride_s);
  strides3(in.out, a.o_stride_b, a.o_stride_h, a.o_stride_s);
  strides3(in.dout, a.do_stride_b, a.do_stride_h, a.do_stride_s);
  strides3(in.dq, a.dq_stride_b, a.dq_stride_h, a.dq_stride_s);
  strides3(in.dk, a.dk_stride_b, a.dk_stride_h, a.dk_stride_s);
  strides3(in.dv, a.dv_stride_b, a.dv_stride_h, a.dv_stride_s);
  a.lse_stride_b = in.lse.strides[0], a.lse_stride_h = in.lse.strides[1];
  if (in.dlse) a.dlse_stride_b = in.dlse->strides[0], a.dlse_stride_h = in.dlse->strides[1];
  a.batch = static_cast<int>(s.batch);
  a.heads_q = static_cast<int>(s.heads_q);
  a.heads_kv = static_cast<int>(s.heads_kv);
  a.seqlen_q = static_cast<int>(s.seqlen_q);
  a.seqlen_kv = static_cast<int>(s.seqlen_kv);
  a.seqlen_q_pad = static_cast<int>(backward_padded_seqlen_q(s.seqlen_q));
  a.scale = in.scale ? *in.scale
                     : static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim_qk)));
  if (in.block_mask != nullptr) {
    const DeviceBlockMask& d = *in.block_mask;
    a.mask = block_mask_args(d, full_blocks);
    a.mask_t = transposed_block_mask_args(d, full_blocks);
  }
  return a;
}

}  // namespace flexjit::kernels
