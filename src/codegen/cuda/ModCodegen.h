// Lowering of mods to CUDA device functions with fixed signatures (the "hooks" the kernel
// templates call; the templates never see the IR):
//
//   struct alignas(8) FjModParams { ... };   // see binding/ModParamLayout.h; + static_asserts
//   __device__ __forceinline__ float fj_score_mod(const FjModParams& mp, float score,
//                                                 int b, int h, int q_idx, int kv_idx);
//   __device__ __forceinline__ bool fj_mask_mod(const FjModParams& mp,
//                                               int b, int h, int q_idx, int kv_idx);
//
// and the score_mod's diagonal load (kFjDiagLoad), used by the sm_90a kernels:
//   static constexpr bool kFjDiagLoad;   // the score_mod loads a float buffer at a "diagonal
//       site": indices that depend on q_idx and kv_idx only through d = q_idx - kv_idx
//       (passes::depends_only_on_position_difference: ±d + (b, h, params), T5's bucket of d;
//       the first such load); its value is constant along each diagonal of a score tile
//   float fj_diag_load_at(mp, b, h, int d);   // the site's value on diagonal d (its indices
//       evaluated at q_idx = d, kv_idx = 0)
//   float fj_score_mod(mp, score, b, h, q_idx, kv_idx, float fj_dl);  // the site read from fj_dl
//       (without a site: 0, 0 and forwarding to the overload without fj_dl)
//
// and the mask_mod's column load (kFjColLoad), used by the sm_90a forward:
//   static constexpr bool kFjColLoad;   // the mask_mod loads an i32 / f32 buffer at indices
//       that read kv_idx and neither q_idx nor another load (the first such load: a document id
//       doc_id[kv_idx]); its value is constant along each column of a score tile
//   using FjColLoad = int | float;      // the load's C type
//   FjColLoad fj_col_load_at(mp, b, h, int kv_idx);   // the site's value at column kv_idx
//   bool fj_mask_mod(mp, b, h, q_idx, kv_idx, FjColLoad fj_cl);  // the site read from fj_cl
//       (without a site: int, 0 and forwarding to the overload without fj_cl)
//
// and the sink_mod (an attention sink: one extra logit per row in the softmax denominator):
//   static constexpr bool kFjHasSinkMod;   // whether the mods define a sink_mod
//   float fj_sink_mod(mp, int b, int h, int q_idx);   // the row's sink (-inf without a sink_mod),
//       always lowered exactly; the epilogues fold it in with fj_softmax_finish (prelude.cuh)
//
// Both functions are always emitted: an absent score_mod returns `score`, an absent mask_mod
// returns `true`. Bodies are straight-line SSA (`const float t3 = ...;`), one temporary per
// distinct IR node; structurally equal sub-expressions share a temporary even when they are
// distinct nodes. Every operator lowers to a prelude function (templates/prelude.cuh) that
// implements the language's semantics (wrapping i32 arithmetic, floor division and modulo,
// saturating int(x)); see docs/codegen.md for the table.
//
// Select lowers to `c ? a : b` with both a and b computed first as temporaries: both branches
// are evaluated. That is correct because mods have no side effects and captured-buffer loads
// are in bounds by the user's contract for every (b, h, q_idx, kv_idx) in the problem, in
// either branch.
#pragma once

#include <flexjit/mods.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flexjit::cuda {

// How the score_mod's transcendentals lower (docs/math.md): Exact calls the accurate CUDA
// functions (fj_tanh -> tanhf, fj_exp -> expf, ...); Approx the hardware approximations
// (fj_tanh_approx -> tanh.approx.f32, fj_exp_approx -> ex2.approx.ftz.f32, fj_log_approx ->
// lg2.approx.ftz.f32, ...). Division, sqrt, pow and the mask_mod are exact either way.
enum class MathFunctions { Exact, Approx };
std::string_view to_string(MathFunctions math);  // "exact" | "approx"

// Whether the mods' captured-buffer loads are checked (AttentionOptions::check_buffers; the record
// and its words: binding/BufferCheck.h). Record: FjModParams gains each buffer's extents and the
// record's address (layout_of(mods, true)); every load tests its indices, an index outside
// [0, extent) reads 0 instead of memory, and the first such load claims the record with its
// load site, buffer, dim, index and position (fj_buffer_check_fail). Off: no check, the source
// as it was before the option existed.
enum class BufferChecks { Off, Record };
std::string_view to_string(BufferChecks checks);  // "off" | "record"

