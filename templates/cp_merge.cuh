// flexjit context parallelism: the lse merge of partial attention results
// (docs/context_parallel.md; the host's version is src/cp/LseMerge.cpp, the same arithmetic).
//
// Spliced after flexjit_abi.h, prelude.cuh and the generated FjConfig (kNumWarps, Element).
// One warp per row (b, h, s); lane l owns elements l, l + 32, ... of the row. Rows are numbered
// ((b * heads) + h) * seqlen + s; acc and acc_lse are contiguous in that order.
//
// merge:    m = max(lse_acc, lse_part); w_a = exp(lse_acc - m), w_p = exp(lse_part - m);
//           acc = (w_a acc + w_p part) / (w_a + w_p); lse_acc = m + log(w_a + w_p). A row where
//           both are -inf (no key seen yet) stays out 0, lse -inf; a NaN lse makes the row NaN.
// finalize: out = Element(acc), out_lse = acc_lse.
// accumulate: acc[rows acc_row0 + s of a [B, H, acc_seqlen, dv] tensor] += part (the backward).
#ifndef FLEXJIT_CP_MERGE_CUH_
#define FLEXJIT_CP_MERGE_CUH_

FJ_DEVICE float fj_cp_load(const fj_bf16* p) {
  return __uint_as_float(static_cast<unsigned>(p->bits) << 16);
}
FJ_DEVICE float fj_cp_load(const fj_f16* p) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p->bits));
  return f;
}
FJ_DEVICE float fj_cp_load(const float* p) {
  return *p;
}
FJ_DEVICE void fj_cp_store(fj_bf16* p, float x) {
  unsigned short b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(x));
  p->bits = b;
}
FJ_DEVICE void fj_cp_store(fj_f16* p, float x) {
  unsigned short b;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(x));
  p->bits = b;
}
FJ_DEVICE void fj_cp_store(float* p, float x) {
  *p = x;
}

// The row this warp owns, or -1 past the last one; (b, h, s) of it.
FJ_DEVICE fj_i64 fj_cp_row(const FjCpMergeArgs& a, int& b, int& h, int& s) {
  const fj_i64 row = (fj_i64)blockIdx.x * FjConfig::kNumWarps + threadIdx.x / 32;
  const fj_i64 rows = (fj_i64)a.batch * a.heads * a.seqlen;
  if (row >= rows) return -1;
  s = (int)(row % a.seqlen);
  h = (int)(row / a.seqlen % a.heads);
  b = (int)(row / ((fj_i64)a.seqlen * a.heads));
  return row;
}

extern "C" __global__ void __launch_bounds__(FjConfig::kNumWarps * 32)
    flexjit_cp_merge(const FjCpMergeArgs a) {
  using Element = typename FjConfig::Element;
  int b, h, s;
  const fj_i64 row = fj_cp_row(a, b, h, s);
  if (row < 0) return;
  const int lane = threadIdx.x % 32;
  const float la = a.acc_lse[row];
  const float lp = a.part_lse[b * a.part_lse_stride_b + h * a.part_lse_stride_h + s];
  float* acc = a.acc + row * a.dv;
  const Element* part = static_cast<const Element*>(a.part) + b * a.part_stride_b +
                        h * a.part_stride_h + s * a.part_stride_s;
  if (la != la || lp != lp) {  // NaN
    const float nan = __int_as_float(0x7fc00000);
    for (int d = lane; d < a.dv; d += 32)
      acc[d] = nan;
    if (lane == 0) a.acc_lse[row] = nan;
    return;
  }
  const float m = fmaxf(la, lp);
  if (m == __int_as_float(0xff800000u)) return;  // neither saw a key
  const float wa = expf(la - m), wp = expf(lp - m);
  const float inv = 1.0f / (wa + wp);
  for (int d = lane; d < a.dv; d += 32)
    acc[d] = (wa * acc[d] + wp * fj_cp_load(part + d)) * inv;
  if (lane == 0) a.acc_lse[row] = m + logf(wa + wp);
}

extern "C" __global__ void __launch_bounds__(FjConfig::kNumWarps * 32)
    flexjit_cp_finalize(const FjCpMergeArgs a) {
  using Element = typename FjConfig::Element;
  int b, h, s;
  const fj_i64 row = fj_cp_row(a, b, h, s);
  if (row < 0) return;
  const int lane = threadIdx.x % 32;
  const float* acc = a.acc + row * a.dv;
  Element* out =
      static_cast<Element*>(a.out) + b * a.out_stride_b + h * a.out_stride_h + s * a.out_stride_s;
  for (int d = lane; d < a.dv; d += 32)
    fj_cp_store(out + d, acc[d]);
  if (lane == 0 && a.out_lse != nullptr) {
    a.out_lse[b * a.out_lse_stride_b + h * a.out_lse_stride_h + s] = a.acc_lse[row];
  }
}

extern "C" __global__ void __launch_bounds__(FjConfig::kNumWarps * 32)
    flexjit_cp_accumulate(const FjCpMergeArgs a) {
  using Element = typename FjConfig::Element;
  int b, h, s;
  const fj_i64 row = fj_cp_row(a, b, h, s);
  if (row < 0) return;
  const int lane = threadIdx.x % 32;
  float* acc = a.acc + (((fj_i64)b * a.heads + h) * a.acc_seqlen + a.acc_row0 + s) * a.dv;
  const Element* part = static_cast<const Element*>(a.part) + b * a.part_stride_b +
                        h * a.part_stride_h + s * a.part_stride_s;
  for (int d = lane; d < a.dv; d += 32)
    acc[d] += fj_cp_load(part + d);
}

#endif  // FLEXJIT_CP_MERGE_CUH_
