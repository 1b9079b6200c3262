// AttentionOptions::check_buffers on the GPU (issue 34: buffer indices that only the device
// knows). A document-id buffer holding a value past the end of the per-document bias it indexes
// (doc_bias[doc_id[q_idx]]) is a RuntimeError naming the buffer, the index, the extent, the load
// and the position, after a kernel that did not fault (the context serves the next call); with
// valid data the checked kernels give the unchecked kernels' output, and both match the CPU fp64
// reference. The forward (sm80_mma and, on sm_90a, sm90a_wgmma with the diagonal and column
// loads), the backward, split-KV decoding (contiguous and on a KV cache) and create_block_mask.
// Codegen, layout and NVRTC compiles without a GPU: tests/unit/test_check_buffers.cpp.
#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/device_tensor.h>
#include <flexjit/error.h>
#include <flexjit/paged_kv.h>

#include "cpu/ForwardKernel.h"
#include "gpu/GpuTestUtil.h"
#include "runtime/CreateBlockMask.h"
#include "support/CacheTest.h"
#include "support/CliPath.h"
#include "util/Npy.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

using namespace flexjit;
using namespace flexjit::test;

namespace {

constexpr int64_t kB = 2, kH = 4, kS = 200, kD = 64, kDocs = 5;

// Documents of 40 positions, a bias per document, and a relative-position table of 2S - 1
// entries read at q_idx - kv_idx + off (a diagonal load on sm_90a). off = S - 1 keeps it in
// bounds.
const char* const kMods =
    "buffer doc_id: i32[S]\n"
    "buffer doc_bias: f32[N]\n"
    "buffer rel: f32[R]\n"
    "param off: i32 = 199\n"
    "score_mod = score + doc_bias[doc_id[q_idx]] + rel[q_idx - kv_idx + off]\n"
    "mask_mod = doc_id[q_idx] == doc_id[kv_idx] || kv_idx < 8\n";

struct Inputs {
  Mods mods = parse_mods(kMods, "doc_bias.fx");
  HostTensor q, k, v, dout;
  std::vector<int32_t> doc;
  std::vector<float> bias, rel;
  DeviceTensor dq, dk, dv, ddout, ddoc, dbias, drel;

  Inputs(Context& ctx, std::mt19937_64& rng) {
    q = random_tensor(rng, DType::BF16, {kB, kH, kS, kD});
    k = random_tensor(rng, DType::BF16, {kB, kH, kS, kD});
    v = random_tensor(rng, DType::BF16, {kB, kH, kS, kD});
    dout = random_tensor(rng, DType::BF16, {kB, kH, kS, kD});
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    doc.resize(kS);
    for (int64_t i = 0; i < kS; ++i)
      doc[static_cast<size_t>(i)] = static_cast<int32_t>(i / (kS / kDocs));
    bias.resize(kDocs);
    for (float& x : bias)
      x = u(rng);
    rel.resize(2 * kS - 1);
    for (float& x : rel)
      x = 0.5f * u(rng);
    dq = upload(ctx, q);
    dk = upload(ctx, k);
    dv = upload(ctx, v);
    ddout = upload(ctx, dout);
    ddoc = DeviceTensor::from_host(ctx, DType::I32, {kS}, doc.data());
    dbias = DeviceTensor::from_host(ctx, DType::F32, {kDocs}, bias.data());
    drel = DeviceTensor::from_host(ctx, DType::F32, {2 * kS - 1}, rel.data());
  }

  AttentionOptions options(const std::string& variant, bool check) const {
    AttentionOptions o;
    o.mods = mods;
    o.bindings.buffers = {{"doc_id", ddoc.ref()}, {"doc_bias", dbias.ref()}, {"rel", drel.ref()}};
    o.variant = variant;
    o.return_lse = true;
    o.check_buffers = check;
    return o;
  }

  // The CPU fp64 forward on the same (bf16-rounded) values.
  std::vector<double> reference() const {
    auto host = [](const HostTensor& t) {
      return TensorRef::contiguous(const_cast<float*>(t.values.data()), DType::F32, t.shape);
    };
    ModBindings b;
    b.buffers = {
        {"doc_id", TensorRef::contiguous(const_cast<int32_t*>(doc.data()), DType::I32, {kS})},
        {"doc_bias", TensorRef::contiguous(const_cast<float*>(bias.data()), DType::F32, {kDocs})},
        {"rel", TensorRef::contiguous(const_cast<float*>(rel.data()), DType::F32, {2 * kS - 1})}};
    std::vector<double> out(static_cast<size_t>(kB * kH * kS * kD)),
        lse(static_cast<size_t>(kB * kH * kS));
    cpu::cpu_attention_forward_f64(mods, b, host(q), host(k), host(v), out.data(), lse.data(), {});
    return out;
  }

