// What every context-parallel call checks and views, on the CPU and on GPUs alike.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/tensor.h>

#include <cstdint>

namespace flexjit::cp {

// The options a context-parallel call cannot take, refused before anything runs: a block mask
// (RuntimeError: the pairs get their own, built from the mods), a KV cache (RuntimeError), a
// sink_mod (UnsupportedError: each partial would count the sink; not done yet).
void check_cp_options(const AttentionOptions& options);

// Rows [first, first + count) of dim 2 (the sequence) of a [B, H, S, D] or [B, H, S] tensor: a
// view with the same strides, no copy.
TensorRef rows_of(const TensorRef& t, int64_t first, int64_t count);

}  // namespace flexjit::cp
