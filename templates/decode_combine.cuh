// flexjit split-KV decoding: the combine kernel (docs/kernels/decode.md).
//
// Spliced after flexjit_abi.h, prelude.cuh, the generated FjConfig (kNumWarps, kHeadDimV: the
// tile dim 64 / 128 / 256, kRealDimV: the rows' own length, a multiple of 8, Element) and mods
// (only the sink_mod reaches it) and mma_sm80.cuh (FjMma<Element>::store2). With a sink_mod
// the row's sink joins the denominator (fj_softmax_finish, prelude.cuh): out = sum_s w_s o_s /
// (sum_s w_s + 2^(sink log2 e - m)), lse = logaddexp(lse_keys, sink); no split saw a key: out 0
// and lse = sink.
//
// One warp per output row (b, h, q): with the splits' log2-domain LSEs l_s and normalized partial
// outputs o_s, m = max_s l_s, w_s = 2^(l_s - m), out = sum_s w_s o_s / sum_s w_s and
// lse = (m + log2(sum_s w_s)) * ln 2. A row no split saw a key for (every l_s = -inf) gets
// out 0 and lse -inf, as the forward writes a fully masked row. Lane l owns the element pairs
// d = 64 i + 2 l of the row: float2 reads of the workspace, one 4-byte (16-bit Element) or
// 8-byte (float) store per pair.
#ifndef FLEXJIT_DECODE_COMBINE_CUH_
#define FLEXJIT_DECODE_COMBINE_CUH_

struct alignas(8) fj_f32x2 {
  float x, y;
};

// FjConfig::kSplitLanes (decode_combine/warp_batched): the lanes of the warp divide the splits
// among them instead: kLanes = Dv / 16 lanes per split, each owning 16 consecutive floats of the
// row (four 16-byte loads), kPerPass = 32 / kLanes splits at once. With at most kPerPass splits
// (the anchors' decode shape: 4 at Dv = 128) one pass loads every LSE and partial at once, a
// single round trip to the L2 where the loop below makes one per split; more splits take their
// max first, then passes of kPerPass. The sums over the splits end with shuffles (xor kLanes ..
// 16), so the additions' order differs from the loop's (rounding only).
template <class Cfg>
FJ_DEVICE void fj_dec_combine_split_lanes(const FjDecodeCombineArgs& args, const FjModParams& mods,
                                          fj_i64 row, int b, int h, int qi, int lane) {
  using Element = typename Cfg::Element;
  constexpr int kDimV = Cfg::kHeadDimV;   // the tile dim: how the lanes divide a row
  constexpr int kRealV = Cfg::kRealDimV;  // the row's own length (a multiple of 8)
  constexpr int kLanes = kDimV / 16;
  constexpr int kPerPass = 32 / kLanes;
  constexpr float kLn2 = 0.6931471805599453f;
  const float neg_inf = __int_as_float(0xff800000u);
  const int splits = args.num_splits;
  const float* lse = args.lse_part + row * splits;
  const float* o = args.o_part + row * splits * kRealV;
  const int sub = lane / kLanes;         // this lane's split within a pass
  const int col = (lane % kLanes) * 16;  // its first element of the row
  // Elements past kRealV (the tile's padding) are neither read nor written: they count as 0.
  auto load = [&](int s, float(&x)[16]) {
    const float4* src = reinterpret_cast<const float4*>(o + (fj_i64)s * kRealV + col);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 v = col + 4 * k < kRealV ? src[k] : float4{0.0f, 0.0f, 0.0f, 0.0f};
      x[4 * k] = v.x, x[4 * k + 1] = v.y, x[4 * k + 2] = v.z, x[4 * k + 3] = v.w;
    }
  };
  float acc[16];
