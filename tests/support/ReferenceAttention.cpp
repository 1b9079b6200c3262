#include "support/ReferenceAttention.h"

#include <cmath>
#include <limits>
#include <optional>

namespace flexjit::test {

ReferenceResult reference_attention(const Mods& mods, const AttentionShape& s,
                                    const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, float scale,
                                    const ir::EvalEnv& bindings) {
  ReferenceResult r;
  r.out.assign(static_cast<size_t>(s.batch) * s.heads_q * s.seqlen_q * s.head_dim_v, 0.0);
  r.lse.assign(static_cast<size_t>(s.batch) * s.heads_q * s.seqlen_q,
               -std::numeric_limits<double>::infinity());
  std::optional<ir::Evaluator> score_eval, mask_eval;
  if (mods.score_mod.defined()) score_eval.emplace(mods.score_mod);
  if (mods.mask_mod.defined()) mask_eval.emplace(mods.mask_mod);
  ir::EvalEnv env = bindings;
  const int ratio = s.heads_q / s.heads_kv;
  std::vector<double> scores(s.seqlen_kv);
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.heads_q; ++h) {
      const int hk = h / ratio;
      for (int i = 0; i < s.seqlen_q; ++i) {
        const float* qrow =
            &q[((static_cast<size_t>(b) * s.heads_q + h) * s.seqlen_q + i) * s.head_dim_qk];
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < s.seqlen_kv; ++j) {
          const float* krow =
              &k[((static_cast<size_t>(b) * s.heads_kv + hk) * s.seqlen_kv + j) * s.head_dim_qk];
          double dot = 0;
          for (int d = 0; d < s.head_dim_qk; ++d)
            dot += static_cast<double>(qrow[d]) * krow[d];
          env.b = b;
          env.h = h;
          env.q_idx = i;
          env.kv_idx = j;
          env.score = static_cast<float>(scale * dot);
          double sc = score_eval ? score_eval->run(env).f : scale * dot;
          if (mask_eval && !mask_eval->run(env).as_bool()) {
            sc = -std::numeric_limits<double>::infinity();
          }
          scores[j] = sc;
          mx = std::max(mx, sc);
        }
        if (std::isinf(mx) && mx < 0) continue;  // fully masked: out 0, lse -inf
        double sum = 0;
        for (int j = 0; j < s.seqlen_kv; ++j) {
          scores[j] = std::exp(scores[j] - mx);
          sum += scores[j];
        }
        double* orow =
            &r.out[((static_cast<size_t>(b) * s.heads_q + h) * s.seqlen_q + i) * s.head_dim_v];
        for (int j = 0; j < s.seqlen_kv; ++j) {
          const float* vrow =
              &v[((static_cast<size_t>(b) * s.heads_kv + hk) * s.seqlen_kv + j) * s.head_dim_v];
          double p = scores[j] / sum;
          for (int d = 0; d < s.head_dim_v; ++d)
            orow[d] += p * vrow[d];
        }
        r.lse[(static_cast<size_t>(b) * s.heads_q + h) * s.seqlen_q + i] = mx + std::log(sum);
      }
    }
  }
  return r;
}

}  // namespace flexjit::test
