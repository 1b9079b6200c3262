// Merging partial attention results by their logsumexp, on the host (the GPU's merge is the
// cp_merge kernel family: cp/MergeKernel.h, templates/cp_merge.cuh, the same arithmetic).
//
// Two results of one query row over disjoint key sets A and B, each normalized over its own
// keys — out_A with lse_A = log sum_A exp(s), out_B with lse_B — combine into the result over
// A ∪ B:
//
//     m   = max(lse_A, lse_B)
//     w_A = exp(lse_A - m),  w_B = exp(lse_B - m)
//     out = (w_A out_A + w_B out_B) / (w_A + w_B)
//     lse = m + log(w_A + w_B)
//
// A row that saw no key (every key masked) has lse -inf and out 0, as the forward writes it: it
// weighs 0, and two such rows merge into out 0, lse -inf. A NaN lse makes the row NaN.
#pragma once

#include <cstdint>

namespace flexjit::cp {

// acc_out [rows, dv] and acc_lse [rows] (contiguous f32) become the merge of themselves with
// part_out [rows, dv] and part_lse [rows]. Start from acc_out 0 and acc_lse -inf (nothing seen).
void merge_partial(float* acc_out, float* acc_lse, const float* part_out, const float* part_lse,
                   int64_t rows, int64_t dv);

}  // namespace flexjit::cp
