#include "cp/Sharding.h"

#include <flexjit/error.h>

#include <fmt/format.h>

namespace flexjit {

std::string_view to_string(CpLayout l) {
  return l == CpLayout::Zigzag ? "zigzag" : "contiguous";
}

std::optional<CpLayout> parse_cp_layout(std::string_view s) {
  if (s == "zigzag") return CpLayout::Zigzag;
  if (s == "contiguous") return CpLayout::Contiguous;
  return std::nullopt;
}

}  // namespace flexjit

namespace flexjit::cp {

Sharding::Sharding(ShardLayout layout, int64_t seqlen, int ranks)
    : layout_(layout), seqlen_(seqlen), ranks_(ranks) {
  if (ranks < 1) {
    throw RuntimeError(fmt::format("context parallelism over {} ranks: need at least 1", ranks));
  }
  if (seqlen < 1) {
    throw RuntimeError(fmt::format("context parallelism over seqlen {}: need at least 1", seqlen));
  }
  const int64_t chunks = num_chunks();
  if (seqlen % chunks != 0) {
    throw RuntimeError(fmt::format(
        "seqlen {} is not a multiple of the {} chunks of a {} sharding over {} rank{}; pad the "
        "sequence to a multiple of {}{}",
        seqlen, chunks, to_string(layout), ranks, ranks == 1 ? "" : "s", chunks,
        layout == ShardLayout::Zigzag ? " (zigzag cuts S into 2N chunks)" : ""));
  }
}

Chunk Sharding::chunk(int64_t index) const {
  FJ_ASSERT(index >= 0 && index < num_chunks(), "chunk index out of range");
  return Chunk{index, index * chunk_length(), chunk_length()};
}

std::vector<Chunk> Sharding::chunks_of(int rank) const {
  FJ_ASSERT(rank >= 0 && rank < ranks_, "rank out of range");
  if (layout_ == ShardLayout::Contiguous) return {chunk(rank)};
  return {chunk(rank), chunk(2 * int64_t{ranks_} - 1 - rank)};
}

int Sharding::owner_of(int64_t chunk_index) const {
  FJ_ASSERT(chunk_index >= 0 && chunk_index < num_chunks(), "chunk index out of range");
  if (layout_ == ShardLayout::Contiguous || chunk_index < ranks_) {
    return static_cast<int>(chunk_index);
  }
  return static_cast<int>(2 * int64_t{ranks_} - 1 - chunk_index);
}

int64_t Sharding::local_row_of(int64_t chunk_index) const {
  const bool second = layout_ == ShardLayout::Zigzag && chunk_index >= ranks_;
  return second ? chunk_length() : 0;
}

int64_t Sharding::global_position(int rank, int64_t local_row) const {
  FJ_ASSERT(local_row >= 0 && local_row < local_length(), "local row out of range");
  const std::vector<Chunk> chunks = chunks_of(rank);
  const int64_t which = local_row / chunk_length();
  return chunks[static_cast<size_t>(which)].start + local_row % chunk_length();
}

std::string Sharding::str() const {
  std::string s =
      fmt::format("{}: S = {} over {} rank{}, {} chunks of {}", to_string(layout_), seqlen_, ranks_,
                  ranks_ == 1 ? "" : "s", num_chunks(), chunk_length());
  for (int r = 0; r < ranks_; ++r) {
    s += fmt::format("{} rank {} holds", r == 0 ? ";" : ",", r);
    for (const Chunk& c : chunks_of(r))
      s += fmt::format(" [{}, {})", c.start, c.end());
  }
  return s;
}

}  // namespace flexjit::cp
