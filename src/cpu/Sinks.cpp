#include "cpu/Sinks.h"

#include "ir/Evaluate.h"
#include "passes/Autodiff.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flexjit::cpu {

std::vector<float> evaluate_sinks(const Mods& mods, const runtime::BoundModArgs& bound, int64_t B,
                                  int64_t Hq, int64_t Sq) {
  std::vector<float> sinks;
  if (!mods.sink_mod.defined()) return sinks;
  sinks.resize(static_cast<size_t>(B * Hq * Sq));
  ir::Evaluator eval(mods.sink_mod);
  ir::EvalEnv env = runtime::eval_env_of(mods, bound);
  size_t row = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      for (int64_t q = 0; q < Sq; ++q) {
        env.b = static_cast<int32_t>(b);
        env.h = static_cast<int32_t>(h);
        env.q_idx = static_cast<int32_t>(q);
        sinks[row++] = eval.run(env).f;
      }
    }
  }
  return sinks;
}

template <typename T>
T fold_sink(T m, T l, T sink, T& lse) {
  if (l == T(0)) {
    lse = sink;
    return T(0);
  }
  const T keys = m + std::log(l);
  const T top = std::max(keys, sink);
  lse = top == -std::numeric_limits<T>::infinity()
            ? top
            : top + std::log(std::exp(keys - top) + std::exp(sink - top));
  return std::exp(m - lse);
}

template <typename T>
void add_sink_grads(const Mods& mods, const runtime::BoundModArgs& bound, int64_t B, int64_t Hq,
                    int64_t Sq, const std::vector<T>& g, std::vector<std::vector<T>>& grads) {
  if (!mods.sink_mod.defined()) return;
  struct Site {
    size_t buffer;
    ir::Evaluator reached, derivative;
    std::vector<ir::Evaluator> indices;
  };
  std::vector<Site> sites;
  for (const passes::BufferGrad& bg : passes::buffer_grads(mods.sink_mod)) {
    for (size_t i = 0; i < mods.buffers.size(); ++i) {
      if (mods.buffers[i].name() != bg.buffer->name || grads[i].empty() ||
          bound.buffers[i]->numel() == 0) {
        continue;
      }
      Site s{i, ir::Evaluator(bg.reached), ir::Evaluator(bg.derivative), {}};
      for (const Expr& e : bg.indices)
        s.indices.emplace_back(e);
      sites.push_back(std::move(s));
    }
  }
  if (sites.empty()) return;
  ir::EvalEnv env = runtime::eval_env_of(mods, bound);
  size_t row = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      for (int64_t q = 0; q < Sq; ++q, ++row) {
        const T gr = g[row];
        if (gr == T(0)) continue;
        env.b = static_cast<int32_t>(b);
        env.h = static_cast<int32_t>(h);
        env.q_idx = static_cast<int32_t>(q);
        for (Site& s : sites) {
          if (!s.reached.run(env).as_bool()) continue;
          const std::vector<int64_t>& shape = bound.buffers[s.buffer]->shape;
          int64_t offset = 0;
          for (size_t d = 0; d < s.indices.size(); ++d) {
            const int64_t i = s.indices[d].run(env).i;
            offset = offset * shape[d] + std::clamp<int64_t>(i, 0, shape[d] - 1);
          }
          grads[s.buffer][static_cast<size_t>(offset)] +=
              gr * static_cast<T>(s.derivative.run(env).f);
        }
      }
    }
  }
}

template float fold_sink<float>(float, float, float, float&);
template double fold_sink<double>(double, double, double, double&);
template void add_sink_grads<float>(const Mods&, const runtime::BoundModArgs&, int64_t, int64_t,
                                    int64_t, const std::vector<float>&,
                                    std::vector<std::vector<float>>&);
template void add_sink_grads<double>(const Mods&, const runtime::BoundModArgs&, int64_t, int64_t,
                                     int64_t, const std::vector<double>&,
                                     std::vector<std::vector<double>>&);

}  // namespace flexjit::cpu
