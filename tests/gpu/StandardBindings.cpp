#include "gpu/StandardBindings.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

namespace flexjit::test {

void bind_standard_mods(const Mods& mods, const AttentionShape& s, std::mt19937_64& rng,
                        std::map<std::string, HostBuffer>& buffers,
                        std::vector<std::pair<std::string, double>>& params) {
  const int S = std::max(s.seqlen_q, s.seqlen_kv);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const Buffer& b : mods.buffers) {
    if (buffers.count(b.name())) continue;
    if (b.name() == "slopes") {
      std::vector<float> v(s.heads_q);
      for (int h = 0; h < s.heads_q; ++h)
        v[h] = std::exp2(-8.0f * (h + 1) / s.heads_q);
      buffers[b.name()] = host_buffer(DType::F32, {s.heads_q}, v);
    } else if (b.name() == "doc_id" || b.name() == "doc_ids") {
      std::vector<int32_t> v(std::max(S, 1));
      int doc = 0;
      for (int i = 0; i < S; ++i) {
        if (i > 0 && rng() % std::max(2, S / 3) == 0) ++doc;  // a few documents
        v[i] = doc;
      }
      buffers[b.name()] = host_buffer(DType::I32, {static_cast<int64_t>(v.size())}, v);
    } else if (b.name() == "bias" && b.rank() == 1) {
      std::vector<float> v(s.seqlen_q + s.seqlen_kv + 1);
      for (float& x : v)
        x = 0.5f * u(rng);
      buffers[b.name()] = host_buffer(DType::F32, {static_cast<int64_t>(v.size())}, v);
      params.emplace_back("offset", s.seqlen_kv);  // q - kv + Skv in [1, Sq + Skv - 1]
    } else if (b.name() == "bias" && b.rank() == 2) {
      std::vector<float> v(static_cast<size_t>(s.heads_q) * 32);
      for (float& x : v)
        x = 0.5f * u(rng);
      buffers[b.name()] = host_buffer(DType::F32, {s.heads_q, 32}, v);
    } else {
      FAIL("no binding rule for buffer " << b.name());
    }
  }
  for (const Param& p : mods.params) {
    bool given = false;
    for (auto& [n, v] : params)
      given |= n == p.name();
    if (given) continue;
    const int skv = std::max(s.seqlen_kv, 1);
    if (p.name() == "window") params.emplace_back("window", 1 + rng() % skv);
    if (p.name() == "chunk") params.emplace_back("chunk", 16 + rng() % 240);
    if (p.name() == "prefix") params.emplace_back("prefix", rng() % skv);
    if (p.name() == "dilation") params.emplace_back("dilation", 1 + rng() % 3);
    if (p.name() == "cap") params.emplace_back("cap", 5.0 + (rng() % 45));
  }
}

}  // namespace flexjit::test
