// How a sequence of S positions is cut among the N ranks of a context-parallel attention
// (docs/context_parallel.md, "Sharding").
//
//   zigzag      S is cut into 2N chunks of S / (2N) positions; rank r holds chunks r and
//               2N - 1 - r, in that order. Under a causal mask every rank then has the same
//               work (a chunk early in the sequence pairs with one late in it).
//   contiguous  S is cut into N chunks of S / N; rank r holds chunk r. For masks that are not
//               causal (bidirectional, document masks), where every chunk costs the same.
//
// A rank's shard is its chunks one after the other: local row i of the shard is global position
// global_position(r, i). Both the CPU check (runtime/ContextParallelCpu.cpp) and the GPU path
// (runtime/ContextParallel.cpp) read the layout from here, so they agree on every offset.
#pragma once

#include <flexjit/context_parallel.h>

#include <cstdint>
#include <string>
#include <vector>

namespace flexjit::cp {

using ShardLayout = CpLayout;  // the public enum (to_string, parse_cp_layout)

// One chunk of the sequence: global positions [start, start + length).
struct Chunk {
  int64_t index = 0;  // its number among all the chunks, in sequence order
  int64_t start = 0;
  int64_t length = 0;
  int64_t end() const { return start + length; }
};

class Sharding {
 public:
  // RuntimeError unless ranks >= 1, seqlen >= 1 and seqlen divisible by the chunk count (2N for
  // zigzag, N for contiguous): "seqlen 1000 is not a multiple of the 6 chunks of a zigzag
  // sharding over 3 ranks; pad the sequence to a multiple of 6".
  Sharding(ShardLayout layout, int64_t seqlen, int ranks);

  ShardLayout layout() const { return layout_; }
  int64_t seqlen() const { return seqlen_; }
  int ranks() const { return ranks_; }
  int64_t num_chunks() const { return layout_ == ShardLayout::Zigzag ? 2 * ranks_ : ranks_; }
  int64_t chunk_length() const { return seqlen_ / num_chunks(); }
  // Positions each rank holds: S / N.
  int64_t local_length() const { return seqlen_ / ranks_; }

  // The chunks rank `rank` holds, in the order of its shard's rows.
  std::vector<Chunk> chunks_of(int rank) const;
  // Chunk number `index` of the sequence (0 <= index < num_chunks()).
  Chunk chunk(int64_t index) const;
  // The rank holding chunk `index` and the chunk's first row in that rank's shard.
  int owner_of(int64_t chunk_index) const;
  int64_t local_row_of(int64_t chunk_index) const;
  // The global position of row `local_row` of rank `rank`'s shard.
  int64_t global_position(int rank, int64_t local_row) const;

  // "zigzag: S = 4096 over 2 ranks, 4 chunks of 1024; rank 0 holds [0, 1024) [3072, 4096), ..."
  std::string str() const;

 private:
  ShardLayout layout_;
  int64_t seqlen_;
  int ranks_;
};

}  // namespace flexjit::cp
