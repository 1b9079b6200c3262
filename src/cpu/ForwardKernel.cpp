#include "cpu/ForwardKernel.h"

#include "binding/ModArgs.h"
#include "codegen/llvm/CpuModParams.h"
#include "codegen/llvm/LlvmCodegen.h"
#include "cpu/ParallelFor.h"
#include "cpu/Sinks.h"
#include "ir/Evaluate.h"
#include "util/CheckedMath.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace flexjit::cpu {

namespace {

constexpr int kKvTile = 64;   // kv columns per inner tile (the K^T tile's row length)
constexpr int kQTile = 64;    // query rows per work item without a block mask
constexpr int kRowGroup = 4;  // query rows sharing each K^T load in the inner product

inline double exp_nonpositive(double x) {  // the fp64 reference mode: libm
  return std::exp(x);
}

// The fp64 reference mode's loops (portable C++; speed is secondary there).
// s[r * kKvTile + j] = scale * sum_d q[r * D + d] * kt[d * kKvTile + j] for r < nr, j < kKvTile.
// Register-blocked: 4 rows x 16 columns of accumulators, each K^T row load feeding 4 rows.
template <typename Acc>
inline __attribute__((always_inline)) void qk_tile(const Acc* q, int64_t D, int64_t nr,
                                                   const Acc* kt, Acc scale, Acc* s) {
  constexpr int kCols = 16;
  for (int64_t r0 = 0; r0 < nr; r0 += kRowGroup) {
    const Acc* rows[kRowGroup];
    for (int rr = 0; rr < kRowGroup; ++rr)
      rows[rr] = q + std::min<int64_t>(r0 + rr, nr - 1) * D;  // past the end: recompute the last
    for (int j0 = 0; j0 < kKvTile; j0 += kCols) {
      Acc acc[kRowGroup][kCols] = {};
      for (int64_t d = 0; d < D; ++d) {
        const Acc* k = kt + d * kKvTile + j0;
        for (int rr = 0; rr < kRowGroup; ++rr) {
          const Acc qv = rows[rr][d];
          for (int jj = 0; jj < kCols; ++jj)
            acc[rr][jj] = acc[rr][jj] + qv * k[jj];
        }
      }
      for (int rr = 0; rr < kRowGroup && r0 + rr < nr; ++rr) {
        for (int jj = 0; jj < kCols; ++jj)
          s[(r0 + rr) * kKvTile + j0 + jj] = acc[rr][jj] * scale;
      }
    }
  }
}

// a[d] = a[d] * alpha + sum_j p[j] * v[j * Dv + d]: 16 accumulators per block of d, kept in
// registers across j.
template <typename Acc>
inline __attribute__((always_inline)) void pv_row(const Acc* p, int n, const Acc* v, int64_t Dv,
                                                  Acc alpha, Acc* a) {
  constexpr int kCols = 16;
  int64_t d0 = 0;
  for (; d0 + kCols <= Dv; d0 += kCols) {
    Acc t[kCols];
    for (int dd = 0; dd < kCols; ++dd)
      t[dd] = a[d0 + dd] * alpha;
    for (int j = 0; j < n; ++j) {
      const Acc pj = p[j];
      const Acc* vj = v + j * Dv + d0;
      for (int dd = 0; dd < kCols; ++dd)
        t[dd] = t[dd] + pj * vj[dd];
    }
    for (int dd = 0; dd < kCols; ++dd)
      a[d0 + dd] = t[dd];
  }
  for (int64_t d = d0; d < Dv; ++d) {
    Acc t = a[d] * alpha;
    for (int j = 0; j < n; ++j)
      t += p[j] * v[j * Dv + d];
    a[d] = t;
  }
}

// s[j] = exp(s[j] - m) for j < n; returns their sum.
template <typename Acc>
inline __attribute__((always_inline)) Acc exp_row(Acc* s, int n, Acc m) {
  for (int j = 0; j < n; ++j)
    s[j] = exp_nonpositive(s[j] - m);
  Acc sum = 0;
  for (int j = 0; j < n; ++j)
    sum += s[j];
  return sum;
}

}  // namespace

