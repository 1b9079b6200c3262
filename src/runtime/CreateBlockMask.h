// Internals of create_block_mask (include/flexjit/device_block_mask.h) for the CLI benchmark
// and tests: the same build with the host analysis switchable, and with buffer checks.
#pragma once

#include <flexjit/device_block_mask.h>

namespace flexjit::runtime {

struct BlockMaskBuildOptions {
  // Decide tiles by interval analysis on the host first (cached per mask structure, parameter
  // values and shape), so the GPU evaluates only undecided tiles. Off: every tile on the GPU.
  bool host_analysis = true;
  // AttentionOptions::check_buffers for the build kernel's mask_mod (runtime/BufferCheck.h): its
  // captured-buffer loads are checked, and the build synchronizes and throws RuntimeError naming
  // the first one out of bounds.
  bool check_buffers = false;
};

DeviceBlockMask create_block_mask_with(Context& ctx, const Mods& mask, int batch, int heads,
                                       int seqlen_q, int seqlen_kv, int block_size,
                                       const ModBindings& bindings,
                                       const BlockMaskBuildOptions& options);

}  // namespace flexjit::runtime
