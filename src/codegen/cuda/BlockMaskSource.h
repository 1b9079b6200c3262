// Assembly of the block-mask builder's CUDA source (templates/block_mask.cuh), one
// self-contained translation unit in the manner of ForwardSource.h:
//
//   1. a comment block: flexjit and NVRTC versions, the block sizes, the mask_mod as text
//      (parameter defaults left out) and `// source key: <sha256>` of all the text after it;
//   2. templates/flexjit_abi.h   3. templates/prelude.cuh
//   4. struct FjBlockMaskConfig { kQBlock, kKvBlock, kNumWarps }   5. the mods (mask_mod only)
//   6. templates/block_mask.cuh: the kernels flexjit_block_mask_classify and
//      flexjit_block_mask_index.
//
// Only the mask_mod and the buffers / params it uses reach the source: a score_mod in the same
// Mods does not change the kernel.
#pragma once

#include "codegen/cuda/ForwardSource.h"

#include <flexjit/mods.h>

#include <string>

namespace flexjit::cuda {

inline constexpr const char* kBlockMaskClassifyKernel = "flexjit_block_mask_classify";
inline constexpr const char* kBlockMaskIndexKernel = "flexjit_block_mask_index";

struct BlockMaskSpec {
  int q_block = 128;
  int kv_block = 128;
  int num_warps = 8;        // warps per block of the classify kernel (one tile each)
  std::string str() const;  // "blocks 128x128, 8 warps"
};

// The mask_mod of `mods` alone (score_mod dropped), with only the buffers and params it uses.
// Throws CompileError if `mods` has no mask_mod.
Mods mask_only(const Mods& mods);

// Type-checks, then assembles the source for `mask_only(mods)`; GeneratedSource::kernel_name is
// the classify kernel (the index kernel lives in the same module). Throws CompileError for a
// missing mask_mod, RuntimeError for block sizes outside [1, 4096] or warps outside [1, 32].
GeneratedSource generate_block_mask(const Mods& mods, const BlockMaskSpec& spec);

}  // namespace flexjit::cuda
