#include "cp/LseMerge.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flexjit::cp {

void merge_partial(float* acc_out, float* acc_lse, const float* part_out, const float* part_lse,
                   int64_t rows, int64_t dv) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const float la = acc_lse[r], lb = part_lse[r];
    float* a = acc_out + r * dv;
    const float* b = part_out + r * dv;
    if (std::isnan(la) || std::isnan(lb)) {
      acc_lse[r] = std::numeric_limits<float>::quiet_NaN();
      std::fill(a, a + dv, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const float m = std::max(la, lb);
    if (m == kNegInf) continue;  // neither saw a key: out 0, lse -inf
    const float wa = std::exp(la - m), wb = std::exp(lb - m);
    const float sum = wa + wb;
    for (int64_t d = 0; d < dv; ++d)
      a[d] = (wa * a[d] + wb * b[d]) / sum;
    acc_lse[r] = m + std::log(sum);
  }
}

}  // namespace flexjit::cp
