// A naive attention kernel for tests at shapes too large for the CPU reference: fp32 math,
// scores materialized in a global fp32 workspace, the mask_mod applied at every position (the
// block mask in args.mask is ignored: the reference must not share the fast path's sparsity).
//
// The forward family's variant forward/reference (tests/support/ReferenceKernel.h registers it);
// spliced after flexjit_abi.h, the prelude and the generated parts:
//   struct FjReferenceConfig { static constexpr int kDType;       // 0 f32, 1 f16, 2 bf16
//                              static constexpr int kHeadDimQk, kHeadDimV, kGqaRatio; };
//   struct FjModParams { ... };
//   __device__ float fj_score_mod(const FjModParams& p, float score, int b, int h, int q_idx,
//                                 int kv_idx);
//   __device__ bool fj_mask_mod(const FjModParams& p, int b, int h, int q_idx, int kv_idx);
// Launch: grid (seqlen_q, heads_q, batch), block 128, workspace of
// batch * heads_q * seqlen_q * seqlen_kv floats. Semantics (pinned by the forward's tests):
// a fully masked row writes zeros and lse = -inf.

namespace fj_reference {

constexpr int kThreads = 128;

// Loads element i of a q/k/v/out row as float. 16-bit formats convert through PTX so that the
// template needs no CUDA headers.
__device__ inline float load(const void* base, fj_i64 i) {
  if (FjReferenceConfig::kDType == 0) return static_cast<const float*>(base)[i];
  const unsigned short bits = static_cast<const unsigned short*>(base)[i];
  if (FjReferenceConfig::kDType == 2) return __uint_as_float(((unsigned)bits) << 16);
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
  return f;
}

__device__ inline void store(void* base, fj_i64 i, float v) {
  if (FjReferenceConfig::kDType == 0) {
    static_cast<float*>(base)[i] = v;
    return;
  }
  unsigned short bits;
  if (FjReferenceConfig::kDType == 2) {
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(v));
  } else {
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(v));
  }
  static_cast<unsigned short*>(base)[i] = bits;
}

// Block-wide reduction (max when is_max, else sum) over kThreads threads.
__device__ inline float block_reduce(float v, bool is_max, float* scratch) {
  for (int o = 16; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float r = scratch[0];
  for (int i = 1; i < kThreads / 32; ++i)
    r = is_max ? fmaxf(r, scratch[i]) : r + scratch[i];
  __syncthreads();
  return r;
}

}  // namespace fj_reference

extern "C" __global__ void __launch_bounds__(fj_reference::kThreads)
    flexjit_reference_forward(const FjFwdArgs args, const FjModParams params, float* workspace) {
  __shared__ float scratch[fj_reference::kThreads / 32];
  const int q = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hkv = h / FjReferenceConfig::kGqaRatio;
  const fj_i64 q_off = b * args.q_stride_b + h * args.q_stride_h + q * args.q_stride_s;
  float* scores = workspace + (((fj_i64)b * args.heads_q + h) * args.seqlen_q + q) * args.seqlen_kv;
  const float kNegInf = -__int_as_float(0x7f800000);

  float row_max = kNegInf;
  for (int kv = threadIdx.x; kv < args.seqlen_kv; kv += fj_reference::kThreads) {
    float s = kNegInf;
    if (fj_mask_mod(params, b, h, q, kv)) {
      const fj_i64 k_off = b * args.k_stride_b + hkv * args.k_stride_h + kv * args.k_stride_s;
      float dot = 0.f;
      for (int d = 0; d < FjReferenceConfig::kHeadDimQk; ++d) {
        dot += fj_reference::load(args.q, q_off + d) * fj_reference::load(args.k, k_off + d);
      }
      s = fj_score_mod(params, dot * args.scale, b, h, q, kv);
    }
    scores[kv] = s;
    row_max = fmaxf(row_max, s);
  }
  row_max = fj_reference::block_reduce(row_max, true, scratch);

  float row_sum = 0.f;
  if (row_max != kNegInf) {
    for (int kv = threadIdx.x; kv < args.seqlen_kv; kv += fj_reference::kThreads) {
      const float p = expf(scores[kv] - row_max);  // exp(-inf) = 0 for masked positions
      scores[kv] = p;
      row_sum += p;
    }
  }
  row_sum = fj_reference::block_reduce(row_sum, false, scratch);  // also orders scores[] writes

  // The attention sink (sink_mod) joins the denominator: lse = logaddexp(lse_keys, sink).
  float lse = row_sum > 0.f ? row_max + logf(row_sum) : kNegInf;
  float denom = row_sum;
  if constexpr (kFjHasSinkMod) {
    const float sink = fj_sink_mod(params, b, h, q);
    const float top = fmaxf(lse, sink);
    lse = top == kNegInf ? top : top + logf(expf(lse - top) + expf(sink - top));
    denom = row_sum > 0.f ? expf(lse - row_max) : 0.f;
  }
  const fj_i64 o_off = b * args.o_stride_b + h * args.o_stride_h + q * args.o_stride_s;
  for (int d = threadIdx.x; d < FjReferenceConfig::kHeadDimV; d += fj_reference::kThreads) {
    float acc = 0.f;
    if (row_sum > 0.f) {
      for (int kv = 0; kv < args.seqlen_kv; ++kv) {
        const fj_i64 v_off = b * args.v_stride_b + hkv * args.v_stride_h + kv * args.v_stride_s;
        acc += scores[kv] * fj_reference::load(args.v, v_off + d);
      }
      acc /= denom;
    }
    fj_reference::store(args.out, o_off + d, acc);
  }
  if (args.lse != nullptr && threadIdx.x == 0) {
    args.lse[b * args.lse_stride_b + h * args.lse_stride_h + q] = lse;
  }
}
