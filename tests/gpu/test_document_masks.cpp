// Document masks on sm_90a: mask_mods that compare a key of the query with a key loaded at
// kv_idx (doc_id[q_idx] == doc_id[kv_idx]), which forward/sm90a_wgmma reads through its column
// load (kFjColLoad: each column's key loaded once per warp and shuffled to the lanes;
// docs/kernels/forward_sm90.md "The mask_mod's column load"). Document ids in runs of 1 to 300
// positions put run boundaries inside a warp's 16 rows, inside its columns, or nowhere in a
// tile; the compare in several forms (either order, inside a longer And tree, float keys, beside
// a score_mod: the union kernels' mask after the scores), with and without a block mask (every
// tile partial, or only the tiles the block mask calls partial). forward/sm90a_wgmma's out and
// lse and the sm90a_wgmma backward's dq / dk / dv against the fp64 CPU reference on fresh random
// inputs (the seed is printed on failure). Skips without a GPU, and where the sm_90a variants
// are not selectable.
#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/dsl.h>

#include "gpu/BackwardCheck.h"
#include "gpu/ForwardCheck.h"
#include "gpu/GpuTestUtil.h"
#include "support/CpuReference.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

using namespace flexjit;
using namespace flexjit::test;

namespace {

// The mods: the document compare in another place or form in each. doc_id is an i32 document
// id, seg an f32 one.
struct DocCase {
  const char* label;
  Mods mods;
};

std::vector<DocCase> doc_cases() {
  return {
      {"document_causal", standard_mods("document_causal")},
      {"document", standard_mods("document")},
      {"compare in the middle, reversed",
       parse_mods("buffer doc_id: i32[S]\nmask_mod = kv_idx <= q_idx + 40 && doc_id[kv_idx] == "
                  "doc_id[q_idx] && q_idx < kv_idx + 300")},
      {"float key", parse_mods("buffer seg: f32[S]\nmask_mod = seg[q_idx] == seg[kv_idx] && "
                               "q_idx >= kv_idx")},
      {"with a score_mod",
       parse_mods("buffer doc_id: i32[S]\nscore_mod = 20.0 * tanh(score / 20.0)\nmask_mod = "
                  "doc_id[q_idx] == doc_id[kv_idx] && q_idx >= kv_idx")},
  };
}

// Document ids of positions 0 .. n - 1 in runs whose lengths cycle through short ones (a
// boundary inside a warp's rows or columns) and long ones (warps inside one document), from a
// random start in the cycle.
std::vector<int32_t> document_ids(int n, std::mt19937_64& rng) {
  const int lens[] = {5, 300, 1, 3, 170, 9, 212, 2};
  std::vector<int32_t> ids(n);
  int pos = 0, doc = 0;
  for (size_t k = rng() % 8; pos < n; ++k, ++doc) {
    for (int i = 0; i < lens[k % 8] && pos < n; ++i)
      ids[pos++] = doc;
  }
  return ids;
}

struct Inputs {
  HostTensor q, k, v;
  DeviceTensor dq, dk, dv;
  std::vector<int32_t> ids;
  std::vector<float> seg;
  DeviceTensor ids_dev, seg_dev;
  ModBindings dev, host;
  ir::EvalEnv env;
  std::optional<DeviceBlockMask> block_mask;
};

void make_inputs(Context& ctx, const Mods& mods, const AttentionShape& s, bool block_mask,
                 std::mt19937_64& rng, Inputs& in) {
  const int n = std::max(s.seqlen_q, s.seqlen_kv);
  in.ids = document_ids(n, rng);
  for (int32_t id : in.ids)
    in.seg.push_back(0.5f * static_cast<float>(id) - 3.0f);
  in.ids_dev = DeviceTensor::from_host(ctx, DType::I32, {n}, in.ids.data());
  in.seg_dev = DeviceTensor::from_host(ctx, DType::F32, {n}, in.seg.data());
  for (const Buffer& b : mods.buffers) {
    const bool ids = b.name() == "doc_id";
    REQUIRE((ids || b.name() == "seg"));
    void* host = ids ? static_cast<void*>(in.ids.data()) : static_cast<void*>(in.seg.data());
    const DType dt = ids ? DType::I32 : DType::F32;
    in.dev.buffers.emplace_back(b.name(), (ids ? in.ids_dev : in.seg_dev).ref());
    in.host.buffers.emplace_back(b.name(), TensorRef::contiguous(host, dt, {n}));
    in.env.buffers[b.name()] = ir::BufferView{host, dt, {n}, {}};
  }
  in.q = random_tensor(rng, DType::BF16, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_qk});
  in.k = random_tensor(rng, DType::BF16, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_qk});
  in.v = random_tensor(rng, DType::BF16, {s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_v});
  in.dq = upload(ctx, in.q);
  in.dk = upload(ctx, in.k);
  in.dv = upload(ctx, in.v);
  if (block_mask) {
    in.block_mask.emplace(
        create_block_mask(ctx, mask_only(mods), s.batch, 1, s.seqlen_q, s.seqlen_kv, 128, in.dev));
  }
}