  void set_doc(int64_t i, int32_t value) {
    doc[static_cast<size_t>(i)] = value;
    ddoc.copy_from_host(doc.data());
  }
};

std::vector<std::string> variants(Context& ctx) {
  std::vector<std::string> v = {"sm80_mma"};
  if (ctx.arch() == "sm_90a") v.push_back("sm90a_wgmma");
  return v;
}

}  // namespace

TEST_CASE("check_buffers: the forward names an out-of-bounds buffer index and keeps running",
          "[gpu][check_buffers][forward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (const std::string& variant : variants(*ctx)) {
    INFO(variant << " seed " << seed);
    Inputs in(*ctx, rng);
    // Valid data: the checked kernel's output is the unchecked one's, and the reference's.
    const AttentionResult plain =
        flex_attention(*ctx, in.dq, in.dk, in.dv, in.options(variant, false));
    const AttentionResult checked =
        flex_attention(*ctx, in.dq, in.dk, in.dv, in.options(variant, true));
    const std::vector<float> out_plain = download(plain.out), out_checked = download(checked.out);
    // (The checked kernel's code differs around its loads only; the compiler may contract a
    // multiply-add differently, so allow a last-bit difference before the bf16 rounding.)
    const ErrorStats same = compare(out_checked, out_plain);
    INFO("checked vs unchecked " << same.str());
    CHECK(same.rel <= 2e-3);
    CHECK(compare(download(checked.lse), download(plain.lse)).max_abs <= 1e-4);
    const ErrorStats e = compare(out_checked, in.reference());
    INFO("checked vs fp64 " << e.str());
    CHECK(e.nonfinite == 0);
    CHECK(e.rel <= tolerance(DType::BF16));

    // Document 7 at q_idx 150: doc_bias has 5 entries.
    in.set_doc(150, 7);
    CHECK_THROWS_AS(flex_attention(*ctx, in.dq, in.dk, in.dv, in.options(variant, true)),
                    RuntimeError);
    try {
      flex_attention(*ctx, in.dq, in.dk, in.dv, in.options(variant, true));
    } catch (const RuntimeError& err) {
      const std::string msg = err.what();
      INFO(msg);
      CHECK_THAT(msg, Catch::StartsWith("buffer 'doc_bias': index 7 is out of bounds for dim 0 of "
                                        "extent 5 (at doc_bias[7]): the score_mod's load "
                                        "doc_bias[doc_id[q_idx]] at b="));
      CHECK_THAT(msg, Catch::Contains(", q_idx=150, kv_idx=") &&
                          Catch::Contains("found by check_buffers on the GPU") &&
                          Catch::EndsWith("fix the entries of 'doc_id' that it is computed from, "
                                          "or bind a larger 'doc_bias'"));
    }
    // An index a billion entries past the end: the checked load reads nothing, the kernel does
    // not fault, and the context serves the next call.
    in.set_doc(150, 1000000000);
    CHECK_THROWS_WITH(flex_attention(*ctx, in.dq, in.dk, in.dv, in.options(variant, true)),
                      Catch::StartsWith("buffer 'doc_bias': index 1000000000 is out of bounds"));
    in.set_doc(150, 150 / (kS / kDocs));
    const AttentionResult again =
        flex_attention(*ctx, in.dq, in.dk, in.dv, in.options(variant, true));
    CHECK(compare(download(again.out), out_checked).rel == 0);  // the same kernel again

    // The relative-position table read past its start: the diagonal load on sm_90a.
    AttentionOptions o = in.options(variant, true);
    o.bindings.params = {{"off", 150.0}};
    CHECK_THROWS_WITH(flex_attention(*ctx, in.dq, in.dk, in.dv, o),
                      Catch::StartsWith("buffer 'rel': index -") &&
                          Catch::Contains("out of bounds for dim 0 of extent 399 (at rel[-") &&
                          Catch::Contains("the score_mod's load rel[q_idx - kv_idx + off]") &&
                          Catch::EndsWith("fix the param 'off' that it is computed from, or "
                                          "bind a larger 'rel'"));
  }
}