// The fp32 kernels, twice (see ForwardInnerLoops.h).
// no-trapping-math lets GCC if-convert the exp's range checks, so that its loop vectorises.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif
namespace base {
#include "cpu/ForwardInnerLoops.h"
}  // namespace base
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FJ_HAVE_AVX2_PATH 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#pragma GCC optimize("fp-contract=fast", "no-trapping-math")
namespace avx2 {
#include "cpu/ForwardInnerLoops.h"
}  // namespace avx2
#pragma GCC pop_options
#else
#define FJ_HAVE_AVX2_PATH 0
#endif

namespace {

inline float exp_nonpositive(float x) {
  return base::exp_nonpositive(x);
}

#if FJ_HAVE_AVX2_PATH
bool use_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#endif

inline void qk_tile_any(bool wide, const float* q, int64_t D, int64_t nr, const float* kt,
                        float scale, float* s) {
#if FJ_HAVE_AVX2_PATH
  if (wide) return avx2::qk_tile_f32(q, D, nr, kt, scale, s);
#endif
  base::qk_tile_f32(q, D, nr, kt, scale, s);
}
inline void pv_row_any(bool wide, const float* p, int n, const float* v, int64_t Dv, float alpha,
                       float* a) {
#if FJ_HAVE_AVX2_PATH
  if (wide) return avx2::pv_row_f32(p, n, v, Dv, alpha, a);
#endif
  base::pv_row_f32(p, n, v, Dv, alpha, a);
}
inline float exp_row_any(bool wide, float* s, int n, float m) {
#if FJ_HAVE_AVX2_PATH
  if (wide) return avx2::exp_row_f32(s, n, m);
#endif
  return base::exp_row_f32(s, n, m);
}
inline void qk_tile_any(bool, const double* q, int64_t D, int64_t nr, const double* kt,
                        double scale, double* s) {
  qk_tile(q, D, nr, kt, scale, s);
}
inline void pv_row_any(bool, const double* p, int n, const double* v, int64_t Dv, double alpha,
                       double* a) {
  pv_row(p, n, v, Dv, alpha, a);
}
inline double exp_row_any(bool, double* s, int n, double m) {
  return exp_row(s, n, m);
}

template <typename Acc>
void load_row(const TensorRef& t, int64_t b, int64_t h, int64_t s, Acc* dst) {
  const int64_t d = t.shape[3];
  const int64_t off = b * t.strides[0] + h * t.strides[1] + s * t.strides[2];
  switch (t.dtype) {
    case DType::F32: {
      const float* p = static_cast<const float*>(t.data) + off;
      for (int64_t i = 0; i < d; ++i)
        dst[i] = static_cast<Acc>(p[i]);
      return;
    }
    case DType::F16: {
      const uint16_t* p = static_cast<const uint16_t*>(t.data) + off;
      for (int64_t i = 0; i < d; ++i)
        dst[i] = static_cast<Acc>(ir::f16_bits_to_float(p[i]));
      return;
    }
    case DType::BF16: {
      const uint16_t* p = static_cast<const uint16_t*>(t.data) + off;
      for (int64_t i = 0; i < d; ++i)
        dst[i] = static_cast<Acc>(ir::bf16_bits_to_float(p[i]));
      return;
    }
    case DType::E4M3: {  // dequantized by the caller's descale (not applied here)
      const uint8_t* p = static_cast<const uint8_t*>(t.data) + off;
      for (int64_t i = 0; i < d; ++i)
        dst[i] = static_cast<Acc>(ir::e4m3_bits_to_float(p[i]));
      return;
    }
    default:
      break;
  }
  FJ_ASSERT(false, "unchecked tensor dtype");
}

struct Problem {
  int64_t B, Hq, Hkv, Sq, Skv, D, Dv, group;
};

Problem check_problem(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                      const BlockMask* bm) {
  const QkvShape s = check_cpu_qkv("CPU attention", q, k, v);
  Problem p{s.batch,     s.heads_q,     s.heads_kv,   s.seqlen_q,
            s.seqlen_kv, s.head_dim_qk, s.head_dim_v, s.heads_q / s.heads_kv};
  if (bm != nullptr) {
    bm->validate();
    if (bm->seqlen_q != p.Sq || bm->seqlen_kv != p.Skv || (bm->batch != 1 && bm->batch != p.B) ||
        (bm->heads != 1 && bm->heads != p.Hq)) {
      throw RuntimeError(fmt::format(
          "CPU attention: block mask for [{}, {}, {}, {}] does not fit B={} Hq={} Sq={} Skv={}",
          bm->batch, bm->heads, bm->seqlen_q, bm->seqlen_kv, p.B, p.Hq, p.Sq, p.Skv));
    }
  }
  return p;
}

// One work item's state and scratch, reused across items run by the same thread.
template <typename Acc>
struct Scratch {
  std::vector<Acc> q, kt, v, s, acc, m, l;
  std::vector<Acc> krow;      // one K row before its transposition into kt
  std::vector<float> s32;     // f64 mode: scores rounded for the score_mod
  std::vector<uint8_t> keep;  // f64 mode: mask_mod results
};

template <typename Acc>
void run_forward(const Mods& mods, const ModBindings& bindings, const TensorRef& q,
                 const TensorRef& k, const TensorRef& v, Acc* out, Acc* lse,
                 const CpuForwardOptions& options) {
  const BlockMask* bm = options.block_mask;
  const Problem p = check_problem(q, k, v, bm);
  // Bindings are checked even when nothing runs, so a mistake shows on the first call.
  const runtime::CallExtents extents{p.B, p.Hq, p.Hkv, p.Sq, p.Skv};
  const runtime::BoundModArgs bound =
      runtime::bind_mod_args(mods, bindings, TensorRef::Device::CPU, 0, nullptr, &extents);
  const int64_t rows_total = p.B * p.Hq * p.Sq;
  if (rows_total == 0) return;
  std::fill(out, out + rows_total * p.Dv, Acc(0));
  std::fill(lse, lse + rows_total, -std::numeric_limits<Acc>::infinity());
  // The attention sink per row (empty without a sink_mod): a row without keys gets lse = sink.
  const std::vector<float> sinks = evaluate_sinks(mods, bound, p.B, p.Hq, p.Sq);
  if (!sinks.empty()) std::copy(sinks.begin(), sinks.end(), lse);
  if (p.Skv == 0) return;

  const llvmjit::CpuModFunctions fns = llvmjit::compile_cpu_mods(mods);
  const std::vector<uint64_t> params = llvmjit::pack_cpu_mod_params(mods, bound);
  const Acc scale = options.scale ? static_cast<Acc>(*options.scale)
                                  : Acc(1) / std::sqrt(static_cast<Acc>(std::max<int64_t>(p.D, 1)));
  const int64_t q_tile = bm != nullptr ? bm->q_block_size : kQTile;
  const int64_t nq = (p.Sq + q_tile - 1) / q_tile;
  const int64_t D = p.D, Dv = p.Dv;
  const int threads = resolve_threads(options.num_threads);
#if FJ_HAVE_AVX2_PATH
  const bool wide = options.allow_avx2 && use_avx2();
#else
  const bool wide = false;
#endif
  std::vector<Scratch<Acc>> scratch(static_cast<size_t>(threads));

  auto item = [&](int64_t idx, Scratch<Acc>& sc) {
    const int64_t qb = idx % nq;
    const int64_t bh = idx / nq;
    const int64_t b = bh / p.Hq, h = bh % p.Hq, hk = h / p.group;
    const int64_t r0 = qb * q_tile;
    const int64_t nr = std::min(q_tile, p.Sq - r0);
    sc.q.resize(static_cast<size_t>(nr * D));
    sc.kt.assign(static_cast<size_t>(D * kKvTile), Acc(0));
    sc.krow.resize(static_cast<size_t>(D));
    sc.v.resize(static_cast<size_t>(kKvTile * Dv));
    sc.s.resize(static_cast<size_t>(nr * kKvTile));
    sc.acc.assign(static_cast<size_t>(nr * Dv), Acc(0));
    sc.m.assign(static_cast<size_t>(nr), -std::numeric_limits<Acc>::infinity());
    sc.l.assign(static_cast<size_t>(nr), Acc(0));
    sc.s32.resize(kKvTile);
    sc.keep.resize(kKvTile);
    for (int64_t r = 0; r < nr; ++r)
      load_row(q, b, h, r0 + r, sc.q.data() + r * D);

    // One kv chunk [c0, c0 + n) with or without the mask_mod.
    auto chunk = [&](int64_t c0, int n, bool masked) {
      Acc* kt = sc.kt.data();
      for (int j = 0; j < n; ++j) {
        load_row(k, b, hk, c0 + j, sc.krow.data());
        for (int64_t d = 0; d < D; ++d)
          kt[d * kKvTile + j] = sc.krow[static_cast<size_t>(d)];
        load_row(v, b, hk, c0 + j, sc.v.data() + j * Dv);
      }
      for (int j = n; j < kKvTile; ++j) {
        for (int64_t d = 0; d < D; ++d)
          kt[d * kKvTile + j] = Acc(0);
      }
      qk_tile_any(wide, sc.q.data(), D, nr, kt, scale, sc.s.data());
      const auto bi = static_cast<int32_t>(b), hi = static_cast<int32_t>(h),
                 kv0 = static_cast<int32_t>(c0);
      for (int64_t r = 0; r < nr; ++r) {
        Acc* s = sc.s.data() + r * kKvTile;
        const auto qi = static_cast<int32_t>(r0 + r);
        if constexpr (std::is_same_v<Acc, float>) {
          if (masked && fns.has_mask_mod) {
            fns.score_row(params.data(), s, bi, hi, qi, kv0, n);
          } else if (fns.has_score_mod) {
            fns.score_row_nomask(params.data(), s, bi, hi, qi, kv0, n);
          }
        } else {
          if (fns.has_score_mod) {
            for (int j = 0; j < n; ++j)
              sc.s32[j] = static_cast<float>(s[j]);
            fns.score_row_nomask(params.data(), sc.s32.data(), bi, hi, qi, kv0, n);
            for (int j = 0; j < n; ++j)
              s[j] = sc.s32[j];
          }
          if (masked && fns.has_mask_mod) {
            fns.mask_row(params.data(), sc.keep.data(), bi, hi, qi, kv0, n);
            for (int j = 0; j < n; ++j)
              s[j] = sc.keep[j] ? s[j] : -std::numeric_limits<Acc>::infinity();
          }
        }
        // Online softmax update of row r. NaN in, NaN out (as PyTorch's softmax): a NaN score
        // makes exp(s - m), so the row's sum and output, NaN; the maximum skips it, so a row
        // whose other scores are all masked so far takes a NaN maximum instead of skipping.
        Acc mx = -std::numeric_limits<Acc>::infinity();
        for (int j = 0; j < n; ++j)
          mx = s[j] > mx ? s[j] : mx;
        const Acc m_old = sc.m[static_cast<size_t>(r)];
        Acc m_new = mx > m_old ? mx : m_old;
        if (m_new == -std::numeric_limits<Acc>::infinity()) {
          bool nan = false;
          for (int j = 0; j < n; ++j)
            nan = nan || s[j] != s[j];
          if (!nan) continue;  // all masked so far
          m_new = std::numeric_limits<Acc>::quiet_NaN();
        }
        const Acc alpha = exp_nonpositive(m_old - m_new);
        const Acc sum = exp_row_any(wide, s, n, m_new);
        sc.m[static_cast<size_t>(r)] = m_new;
        sc.l[static_cast<size_t>(r)] = sc.l[static_cast<size_t>(r)] * alpha + sum;
        pv_row_any(wide, s, n, sc.v.data(), Dv, alpha, sc.acc.data() + r * Dv);
      }
    };

    auto block = [&](int64_t kb, int64_t block_size, bool masked) {
      const int64_t start = kb * block_size;
      const int64_t end = std::min(p.Skv, start + block_size);
      for (int64_t c0 = start; c0 < end; c0 += kKvTile)
        chunk(c0, static_cast<int>(std::min<int64_t>(kKvTile, end - c0)), masked);
    };
    if (bm == nullptr) {
      block(0, p.Skv, true);
    } else {
      const int64_t row = ((b % bm->batch) * bm->heads + h % bm->heads) * bm->num_q_blocks + qb;
      const int64_t base = row * bm->num_kv_blocks;
      // Partial and full tiles merged in ascending kv order.
      int32_t ip = 0, jf = 0;
      const int32_t np = bm->kv_num_blocks[static_cast<size_t>(row)];
      const int32_t nf = bm->full_kv_num_blocks[static_cast<size_t>(row)];
      while (ip < np || jf < nf) {
        const int32_t kp = ip < np ? bm->kv_indices[static_cast<size_t>(base + ip)]
                                   : std::numeric_limits<int32_t>::max();
        const int32_t kf = jf < nf ? bm->full_kv_indices[static_cast<size_t>(base + jf)]
                                   : std::numeric_limits<int32_t>::max();
        if (kp < kf) {
          block(kp, bm->kv_block_size, true);
          ++ip;
        } else {
          block(kf, bm->kv_block_size, false);
          ++jf;
        }
      }
    }
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t o = (b * p.Hq + h) * p.Sq + r0 + r;
      const Acc l = sc.l[static_cast<size_t>(r)];
      // Fully masked: out 0, lse -inf or the sink (already written); NaN goes on.
      if (l == Acc(0)) continue;
      const Acc* a = sc.acc.data() + r * Dv;
      if (!sinks.empty()) {
        const Acc f = fold_sink<Acc>(sc.m[static_cast<size_t>(r)], l,
                                     static_cast<Acc>(sinks[static_cast<size_t>(o)]), lse[o]);
        for (int64_t d = 0; d < Dv; ++d)
          out[o * Dv + d] = a[d] * f;
        continue;
      }
      for (int64_t d = 0; d < Dv; ++d)
        out[o * Dv + d] = a[d] / l;
      lse[o] = sc.m[static_cast<size_t>(r)] + std::log(l);
    }
  };

