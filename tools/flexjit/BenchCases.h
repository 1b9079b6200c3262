// The standard attention benchmark cases: the shapes, masks and score mods of the anchor
// benchmark (/work/shared/anchors/torch_flex_bench.py, docs/benchmarks.md), mapped to flexjit's
// standard mods, with the host data of their captured buffers.
#pragma once

#include <flexjit/mods.h>
#include <flexjit/types.h>

#include "util/Npy.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace flexjit::cli {

struct BenchShape {
  int batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_kv = 0, head_dim = 0;
  int head_dim_v = 0;  // 0: head_dim (q, k and v alike); else v's (and out's) head dim
  int dim_v() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  // "128", or "192/128" where v's head dim differs (the D column of the tables and CSVs).
  std::string dims() const;
};

struct BenchCase {
  std::string name;   // the anchors' case name ("alibi+causal"), the key the CSVs join on
  std::string group;  // "main", "gqa", "d64", "long", "decode", "small"
  BenchShape shape;
  std::string mods;         // a standard mods name (dsl/)
  bool block_mask = false;  // build a block mask (block 128) from the mods' mask_mod
  std::vector<std::pair<std::string, double>> params;
  int page_size = 0;    // > 0: K / V in a paged cache of this page size (shuffled page table)
  bool ragged = false;  // contiguous K / V passed as a KV cache with (full) seq_lens
  // A case of the user's own mods (`bench --shape ... --mods X`): used instead of `mods`, which
  // then only names the case.
  std::shared_ptr<const Mods> custom_mods = nullptr;
  // q, k, v's dtype: bf16, or e4m3 (group "fp8": per-tensor descales, out bf16).
  DType dtype = DType::BF16;
  // An e4m3 KV cache (decode groups): q bf16, K / V e4m3 with per-kv-head scales, passed as a
  // KvCache (full lengths; paged with page_size); its K/V bytes are half of bf16's.
  bool kv_e4m3 = false;
};

// The chunked-prefill cases' mods: causal with the chunk at the end of each sequence, the offset
// captured as a buffer (q_pos[b] = Skv - Sq), as a serving engine prefills against its cache.
inline constexpr const char* kOffsetCausal = "offset_causal";

// The anchors' main shape: B=4, Hq=Hkv=16, S=4096, D=128.
inline constexpr BenchShape kMainShape{4, 16, 16, 4096, 4096, 128};

// Which cases standard_cases returns.
struct CaseSelection {
  bool main = true;    // B=4 H=16 S=4096 D=128
  bool extra = false;  // GQA 4:1, D=64, S=16384 (quick subset each) and decode
  bool quick = false;  // main shape: noop, causal, alibi+causal, document+causal only
  bool small = false;  // only tiny shapes of every case (memcheck, smoke tests)
  // The decoding cases (docs/kernels/decode.md): the anchors' decode shape contiguous and in
  // 16-key pages, one 128k-key sequence, and 4 query tokens (speculative decoding); and chunked
  // prefill (group "prefill": B=4 Hq=32 Hkv=8, 2048 queries against 8192 keys, offset causal)
  // contiguous, ragged (a KV cache without pages) and in 16-key pages.
  bool decode = false;
  // `bench --shape`: only this shape (group "custom"; self-attention, Sq = Skv), with the eight
  // standard cases (`quick`: four); replaces every other group.
  std::optional<BenchShape> custom = std::nullopt;
  // Also the main shape's noop and causal with e4m3 q, k, v (group "fp8", beside the bf16
  // rows; the e4m3 forward of sm_90a, docs/kernels/forward_sm90.md "FP8").
  bool fp8 = false;
};

// Parses --shape's "B,Hq,Hkv,S,D" (positive; Hq a multiple of Hkv; D is the kernels' to
// check); Error naming the field that is wrong.
BenchShape parse_bench_shape(const std::string& text);

// Bytes of K and V one decoding call reads (the effective-bandwidth numerator).
double kv_bytes(const BenchShape& s);

// The cases of `sel`, in the anchors' order.
std::vector<BenchCase> standard_cases(const CaseSelection& sel);

// The mods of a case: its standard mods, checked to declare every parameter the case sets.
Mods case_mods(const BenchCase& c);

// The buffers `case_mods(c)` captures, by name, with the anchors' contents: ALiBi slopes
// exp2(-8 (h + 1) / Hq), document ids (anchor_document_ids), a relative bias of 2 S normal f32
// values (seeded by `seed`).
std::vector<std::pair<std::string, npy::Array>> case_buffers(const BenchCase& c, uint64_t seed);

// The anchors' packed documents: lengths cycling S/8, S/4, S/16, S/2, S/16, ids 0, 1, 2, ...;
// the last document is cut at S.
std::vector<int32_t> anchor_document_ids(int seqlen);

// Forward FLOPs by the anchors' rule: 4 B Hq Sq Skv D x density (computed block fraction).
double forward_flops(const BenchShape& s, double density);

// `n` bf16 values (as uint16 bits) drawn from a standard normal distribution, deterministic in
// `seed`; never zero-filled data, which hides bugs and can time faster than real data.
std::vector<uint16_t> random_bf16(size_t n, uint64_t seed);

}  // namespace flexjit::cli
