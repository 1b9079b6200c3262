// The attention sink (the sink_mod, docs/attention.md) on the CPU: its value per row and the
// gradient it sends into its captured float buffers. The sink_mod is evaluated once per row
// (b, h, q_idx) by the interpreter (ir/Evaluate.h) in its f32 semantics; the per-row work is
// small beside a row's softmax over the keys.
#pragma once

#include <flexjit/mods.h>

#include "binding/ModArgs.h"

#include <cstdint>
#include <vector>

namespace flexjit::cpu {

// sink_mod(b, h, q) for every row of a [B, Hq, Sq] problem, row-major ((b * Hq + h) * Sq + q);
// empty when the mods have no sink_mod.
std::vector<float> evaluate_sinks(const Mods& mods, const runtime::BoundModArgs& bound, int64_t B,
                                  int64_t Hq, int64_t Sq);

// Folds a row's sink into its softmax: m is the row's max score (natural log units, -inf
// without a key), l = sum_j exp(s_j - m) over its keys. Returns the factor that turns the
// row's unnormalized accumulator sum_j exp(s_j - m) v_j into its output, exp(m - lse') (0 for
// a row without keys), and sets lse to lse' = logaddexp(m + log l, sink) (the sink for a row
// without keys).
template <typename T>
T fold_sink(T m, T l, T sink, T& lse);

// Adds g[row] * d sink_mod / d buffer[idx] into grads[i] for every float buffer i that the
// sink_mod loads (indices clamped into the bound extents, as the GPU kernels do; row-major
// over the bound buffer's shape). g: d loss / d sink per row of the [B, Hq, Sq] problem.
// grads has one entry per mods.buffers, each empty or sized to its buffer.
template <typename T>
void add_sink_grads(const Mods& mods, const runtime::BoundModArgs& bound, int64_t B, int64_t Hq,
                    int64_t Sq, const std::vector<T>& g, std::vector<std::vector<T>>& grads);

}  // namespace flexjit::cpu
