// The fp32 inner loops of the CPU forward. No include guard on purpose: ForwardKernel.cpp
// includes this file twice, once for baseline x86-64 (namespace base) and once under
// `#pragma GCC target("avx2,fma")` with fp-contract=fast (namespace avx2), and picks one at run
// time from the CPU's features. GCC vector extensions keep the accumulators in registers (a
// 32-byte vector is two SSE registers in the baseline build).
//
// Expects kKvTile and kRowGroup (= 4) from the including file.

// exp(x) for x <= 0 in float, branch-free so that the softmax loops vectorise (libm's expf is a
// call per element). Cody-Waite range reduction and Cephes' degree-6 polynomial: within 2 ulp.
// The reduction runs on x clamped to [-87, 0], so the float -> int conversion is always defined;
// outside the domain the result is x + 1, which keeps NaN (a NaN score makes its row NaN) and
// +inf as they are.
inline float exp_nonpositive(float x) {
  const float xc = x >= -87.0f ? (x <= 0.0f ? x : 0.0f) : -87.0f;           // -inf and NaN: -87
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return x < -87.0f ? 0.0f : (x <= 0.0f ? y * two_n : x + 1.0f);
}
typedef float V8 __attribute__((vector_size(32)));

// V8 never crosses a non-inlined call, so the AVX argument-passing ABI note does not apply.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

inline __attribute__((always_inline)) V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline __attribute__((always_inline)) void store8(float* p, V8 v) {
  std::memcpy(p, &v, sizeof v);
}

// s[r * kKvTile + j] = scale * sum_d q[r * D + d] * kt[d * kKvTile + j] for r < nr, j < kKvTile:
// 4 rows x 16 columns of accumulators (8 vectors, 8 independent chains), each K^T load feeding
// 4 rows.
inline void qk_tile_f32(const float* q, int64_t D, int64_t nr, const float* kt, float scale,
                        float* s) {
  static_assert(kKvTile % 16 == 0 && kRowGroup == 4);
  for (int64_t r0 = 0; r0 < nr; r0 += 4) {
    // Rows past the end recompute the last row (no branches in the loop; results discarded).
    const float* q0 = q + std::min<int64_t>(r0, nr - 1) * D;
    const float* q1 = q + std::min<int64_t>(r0 + 1, nr - 1) * D;
    const float* q2 = q + std::min<int64_t>(r0 + 2, nr - 1) * D;
    const float* q3 = q + std::min<int64_t>(r0 + 3, nr - 1) * D;
    for (int j0 = 0; j0 < kKvTile; j0 += 16) {
      V8 a00 = {}, a01 = {}, a10 = {}, a11 = {}, a20 = {}, a21 = {}, a30 = {}, a31 = {};
      for (int64_t d = 0; d < D; ++d) {
        const V8 k0 = load8(kt + d * kKvTile + j0);
        const V8 k1 = load8(kt + d * kKvTile + j0 + 8);
        a00 += q0[d] * k0;
        a01 += q0[d] * k1;
        a10 += q1[d] * k0;
        a11 += q1[d] * k1;
        a20 += q2[d] * k0;
        a21 += q2[d] * k1;
        a30 += q3[d] * k0;
        a31 += q3[d] * k1;
      }
      const V8 acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
      for (int rr = 0; rr < 4 && r0 + rr < nr; ++rr) {
        store8(s + (r0 + rr) * kKvTile + j0, acc[rr][0] * scale);
        store8(s + (r0 + rr) * kKvTile + j0 + 8, acc[rr][1] * scale);
      }
    }
  }
}

// a[d] = a[d] * alpha + sum_{j < n} p[j] * v[j * Dv + d]. Blocks of 32 columns, j unrolled by
// two into separate accumulators (8 independent chains).
inline void pv_row_f32(const float* p, int n, const float* v, int64_t Dv, float alpha, float* a) {
  int64_t d0 = 0;
  for (; d0 + 32 <= Dv; d0 += 32) {
    V8 t0 = load8(a + d0) * alpha, t1 = load8(a + d0 + 8) * alpha;
    V8 t2 = load8(a + d0 + 16) * alpha, t3 = load8(a + d0 + 24) * alpha;
    V8 u0 = {}, u1 = {}, u2 = {}, u3 = {};
    int j = 0;
    for (; j + 2 <= n; j += 2) {
      const float* v0 = v + j * Dv + d0;
      const float* v1 = v0 + Dv;
      const float p0 = p[j], p1 = p[j + 1];
      t0 += p0 * load8(v0);
      t1 += p0 * load8(v0 + 8);
      t2 += p0 * load8(v0 + 16);
      t3 += p0 * load8(v0 + 24);
      u0 += p1 * load8(v1);
      u1 += p1 * load8(v1 + 8);
      u2 += p1 * load8(v1 + 16);
      u3 += p1 * load8(v1 + 24);
    }
    if (j < n) {
      const float* v0 = v + j * Dv + d0;
      t0 += p[j] * load8(v0);
      t1 += p[j] * load8(v0 + 8);
      t2 += p[j] * load8(v0 + 16);
      t3 += p[j] * load8(v0 + 24);
    }
    store8(a + d0, t0 + u0);
    store8(a + d0 + 8, t1 + u1);
    store8(a + d0 + 16, t2 + u2);
    store8(a + d0 + 24, t3 + u3);
  }
  for (; d0 < Dv; ++d0) {
    float t = a[d0] * alpha;
    for (int j = 0; j < n; ++j)
      t += p[j] * v[j * Dv + d0];
    a[d0] = t;
  }
}

// s[j] = exp(s[j] - m) for j < n; returns their sum.
inline float exp_row_f32(float* s, int n, float m) {
  for (int j = 0; j < n; ++j)
    s[j] = exp_nonpositive(s[j] - m);
  float sum = 0;
  for (int j = 0; j < n; ++j)
    sum += s[j];
  return sum;
}

#pragma GCC diagnostic pop
