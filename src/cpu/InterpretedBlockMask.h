// build_block_mask_interpreted: block masks built on the host by the reference interpreter
// (ir/Evaluate.h), after the interval analysis (cpu/TileHints.h) has decided what it can.
// `flexjit mask show` uses it without a GPU; tests use it as the reference of the two compiled
// builders (create_block_mask on the GPU, cpu_create_block_mask through the LLVM JIT).
#pragma once

#include <flexjit/attention.h>
#include <flexjit/block_mask.h>
#include <flexjit/mods.h>

namespace flexjit::cpu {

// The block mask of `mods.mask_mod` (CompileError if it has none) over [batch, heads, Sq, Skv]
// with square tiles of `block_size`; `bindings` supplies parameter values and host buffers,
// checked as runtime::bind_mod_args does for a block mask (every name declared, the mask_mod's
// buffers bound). Same result as block_mask_from_predicate of the interpreted mask_mod.
// RuntimeError for non-positive sizes, a grid of tiles too large to hold, or bad bindings.
BlockMask build_block_mask_interpreted(const Mods& mods, int batch, int heads, int seqlen_q,
                                       int seqlen_kv, int block_size, const ModBindings& bindings);

}  // namespace flexjit::cpu