#pragma unroll
  for (int k = 0; k < 16; ++k)
    acc[k] = 0.0f;
  float denom = 0.0f, m;
  if (splits <= kPerPass) {
    const bool valid = sub < splits;
    const int s = valid ? sub : 0;  // a lane past the last split reads split 0, weighs it 0
    float x[16];
    const float l_raw = lse[s];
    load(s, x);
    const float l = valid ? l_raw : neg_inf;
    m = l;
#pragma unroll
    for (int off = kLanes; off < 32; off <<= 1)
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (m != neg_inf) {
      const float w = exp2f(l - m);  // 0 for a split that saw no key
      if (w != 0.0f) {
        denom = w;
#pragma unroll
        for (int k = 0; k < 16; ++k)
          acc[k] = w * x[k];
      }
    }
  } else {
    m = neg_inf;
    for (int s = lane; s < splits; s += 32)
      m = fmaxf(m, lse[s]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (m != neg_inf) {
      for (int s0 = 0; s0 < splits; s0 += kPerPass) {
        const int s = s0 + sub;
        if (s >= splits) break;
        float x[16];
        const float l = lse[s];
        load(s, x);
        const float w = exp2f(l - m);
        if (w == 0.0f) continue;
        denom += w;
#pragma unroll
        for (int k = 0; k < 16; ++k)
          acc[k] += w * x[k];
      }
    }
  }
#pragma unroll
  for (int off = kLanes; off < 32; off <<= 1) {
    denom += __shfl_xor_sync(0xffffffffu, denom, off);
#pragma unroll
    for (int k = 0; k < 16; ++k)
      acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], off);
  }
  float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
  float row_lse = denom > 0.0f ? (m + log2f(denom)) * kLn2 : neg_inf;
  if constexpr (kFjHasSinkMod)
    inv = fj_softmax_finish(m, denom, fj_sink_mod(mods, b, h, qi), row_lse);
  if (sub == 0) {
    unsigned char* out_row =
        static_cast<unsigned char*>(args.out) +
        sizeof(Element) * ((fj_i64)b * args.o_stride_b + (fj_i64)h * args.o_stride_h +
                           (fj_i64)qi * args.o_stride_s + col);
#pragma unroll
    for (int k = 0; k < 16; k += 2)
      if (col + k < kRealV)
        FjMma<Element>::store2(out_row + sizeof(Element) * k, acc[k] * inv, acc[k + 1] * inv);
  }
  if (args.lse != nullptr && lane == 0) {
    args.lse[(fj_i64)b * args.lse_stride_b + (fj_i64)h * args.lse_stride_h + qi] = row_lse;
  }
}

extern "C" __global__ void __launch_bounds__(FjConfig::kNumWarps * 32)
    flexjit_decode_combine(const FjDecodeCombineArgs args, const FjModParams mods) {
  using Cfg = FjConfig;
  using Element = typename Cfg::Element;
  constexpr int kDimV = Cfg::kRealDimV;      // the row's length, a multiple of 8
  constexpr int kPairs = (kDimV + 63) / 64;  // element pairs per lane (the last may be past kDimV)
  static_assert(kDimV % 8 == 0 && kDimV <= Cfg::kHeadDimV,
                "flexjit decode_combine: Dv must be a multiple of 8 within the tile dim");
  constexpr float kLn2 = 0.6931471805599453f;
  const float neg_inf = __int_as_float(0xff800000u);

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched programmatically (sm_90+): wait until the split kernel's partials are complete and
  // visible; a no-op for a plain launch.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const fj_i64 row = (fj_i64)blockIdx.x * Cfg::kNumWarps + warp;
  const fj_i64 rows = (fj_i64)args.batch * args.heads_q * args.seqlen_q;
  if (row >= rows) return;
  const int qi = (int)(row % args.seqlen_q);
  const int h = (int)((row / args.seqlen_q) % args.heads_q);
  const int b = (int)(row / ((fj_i64)args.seqlen_q * args.heads_q));
  if constexpr (Cfg::kSplitLanes) {
    fj_dec_combine_split_lanes<Cfg>(args, mods, row, b, h, qi, lane);
    return;
  }
  const int splits = args.num_splits;
  const float* lse = args.lse_part + row * splits;

  float m = neg_inf;
  for (int s = lane; s < splits; s += 32)
    m = fmaxf(m, lse[s]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));

  float acc[kPairs][2];
#pragma unroll
  for (int i = 0; i < kPairs; ++i)
    acc[i][0] = acc[i][1] = 0.0f;
  float denom = 0.0f;
  if (m != neg_inf) {
    const float* o = args.o_part + row * splits * kDimV;
    for (int s = 0; s < splits; ++s) {
      const float w = exp2f(lse[s] - m);  // the same value in every lane: no divergence
      if (w == 0.0f) continue;
      denom += w;
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        if (64 * i + 2 * lane >= kDimV) continue;
        const fj_f32x2 x = *reinterpret_cast<const fj_f32x2*>(o + s * kDimV + 64 * i + 2 * lane);
        acc[i][0] += w * x.x;
        acc[i][1] += w * x.y;
      }
    }
  }
  float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
  float row_lse = denom > 0.0f ? (m + log2f(denom)) * kLn2 : neg_inf;
  if constexpr (kFjHasSinkMod)
    inv = fj_softmax_finish(m, denom, fj_sink_mod(mods, b, h, qi), row_lse);
  unsigned char* out_row =
      static_cast<unsigned char*>(args.out) +
      sizeof(Element) * ((fj_i64)b * args.o_stride_b + (fj_i64)h * args.o_stride_h +
                         (fj_i64)qi * args.o_stride_s);
#pragma unroll
  for (int i = 0; i < kPairs; ++i)
    if (64 * i + 2 * lane < kDimV)
      FjMma<Element>::store2(out_row + sizeof(Element) * (64 * i + 2 * lane), acc[i][0] * inv,
                             acc[i][1] * inv);
  if (args.lse != nullptr && lane == 0) {
    args.lse[(fj_i64)b * args.lse_stride_b + (fj_i64)h * args.lse_stride_h + qi] = row_lse;
  }
}

#endif  // FLEXJIT_DECODE_COMBINE_CUH_
