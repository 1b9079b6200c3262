// BlockMask: FlexAttention's block-sparse description of which (query tile, key tile) pairs an
// attention kernel visits, and whether it must apply the mask_mod there.
//
// The (Sq x Skv) score matrix is cut into tiles of q_block_size x kv_block_size. A tile is
//   empty    every position masked out: skipped;
//   partial  some positions masked: visited, mask_mod applied;
//   full     nothing masked: visited, mask_mod skipped.
// Positions past Sq or Skv in the last row / column of tiles count as masked (as in PyTorch's
// create_block_mask), so a boundary tile is never full unless it is whole.
//
// Host arrays (int32, C order; the layout of FjBlockMaskArgs in templates/flexjit_abi.h):
//   kv_num_blocks      [Bm, Hm, num_q_blocks]                 partial KV tiles per Q tile
//   kv_indices         [Bm, Hm, num_q_blocks, num_kv_blocks]  their indices, ascending, then
//                                                             the unused indices ascending
//   full_kv_num_blocks / full_kv_indices: the same for full tiles
//   q_num_blocks       [Bm, Hm, num_kv_blocks]                transposed, for the backward
//   q_indices          [Bm, Hm, num_kv_blocks, num_q_blocks]
//   full_q_num_blocks / full_q_indices
// Bm and Hm are 1 (broadcast over batch / heads) or the batch and query-head counts.
#pragma once

#include <flexjit/export.h>

#include <flexjit/mods.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace flexjit {

enum class TileKind : uint8_t { Empty, Partial, Full };

// PyTorch's default sparse block size.
constexpr int kDefaultSparseBlockSize = 128;

struct FLEXJIT_API BlockMask {
  int batch = 1;  // Bm
  int heads = 1;  // Hm
  int seqlen_q = 0;
  int seqlen_kv = 0;
  int q_block_size = kDefaultSparseBlockSize;
  int kv_block_size = kDefaultSparseBlockSize;
  int num_q_blocks = 0;   // ceil(seqlen_q / q_block_size)
  int num_kv_blocks = 0;  // ceil(seqlen_kv / kv_block_size); also the indices' last extent

  std::vector<int32_t> kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices;
  std::vector<int32_t> q_num_blocks, q_indices, full_q_num_blocks, full_q_indices;

  // The mask the tiles came from: mods.mask_mod is the predicate partial tiles apply. Undefined
  // when unknown (built from a dense mask or a tile callback): the attention call must then
  // supply the mask_mod itself.
  Mods mods;

  // The class of one tile. b and h are taken modulo a broadcast dimension.
  TileKind tile(int b, int h, int q_block, int kv_block) const;
  // Fraction of tiles computed (partial or full) over all Bm x Hm x tiles; 0 when there are
  // no tiles.
  double density() const;
  // Recomputes q_* from kv_* (the transposition the backward reads). Checks kv_* and full_kv_*
  // first as validate() does (sizes, counts, indices): RuntimeError naming the first bad entry.
  void build_transposed();
  // Checks the invariants: array sizes, counts within [0, max], indices in range, the counted
  // prefix strictly ascending, no tile both partial and full, q_* the transpose of kv_*.
  // Throws RuntimeError naming the first violation ("kv_indices[0, 0, 3, 1] = 9 is out of range
  // [0, 8)").
  void validate() const;
  // "BlockMask(shape=[1, 1, 4096, 4096], sparsity block 128x128, density 51.56%)"
  std::string str() const;
};

// Builders. Every builder validates its arguments (RuntimeError on non-positive sizes or a
// mismatched array) and fills both kv_* and q_*.

// From a callback classifying each tile.
FLEXJIT_API BlockMask block_mask_from_tiles(
    int batch, int heads, int seqlen_q, int seqlen_kv,
    const std::function<TileKind(int b, int h, int qb, int kvb)>& fn,
    int q_block_size = kDefaultSparseBlockSize, int kv_block_size = kDefaultSparseBlockSize);

// From a dense boolean mask [batch, heads, seqlen_q, seqlen_kv] (nonzero = attend).
FLEXJIT_API BlockMask block_mask_from_dense(const std::vector<uint8_t>& mask, int batch, int heads,
                                            int seqlen_q, int seqlen_kv,
                                            int q_block_size = kDefaultSparseBlockSize,
                                            int kv_block_size = kDefaultSparseBlockSize);

// By evaluating a C++ predicate at every position on the CPU (tests, small shapes; the GPU
// builder evaluates the compiled mask_mod instead).
FLEXJIT_API BlockMask block_mask_from_predicate(
    const std::function<bool(int b, int h, int q, int kv)>& pred, int batch, int heads,
    int seqlen_q, int seqlen_kv, int q_block_size = kDefaultSparseBlockSize,
    int kv_block_size = kDefaultSparseBlockSize);

// Document masking for packed sequences: q attends kv iff doc_ids[q] == doc_ids[kv] (and
// q >= kv when causal). Sq = Skv = doc_ids.size(), Bm = Hm = 1. mods carries the equivalent
// mask_mod over a captured buffer `doc_ids: i32[S]` (bind the same ids on the device).
FLEXJIT_API BlockMask block_mask_from_document_ids(const std::vector<int32_t>& doc_ids, bool causal,
                                                   int q_block_size = kDefaultSparseBlockSize,
                                                   int kv_block_size = kDefaultSparseBlockSize);

// Tile-wise intersection / union of two masks of the same sequence lengths and block sizes
// (Bm / Hm of 1 broadcast against the other's). and: full&full = full, empty&x = empty, else
// partial. or: full|x = full, empty|empty = empty, else partial. The result's mask_mod is the
// AND / OR of both mask_mods (undefined if either is unknown). RuntimeError on a mismatch.
FLEXJIT_API BlockMask and_masks(const BlockMask& a, const BlockMask& b);
FLEXJIT_API BlockMask or_masks(const BlockMask& a, const BlockMask& b);

// A text picture of tile (b, h): '█' full, '░' partial, '·' empty, one character per tile, rows
// are Q tiles. Masks with more than max_width tiles along a side are downsampled: a cell is
// full (empty) when every tile it covers is, else partial. Ends with a legend and the density.
FLEXJIT_API std::string to_picture(const BlockMask& mask, int b = 0, int h = 0, int max_width = 80);

// Writes tile (b, h) as a binary PPM image (P6), one pixel per tile scaled by `scale`:
// full black, partial grey, empty white. Throws Error when the file cannot be written.
FLEXJIT_API void write_ppm(const BlockMask& mask, const std::string& path, int b = 0, int h = 0,
                           int scale = 4);

}  // namespace flexjit