TEST_CASE("check_buffers: the backward names an out-of-bounds buffer index",
          "[gpu][check_buffers][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  Inputs in(*ctx, rng);
  const AttentionResult fwd = flex_attention(*ctx, in.dq, in.dk, in.dv, in.options("", false));
  // Valid data: the same gradients with the check. Deterministic, so that no atomic order
  // differs between the two.
  BackwardOptions det;
  det.deterministic = true;
  const BackwardResult plain = flex_attention_backward(*ctx, in.dq, in.dk, in.dv, fwd.out, fwd.lse,
                                                       in.ddout, in.options("", false), det);
  const BackwardResult checked = flex_attention_backward(
      *ctx, in.dq, in.dk, in.dv, fwd.out, fwd.lse, in.ddout, in.options("", true), det);
  for (auto [name, a, b] :
       {std::tuple{"dq", &checked.dq, &plain.dq}, std::tuple{"dk", &checked.dk, &plain.dk},
        std::tuple{"dv", &checked.dv, &plain.dv}}) {
    const ErrorStats e = compare(download(*a), download(*b));
    INFO(name << " " << e.str());
    CHECK(e.nonfinite == 0);
    CHECK(e.rel <= 2e-3);
  }
  for (const auto& [name, g] : checked.buffer_grads) {
    const DeviceTensor* base = nullptr;
    for (const auto& [n, t] : plain.buffer_grads)
      if (n == name) base = &t;
    REQUIRE(base != nullptr);
    const ErrorStats e = compare(download(g), download(*base));
    INFO(name << " gradient " << e.str());
    CHECK(e.rel <= 1e-3);
  }
  in.set_doc(17, -3);
  CHECK_THROWS_WITH(
      flex_attention_backward(*ctx, in.dq, in.dk, in.dv, fwd.out, fwd.lse, in.ddout,
                              in.options("", true)),
      Catch::StartsWith("buffer 'doc_bias': index -3 is out of bounds for dim 0 of extent 5 (at "
                        "doc_bias[-3])") &&
          Catch::Contains("q_idx=17"));
}

TEST_CASE("check_buffers: split-KV decoding names an out-of-bounds buffer index",
          "[gpu][check_buffers][decode]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  // Per-key document biases read at kv_idx: decoding's keys.
  const Mods mods = parse_mods(
      "buffer doc_id: i32[S]\nbuffer doc_bias: f32[N]\n"
      "score_mod = score + doc_bias[doc_id[kv_idx]]\n",
      "kv_doc_bias.fx");
  const HostTensor q = random_tensor(rng, DType::BF16, {kB, kH, 1, kD});
  const HostTensor k = random_tensor(rng, DType::BF16, {kB, kH, kS, kD});
  const HostTensor v = random_tensor(rng, DType::BF16, {kB, kH, kS, kD});
  const DeviceTensor dq = upload(*ctx, q), dk = upload(*ctx, k), dv = upload(*ctx, v);
  std::vector<int32_t> doc(kS);
  for (int64_t i = 0; i < kS; ++i)
    doc[static_cast<size_t>(i)] = static_cast<int32_t>(i % kDocs);
  std::vector<float> bias = {0.5f, -0.25f, 1.0f, 0.0f, -1.5f};
  DeviceTensor ddoc = DeviceTensor::from_host(*ctx, DType::I32, {kS}, doc.data());
  const DeviceTensor dbias = DeviceTensor::from_host(*ctx, DType::F32, {kDocs}, bias.data());
  std::vector<int32_t> lens = {static_cast<int32_t>(kS), 120};
  const DeviceTensor dlens = DeviceTensor::from_host(*ctx, DType::I32, {kB}, lens.data());
  KvCache cache;
  cache.seq_lens = dlens.ref();
  auto options = [&](bool check, bool kv_cache) {
    AttentionOptions o;
    o.mods = mods;
    o.bindings.buffers = {{"doc_id", ddoc.ref()}, {"doc_bias", dbias.ref()}};
    o.check_buffers = check;
    if (kv_cache) o.kv_cache = &cache;
    return o;
  };
  for (bool kv_cache : {false, true}) {
    INFO((kv_cache ? "KV cache" : "contiguous"));
    doc[150] = 150 % kDocs;
    ddoc.copy_from_host(doc.data());
    const AttentionResult plain = flex_attention(*ctx, dq, dk, dv, options(false, kv_cache));
    const AttentionResult checked = flex_attention(*ctx, dq, dk, dv, options(true, kv_cache));
    CHECK(compare(download(checked.out), download(plain.out)).rel <= 2e-3);
    // Key 150: read by both sequences when contiguous; on the KV cache by sequence 0 (200
    // keys), not by sequence 1 (120).
    doc[150] = 5;
    ddoc.copy_from_host(doc.data());
    CHECK_THROWS_WITH(flex_attention(*ctx, dq, dk, dv, options(true, kv_cache)),
                      Catch::StartsWith("buffer 'doc_bias': index 5 is out of bounds for dim 0 of "
                                        "extent 5 (at doc_bias[5]): the score_mod's load "
                                        "doc_bias[doc_id[kv_idx]] at b=") &&
                          Catch::Contains(kv_cache ? "at b=0, h=" : ", h=") &&
                          Catch::Contains(", kv_idx=150"));
  }
  lens[0] = 100;  // no sequence reaches key 150 now
  const DeviceTensor shorter = DeviceTensor::from_host(*ctx, DType::I32, {kB}, lens.data());
  cache.seq_lens = shorter.ref();
  CHECK_NOTHROW(flex_attention(*ctx, dq, dk, dv, options(true, true)));
}