  parallel_for(p.B * p.Hq * nq, threads,
               [&](int64_t idx, int worker) { item(idx, scratch[static_cast<size_t>(worker)]); });
}

}  // namespace

QkvShape check_cpu_qkv(const char* who, const TensorRef& q, const TensorRef& k,
                       const TensorRef& v) {
  const QkvShape s = validate_qkv(q, k, v);
  if (q.device != TensorRef::Device::CPU) {
    throw RuntimeError(fmt::format("{}: q, k and v are on {}; the CPU backend needs CPU tensors",
                                   who, to_string(q.device, q.device_index)));
  }
  constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();
  if (s.batch > kMaxIndex || s.heads_q > kMaxIndex || s.seqlen_q > kMaxIndex ||
      s.seqlen_kv > kMaxIndex) {
    throw RuntimeError(fmt::format(
        "{}: B={} Hq={} Sq={} Skv={}: every one must fit the mods' i32 indices (< 2^31)", who,
        s.batch, s.heads_q, s.seqlen_q, s.seqlen_kv));
  }
  if (!checked_product({s.batch, s.heads_q, s.seqlen_q, s.head_dim_v})) {
    throw RuntimeError(fmt::format("{}: the output [{}, {}, {}, {}] has more than 2^63 elements",
                                   who, s.batch, s.heads_q, s.seqlen_q, s.head_dim_v));
  }
  return s;
}

void cpu_attention_forward(const Mods& mods, const ModBindings& bindings, const TensorRef& q,
                           const TensorRef& k, const TensorRef& v, float* out, float* lse,
                           const CpuForwardOptions& options) {
  run_forward<float>(mods, bindings, q, k, v, out, lse, options);
}

void cpu_attention_forward_f64(const Mods& mods, const ModBindings& bindings, const TensorRef& q,
                               const TensorRef& k, const TensorRef& v, double* out, double* lse,
                               const CpuForwardOptions& options) {
  run_forward<double>(mods, bindings, q, k, v, out, lse, options);
}

}  // namespace flexjit::cpu