// The FjModParams struct, its layout asserts and the two device functions, for type-checked
// mods. Throws CompileError if a buffer or param name is not an identifier.
std::string generate_mod_functions(const Mods& mods, MathFunctions math = MathFunctions::Exact,
                                   BufferChecks checks = BufferChecks::Off);

// How the backward's dK/dV kernel accumulates the captured float buffers' gradients:
//   Atomic   fp32 atomics into the gradient tensors (the last bits can differ between runs);
//   Ordered  deterministic: each 16-kv-row warp of the dK/dV kernel adds into its own partial
//            slice of the workspace (a contiguous f32 copy of every float buffer), lanes of a
//            warp that share an address combined in lane order; flexjit_bwd_bufgrad_reduce then
//            sums the slices in a fixed order into the gradients (docs/backward.md).
enum class GradAccumulation { Atomic, Ordered };

// The backward's hooks (templates/backward_sm80.cuh), from passes::differentiate(score_mod):
//
//   struct alignas(8) FjGradParams {   // per float buffer of the mods, in Mods::buffers order:
//     float* grad_<name>;              //   its gradient, f32, in the bound buffer's shape
//     fj_i64 gstride_<name>[rank];     //   strides of the gradient (elements)
//     fj_i64 gextent_<name>[rank];     //   the bound buffer's extents
//     fj_i64 gslice_<name>;            //   where its elements start in a partial slice
//     ...
//     float* partials;                 // Ordered: the partial slice this warp adds into
//     fj_i64 slice_elems;              // elements of a slice (every buffer, rounded up to 4)
//   };                                 // (`int unused_;` when the mods have no float buffer)
//   float fj_dscore(const FjModParams& mp, float score, int b, int h, int q_idx, int kv_idx);
//       d score_mod / d score at score (the pre-mod score, scale * q.k); 1 without a score_mod
//   void fj_bufgrad(const FjModParams& mp, const FjGradParams& gp, float ds, float score,
//                   int b, int h, int q_idx, int kv_idx, float (&acc)[kFjGradSlots]);
//       for every float load site of the score_mod that the forward evaluates at this point,
//       the contribution ds * d score_mod / d buffer[idx] (idx: the load's indices clamped into
//       the extents, so a gradient never lands outside its buffer). A site whose indices depend
//       on b, h and params only (ALiBi's slopes[h]) has one address per head: the contribution
//       is summed into acc[i]; the others are added at once with fj_grad_add (Atomic: fp32
//       atomics, lanes of a warp that share the address combined first) or fj_grad_add_ordered
//       (Ordered: into gp.partials, lanes combined in lane order); every lane of a warp must
//       call it together, and nothing happens when ds is 0 in all of them.
//   void fj_bufgrad_flush(mp, gp, int b, int h, float (&acc)[kFjGradSlots]);
//       adds the per-head sums at their addresses (one add per warp and site) and zeroes acc.
//   FjGradParams fj_bufgrad_with_slice(const FjGradParams& gp, fj_i64 slice);
//       gp with `partials` pointing at slice number `slice` (Ordered); gp itself otherwise
//   const float* fj_bufgrad_partials(gp), fj_i64 fj_bufgrad_slice_elems(gp);
//       the workspace of the slices and a slice's length (null / 0 without float buffers)
//   void fj_bufgrad_store(const FjGradParams& gp, fj_i64 e, float v);
//       writes v at element e of a slice's layout into its gradient tensor (no-op past the end)
//   template <bool kDiagByCaller = false> void fj_bufgrad(...)   (the signature above)
//       kDiagByCaller = true leaves the diagonal site out: the kernel sums it itself.
//   static constexpr bool kFjDiagGradSite;  // Atomic mode: the first per-element site whose
//       indices depend on q_idx and kv_idx only through d = q_idx - kv_idx (as kFjDiagLoad's);
//       its gradient lands along the score tile's diagonals
//   float fj_bufgrad_diag_value(mp, ds, score, b, h, q_idx, kv_idx);  // its contribution
//   void fj_bufgrad_diag_add_at(mp, gp, b, h, int d, float v);   // fp32 atomic at the site's
//       indices on diagonal d (q_idx = d, kv_idx = 0), clamped
//       (without a diagonal site: 0 and a no-op)
//   float fj_dscore(..., float fj_dl), float fj_bufgrad_diag_value(..., float fj_dl),
//   void fj_bufgrad<kDiagByCaller>(..., float fj_dl)   // kFjDiagLoad's site read from fj_dl
//       (generate_mod_functions emits kFjDiagLoad, fj_diag_load_at and fj_score_mod's overload)
//   static constexpr bool kFjHasSinkGrads;   // whether the sink_mod loads a float buffer
//   void fj_sink_mod_grad(const FjModParams& mp, const FjGradParams& gp, int b, int h,
//                         int q_idx, float g);
//       g = d loss / d sink of row (b, h, q_idx); adds g * d sink_mod / d buffer[idx] into the
//       gradient of every float load site of the sink_mod (idx clamped as fj_bufgrad's), with
//       fj_grad_add (Atomic) or fj_grad_add_ordered straight into the gradient (Ordered: one
//       warp runs it, after the partial slices' reduction, so the order is fixed). Every lane
//       of a warp calls it together; nothing happens when g is 0 in all of them.
//   static constexpr bool kFjHasBufferGrads;   // whether fj_bufgrad does anything
//   static constexpr int kFjUniformGradSites;  // sites summed per head; kFjGradSlots = max(1, ..)
//   static constexpr int kFjElementGradSites;  // sites added at every element
//   static constexpr int kFjGradSmemFloats;    // smem_floats (Atomic mode; 0: off)
//   void fj_bufgrad_smem_zero(int tid, int nthreads);
//   void fj_bufgrad_smem_flush(const FjGradParams& gp, int tid, int nthreads);
//       With smem_floats > 0 the per-element sites and the diagonal site add into the CTA's
//       private copy `fj_grad_smem` (static shared memory, smem_floats floats, the partial
//       slice's layout: gp.gslice_<name> + the row-major index) with fj_grad_add_shared instead
//       of global atomics; the kernel zeroes it before its first add (then a CTA barrier) and
//       flushes it after its last (a barrier first): one fp32 atomic per nonzero element, of
//       the gp.slice_elems <= smem_floats the buffers hold (fj_bufgrad_add_to: the atomic twin
//       of fj_bufgrad_store, emitted only then). Without it both are no-ops. The
//       per-head sites keep their one atomic per warp and head.
//
// The layout of FjGradParams is grad_param_layout(); sizeof is static_asserted.
// The score_mod's derivatives lower with `math` as the score_mod itself does (the backward must
// recompute the forward's probabilities).
// With BufferChecks::Record the loads of the derivatives are checked as generate_mod_functions'
// (which must use the same mode).
std::string generate_mod_grad_functions(const Mods& mods, MathFunctions math = MathFunctions::Exact,
                                        GradAccumulation accumulation = GradAccumulation::Atomic,
                                        BufferChecks checks = BufferChecks::Off,
                                        int smem_floats = 0);

