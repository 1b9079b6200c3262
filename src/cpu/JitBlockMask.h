// cpu_create_block_mask: block masks built by the LLVM-JIT'ed mask_mod, the CPU backend's
// counterpart of create_block_mask (the GPU builder) and what the CPU forward consumes.
//
// Each tile is classified by the JIT'ed fj_mask_tile function (codegen/llvm/LlvmCodegen.h),
// which evaluates the mask_mod over the tile row by row with a vectorised kv loop and stops at
// the first row that proves the tile partial. Work is spread over threads by (b, h, q tile).
// (InterpretedBlockMask.h builds the same masks with the reference interpreter instead.)
#pragma once

#include <flexjit/attention.h>
#include <flexjit/block_mask.h>
#include <flexjit/mods.h>

#include <cstdint>

namespace flexjit::cpu {

struct CpuBlockMaskOptions {
  int q_block = kDefaultSparseBlockSize;
  int kv_block = kDefaultSparseBlockSize;
  int num_threads = 0;  // 0: std::thread::hardware_concurrency()
};

// The BlockMask (include/flexjit/block_mask.h: kv_* and the transposed q_*, mods set) of
// `mods.mask_mod` over a [batch, heads, q_len, kv_len] attention matrix, with the bindings'
// parameter values and host buffers (checked as runtime::bind_mod_args does for a block mask:
// every name must be declared, only the mask_mod's buffers must be bound). Every whole tile is
// full without a mask_mod (a score_mod is ignored); as in every BlockMask, positions past q_len /
// kv_len count as masked, so a cut tile at the end is partial at most. Pass batch / heads 1 for a
// mask that does not depend on b / h. Throws RuntimeError for negative sizes, tile sizes < 1,
// extents past the i32 range, or bad bindings; CompileError if the mods do not type check.
BlockMask cpu_create_block_mask(const Mods& mods, const ModBindings& bindings, int64_t batch,
                                int64_t heads, int64_t q_len, int64_t kv_len,
                                const CpuBlockMaskOptions& options = {});

}  // namespace flexjit::cpu
