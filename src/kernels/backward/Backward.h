// The backward families: the gradients of flex_attention (dQ, dK, dV and the captured float
// buffers' gradients) from q, k, v, the forward's out and lse, and dout. A backward call is a
// plan of three steps (runtime/Backward.cpp), one per family:
//
//   backward_preprocess  lse2 and delta per q row, into the plan's workspace (its slice)
//   backward_dkdv        dK, dV and the buffer gradients; reads that slice
//   backward_dq          dQ; reads that slice
//
// The three share the inputs type (BackwardInputs), the problem description and the kernel ABI
// (FjBwdArgs in templates/flexjit_abi.h). Problem flags as the forward's: `divisible` (every tile
// full: bounds checks compiled out), `full_blocks` (the block mask has full_* arrays) and, for
// dK/dV and dQ, `fast_math` (the score_mod and its derivatives; must be the forward's).
#pragma once

#include <flexjit/attention.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/tensor.h>

#include "kernels/Family.h"
#include "kernels/TuningOutputs.h"
#include "kernels/Variant.h"

#include <flexjit_abi.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace flexjit::kernels {

// What a backward launch reads and writes, as the runtime validated it.
struct BackwardInputs {
  TensorRef q, k, v, out, lse, dout;
  std::optional<TensorRef> dlse;
  TensorRef dq, dk, dv;
  QkvShape shape;
  std::optional<float> scale;                   // default 1 / sqrt(head_dim_qk)
  const DeviceBlockMask* block_mask = nullptr;  // null: every tile, mask_mod everywhere
  std::vector<uint64_t> mod_params;             // the FjModParams bytes (binding/ModArgs.h)
  std::vector<uint64_t> grad_params;            // the FjGradParams bytes (grad_param_layout)
  std::vector<TensorRef> buffer_grads;          // the f32 tensors grad_params points at
  // The dK/dV kernel adds dQ into an f32 accumulator in the workspace (its config's dq_atomic);
  // the preprocess zeroes it and backward_dq/atomic_convert writes dq from it.
  bool dq_atomic = false;
  // Deterministic buffer gradients (BackwardOptions::deterministic; the dK/dV problem's flag
  // `deterministic`): the dK/dV kernel's warps add into partial slices of bufgrad_slice_elems
  // floats each (backward_bufgrad_slices of them, after lse2 / delta / dq_accum in the
  // workspace), which flexjit_bwd_bufgrad_reduce sums into the gradients. grad_partials_offset:
  // where the `partials` pointer goes in grad_params (cuda::GradParamLayout::partials_offset).
  bool deterministic = false;
  // The sink_mod loads a float buffer (cuda::has_sink_grads): the dK/dV step launches
  // flexjit_bwd_sink_grad after its kernel (and its reduction), templates/sink_grad.cuh.
  bool sink_grads = false;
  int64_t bufgrad_slice_elems = 0;
  int grad_partials_offset = -1;
};

// How a dK/dV kernel that adds dQ (config dq_atomic = 1) lays out the f32 accumulator; the
// plan's backward_dq/atomic_convert takes it as its config `dq_layout`. 0: rows [B * Hq,
// seqlen_q_pad, Dqk] (sm80_mma's atomics); 1: blocks of 64 query rows (at the same offsets as
// those rows), each in the order of the sm_90a wgmma accumulator fragments that one bulk
// reduction per warp adds (sm90a_wgmma; templates/backward_sm90.cuh, fj_bwd_sm90_dq_bulk_add).
int dq_accum_layout(const KernelDesc& dkdv);
// The width (floats) of the f32 dQ accumulator's rows: head_dim_qk rounded up to 64, the tile
// dim the sm_90a dK/dV kernel adds its blocks in (layout 1; a head dim below it leaves zeros in
// the padded columns); layout 0 uses the first head_dim_qk of each row. The preprocess zeroes
// this width, the workspace holds it, atomic_convert reads it (FjConfig::kDqAccumDim).
int dq_accum_dim(int head_dim_qk);

using BackwardPreprocessVariant = FamilyVariant<Family::BackwardPreprocess, BackwardInputs>;
using BackwardDkDvVariant = FamilyVariant<Family::BackwardDkDv, BackwardInputs>;
using BackwardDqVariant = FamilyVariant<Family::BackwardDq, BackwardInputs>;

}  // namespace flexjit::kernels

// The autotuner compares what each step writes with the default config's: dK and dV (and the
// buffer gradients, which the dK/dV kernel adds into with atomics, or writes from its
// deterministic partials: zeroed before every run) for
// backward_dkdv, dQ for backward_dq. The preprocess writes only its workspace (one config: not
// tuned).
template <>
struct flexjit::kernels::TuningOutputs<flexjit::kernels::BackwardInputs> {
  static constexpr bool kCompared = true;
  static std::vector<TensorRef> of(const kernels::BackwardInputs& in, kernels::Family f) {
    if (f == kernels::Family::BackwardDq) return {in.dq};
    if (f != kernels::Family::BackwardDkDv) return {};
    std::vector<TensorRef> v = {in.dk, in.dv};
    v.insert(v.end(), in.buffer_grads.begin(), in.buffer_grads.end());
    return v;
  }
  static std::vector<TensorRef> accumulated(const kernels::BackwardInputs& in, kernels::Family f) {
    return f == kernels::Family::BackwardDkDv ? in.buffer_grads : std::vector<TensorRef>{};
  }
};