AttentionShape shape_of(size_t i) {
  AttentionShape s;
  s.batch = 1;
  s.heads_q = 4;
  s.heads_kv = 2;  // GQA 2:1
  s.seqlen_q = i % 2 == 0 ? 700 : 517;
  s.seqlen_kv = 700;
  s.head_dim_qk = s.head_dim_v = 128;
  return s;
}

AttentionOptions options_of(const DocCase& kc, Inputs& in) {
  AttentionOptions o;
  o.mods = kc.mods;
  o.bindings = in.dev;
  o.block_mask = in.block_mask ? &*in.block_mask : nullptr;
  o.return_lse = true;
  return o;
}

}  // namespace

TEST_CASE("document masks on sm_90a: the forward matches the fp64 reference",
          "[gpu][forward][document]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!sm90a_wgmma_selectable(*ctx)) return;
  ForwardFamilyScope family_scope("sm90a_wgmma");
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const std::vector<DocCase> cases = doc_cases();
  for (size_t i = 0; i < cases.size(); ++i) {
    for (bool block_mask : {false, true}) {
      const AttentionShape s = shape_of(i);
      const std::string label =
          fmt::format("{}{} Sq={} Skv={} (seed {})", cases[i].label,
                      block_mask ? " block mask" : "", s.seqlen_q, s.seqlen_kv, seed);
      INFO(label);
      Inputs in;
      make_inputs(*ctx, cases[i].mods, s, block_mask, rng, in);
      const AttentionResult r = flex_attention(*ctx, in.dq, in.dk, in.dv, options_of(cases[i], in));
      ctx->synchronize();
      const float scale = static_cast<float>(1.0 / std::sqrt(128.0));
      const ReferenceResult ref = cpu_reference_attention(cases[i].mods, s, in.q.values,
                                                          in.k.values, in.v.values, scale, in.env);
      check_forward_f64(download(r.out), download(r.lse), ref, label);
    }
  }
}

TEST_CASE("document masks on sm_90a: the backward matches the fp64 reference",
          "[gpu][backward][document]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  if (!sm90a_wgmma_selectable(*ctx)) return;
  BackwardFamilyScope family_scope("sm90a_wgmma");
  ForwardFamilyScope forward_scope("sm90a_wgmma");
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const std::vector<DocCase> cases = doc_cases();
  for (size_t i = 0; i < cases.size(); ++i) {
    // dQ by the second pass without a block mask, by atomics from dK/dV with one (the two dQ
    // kernels' partial tiles).
    const bool block_mask = i % 2 == 1;
    const AttentionShape s = shape_of(i / 2);
    const std::string label =
        fmt::format("{}{} Sq={} Skv={} (seed {})", cases[i].label, block_mask ? " block mask" : "",
                    s.seqlen_q, s.seqlen_kv, seed);
    INFO(label);
    Inputs in;
    make_inputs(*ctx, cases[i].mods, s, block_mask, rng, in);
    const HostTensor dout =
        random_tensor(rng, DType::BF16, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v});
    const DeviceTensor ddout = upload(*ctx, dout);
    const AttentionOptions o = options_of(cases[i], in);
    AttentionResult fwd = flex_attention(*ctx, in.dq, in.dk, in.dv, o);
    BackwardOptions bo;
    bo.dq_mode = block_mask ? BackwardOptions::DqMode::Atomic : BackwardOptions::DqMode::SecondPass;
    BackwardResult g =
        flex_attention_backward(*ctx, in.dq, in.dk, in.dv, fwd.out, fwd.lse, ddout, o, bo);
    ctx->synchronize();
    check_backward_f64(cases[i].mods, in.host, in.q, in.k, in.v, dout, fwd, g, label);
  }
}
