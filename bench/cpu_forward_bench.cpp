// Times the CPU forward (LLVM-JIT'ed mods, src/cpu/ForwardKernel) for B=1 H=8 S=2048 D=64 with
// the causal and noop mods against a straightforward C++ loop of the same computation, written
// here and compiled with the same flags (-O3). Prints the median of several runs of each.
//
//   flexjit-cpu-bench [runs=5] [threads=0 (all cores)]
#include <flexjit/mods.h>

#include "codegen/llvm/LlvmCodegen.h"
#include "codegen/llvm/OrcJit.h"
#include "cpu/BackwardKernel.h"
#include "cpu/ForwardKernel.h"
#include "cpu/JitBlockMask.h"
#include "cpu/ParallelFor.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <vector>

using namespace flexjit;

namespace {

constexpr int kB = 1, kH = 8, kS = 2048, kD = 64;

// The straightforward loop: per query row, scores against every unmasked key, a max-subtracted
// softmax, and the weighted sum of values. Single-threaded.
void naive_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                   bool causal) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(kD));
  std::vector<float> s(kS);
  for (int bh = 0; bh < kB * kH; ++bh) {
    const float* qh = q + static_cast<size_t>(bh) * kS * kD;
    const float* kh = k + static_cast<size_t>(bh) * kS * kD;
    const float* vh = v + static_cast<size_t>(bh) * kS * kD;
    for (int i = 0; i < kS; ++i) {
      const int n = causal ? i + 1 : kS;
      float mx = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < n; ++j) {
        float dot = 0.0f;
        for (int d = 0; d < kD; ++d)
          dot += qh[i * kD + d] * kh[j * kD + d];
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      float* o = out + (static_cast<size_t>(bh) * kS + i) * kD;
      std::fill(o, o + kD, 0.0f);
      for (int j = 0; j < n; ++j)
        for (int d = 0; d < kD; ++d)
          o[d] += s[j] * vh[j * kD + d];
      for (int d = 0; d < kD; ++d)
        o[d] /= sum;
      lse[bh * kS + i] = mx + std::log(sum);
    }
  }
}

double median_ms(int runs, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int r = 0; r < runs; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, static_cast<double>(std::abs(a[i] - b[i])));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 5;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 0;
  const size_t n = static_cast<size_t>(kB) * kH * kS * kD;
  std::vector<float> q(n), k(n), v(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    q[i] = dist(rng);
    k[i] = dist(rng);
    v[i] = dist(rng);
  }
  auto qt = TensorRef::contiguous(q.data(), DType::F32, {kB, kH, kS, kD});
  auto kt = TensorRef::contiguous(k.data(), DType::F32, {kB, kH, kS, kD});
  auto vt = TensorRef::contiguous(v.data(), DType::F32, {kB, kH, kS, kD});
  const ModBindings env;
  const auto j0 = std::chrono::steady_clock::now();
  llvmjit::OrcJit::instance();  // one-time LLVM / LLJIT start-up, reported apart from mod compiles
  fmt::print(
      "JIT start-up {:.1f} ms\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - j0).count());
  fmt::print("CPU forward B={} H={} S={} D={} fp32, median of {} runs, threads={} ({} cores)\n", kB,
             kH, kS, kD, runs, cpu::resolve_threads(threads), cpu::resolve_threads(0));
  for (const char* name : {"causal", "noop"}) {
    const bool causal = std::string(name) == "causal";
    Mods mods = standard_mods(name);
    const auto c0 = std::chrono::steady_clock::now();
    const llvmjit::CpuModFunctions fns = llvmjit::compile_cpu_mods(mods);
    const double compile_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count();
    std::vector<float> out(n), lse(static_cast<size_t>(kB) * kH * kS), ref_out(n),
        ref_lse(lse.size());
    BlockMask bm;
    const double mask_ms = median_ms(runs, [&] {
      bm = cpu::cpu_create_block_mask(mods, env, 1, 1, kS, kS,
                                      cpu::CpuBlockMaskOptions{128, 128, threads});
    });
    cpu::CpuForwardOptions plain;
    plain.num_threads = threads;
    cpu::CpuForwardOptions sparse = plain;
    sparse.block_mask = &bm;
    cpu::CpuForwardOptions single = sparse;
    single.num_threads = 1;
    const double ms_plain = median_ms(runs, [&] {
      cpu::cpu_attention_forward(mods, env, qt, kt, vt, out.data(), lse.data(), plain);
    });
    const double ms_sparse = median_ms(runs, [&] {
      cpu::cpu_attention_forward(mods, env, qt, kt, vt, out.data(), lse.data(), sparse);
    });
    const double ms_single = median_ms(runs, [&] {
      cpu::cpu_attention_forward(mods, env, qt, kt, vt, out.data(), lse.data(), single);
    });
    const double ms_naive = median_ms(runs, [&] {
      naive_forward(q.data(), k.data(), v.data(), ref_out.data(), ref_lse.data(), causal);
    });
    fmt::print(
        "{:>7}: mods compile {:6.1f} ms | block mask {:6.2f} ms | flexjit {:8.1f} ms "
        "(block mask, {} threads) {:8.1f} ms (no block mask) {:8.1f} ms (block mask, 1 "
        "thread) | naive -O3 loop {:8.1f} ms (1 thread) | speedup {:.1f}x | max |diff| {:.2e}\n",
        name, compile_ms, mask_ms, ms_sparse, cpu::resolve_threads(threads), ms_plain, ms_single,
        ms_naive, ms_naive / ms_sparse, max_abs_diff(out, ref_out));
    // The backward (cpu/BackwardKernel.h; plain C++ loops, not yet tiled), one run: it is slow.
    std::vector<float> dout(n, 1.0f);
    auto dot = TensorRef::contiguous(dout.data(), DType::F32, {kB, kH, kS, kD});
    cpu::cpu_attention_forward(mods, env, qt, kt, vt, out.data(), lse.data(), sparse);
    const double ms_backward = median_ms(1, [&] {
      cpu::cpu_attention_backward(mods, env, qt, kt, vt, out.data(), lse.data(), dot,
                                  cpu::CpuBackwardOptions{std::nullopt, threads});
    });
    fmt::print("{:>7}: backward (dQ, dK, dV) {:8.1f} ms ({} threads)\n", name, ms_backward,
               cpu::resolve_threads(threads));
    (void)fns;
  }
  // LLVM compile time per mod (generation + O2 + codegen of the six functions), warm JIT.
  std::vector<double> compile;
  fmt::print("mod compile times (ms):");
  for (const std::string& name : standard_mod_names()) {
    const double ms = llvmjit::compile_cpu_mods(standard_mods(name)).module->compile_ms();
    compile.push_back(ms);
    fmt::print(" {} {:.1f}", name, ms);
  }
  std::sort(compile.begin(), compile.end());
  fmt::print("\nmedian {:.1f} ms, max {:.1f} ms\n", compile[compile.size() / 2], compile.back());
  return 0;
}