namespace flexjit::kernels {

// The dK/dV problem flag of deterministic buffer gradients: 1 adds them into per-warp partial
// slices and compiles the ordered hooks (cuda::GradAccumulation::Ordered); 0 or absent: fp32
// atomics. Being a flag, it reaches the description's text, its hash and the source.
inline constexpr const char* kDeterministicFlag = "deterministic";
bool is_deterministic(const KernelDesc& desc);

// The dK/dV problem flag of small buffer gradients (docs/backward.md "Small buffer gradients in
// shared memory"): n > 0 floats of static shared memory hold the CTA's private copy of every
// float buffer's gradient (the partial slice's layout), which the per-element and diagonal sites
// add into (shared atomics after the warp's lanes combine) and the CTA flushes with one fp32
// atomic per nonzero element; absent: global fp32 atomics. A power of two from 32 to
// kBufGradSmemMaxFloats, at least the call's bufgrad_slice_elems. Not with deterministic = 1.
inline constexpr const char* kBufGradSmemFlag = "bufgrad_smem";
inline constexpr int64_t kBufGradSmemMaxFloats = 4096;  // 16 KiB per CTA
int bufgrad_smem_floats(const KernelDesc& desc);        // the flag's value, 0 when absent
// The flag a call asks for: the power of two >= max(32, slice_elems) when it is at most
// kBufGradSmemMaxFloats, the mods have a per-element buffer-gradient site
// (cuda::has_element_grad_sites) and the gradients are not deterministic; else 0 (no flag).
int64_t bufgrad_smem_request(int64_t slice_elems, bool element_sites, bool deterministic);
// A variant's specialize: drops the flag when the private copy would not fit beside the config's
// `other_smem_bytes` (dynamic and static) under the arch's per-block limit (the gradients then
// take the global atomics), and refuses a malformed value (UnsupportedError naming it).
void fit_bufgrad_smem(KernelDesc& desc, int other_smem_bytes);
// validate's check of the flag (UnsupportedError): a power of two in [32,
// kBufGradSmemMaxFloats], dK/dV only, not with deterministic = 1.
void check_bufgrad_smem_flag(const KernelDesc& desc);

// The problem of one backward family for a call (no variant, no config yet); dK/dV and dQ get
// fast_math as MathMode::Auto resolves it (set_math_mode changes it; MathMode.h). dK/dV gets
// the flag `deterministic` = 1 when `deterministic` (nothing otherwise).
KernelDesc backward_problem(Family family, const cuda::Arch& arch, DType dtype, int head_dim_qk,
                            int head_dim_v, int gqa_ratio, bool full_blocks,
                            bool deterministic = false);

// The records of the three backward families (kernels/Family.h), of kind "backward" in plan
// order: backward_preprocess (no math mode, no config keys), backward_dkdv and backward_dq (math,
// config keys block_m, block_n, num_warps, num_stages). A query's problem is backward_problem
// with its full_blocks and deterministic and, for dK/dV and dQ, its divisible and math mode.
FamilyInfo backward_preprocess_family();
FamilyInfo backward_dkdv_family();
FamilyInfo backward_dq_family();

// Alignment (every tensor's rows), the block mask's tile size, the lengths.
InputFacts backward_facts(const BackwardInputs& in);

// seqlen_q rounded up to 128: the row length of the lse2 / delta workspace arrays.
int64_t backward_padded_seqlen_q(int64_t seqlen_q);
// The number of partial slices of deterministic buffer gradients: one per 16 kv rows of
// round_up(Skv, 128) per (b, kv head), whatever the dK/dV tiles (templates/backward_sm80.cuh,
// fj_bwd_bufgrad_slice).
int64_t backward_bufgrad_slices(const QkvShape& shape);
// The elements of one partial slice: every float buffer's bound elements, one after another,
// rounded up to a multiple of 4 (16-byte rows).
int64_t backward_bufgrad_slice_elems(const std::vector<std::vector<int64_t>>& buffer_shapes);
// Bytes of the workspace: lse2 + delta (two f32 arrays of [B * Hq, padded Sq]), with dq_atomic
// the dQ accumulator (f32 [B * Hq, padded Sq, Dqk]), and with deterministic buffer gradients
// the partial slices (f32 [backward_bufgrad_slices, bufgrad_slice_elems]).
size_t backward_scratch_bytes(const QkvShape& shape, bool dq_atomic,
                              int64_t bufgrad_slice_elems = 0);
// The partial slices in the workspace (after lse2 / delta / dq_accum); null when the inputs are
// not deterministic or have no float buffer.
float* backward_bufgrad_partials(const BackwardInputs& in, void* scratch);

// FjBwdArgs for the inputs; lse2 / delta (and dq_accum with in.dq_atomic) point into `scratch`
// (backward_scratch_bytes).
FjBwdArgs make_bwd_args(const BackwardInputs& in, void* scratch, bool full_blocks);

// The launch of flexjit_bwd_sink_grad (templates/sink_grad.cuh; a dK/dV module's entry point)
// for inputs with sink_grads: a grid of 256-thread CTAs over the B * Hq * Sq rows with fp32
// atomics, or one warp when `deterministic`. Its FjGradParams are `grad_params`.
Launch backward_sink_grad_launch(const BackwardInputs& in, void* scratch, bool full_blocks,
                                 const std::vector<uint64_t>& grad_params, bool deterministic);

}  // namespace flexjit::kernels