// The byte layout of FjGradParams: per float buffer (index into Mods::buffers), the offset of
// its pointer; strides, extents and the slice offset follow it (8 bytes each), then
// `partials` and `slice_elems` (partials_offset; -1 without float buffers). size: a multiple
// of 8, at least 8.
struct GradParamLayout {
  struct Entry {
    int buffer_index = 0;
    int offset = 0;
    int rank = 0;
    int slice_offset() const { return offset + 8 * (1 + 2 * rank); }  // gslice_<name>
  };
  std::vector<Entry> entries;
  int partials_offset = -1;  // slice_elems at partials_offset + 8
  int size = 8;
};
GradParamLayout grad_param_layout(const Mods& mods);

// Whether the kernel must apply the mod at all: false when it is absent or the identity
// (score_mod exactly `score`, mask_mod exactly `true`), so templates can skip the call.
bool has_score_mod(const Mods& mods);
bool has_mask_mod(const Mods& mods);
// Whether the sink_mod loads a float buffer, whose gradient the backward adds
// (kFjHasSinkGrads).
bool has_sink_grads(const Mods& mods);

// Whether the score_mod has a float load site whose gradient is added at every element (any
// site but those indexed by b, h and params only: kFjElementGradSites > 0), the sites that the
// CTA's private shared-memory copy serves (smem_floats above).
bool has_element_grad_sites(const Mods& mods);

// Exact C literals: an f32 constant in its shortest round-trip decimal form with an `f` suffix
// ("0.1f", "(-2.5f)", "16777216.0f"; inf and nan as __int_as_float bit patterns), an i32
// constant ("7", "(-7)", "(-2147483647 - 1)"). Negative values are parenthesised so that they
// can be used as operands verbatim.
std::string cuda_float_literal(float v);
std::string cuda_int_literal(int64_t v);

}  // namespace flexjit::cuda
