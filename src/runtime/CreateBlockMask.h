// Internals of create_block_mask (include/flexjit/device_block_mask.h) for the CLI benchmark
// and tests: the same build with the host analysis switchable.
#pragma once

#include <flexjit/device_block_mask.h>

namespace flexjit::runtime {

struct BlockMaskBuildOptions {
  // Decide tiles by interval analysis on the host first (cached per mask structure, parameter
  // values and shape), so the GPU evaluates only undecided tiles. Off: every tile on the GPU.
  bool host_analysis = true;
};

DeviceBlockMask create_block_mask_with(Context& ctx, const Mods& mask, int batch, int heads,
                                       int seqlen_q, int seqlen_kv, int block_size,
                                       const ModBindings& bindings,
                                       const BlockMaskBuildOptions& options);

}  // namespace flexjit::runtime
