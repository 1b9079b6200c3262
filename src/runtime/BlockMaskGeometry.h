// The geometry rules every block mask follows, whoever builds it: the host builders
// (BlockMask.cpp), the GPU builder and masks over a framework's arrays (DeviceBlockMask.cpp).
// Each throws RuntimeError naming the values and the rule.
#pragma once

#include <cstdint>

namespace flexjit::runtime {

// The most tiles (Bm x Hm x num_q_blocks x num_kv_blocks) of a block mask.
constexpr int64_t kMaxBlockMaskTiles = int64_t{1} << 31;

// Sequence lengths >= 0 and block sizes >= 1.
void check_block_mask_lengths(int seqlen_q, int seqlen_kv, int q_block_size, int kv_block_size);

// At most kMaxBlockMaskTiles tiles in all (the products checked for overflow).
void check_block_mask_tiles(int64_t batch, int64_t heads, int64_t num_q_blocks,
                            int64_t num_kv_blocks);

// batch, heads >= 1, then both of the above.
void check_block_mask_geometry(int batch, int heads, int seqlen_q, int seqlen_kv, int q_block_size,
                               int kv_block_size);

// ceil(length / block) for length >= 0, block >= 1, in 64 bits (a block size near INT_MAX does
// not wrap).
inline int64_t block_count(int length, int block) {
  return (int64_t{length} + block - 1) / block;
}

}  // namespace flexjit::runtime
