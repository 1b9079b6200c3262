#include "flexjit/BenchCases.h"

#include <flexjit/error.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace flexjit::cli {

namespace {

// The anchors' eight cases at one shape; `quick` keeps noop, causal, alibi+causal and
// document+causal (the anchors' quick subset, also used for every extra shape).
void add_shape(std::vector<BenchCase>& out, const std::string& group, BenchShape s, bool quick) {
  const bool decode = s.seqlen_q != s.seqlen_kv;
  auto add = [&](const char* name, const char* mods, bool mask,
                 std::vector<std::pair<std::string, double>> params = {}) {
    const bool in_quick = std::strcmp(name, "noop") == 0 || std::strcmp(name, "causal") == 0 ||
                          std::strcmp(name, "alibi+causal") == 0 ||
                          std::strcmp(name, "document+causal") == 0;
    if (quick && !in_quick) return;
    out.push_back({name, group, s, mods, mask, std::move(params)});
  };
  const int S = s.seqlen_kv;
  if (decode) {
    // Decoding: the one query sits at the end, so the anchors drop the mask and keep only the
    // cases with a score_mod (noop and alibi+causal, under its name, without the causal mask).
    add("noop", "noop", false);
    add("alibi+causal", "alibi", false);
    return;
  }
  add("noop", "noop", false);
  add("causal", "causal", true);
  add("alibi+causal", "alibi_causal", true);
  add("sliding1024", "sliding_window", true, {{"window", 1024}});
  add("prefix_lm", "prefix_lm", true, {{"prefix", S / 4}});
  add("document+causal", "document_causal", true);
  add("softcap30+causal", "softcap_causal", true, {{"cap", 30.0}});
  add("relbias+causal", "relative_bias_causal", true, {{"offset", S}});
}

// splitmix64: a fast, well-mixed stream for benchmark inputs.
uint64_t next_u64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A standard normal value by Box-Muller (one of the pair; speed is not critical at 10^8).
float next_normal(uint64_t& state) {
  const double u1 = (static_cast<double>(next_u64(state) >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = static_cast<double>(next_u64(state) >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

uint16_t to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (inputs are finite)
  return static_cast<uint16_t>(u >> 16);
}

template <typename T>
std::pair<std::string, npy::Array> make_buffer(std::string name, DType dtype,
                                               const std::vector<T>& v) {
  npy::Array a = npy::make_array(dtype, {static_cast<int64_t>(v.size())});
  std::memcpy(a.bytes.data(), v.data(), a.bytes.size());
  return {std::move(name), std::move(a)};
}

}  // namespace

std::vector<BenchCase> standard_cases(const CaseSelection& sel) {
  std::vector<BenchCase> out;
  if (sel.small) {
    // Tiny shapes of every case, with a partial last tile (S not a multiple of 128) and GQA,
    // for compute-sanitizer runs and smoke tests.
    add_shape(out, "small", {1, 2, 2, 384, 384, 128}, false);
    add_shape(out, "small", {2, 4, 2, 200, 200, 64}, true);
    add_shape(out, "small", {1, 4, 1, 1, 300, 128}, false);
    return out;
  }
  if (sel.custom) {
    add_shape(out, "custom", *sel.custom, sel.quick);
    return out;
  }
  if (sel.main) add_shape(out, "main", kMainShape, sel.quick);
  if (sel.fp8) {
    for (auto [mods, mask] : {std::pair{"noop", false}, {"causal", true}}) {
      BenchCase c{mods, "fp8", kMainShape, mods, mask, {}};
      c.dtype = DType::E4M3;
      out.push_back(c);
    }
  }
  if (sel.extra) {
    add_shape(out, "gqa", {4, 32, 8, 4096, 4096, 128}, true);
    add_shape(out, "d64", {8, 16, 16, 2048, 2048, 64}, true);
    add_shape(out, "long", {2, 16, 16, 16384, 16384, 128}, true);
    add_shape(out, "decode", {8, 32, 8, 1, 8192, 128}, true);
  }
  if (sel.decode) {
    const BenchShape anchor{8, 32, 8, 1, 8192, 128};
    if (!sel.extra) add_shape(out, "decode", anchor, true);
    out.push_back({"noop paged16", "decode", anchor, "noop", false, {}, 16});
    out.push_back({"noop", "decode_128k", {1, 32, 8, 1, 131072, 128}, "noop", false, {}});
    out.push_back({"noop", "decode_spec4", {8, 32, 8, 4, 8192, 128}, "noop", false, {}});
    // e4m3 KV caches (issue 31: >= 1.8x the bf16 decode's tokens per second at 8k keys), in
    // groups of their own (the bf16 group's name + "_e4m3", the same case names): the anchors'
    // shape as a cache with full lengths, in 16-key pages, and with 4 query tokens.
    auto e4m3 = [](BenchCase c) {
      c.kv_e4m3 = true;
      return c;
    };
    out.push_back(e4m3({"noop", "decode_e4m3", anchor, "noop", false, {}, 0, true}));
    out.push_back(e4m3({"noop paged16", "decode_e4m3", anchor, "noop", false, {}, 16}));
    out.push_back(
        e4m3({"noop", "decode_spec4_e4m3", {8, 32, 8, 4, 8192, 128}, "noop", false, {}, 0, true}));
    // Chunked prefill against a cache: the forward on contiguous K / V, on a KV cache without
    // pages (per-sequence lengths) and through 16-key pages (on sm_90a all three run
    // sm90a_wgmma: TMA tiles, TMA tiles bounded by the lengths, cp.async gathers through the
    // table; docs/kernels/forward_sm90.md "KV caches").
    const BenchShape prefill{4, 32, 8, 2048, 8192, 128};
    out.push_back({"offset_causal", "prefill", prefill, kOffsetCausal, true, {}});
    out.push_back({"offset_causal ragged", "prefill", prefill, kOffsetCausal, true, {}, 0, true});
    out.push_back({"offset_causal paged16", "prefill", prefill, kOffsetCausal, true, {}, 16});
    // The same chunks on an e4m3 cache (group prefill_e4m3; on sm_90a the forward converts the
    // tiles in its producer: docs/kernels/forward_sm90.md "e4m3 KV caches"): contiguous K / V with
    // lengths and 16-key pages, against the bf16 rows of the same names.
    out.push_back(
        e4m3({"offset_causal ragged", "prefill_e4m3", prefill, kOffsetCausal, true, {}, 0, true}));
    out.push_back(
        e4m3({"offset_causal paged16", "prefill_e4m3", prefill, kOffsetCausal, true, {}, 16}));
  }
  return out;
}

namespace {

Mods named_mods(const std::string& name) {
  if (name == kOffsetCausal) {
    return parse_mods("buffer q_pos: i32[B]\nmask_mod = q_idx + q_pos[b] >= kv_idx", name);
  }
  return standard_mods(name);
}

}  // namespace

std::string BenchShape::dims() const {
  return dim_v() == head_dim ? std::to_string(head_dim) : fmt::format("{}/{}", head_dim, dim_v());
}

BenchShape parse_bench_shape(const std::string& text) {
  static const char* const kFields[] = {"B", "Hq", "Hkv", "S", "D", "Dv"};
  int v[6] = {0, 0, 0, 0, 0, 0};
  size_t pos = 0;
  // The last field is D, or Dqk/Dv (v's head dim after a slash).
  const size_t slash = text.find('/');
  for (int i = 0; i < 6; ++i) {
    if (i == 5 && slash == std::string::npos) break;
    const size_t end = i < 4    ? text.find(',', pos)
                       : i == 4 ? std::min(slash, text.size())
                                : text.size();
    const std::string field =
        end == std::string::npos ? text.substr(pos) : text.substr(pos, end - pos);
    char* stop = nullptr;
    const long x = field.empty() ? 0 : std::strtol(field.c_str(), &stop, 10);
    if (field.empty() || *stop != '\0' || x <= 0 || x > (1L << 30)) {
      throw Error(
          fmt::format("--shape '{}': {} must be a positive integer (the form is "
                      "B,Hq,Hkv,S,D or B,Hq,Hkv,S,Dqk/Dv, e.g. 8,16,16,2048,64 or "
                      "4,16,16,4096,192/128)",
                      text, kFields[i]));
    }
    v[i] = static_cast<int>(x);
    if (i < 4 && end == std::string::npos) {
      throw Error(
          fmt::format("--shape '{}': five values B,Hq,Hkv,S,D (D or Dqk/Dv), e.g. "
                      "8,16,16,2048,64 or 4,16,16,4096,192/128",
                      text));
    }
    pos = end + 1;
  }
  if (v[1] % v[2] != 0) {
    throw Error(
        fmt::format("--shape '{}': Hq = {} is not a multiple of Hkv = {}", text, v[1], v[2]));
  }
  return {v[0], v[1], v[2], v[3], v[3], v[4], v[5]};
}

Mods case_mods(const BenchCase& c) {
  if (c.custom_mods) return *c.custom_mods;
  Mods m = named_mods(c.mods);
  for (const auto& [name, value] : c.params) {
    bool found = false;
    for (Param& p : m.params) {
      if (p.name() == name) found = true;
    }
    if (!found) {
      throw InternalError(
          fmt::format("bench case {}: mods '{}' have no parameter '{}'", c.name, c.mods, name));
    }
  }
  return m;
}

std::vector<std::pair<std::string, npy::Array>> case_buffers(const BenchCase& c, uint64_t seed) {
  std::vector<std::pair<std::string, npy::Array>> out;
  const Mods m = case_mods(c);
  for (const Buffer& b : m.buffers) {
    const std::string& name = b.name();
    if (name == "slopes") {
      const int H = c.shape.heads_q;
      std::vector<float> slopes(H);
      for (int h = 0; h < H; ++h)
        slopes[h] = std::exp2(-static_cast<float>(h + 1) * 8.0f / H);
      out.push_back(make_buffer(name, DType::F32, slopes));
    } else if (name == "doc_id") {
      out.push_back(make_buffer(name, DType::I32, anchor_document_ids(c.shape.seqlen_kv)));
    } else if (name == "q_pos") {
      out.push_back(
          make_buffer(name, DType::I32,
                      std::vector<int32_t>(c.shape.batch, c.shape.seqlen_kv - c.shape.seqlen_q)));
    } else if (name == "bias") {
      uint64_t state = seed ^ 0xb1a5ULL;
      std::vector<float> bias(2 * static_cast<size_t>(c.shape.seqlen_kv));
      for (float& x : bias)
        x = next_normal(state);
      out.push_back(make_buffer(name, DType::F32, bias));
    } else {
      throw InternalError(
          fmt::format("bench case {}: no data for buffer '{}' of '{}'", c.name, name, c.mods));
    }
  }
  return out;
}

std::vector<int32_t> anchor_document_ids(int seqlen) {
  std::vector<int32_t> ids(std::max(seqlen, 0), 0);
  const int lens[] = {seqlen / 8, seqlen / 4, seqlen / 16, seqlen / 2, seqlen / 16};
  int pos = 0;
  for (int k = 0; pos < seqlen; ++k) {
    // max(1, ...) keeps tiny S (< 16) from looping on zero-length documents.
    const int n = std::max(1, lens[k % 5]);
    for (int i = pos; i < std::min(seqlen, pos + n); ++i)
      ids[i] = k;
    pos += n;
  }
  return ids;
}

double kv_bytes(const BenchShape& s) {
  return 2.0 * s.batch * s.heads_kv * static_cast<double>(s.seqlen_kv) * (s.head_dim + s.dim_v());
}

double forward_flops(const BenchShape& s, double density) {
  // 2 FLOPs per multiply-add of Q K^T (head_dim) and of P V (v's head dim).
  return 2.0 * s.batch * s.heads_q * static_cast<double>(s.seqlen_q) * s.seqlen_kv *
         (s.head_dim + s.dim_v()) * density;
}

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> v(n);
  uint64_t state = seed;
  for (uint16_t& x : v)
    x = to_bf16_bits(next_normal(state));
  return v;
}

}  // namespace flexjit::cli
