// flexjit kernel prelude: scalar types and the device functions that generated mod code calls.
//
// Spliced after flexjit_abi.h and before the generated FjConfig / mods. NVRTC compiles the
// translation unit without any header, so everything here is built from NVRTC's built-in math
// functions (expf, tanhf, ... are declared by NVRTC itself) and inline PTX.
//
// Every fj_* function has the semantics of the flexjit language (DESIGN.md), not of C:
//  - float functions are the accurate CUDA ones (no fast-math intrinsics): mods must match an fp64
//    reference to fp32 accuracy. Compile without --use_fast_math. The *_approx functions below
//    are the exception a kernel opts into (fast_math=1; docs/math.md).
//  - integer arithmetic wraps modulo 2^32 (computed in unsigned, so no undefined behaviour);
//    division and modulo floor (Python semantics); x / 0 == 0 and x % 0 == 0.
#ifndef FLEXJIT_PRELUDE_CUH_
#define FLEXJIT_PRELUDE_CUH_

// 16-bit floating point elements, as raw bits (no cuda_bf16.h / cuda_fp16.h).
struct fj_bf16 {
  unsigned short bits;
};
struct fj_f16 {
  unsigned short bits;
};

typedef unsigned int fj_u32;

#define FJ_DEVICE __device__ __forceinline__

// ---- e4m3 KV caches (decode_split.cuh, forward_sm90.cuh) -------------------------------------
template <class Element>
struct FjIsF16 {
  static constexpr bool value = false;
};
template <>
struct FjIsF16<fj_f16> {
  static constexpr bool value = true;
};

// Four e4m3 values (bytes 0..3 of x) as two Element pairs: lo = bytes 0, 1, hi = bytes 2, 3 (low
// byte in the low half), by the sm_89 conversion to f16x2 (exact: every e4m3 value is an f16 and
// a bf16). bf16: each f16 to f32 (exact), whose upper 16 bits are the bf16 (an e4m3 value has 4
// significant bits, so the lower 16 are zero): one prmt per pair instead of a second conversion
// instruction (F2FP.BF16.F32.PACK_AB). NaN stays NaN. sm_89 and newer (instantiated only there).
template <class Element>
FJ_DEVICE void fj_e4m3x4(fj_u32 x, fj_u32& lo, fj_u32& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
      " cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(x));
  if constexpr (!FjIsF16<Element>::value) {
    asm("{\n .reg .f16 a, b, c, d;\n .reg .b32 fa, fb, fc, fd;\n mov.b32 {a, b}, %0;\n"
        " mov.b32 {c, d}, %1;\n cvt.f32.f16 fa, a;\n cvt.f32.f16 fb, b;\n cvt.f32.f16 fc, c;\n"
        " cvt.f32.f16 fd, d;\n prmt.b32 %0, fa, fb, 0x7632;\n prmt.b32 %1, fc, fd, 0x7632;\n}\n"
        : "+r"(lo), "+r"(hi));
  }
}

// ---- float math ----------------------------------------------------------------------------
FJ_DEVICE float fj_exp(float x) {
  return expf(x);
}
FJ_DEVICE float fj_exp2(float x) {
  return exp2f(x);
}
FJ_DEVICE float fj_log(float x) {
  return logf(x);
}
FJ_DEVICE float fj_log2(float x) {
  return log2f(x);
}
FJ_DEVICE float fj_tanh(float x) {
  return tanhf(x);
}
FJ_DEVICE float fj_sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}
FJ_DEVICE float fj_sqrt(float x) {
  return sqrtf(x);
}
// 1/sqrtf (both IEEE-rounded) is within 1 ulp; rsqrtf's 2 ulp would not match a reference.
FJ_DEVICE float fj_rsqrt(float x) {
  return 1.0f / sqrtf(x);
}
FJ_DEVICE float fj_floor(float x) {
  return floorf(x);
}
FJ_DEVICE float fj_ceil(float x) {
  return ceilf(x);
}
FJ_DEVICE float fj_pow(float a, float b) {
  return powf(a, b);
}
FJ_DEVICE float fj_fabs(float x) {
  return fabsf(x);
}
FJ_DEVICE float fj_fminf(float a, float b) {
  return fminf(a, b);
}
FJ_DEVICE float fj_fmaxf(float a, float b) {
  return fmaxf(a, b);
}
// Floor modulo: the result has the divisor's sign (Python's %, torch.remainder).
FJ_DEVICE float fj_fmod_floor(float a, float b) {
  return a - b * floorf(a / b);
}

