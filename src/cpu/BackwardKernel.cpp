#include "cpu/BackwardKernel.h"

#include "binding/ModArgs.h"
#include "codegen/llvm/BackwardCodegen.h"
#include "codegen/llvm/CpuModParams.h"
#include "codegen/llvm/LlvmCodegen.h"
#include "cpu/ParallelFor.h"
#include "cpu/Sinks.h"
#include "ir/Evaluate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>
#include <type_traits>

namespace flexjit::cpu {

namespace {

template <typename T>
void load_row(const TensorRef& t, int64_t b, int64_t h, int64_t s, T* dst) {
  const int64_t d = t.shape[3];
  const int64_t off = b * t.strides[0] + h * t.strides[1] + s * t.strides[2];
  for (int64_t i = 0; i < d; ++i) {
    switch (t.dtype) {
      case DType::F32:
        dst[i] = static_cast<T>(static_cast<const float*>(t.data)[off + i]);
        break;
      case DType::F16:
        dst[i] =
            static_cast<T>(ir::f16_bits_to_float(static_cast<const uint16_t*>(t.data)[off + i]));
        break;
      case DType::BF16:
        dst[i] =
            static_cast<T>(ir::bf16_bits_to_float(static_cast<const uint16_t*>(t.data)[off + i]));
        break;
      default:
        FJ_ASSERT(false, "unchecked tensor dtype");
    }
  }
}

std::string shape_of(const TensorRef& t) {
  return fmt::format("[{}]", fmt::join(t.shape, ", "));
}

bool is_float(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

template <typename T>
CpuGradients<T> run_backward(const Mods& mods, const ModBindings& bindings, const TensorRef& q,
                             const TensorRef& k, const TensorRef& v, const T* out, const T* lse,
                             const TensorRef& dout, const CpuBackwardOptions& options) {
  const QkvShape s = check_cpu_qkv("CPU attention backward", q, k, v);
  const int64_t B = s.batch, Hq = s.heads_q, Sq = s.seqlen_q, D = s.head_dim_qk;
  const int64_t Hkv = s.heads_kv, Skv = s.seqlen_kv, Dv = s.head_dim_v;
  if (dout.shape != std::vector<int64_t>{B, Hq, Sq, Dv}) {
    throw RuntimeError(fmt::format("CPU attention backward: dout is {}; expected [{}, {}, {}, {}]",
                                   shape_of(dout), B, Hq, Sq, Dv));
  }
  if (dout.dtype != q.dtype || dout.device != TensorRef::Device::CPU || dout.strides.size() != 4 ||
      !dout.is_last_dim_contiguous() || (dout.data == nullptr && dout.numel() > 0)) {
    throw RuntimeError(fmt::format(
        "CPU attention backward: dout is {}; expected {} on cpu with the last dim contiguous",
        dout.str(), to_string(q.dtype)));
  }
  const int64_t group = Hq / Hkv;
  const int64_t rows = B * Hq * Sq;
  if (rows > 0 && (out == nullptr || lse == nullptr)) {
    throw RuntimeError("CPU attention backward: out / lse is a null pointer");
  }

  mods.check();
  const runtime::CallExtents extents{B, Hq, Hkv, Sq, Skv};
  const runtime::BoundModArgs bound =
      runtime::bind_mod_args(mods, bindings, TensorRef::Device::CPU, 0, nullptr, &extents);
  const std::vector<uint64_t> params = llvmjit::pack_cpu_mod_params(mods, bound);
  const llvmjit::CpuModFunctions fns = llvmjit::compile_cpu_mods(mods);
  const llvmjit::CpuBackwardFunctions bw = llvmjit::compile_cpu_backward(mods);
  const llvmjit::CpuModParamLayout layout = llvmjit::cpu_layout_of(mods);

  CpuGradients<T> g;
  g.dq.assign(static_cast<size_t>(rows * D), T(0));
  g.dk.assign(static_cast<size_t>(B * Hkv * Skv * D), T(0));
  g.dv.assign(static_cast<size_t>(B * Hkv * Skv * Dv), T(0));
  // Gradient buffers: sized by the packed extents (an empty binding packs as one element).
  std::vector<int64_t> grad_size(mods.buffers.size(), 0);
  for (size_t bi = 0; bi < mods.buffers.size(); ++bi) {
    if (!is_float(mods.buffers[bi].dtype())) continue;
    int64_t n = 1;
    for (int d = 0; d < mods.buffers[bi].rank(); ++d)
      n *= static_cast<int64_t>(params[layout.buffer_slot[bi] + 1 + d]);
    grad_size[bi] = n;
  }

  const double scale_d = options.scale.value_or(D > 0 ? 1.0 / std::sqrt(double(D)) : 1.0);
  const T scale = static_cast<T>(scale_d);
  const int threads = resolve_threads(options.num_threads);
  std::vector<std::vector<std::vector<T>>> tgrad(static_cast<size_t>(threads),
                                                 std::vector<std::vector<T>>(mods.buffers.size()));

  if (rows > 0 && Skv > 0) {
    parallel_for(B * Hkv, threads, [&](int64_t item, int worker) {
      const int64_t b = item / Hkv, gk = item % Hkv;
      std::vector<T> kk(Skv * D), vv(Skv * Dv), qr(D), dor(Dv), p(Skv), dsp(Skv), ds(Skv), dqr(D);
      std::vector<float> pre(Skv), sp(Skv), f(Skv);
      std::vector<uint8_t> keep(Skv);
      for (int64_t j = 0; j < Skv; ++j) {
        load_row(k, b, gk, j, kk.data() + j * D);
        load_row(v, b, gk, j, vv.data() + j * Dv);
      }
      auto& my_grads = tgrad[worker];
      for (const auto& bg : bw.buffers) {
        if (my_grads[bg.buffer].empty()) my_grads[bg.buffer].assign(grad_size[bg.buffer], T(0));
      }
      T* dk = g.dk.data() + (b * Hkv + gk) * Skv * D;
      T* dv = g.dv.data() + (b * Hkv + gk) * Skv * Dv;
      for (int64_t h = gk * group; h < (gk + 1) * group; ++h) {
        for (int64_t i = 0; i < Sq; ++i) {
          const int64_t row = (b * Hq + h) * Sq + i;
          const T L = lse[row];
          if (L == -std::numeric_limits<T>::infinity()) continue;  // fully masked; NaN goes on
          load_row(q, b, h, i, qr.data());
          load_row(dout, b, h, i, dor.data());
          const T* o = out + row * Dv;
          T Di = 0;
          for (int64_t d = 0; d < Dv; ++d)
            Di += dor[d] * o[d];
          if (options.dlse != nullptr) Di -= static_cast<T>(options.dlse[row]);
          const auto bi = static_cast<int32_t>(b), hi = static_cast<int32_t>(h),
                     qi = static_cast<int32_t>(i), n = static_cast<int32_t>(Skv);
          // Recompute the scores exactly as the forward does.
          for (int64_t j = 0; j < Skv; ++j) {
            T acc = 0;
            for (int64_t d = 0; d < D; ++d)
              acc += qr[d] * kk[j * D + d];
            const T raw = acc * scale;
            p[j] = raw;
            pre[j] = static_cast<float>(raw);
          }
          if constexpr (std::is_same_v<T, float>) {
            for (int64_t j = 0; j < Skv; ++j)
              sp[j] = pre[j];
            if (fns.has_mask_mod) {
              fns.score_row(params.data(), sp.data(), bi, hi, qi, 0, n);
            } else if (fns.has_score_mod) {
              fns.score_row_nomask(params.data(), sp.data(), bi, hi, qi, 0, n);
            }
            for (int64_t j = 0; j < Skv; ++j)
              p[j] = sp[j];
          } else {
            if (fns.has_score_mod) {
              for (int64_t j = 0; j < Skv; ++j)
                sp[j] = pre[j];
              fns.score_row_nomask(params.data(), sp.data(), bi, hi, qi, 0, n);
              for (int64_t j = 0; j < Skv; ++j)
                p[j] = sp[j];
            }
            if (fns.has_mask_mod) {
              fns.mask_row(params.data(), keep.data(), bi, hi, qi, 0, n);
              for (int64_t j = 0; j < Skv; ++j)
                if (!keep[j]) p[j] = -std::numeric_limits<T>::infinity();
            }
          }
          for (int64_t j = 0; j < Skv; ++j) {
            const T pj = std::exp(p[j] - L);
            p[j] = pj;
            T dp = 0;
            for (int64_t d = 0; d < Dv; ++d)
              dp += dor[d] * vv[j * Dv + d];
            dsp[j] = pj == T(0) ? T(0) : pj * (dp - Di);
          }
          // dS = dS' * d score_mod / d score, zero where P is (masked or underflowed).
          if (bw.dscore_row != nullptr) {
            for (int64_t j = 0; j < Skv; ++j)
              f[j] = std::is_same_v<T, float> ? static_cast<float>(dsp[j]) : 1.0f;
            bw.dscore_row(params.data(), f.data(), pre.data(), bi, hi, qi, 0, n);
            for (int64_t j = 0; j < Skv; ++j) {
              if constexpr (std::is_same_v<T, float>) {
                ds[j] = dsp[j] == T(0) ? T(0) : f[j];
              } else {
                ds[j] = dsp[j] == T(0) ? T(0) : dsp[j] * static_cast<T>(f[j]);
              }
            }
          } else {
            ds = dsp;
          }
          for (const auto& bg : bw.buffers) {
            if constexpr (std::is_same_v<T, float>) {
              bg.f32(params.data(), my_grads[bg.buffer].data(), dsp.data(), pre.data(), bi, hi, qi,
                     0, n);
            } else {
              bg.f64(params.data(), my_grads[bg.buffer].data(), dsp.data(), pre.data(), bi, hi, qi,
                     0, n);
            }
          }
          std::fill(dqr.begin(), dqr.end(), T(0));
          for (int64_t j = 0; j < Skv; ++j) {
            const T dsj = ds[j] * scale;
            if (dsj != T(0)) {
              for (int64_t d = 0; d < D; ++d) {
                dqr[d] += dsj * kk[j * D + d];
                dk[j * D + d] += dsj * qr[d];
              }
            }
            const T pj = p[j];
            if (pj != T(0)) {
              for (int64_t d = 0; d < Dv; ++d)
                dv[j * Dv + d] += pj * dor[d];
            }
          }
          std::copy(dqr.begin(), dqr.end(), g.dq.begin() + row * D);
        }
      }
    });
  }

  // The sink's gradient (docs/backward.md): d loss / d sink = -exp(sink - lse) * delta per row,
  // with lse including the sink and delta = rowsum(dO * O) - dlse, into the sink_mod's buffers.
  if (mods.sink_mod.defined() && rows > 0) {
    const std::vector<float> sinks = evaluate_sinks(mods, bound, B, Hq, Sq);
    std::vector<T> g_rows(static_cast<size_t>(rows), T(0));
    std::vector<T> dor(static_cast<size_t>(Dv));
    for (int64_t row = 0; row < rows; ++row) {
      const T sink = static_cast<T>(sinks[static_cast<size_t>(row)]);
      if (sink == -std::numeric_limits<T>::infinity()) continue;
      const int64_t b = row / (Hq * Sq), h = row / Sq % Hq, i = row % Sq;
      load_row(dout, b, h, i, dor.data());
      T Di = 0;
      for (int64_t d = 0; d < Dv; ++d)
        Di += dor[static_cast<size_t>(d)] * out[row * Dv + d];
      if (options.dlse != nullptr) Di -= static_cast<T>(options.dlse[row]);
      g_rows[static_cast<size_t>(row)] = -std::exp(sink - lse[row]) * Di;
    }
    std::vector<std::vector<T>> sink_grads(mods.buffers.size());
    for (size_t bi = 0; bi < mods.buffers.size(); ++bi) {
      if (is_float(mods.buffers[bi].dtype())) sink_grads[bi].assign(grad_size[bi], T(0));
    }
    add_sink_grads<T>(mods, bound, B, Hq, Sq, g_rows, sink_grads);
    tgrad.push_back(std::move(sink_grads));
  }

  for (size_t bi = 0; bi < mods.buffers.size(); ++bi) {
    if (!is_float(mods.buffers[bi].dtype())) continue;
    const std::string& name = mods.buffers[bi].name();
    std::vector<T> sum(static_cast<size_t>(grad_size[bi]), T(0));
    for (const auto& t : tgrad) {
      if (t[bi].empty()) continue;
      for (size_t e = 0; e < sum.size(); ++e)
        sum[e] += t[bi][e];
    }
    // An empty binding was packed as one element: its gradient is empty.
    if (bound.buffers[bi]->numel() == 0) sum.clear();
    g.buffers[name] = std::move(sum);
  }
  return g;
}

}  // namespace

CpuGradients<float> cpu_attention_backward(const Mods& mods, const ModBindings& bindings,
                                           const TensorRef& q, const TensorRef& k,
                                           const TensorRef& v, const float* out, const float* lse,
                                           const TensorRef& dout,
                                           const CpuBackwardOptions& options) {
  return run_backward<float>(mods, bindings, q, k, v, out, lse, dout, options);
}

CpuGradients<double> cpu_attention_backward_f64(const Mods& mods, const ModBindings& bindings,
                                                const TensorRef& q, const TensorRef& k,
                                                const TensorRef& v, const double* out,
                                                const double* lse, const TensorRef& dout,
                                                const CpuBackwardOptions& options) {
  return run_backward<double>(mods, bindings, q, k, v, out, lse, dout, options);
}

}  // namespace flexjit::cpu
