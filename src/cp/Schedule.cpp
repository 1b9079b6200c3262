#include "cp/Schedule.h"

#include <fmt/format.h>

namespace flexjit {

std::string_view to_string(CpStrategy s) {
  return s == CpStrategy::AllGather ? "allgather" : "ring";
}

std::optional<CpStrategy> parse_cp_strategy(std::string_view s) {
  if (s == "allgather" || s == "all-gather") return CpStrategy::AllGather;
  if (s == "ring") return CpStrategy::Ring;
  return std::nullopt;
}

}  // namespace flexjit

namespace flexjit::cp {

RankSchedule schedule_rank(const Sharding& sharding, Strategy strategy, int rank,
                           const Mods& shifted,
                           const std::unordered_map<std::string, double>& params, int64_t batch,
                           int64_t heads) {
  RankSchedule s;
  s.rank = rank;
  s.strategy = strategy;
  s.q_chunks = sharding.chunks_of(rank);
  const int n = sharding.ranks();
  const int64_t len = sharding.chunk_length();
  auto classify = [&](const Chunk& q, const Chunk& kv) {
    return classify_pair(shifted, params, batch, heads, q, kv);
  };
  if (strategy == Strategy::AllGather) {
    for (size_t qi = 0; qi < s.q_chunks.size(); ++qi) {
      const Chunk& q = s.q_chunks[qi];
      int64_t first = -1, last = -1;
      bool all_full = true;
      for (int64_t c = 0; c < sharding.num_chunks(); ++c) {
        const PairKind k = classify(q, sharding.chunk(c));
        if (k == PairKind::Empty) {
          ++s.skipped_pairs;
          continue;
        }
        if (first < 0) first = c;
        last = c;
        all_full = all_full && k == PairKind::Full;
      }
      if (first < 0) continue;
      // Empty chunks inside the span (none for causal or window masks) are computed, masked,
      // with it: one call per query chunk.
      PairCall call;
      call.q_chunk = static_cast<int>(qi);
      call.q = q;
      call.q_local_row = static_cast<int64_t>(qi) * len;
      call.kv = Chunk{first, first * len, (last - first + 1) * len};
      call.kv_rank = -1;
      call.kv_local_row = call.kv.start;
      call.kind = all_full ? PairKind::Full : classify(q, call.kv);
      s.calls.push_back(call);
    }
    return s;
  }
  for (int t = 0; t < n; ++t) {
    const int src = ((rank - t) % n + n) % n;
    const std::vector<Chunk> kv_chunks = sharding.chunks_of(src);
    for (size_t qi = 0; qi < s.q_chunks.size(); ++qi) {
      for (size_t ki = 0; ki < kv_chunks.size(); ++ki) {
        const PairKind k = classify(s.q_chunks[qi], kv_chunks[ki]);
        if (k == PairKind::Empty) {
          ++s.skipped_pairs;
          continue;
        }
        PairCall call;
        call.step = t;
        call.q_chunk = static_cast<int>(qi);
        call.q = s.q_chunks[qi];
        call.q_local_row = static_cast<int64_t>(qi) * len;
        call.kv = kv_chunks[ki];
        call.kv_rank = src;
        call.kv_local_row = static_cast<int64_t>(ki) * len;
        call.kind = k;
        s.calls.push_back(call);
      }
    }
  }
  return s;
}

std::string describe(const RankSchedule& s) {
  std::string out =
      fmt::format("rank {} ({}): {} call{}, {} empty pair{} skipped\n", s.rank,
                  to_string(s.strategy), s.calls.size(), s.calls.size() == 1 ? "" : "s",
                  s.skipped_pairs, s.skipped_pairs == 1 ? "" : "s");
  for (const PairCall& c : s.calls) {
    const std::string whose =
        c.kv_rank < 0 ? std::string("gathered") : fmt::format("of rank {}", c.kv_rank);
    out += fmt::format("  step {}: q [{}, {}) x kv [{}, {}) {} ({})\n", c.step, c.q.start,
                       c.q.end(), c.kv.start, c.kv.end(), whose, to_string(c.kind));
  }
  return out;
}

}  // namespace flexjit::cp