// ---- approximate transcendentals (fast_math=1 kernels; docs/math.md) --------------------------
// One hardware instruction each (the multi-function unit), or one and a multiply. The codegen
// calls these instead of fj_exp / fj_exp2 / fj_log / fj_log2 / fj_tanh / fj_sigmoid (and f32 /)
// in the
// score_mod (and its derivatives) of a kernel described with fast_math=1; mask_mods stay exact.
// Errors from the PTX ISA: tanh.approx.f32 2^-11 relative over the whole range (subnormals pass
// through); ex2.approx 2 ulp; lg2.approx 2^-22 absolute on (0.5, 2), else 2^-22 relative. The
// .ftz forms flush subnormal inputs and results to zero.
FJ_DEVICE float fj_tanh_approx(float x) {
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
FJ_DEVICE float fj_exp2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// e^x = 2^(x log2 e): the rounding of the product adds |x| * 2^-24 to the relative error
// (CUDA's __expf does the same).
FJ_DEVICE float fj_exp_approx(float x) {
  return fj_exp2_approx(x * 1.44269504088896341f);
}
FJ_DEVICE float fj_log2_approx(float x) {
  float r;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
FJ_DEVICE float fj_log_approx(float x) {
  return fj_log2_approx(x) * 0.693147180559945309f;
}
// a / b of f32 operands in the score_mod: a times the correctly rounded reciprocal of b (about
// 1 ulp; b = 0 or inf behave as in IEEE division except that 0 / 0 and inf / inf stay NaN only
// through 0 * inf; |b| below 2^-126 overflows the reciprocal to inf). A divisor that does not
// change inside the kernel (softcap's cap, a param) has its reciprocal hoisted out of the loops,
// where the IEEE division costs a check and a slow-path branch per score.
FJ_DEVICE float fj_fdiv_approx(float a, float b) {
  return a * __frcp_rn(b);
}
// 1 / (1 + e^-x) with the division exact: relative error within a few ulp of e^-x's, unlike
// 0.5 + 0.5 tanh(x / 2), whose absolute 2^-12 would swamp sigmoid's small values.
FJ_DEVICE float fj_sigmoid_approx(float x) {
  return 1.0f / (1.0f + fj_exp_approx(-x));
}

// ---- int math (wrapping, floor division) ------------------------------------------------------
FJ_DEVICE int fj_iadd(int a, int b) {
  return (int)((fj_u32)a + (fj_u32)b);
}
FJ_DEVICE int fj_isub(int a, int b) {
  return (int)((fj_u32)a - (fj_u32)b);
}
FJ_DEVICE int fj_imul(int a, int b) {
  return (int)((fj_u32)a * (fj_u32)b);
}
FJ_DEVICE int fj_neg_i(int a) {
  return (int)(0u - (fj_u32)a);
}
FJ_DEVICE int fj_iabs(int a) {
  return a < 0 ? fj_neg_i(a) : a;
}  // INT_MIN stays INT_MIN
FJ_DEVICE int fj_imin(int a, int b) {
  return a < b ? a : b;
}
FJ_DEVICE int fj_imax(int a, int b) {
  return a > b ? a : b;
}
FJ_DEVICE int fj_idiv_floor(int a, int b) {
  if (b == 0) return 0;
  if (b == -1) return fj_neg_i(a);  // INT_MIN / -1 wraps to INT_MIN instead of trapping
  int q = a / b;
  int r = a - q * b;
  return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q;
}
FJ_DEVICE int fj_imod_floor(int a, int b) {
  if (b == 0 || b == -1) return 0;
  int r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
// float -> int: truncates toward zero, saturates to [INT_MIN, INT_MAX], NaN -> 0 (PTX cvt
// float-to-integer conversions always saturate and map NaN to 0).
FJ_DEVICE int fj_f2i(float x) {
  int r;
  asm("cvt.rzi.s32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// ---- captured buffer loads (64-bit offsets, element units) ------------------------------------
FJ_DEVICE float fj_ld_f32(const float* p, fj_i64 off) {
  return p[off];
}
FJ_DEVICE float fj_ld_bf16(const unsigned short* p, fj_i64 off) {
  return __int_as_float((int)((fj_u32)p[off] << 16));
}
FJ_DEVICE float fj_ld_f16(const unsigned short* p, fj_i64 off) {
  float r;
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(p[off]));
  return r;
}
FJ_DEVICE int fj_ld_i32(const int* p, fj_i64 off) {
  return p[off];
}
FJ_DEVICE bool fj_ld_bool(const unsigned char* p, fj_i64 off) {
  return p[off] != 0;
}

// Adds v to *p from every lane of a converged warp (the backward's buffer gradients): when all 32
// lanes add to one address (a buffer indexed by the head only) they sum first and one
// atomic goes out; otherwise each lane with a nonzero value adds its own.
FJ_DEVICE void fj_grad_add(float* p, float v) {
  const unsigned peers = __match_any_sync(0xffffffffu, (unsigned long long)p);
  if (peers == 0xffffffffu) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0 && v != 0.0f) atomicAdd(p, v);
  } else if (v != 0.0f) {
    atomicAdd(p, v);
  }
}

// fj_grad_add into the CTA's private copy of small buffer gradients (`p` in shared memory,
// kFjGradSmemFloats; docs/backward.md "Small buffer gradients in shared memory"). A shared f32
// atomicAdd is a compare-and-swap loop (ATOMS.CAST.SPIN on sm_80 and sm_90) that retries once per
// lane sharing the address, so the lanes sharing an address sum first (a butterfly when all 32
// share it, else over the group's lanes) and one lane per distinct address adds. Every lane of
// a converged warp calls it; lanes with nothing to add pass 0.
FJ_DEVICE void fj_grad_add_shared(float* p, float v) {
  const unsigned peers = __match_any_sync(0xffffffffu, (unsigned)__cvta_generic_to_shared(p));
  const int lane = (int)(threadIdx.x & 31);
  float sum = v;
  if (peers == 0xffffffffu) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
  } else if ((peers & (peers - 1u)) != 0u) {
    sum = 0.0f;
    for (unsigned m = peers; m != 0u; m &= m - 1u)
      sum += __shfl_sync(peers, v, __ffs(m) - 1);
  }
  if (lane == __ffs(peers) - 1 && sum != 0.0f) atomicAdd(p, sum);
}

// fj_clamp_index for the private shared-memory copy (extents of at most 4096 elements).
FJ_DEVICE int fj_clamp_index32(int i, int extent) {
  return i < 0 ? 0 : (i >= extent ? extent - 1 : i);
}

// The deterministic twin of fj_grad_add (the backward's ordered buffer gradients): `p` points
// into a partial slice that only this warp writes. Lanes sharing an address are summed in a
// fixed order (a butterfly when all 32 share it, else in increasing lane order), then the
// group's lowest lane adds the sum with a plain read-modify-write. Every lane of the warp calls
// it together; __syncwarp orders one call's writes before the next call's reads.
FJ_DEVICE void fj_grad_add_ordered(float* p, float v) {
  const unsigned peers = __match_any_sync(0xffffffffu, (unsigned long long)p);
  float sum = 0.0f;
  if (peers == 0xffffffffu) {
    sum = v;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
  } else {
    for (unsigned m = peers; m != 0u; m &= m - 1u)
      sum += __shfl_sync(peers, v, __ffs(m) - 1);
  }
  if ((int)(threadIdx.x & 31) == __ffs(peers) - 1 && sum != 0.0f) *p += sum;
  __syncwarp();
}

// An index clamped into [0, extent): where the backward adds a buffer's gradient.
FJ_DEVICE fj_i64 fj_clamp_index(int i, fj_i64 extent) {
  return i < 0 ? 0 : (i >= extent ? extent - 1 : (fj_i64)i);
}

// The end of a row's online softmax with an attention sink (the sink_mod, docs/attention.md):
// row_max2 is the row's running max in log2 units (-inf without a key), sum = sum_j 2^(s_j -
// row_max2) over its keys, sink the row's sink logit (natural log; -inf for none). Returns the
// factor the row's accumulator is multiplied by, 1 / (sum + 2^(sink log2 e - row_max2)) (0 for
// a row without keys, whose output is 0), and sets lse to the row's natural-log LSE including
// the sink: logaddexp(lse_keys, sink), the sink itself for a row without keys.
FJ_DEVICE float fj_softmax_finish(float row_max2, float sum, float sink, float& lse) {
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  if (sum == 0.0f) {
    lse = sink;
    return 0.0f;
  }
  const float sink2 = sink * kLog2e;
  const float m = fmaxf(row_max2, sink2);
  lse = (m + log2f(sum * exp2f(row_max2 - m) + exp2f(sink2 - m))) * kLn2;
  return 1.0f / (sum + exp2f(sink2 - row_max2));
}

#endif  // FLEXJIT_PRELUDE_CUH_
