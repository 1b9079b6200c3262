// flexjit backward: the gradient of an attention sink's captured buffers (the sink_mod;
// docs/backward.md, "Attention sinks").
//
// Spliced into the dK/dV modules (backward_sm80.cuh's FJ_BWD_DKDV, backward_sm90.cuh's
// FJ_BWD_SM90_DKDV), after the mods (fj_sink_mod) and their gradients (fj_sink_mod_grad). With
// the forward's LSE including the sink, lse' = logaddexp(lse_keys, sink), the probabilities and
// dS of the keys keep their formulas, and the sink of row (b, h, q) gets
//
//   d loss / d sink = -exp(sink - lse') * delta,   delta = rowsum(dO * O) - dlse,
//
// from the preprocess's workspace (lse2 = lse' log2 e, delta; +inf and 0 past seqlen_q). The
// kernel runs after the dK/dV kernel (and, deterministic, after its reduction): with fp32
// atomics it takes 32 rows per warp over a grid; deterministic it is launched as one warp, which
// walks the rows in increasing order and adds into the gradients in a fixed order.
#ifndef FLEXJIT_SINK_GRAD_CUH_
#define FLEXJIT_SINK_GRAD_CUH_

#if defined(FJ_BWD_DKDV) || defined(FJ_BWD_SM90_DKDV)
extern "C" __global__ void __launch_bounds__(256)
    flexjit_bwd_sink_grad(const FjBwdArgs args, const FjModParams mods, const FjGradParams grads) {
  if constexpr (kFjHasSinkGrads) {
    constexpr float kLog2e = 1.4426950408889634f;
    const fj_i64 rows = (fj_i64)args.batch * args.heads_q * args.seqlen_q;
    const fj_i64 stride = (fj_i64)gridDim.x * blockDim.x;
    const int lane = threadIdx.x % 32;
    // Warp-uniform trip count: fj_sink_mod_grad is called by every lane of the warp together.
    for (fj_i64 r0 = (fj_i64)blockIdx.x * blockDim.x + (threadIdx.x - lane); r0 < rows;
         r0 += stride) {
      const fj_i64 r = r0 + lane;
      const fj_i64 rc = r < rows ? r : rows - 1;  // past the end: a real row, with g = 0
      const int q = (int)(rc % args.seqlen_q);
      const int h = (int)((rc / args.seqlen_q) % args.heads_q);
      const int b = (int)(rc / ((fj_i64)args.seqlen_q * args.heads_q));
      const float sink = fj_sink_mod(mods, b, h, q);
      float g = 0.0f;
      if (r < rows && sink != fj_neg_inf()) {
        const fj_i64 ws = ((fj_i64)b * args.heads_q + h) * args.seqlen_q_pad + q;
        g = -exp2f(sink * kLog2e - args.lse2[ws]) * args.delta[ws];
      }
      fj_sink_mod_grad(mods, grads, b, h, q, g);
    }
  } else {
    (void)args, (void)mods, (void)grads;
  }
}
#endif  // FJ_BWD_DKDV || FJ_BWD_SM90_DKDV

#endif  // FLEXJIT_SINK_GRAD_CUH_
