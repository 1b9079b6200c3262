#include "gpu/StandardBindings.h"

#include "ir/Evaluate.h"

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
    } else if (b.name() == "sinks") {  // attention sinks: logits around the scores' range
      std::vector<float> v(s.heads_q);
      for (float& x : v)
        x = 2.0f * u(rng);
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

std::vector<DiagonalSiteMod> diagonal_site_mods(DType table) {
  return {
      {"per-head reversed",
       "buffer rel: " + std::string(to_string(table)) +
           "[H, R]\nparam off: i32\nscore_mod = score + 2.0 * rel[h, kv_idx - q_idx + "
           "off]\nmask_mod = kv_idx <= q_idx + 50"},
      {"reached under where",
       "buffer bias: f32[R]\nparam offset: i32\nscore_mod = where(q_idx >= kv_idx, score + "
       "bias[q_idx - kv_idx + offset], score * 0.5)"},
      {"two sites of one table",
       "buffer bias: f32[R]\nparam offset: i32\nscore_mod = score + bias[q_idx - kv_idx + "
       "offset] + 0.5 * bias[q_idx - kv_idx + offset - 1]"},
      {"a nonlinear function of the difference",
       "buffer tab: f32[H, 7]\nscore_mod = score + tab[h, abs(q_idx - kv_idx) % 7] * "
       "where(kv_idx > q_idx, 1.0, -0.5)"},
  };
}

void bind_diagonal_site_mod(const DiagonalSiteMod& mod, DType table, const AttentionShape& s,
                            std::mt19937_64& rng, std::map<std::string, HostBuffer>& buffers,
                            std::vector<std::pair<std::string, double>>& params) {
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  if (mod.label == "per-head reversed") {
    const int64_t r = s.seqlen_q + s.seqlen_kv + 1;
    const size_t n = static_cast<size_t>(s.heads_q * r);
    if (table == DType::F16) {
      std::vector<uint16_t> v(n);  // f16 bits
      for (uint16_t& x : v)
        x = ir::float_to_f16_bits(u(rng));
      buffers["rel"] = host_buffer(table, {s.heads_q, r}, v);
    } else {
      std::vector<float> v(n);
      for (float& x : v)
        x = u(rng);
      buffers["rel"] = host_buffer(table, {s.heads_q, r}, v);
    }
    params.emplace_back("off", s.seqlen_q);
  } else if (mod.label == "a nonlinear function of the difference") {
    std::vector<float> v(static_cast<size_t>(s.heads_q * 7));
    for (float& x : v)
      x = u(rng);
    buffers["tab"] = host_buffer(DType::F32, {s.heads_q, 7}, v);
  }
}

}  // namespace flexjit::test
