// Block masks on the CPU: which (q tile, kv tile) pairs of an attention matrix a mask_mod keeps
// entirely, partly or not at all, in FlexAttention's layout.
//
// Each tile is classified by the JIT'ed fj_mask_tile function (codegen/llvm/LlvmCodegen.h),
// which evaluates the mask_mod over the tile row by row with a vectorised kv loop and stops at
// the first row that proves the tile partial. Work is spread over threads by (b, h, q tile).
#pragma once

#include <flexjit/mods.h>

#include "ir/Evaluate.h"

#include <cstdint>
#include <vector>

namespace flexjit::cpu {

// A block mask in FlexAttention's layout, as plain host arrays. Tiles are q_block x kv_block;
// the last tile of each dim may be short. `batch` / `heads` of 1 broadcast over every batch /
// head of the attention call (the mask was evaluated at b = 0 / h = 0).
//
//   kv_num_blocks      [batch, heads, num_q_blocks]                 partial tiles per q tile
//   kv_indices         [batch, heads, num_q_blocks, num_kv_blocks]  their kv tile indices
//   full_kv_num_blocks [batch, heads, num_q_blocks]                 fully kept tiles per q tile
//   full_kv_indices    [batch, heads, num_q_blocks, num_kv_blocks]  their kv tile indices
//
// Indices are ascending in the first *_num_blocks entries of a row; the remaining entries are 0.
// Tiles neither partial nor full are skipped entirely: no query attends there. Partial tiles
// need the mask_mod applied per element; full tiles do not.
struct CpuBlockMask {
  int64_t batch = 1, heads = 1;
  int64_t q_len = 0, kv_len = 0;
  int q_block = 128, kv_block = 128;
  int64_t num_q_blocks = 0, num_kv_blocks = 0;
  std::vector<int32_t> kv_num_blocks;
  std::vector<int32_t> kv_indices;
  std::vector<int32_t> full_kv_num_blocks;
  std::vector<int32_t> full_kv_indices;

  // Row (b, h, qb) offsets into the arrays; b / h are taken modulo broadcast.
  int64_t row(int64_t b, int64_t h, int64_t qb) const {
    return ((b % batch) * heads + (h % heads)) * num_q_blocks + qb;
  }

  // Throws RuntimeError naming the first inconsistency (array sizes, counts, indices out of
  // range, indices not ascending). The CPU forward checks the masks it is given with this.
  void validate() const;
};

struct CpuBlockMaskOptions {
  int q_block = 128;
  int kv_block = 128;
  int num_threads = 0;  // 0: std::thread::hardware_concurrency()
};

// Evaluates `mods.mask_mod` (every tile is full without one; a score_mod is ignored) with the
// bindings given (parameter values and buffers by name, as for the interpreter) over a
// [batch, heads, q_len, kv_len] attention matrix. Pass batch / heads 1 for a mask that does not
// depend on b / h. Throws RuntimeError for negative sizes, tile sizes < 1, extents past the i32
// range, or bad bindings (see pack_cpu_mod_params); CompileError if the mods do not type check.
CpuBlockMask cpu_create_block_mask(const Mods& mods, const ir::EvalEnv& bindings, int64_t batch,
                                   int64_t heads, int64_t q_len, int64_t kv_len,
                                   const CpuBlockMaskOptions& options = {});

}  // namespace flexjit::cpu