TEST_CASE("check_buffers: create_block_mask names an out-of-bounds buffer index",
          "[gpu][check_buffers][block_mask]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  // Each document's first position, read through the document id: a block-causal document mask.
  const Mods mods = parse_mods(
      "buffer doc_id: i32[S]\nbuffer doc_start: i32[N]\n"
      "mask_mod = kv_idx >= doc_start[doc_id[q_idx]] && kv_idx <= q_idx\n",
      "doc_start.fx");
  std::vector<int32_t> doc(kS), start(kDocs);
  for (int64_t i = 0; i < kS; ++i)
    doc[static_cast<size_t>(i)] = static_cast<int32_t>(i / (kS / kDocs));
  for (int64_t d = 0; d < kDocs; ++d)
    start[static_cast<size_t>(d)] = static_cast<int32_t>(d * (kS / kDocs));
  DeviceTensor ddoc = DeviceTensor::from_host(*ctx, DType::I32, {kS}, doc.data());
  const DeviceTensor dstart = DeviceTensor::from_host(*ctx, DType::I32, {kDocs}, start.data());
  ModBindings b;
  b.buffers = {{"doc_id", ddoc.ref()}, {"doc_start", dstart.ref()}};
  runtime::BlockMaskBuildOptions checked, plain;
  checked.check_buffers = true;
  // Every tile on the GPU, so that the build kernel evaluates the mask_mod everywhere.
  checked.host_analysis = plain.host_analysis = false;
  const DeviceBlockMask want =
      runtime::create_block_mask_with(*ctx, mods, 1, 1, kS, kS, 64, b, plain);
  const DeviceBlockMask got =
      runtime::create_block_mask_with(*ctx, mods, 1, 1, kS, kS, 64, b, checked);
  for (auto [a, w] : {std::pair{&got.kv_num_blocks, &want.kv_num_blocks},
                      std::pair{&got.full_kv_num_blocks, &want.full_kv_num_blocks},
                      std::pair{&got.q_num_blocks, &want.q_num_blocks}}) {
    CHECK(a->to_host<int32_t>() == w->to_host<int32_t>());
  }
  doc[99] = 11;
  ddoc.copy_from_host(doc.data());
  CHECK_THROWS_WITH(runtime::create_block_mask_with(*ctx, mods, 1, 1, kS, kS, 64, b, checked),
                    Catch::StartsWith("buffer 'doc_start': index 11 is out of bounds for dim 0 of "
                                      "extent 5 (at doc_start[11]): the mask_mod's load "
                                      "doc_start[doc_id[q_idx]] at b=0, h=0, q_idx=99, kv_idx="));
}

TEST_CASE("flexjit run --check-buffers on the GPU names the first out-of-bounds load",
          "[gpu][check_buffers][cli]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  test::TempDir dir;
  const std::string mods = (dir.path() / "doc_start.fx").string();
  {
    std::FILE* f = std::fopen(mods.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs(
        "buffer doc_id: i32[S]\nbuffer doc_start: i32[N]\n"
        "mask_mod = kv_idx >= doc_start[doc_id[q_idx]] && kv_idx <= q_idx\n",
        f);
    std::fclose(f);
  }
  npy::Array doc = npy::make_array(DType::I32, {kS});
  for (int64_t i = 0; i < kS; ++i)
    doc.as<int32_t>()[i] = static_cast<int32_t>(i / (kS / kDocs));
  npy::Array start = npy::make_array(DType::I32, {kDocs});
  for (int64_t d = 0; d < kDocs; ++d)
    start.as<int32_t>()[d] = static_cast<int32_t>(d * (kS / kDocs));
  const std::string doc_path = (dir.path() / "doc.npy").string();
  const std::string start_path = (dir.path() / "start.npy").string();
  npy::write(doc_path, doc);
  npy::write(start_path, start);
  const std::string args = "run --device cuda --mods " + mods + " --random 1,2," +
                           std::to_string(kS) + ",64 --buffer doc_id=" + doc_path +
                           " --buffer doc_start=" + start_path + " --check-buffers --check";
  std::string output;
  CHECK(test::run_cli(args, &output) == 0);
  INFO(output);
  CHECK_THAT(output, Catch::Contains("max relative error vs the fp64 CPU reference"));
  doc.as<int32_t>()[100] = 9;
  npy::write(doc_path, doc);
  CHECK(test::run_cli(args, &output) == 1);
  CHECK_THAT(output, Catch::Contains("buffer 'doc_start': index 9 is out of bounds for dim 0 of "
                                     "extent 5 (at doc_start[9]): the mask_mod's load "
                                     "doc_start[doc_id[q_idx]] at b=0, h=") &&
                         Catch::Contains("q_idx=100"));
}
