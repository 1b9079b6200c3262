#include "cp/CallChecks.h"

#include <flexjit/error.h>
#include <flexjit/types.h>

#include <fmt/format.h>

namespace flexjit::cp {

void check_cp_options(const AttentionOptions& options) {
  if (options.block_mask != nullptr) {
    throw RuntimeError(
        "a context-parallel call takes no block mask (AttentionOptions::block_mask): each pair of "
        "shards builds its own from the mods' mask_mod at its global positions; leave it null");
  }
  if (options.kv_cache != nullptr) {
    throw RuntimeError(
        "a context-parallel call takes no KV cache (AttentionOptions::kv_cache): it shards one "
        "sequence of queries, keys and values across ranks");
  }
  if (options.mods.sink_mod.defined()) {
    throw UnsupportedError(fmt::format(
        "the mods '{}' have a sink_mod; context parallelism does not support attention sinks yet "
        "(every partial result would count the sink once; docs/context_parallel.md)",
        options.mods.name));
  }
}

TensorRef rows_of(const TensorRef& t, int64_t first, int64_t count) {
  FJ_ASSERT(t.ndim() >= 3 && first >= 0 && first + count <= t.shape[2], "rows_of out of range");
  TensorRef v = t;
  v.shape[2] = count;
  if (count > 0) {
    v.data = static_cast<char*>(t.data) + first * t.strides[2] * dtype_size(t.dtype);
  }
  return v;
}

}  // namespace flexjit::cp
