// A CPU reference of flex_attention in float64 (mods in the language's f32 semantics through
// the interpreter), for tests at small shapes. Semantics match the GPU kernels: score =
// score_mod(scale * q·k), mask_mod false -> -inf, softmax, · V; a fully masked row gives output 0
// and LSE -inf; LSE is natural-log.
#pragma once

#include <flexjit/mods.h>

#include "ir/Evaluate.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace flexjit::test {

struct AttentionShape {
  int batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1, seqlen_kv = 1;
  int head_dim_qk = 64, head_dim_v = 64;
};

struct ReferenceResult {
  std::vector<double> out;  // [B, Hq, Sq, Dv]
  std::vector<double> lse;  // [B, Hq, Sq]
};

// ||got - want|| / ||want|| (Frobenius; ||got - want|| when want is all zeros).
inline double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// q [B, Hq, Sq, Dqk], k [B, Hkv, Skv, Dqk], v [B, Hkv, Skv, Dv], all contiguous.
ReferenceResult reference_attention(const Mods& mods, const AttentionShape& s,
                                    const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, float scale,
                                    const ir::EvalEnv& bindings);

}  // namespace flexjit::test
