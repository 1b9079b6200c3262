// AttentionOptions::check_buffers without a GPU: the generated source with and without the
// checks (unchecked sources, descriptions and hashes unchanged), the FjModParams layout and
// packing with the extents and the record, NVRTC compiles of the checked forward, backward,
// decode and block-mask kernels on sm_80 and sm_90a, the error text, and the CPU backend's check
// through the C++ API and the CLI. The GPU runs are in tests/gpu/test_check_buffers.cpp
// ([gpu][check_buffers]).
#include <flexjit/cpu.h>
#include <flexjit/error.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>
#include <flexjit/paged_kv.h>

#include "Pipeline.h"
#include "binding/BufferCheck.h"
#include "binding/ModArgs.h"
#include "binding/ModParamLayout.h"
#include "codegen/cuda/ModCodegen.h"
#include "ir/Printer.h"
#include "kernels/BufferChecks.h"
#include "kernels/KernelQuery.h"
#include "support/CacheTest.h"
#include "support/CliPath.h"
#include "util/Npy.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace flexjit;

namespace {

// Every kind of load the codegen checks: a load whose index is another load's value (the
// score_mod's doc_bias[doc_id[q_idx]]), a diagonal site (rel[q_idx - kv_idx + 64], kFjDiagLoad),
// the mask_mod's column load (doc_id[kv_idx], kFjColLoad) and a sink_mod's load.
const char* const kMods =
    "buffer doc_id: i32[S]\n"
    "buffer doc_bias: f32[N]\n"
    "buffer rel: f32[R]\n"
    "buffer sinks: f32[H]\n"
    "score_mod = score + doc_bias[doc_id[q_idx]] + rel[q_idx - kv_idx + 64]\n"
    "mask_mod = doc_id[q_idx] == doc_id[kv_idx]\n"
    "sink_mod = sinks[h]\n";

Mods checked_mods() {
  return parse_mods(kMods, "checked.fx");
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1))
    ++n;
  return n;
}

// The body of the first function named `name` in a generated source.
std::string function_body(const std::string& src, const std::string& name) {
  const size_t at = src.find(name + "(const FjModParams& mp");
  REQUIRE(at != std::string::npos);
  const size_t open = src.find('{', at);
  const size_t close = src.find("\n}", open);
  REQUIRE(close != std::string::npos);
  return src.substr(open, close - open);
}

KernelQuery query(const std::string& family, const std::string& arch) {
  KernelQuery q;
  q.family = family;
  q.arch = arch;
  q.dtype = DType::BF16;
  q.head_dim_qk = 64;
  return q;
}

kernels::KernelDesc checked(kernels::KernelDesc d) {
  kernels::set_buffer_checks(d);
  return d;
}

}  // namespace

TEST_CASE("check_buffers: every load of the checked source is guarded; unchecked sources unchanged",
          "[check_buffers][codegen]") {
  const Mods m = lower_mods(checked_mods());
  const std::string off = cuda::generate_mod_functions(m);
  const std::string on =
      cuda::generate_mod_functions(m, cuda::MathFunctions::Exact, cuda::BufferChecks::Record);
  // Off is the source as it was before the option existed (the goldens hold it byte for byte).
  CHECK(off ==
        cuda::generate_mod_functions(m, cuda::MathFunctions::Exact, cuda::BufferChecks::Off));
  CHECK_THAT(off, !Catch::Contains("fj_in_extent") && !Catch::Contains("check_record") &&
                      !Catch::Contains("extent_"));
  CHECK_THAT(on, Catch::Contains("fj_i64 extent_doc_id[1];") &&
                     Catch::Contains("fj_i64 extent_doc_bias[1];") &&
                     Catch::Contains("unsigned long long* check_record;") &&
                     Catch::Contains("__device__ __noinline__ void fj_buffer_check_fail(") &&
                     Catch::Contains("atomicCAS(rec + 0, 0ull, 1ull)"));
  // Every memory read is behind its in-bounds test ("t ? fj_ld_...(...) : 0").
  CHECK(count(on, "fj_ld_") > 0);
  CHECK(count(on, "fj_ld_") == count(on, "? fj_ld_"));
  // Each load records where it was: the score_mod's three loads and the mask_mod's two at
  // (b, h, q_idx, kv_idx); the diagonal load on diagonal d; the column load at kv_idx; the sink
  // at q_idx. (The record's mod / position codes: binding/BufferCheck.h.)
  const std::string score = function_body(on, "fj_score_mod");
  CHECK(count(score, "fj_buffer_check_fail(mp.check_record") == 3);
  CHECK(count(score, ", 0, 0, b, h, q_idx, kv_idx, 1, ") == 3);  // score_mod, element
  const std::string mask = function_body(on, "fj_mask_mod");
  CHECK(count(mask, ", 1, 0, b, h, q_idx, kv_idx, 1, ") == 2);  // mask_mod, element
  CHECK_THAT(function_body(on, "fj_diag_load_at"), Catch::Contains(", 0, 3, b, h, d, 0, 1, "));
  CHECK_THAT(function_body(on, "fj_col_load_at"), Catch::Contains(", 1, 2, b, h, 0, kv_idx, 1, "));
  CHECK_THAT(function_body(on, "fj_sink_mod"), Catch::Contains(", 2, 1, b, h, q_idx, 0, 1, "));
  // The load's site number names it in the host's message: doc_id[q_idx] is site 0.
  const std::vector<runtime::LoadSite> sites = runtime::load_sites(m);
  REQUIRE(sites.size() == 5);
  CHECK(ir::to_text(sites[0].load) == "doc_id[q_idx]");
  CHECK(ir::to_text(sites[1].load) == "doc_bias[doc_id[q_idx]]");
  CHECK(sites[4].mod == runtime::CheckedMod::SinkMod);

  // The backward's derivatives: the buffer gradients' index loads are checked too.
  const std::string goff = cuda::generate_mod_grad_functions(m);
  const std::string gon = cuda::generate_mod_grad_functions(
      m, cuda::MathFunctions::Exact, cuda::GradAccumulation::Atomic, cuda::BufferChecks::Record);
  CHECK(goff == cuda::generate_mod_grad_functions(m, cuda::MathFunctions::Exact,
                                                  cuda::GradAccumulation::Atomic,
                                                  cuda::BufferChecks::Off));
  CHECK_THAT(goff, !Catch::Contains("fj_buffer_check_fail"));
  CHECK_THAT(function_body(gon, "fj_bufgrad"), Catch::Contains("fj_buffer_check_fail("));
  CHECK(count(gon, "fj_ld_") == count(gon, "? fj_ld_"));

  // Mods without a buffer have nothing to check: the same source either way.
  const Mods causal = lower_mods(standard_mods("causal"));
  CHECK(cuda::generate_mod_functions(causal, cuda::MathFunctions::Exact,
                                     cuda::BufferChecks::Record) ==
        cuda::generate_mod_functions(causal));
}

TEST_CASE("check_buffers: the flag joins the description, its hash and the source only when on",
          "[check_buffers][codegen]") {
  const Mods mods = checked_mods();
  for (const char* family : {"forward", "backward_dkdv", "decode_split", "block_mask"}) {
    INFO(family);
    const kernels::KernelDesc d = kernels::desc_for_query(query(family, "sm_90a"));
    const kernels::KernelDesc c = checked(d);
    // The default description is what it was: no check_buffers in its text, JSON or hash.
    CHECK_THAT(d.str(), !Catch::Contains("check_buffers"));
    CHECK_THAT(emit_kernel(mods, query(family, "sm_90a")).description,
               !Catch::Contains("check_buffers"));
    CHECK(kernels::buffer_checks(d) == cuda::BufferChecks::Off);
    CHECK(kernels::buffer_checks(c) == cuda::BufferChecks::Record);
    CHECK_THAT(c.str(), Catch::Contains(" check_buffers=1"));
    CHECK(c.hash() != d.hash());
    CHECK(kernels::KernelDesc::parse(c.str()) == c);
    CHECK(kernels::KernelDesc::from_json(c.to_json()) == c);
    const cuda::GeneratedSource src_off = emit_source(mods, d);
    const cuda::GeneratedSource src_on = emit_source(mods, c);
    CHECK(src_off.source_key != src_on.source_key);
    CHECK_THAT(src_off.source, !Catch::Contains("fj_buffer_check_fail"));
    CHECK_THAT(src_on.source, Catch::Contains("fj_buffer_check_fail"));
    CHECK(emit_source(mods, d).source == src_off.source);
  }
}

TEST_CASE("check_buffers: FjModParams with checks starts with the unchecked layout",
          "[check_buffers][codegen]") {
  const Mods m = checked_mods();
  const cuda::ModParamLayout off = cuda::layout_of(m);
  const cuda::ModParamLayout on = cuda::layout_of(m, true);
  REQUIRE(on.fields.size() == off.fields.size() + 4 + 1);  // four rank-1 extents, the record
  for (size_t i = 0; i < off.fields.size(); ++i) {
    CHECK(on.fields[i].name == off.fields[i].name);
    CHECK(on.fields[i].offset == off.fields[i].offset);
  }
  CHECK(on.fields[off.fields.size()].name == "extent_doc_id[0]");
  CHECK(on.fields[off.fields.size()].offset == off.size);
  CHECK(on.fields.back().name == "check_record");
  CHECK(on.size == off.size + 8 * 5);
  // Without a buffer there is nothing to check: the layout is the unchecked one.
  const Mods causal = standard_mods("causal");
  CHECK(cuda::layout_of(causal, true).size == cuda::layout_of(causal).size);
  CHECK(cuda::layout_of(causal, true).fields.empty());

  // The packed bytes: the unchecked ones, then the bound extents and the record's address.
  std::vector<int> doc(64, 0);
  std::vector<float> bias(3), rel(128), sinks(8);
  ModBindings bindings;
  const auto gpu = TensorRef::Device::CUDA;
  bindings.buffers = {{"doc_id", TensorRef::contiguous(doc.data(), DType::I32, {64}, gpu)},
                      {"doc_bias", TensorRef::contiguous(bias.data(), DType::F32, {3}, gpu)},
                      {"rel", TensorRef::contiguous(rel.data(), DType::F32, {128}, gpu)},
                      {"sinks", TensorRef::contiguous(sinks.data(), DType::F32, {8}, gpu)}};
  const runtime::BoundModArgs bound = runtime::bind_mod_args(m, bindings, gpu);
  const std::vector<uint64_t> plain = runtime::pack_mod_params(m, bound);
  unsigned long long record[runtime::kBufferCheckWords] = {};
  const std::vector<uint64_t> words = runtime::pack_mod_params(m, bound, record);
  REQUIRE(words.size() * 8 == static_cast<size_t>(on.size));
  CHECK(std::vector<uint64_t>(words.begin(), words.begin() + plain.size()) == plain);
  const size_t first = plain.size();
  CHECK(words[first] == 64);     // doc_id's extent
  CHECK(words[first + 1] == 3);  // doc_bias's
  CHECK(words[first + 2] == 128);
  CHECK(words[first + 3] == 8);
  CHECK(words[first + 4] == reinterpret_cast<uintptr_t>(record));
}

TEST_CASE("check_buffers: checked kernels compile for sm_80 and sm_90a", "[check_buffers][nvrtc]") {
  jit::CacheSettings settings;
  settings.enabled = false;  // real NVRTC compiles
  KernelBuilder builder(settings);
  const Mods mods = checked_mods();
  // The forward, the backward's dK/dV and dQ kernels, decoding's split and combine (the
  // sink_mod's buffer reaches the combine) and the block mask's build.
  for (const char* arch : {"sm_80", "sm_90a"}) {
    for (const char* family : {"forward", "backward_dkdv", "backward_dq", "decode_split",
                               "decode_combine", "block_mask"}) {
      // decode_combine and block_mask: one variant each, templates that do not depend on the
      // arch (compiled for sm_80 only).
      const std::string f = family;
      if (std::string(arch) == "sm_90a" && (f == "decode_combine" || f == "block_mask")) continue;
      const kernels::KernelDesc d = checked(kernels::desc_for_query(query(family, arch)));
      INFO(d.str());
      const BuiltKernel k = builder.build(mods, d);
      CHECK_THAT(k.source->source, Catch::Contains("fj_buffer_check_fail("));
      CHECK(k.compiled.kernel->usage.registers > 0);
      std::printf("  %s: %s\n", d.str().substr(0, d.str().find(" |")).c_str(),
                  k.compiled.kernel->usage.str().c_str());
    }
  }
}

TEST_CASE("check_buffers: the error names the buffer, index, extent, load, position and fix",
          "[check_buffers][errors]") {
  const Mods m = lower_mods(checked_mods());
  std::vector<int> doc(64, 0);
  std::vector<float> bias(3), rel(128), sinks(8);
  ModBindings bindings;
  bindings.buffers = {{"doc_id", TensorRef::contiguous(doc.data(), DType::I32, {64})},
                      {"doc_bias", TensorRef::contiguous(bias.data(), DType::F32, {3})},
                      {"rel", TensorRef::contiguous(rel.data(), DType::F32, {128})},
                      {"sinks", TensorRef::contiguous(sinks.data(), DType::F32, {8})}};
  const runtime::BoundModArgs bound = runtime::bind_mod_args(m, bindings, TensorRef::Device::CPU);
  using namespace runtime::buffer_check;
  std::vector<int64_t> r(kWords, 0);
  r[kClaimed] = 1;
  r[kSite] = 1;  // doc_bias[doc_id[q_idx]]
  r[kBuffer] = 1;
  r[kDim] = 0;
  r[kIndex] = 7;
  r[kMod] = 0;
  r[kAt] = 0;
  r[kB] = 1;
  r[kH] = 2;
  r[kQ] = 37;
  r[kKv] = 5;
  r[kIndices] = 7;
  CHECK(runtime::buffer_check_message(m, bound, r) ==
        "buffer 'doc_bias': index 7 is out of bounds for dim 0 of extent 3 (at doc_bias[7]): the "
        "score_mod's load doc_bias[doc_id[q_idx]] at b=1, h=2, q_idx=37, kv_idx=5, found by "
        "check_buffers on the GPU (the first out-of-bounds load the kernels recorded; it read 0 "
        "there). Every index a mod computes must lie in [0, extent) at every position of the "
        "call, in both branches of a where(): fix the entries of 'doc_id' that it is computed "
        "from, or bind a larger 'doc_bias'");
  // The diagonal load: its position is the diagonal.
  r[kSite] = 2;
  r[kBuffer] = 2;
  r[kIndex] = r[kIndices] = 200;
  r[kAt] = static_cast<int64_t>(runtime::CheckPosition::Diagonal);
  r[kQ] = 136;
  CHECK_THAT(runtime::buffer_check_message(m, bound, r),
             Catch::StartsWith("buffer 'rel': index 200 is out of bounds for dim 0 of extent 128 "
                               "(at rel[200]): the score_mod's load rel[q_idx - kv_idx + 64] at "
                               "b=1, h=2 on the diagonal q_idx - kv_idx = 136") &&
                 Catch::EndsWith("fix the index expression, or bind a larger 'rel'"));
}

TEST_CASE("check_buffers on the CPU backend: an index computed from data is an error, not clamped",
          "[check_buffers][cpu][errors]") {
  const int64_t B = 2, H = 2, S = 64, D = 16;
  std::mt19937 rng(5);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> q(B * H * S * D), k(q.size()), v(q.size());
  for (auto* x : {&q, &k, &v})
    for (float& e : *x)
      e = n01(rng);
  const TensorRef tq = TensorRef::contiguous(q.data(), DType::F32, {B, H, S, D});
  const TensorRef tk = TensorRef::contiguous(k.data(), DType::F32, {B, H, S, D});
  const TensorRef tv = TensorRef::contiguous(v.data(), DType::F32, {B, H, S, D});
  // Four documents of 16 positions; one bias per document.
  std::vector<int> doc(S);
  for (int64_t i = 0; i < S; ++i)
    doc[static_cast<size_t>(i)] = static_cast<int>(i / 16);
  std::vector<float> bias = {0.5f, -1.0f, 2.0f, 0.25f};
  AttentionOptions o;
  o.mods = parse_mods(
      "buffer doc_id: i32[S]\nbuffer doc_bias: f32[N]\n"
      "score_mod = score + doc_bias[doc_id[q_idx]]\nmask_mod = doc_id[q_idx] == doc_id[kv_idx]\n",
      "doc_bias.fx");
  o.bindings.buffers = {{"doc_id", TensorRef::contiguous(doc.data(), DType::I32, {S})},
                        {"doc_bias", TensorRef::contiguous(bias.data(), DType::F32, {4})}};
  // Valid data: the check changes nothing.
  const CpuAttentionResult plain = flex_attention_cpu(tq, tk, tv, o);
  o.check_buffers = true;
  const CpuAttentionResult with_check = flex_attention_cpu(tq, tk, tv, o);
  CHECK(plain.out == with_check.out);

  // Document 9 at q_idx 37..39: doc_bias has 4 entries. Unchecked, the load is clamped (a
  // silently different answer); checked, the first bad position is named.
  for (int i = 37; i < 40; ++i)
    doc[static_cast<size_t>(i)] = 9;
  o.check_buffers = false;
  CHECK_NOTHROW(flex_attention_cpu(tq, tk, tv, o));
  o.check_buffers = true;
  CHECK_THROWS_AS(flex_attention_cpu(tq, tk, tv, o), RuntimeError);
  CHECK_THROWS_WITH(
      flex_attention_cpu(tq, tk, tv, o),
      Catch::StartsWith("buffer 'doc_bias': index 9 is out of bounds for dim 0 of extent 4 (at "
                        "doc_bias[9]): the score_mod's load doc_bias[doc_id[q_idx]] at b=0, h=0, "
                        "q_idx=37, kv_idx=0, found by check_buffers before the CPU kernels ran") &&
          Catch::EndsWith("fix the entries of 'doc_id' that it is computed from, or bind a larger "
                          "'doc_bias'"));

  // A KV cache: only each sequence's keys count. Sequence 1 holds 30 keys; a document id of -1
  // past them is never read, one before them is.
  for (int i = 37; i < 40; ++i)
    doc[static_cast<size_t>(i)] = 2;
  AttentionOptions kv = o;
  kv.mods = parse_mods(
      "buffer doc_id: i32[S]\nbuffer doc_bias: f32[N]\n"
      "score_mod = score + doc_bias[doc_id[kv_idx]]\n",
      "kv_bias.fx");
  std::vector<int> lens = {64, 30};
  KvCache cache;
  cache.seq_lens = TensorRef::contiguous(lens.data(), DType::I32, {B});
  kv.kv_cache = &cache;
  const TensorRef q1 = TensorRef::contiguous(q.data(), DType::F32, {B, H, 1, D});
  CHECK_NOTHROW(flex_attention_cpu(q1, tk, tv, kv));
  doc[45] = -1;  // read by sequence 0 (64 keys), not by sequence 1
  CHECK_THROWS_WITH(flex_attention_cpu(q1, tk, tv, kv),
                    Catch::StartsWith("buffer 'doc_bias': index -1 is out of bounds for dim 0 of "
                                      "extent 4 (at doc_bias[-1]): the score_mod's load "
                                      "doc_bias[doc_id[kv_idx]] at b=0, h=0, q_idx=0, kv_idx=45"));
  lens[0] = 40;  // now no sequence reads key 45
  CHECK_NOTHROW(flex_attention_cpu(q1, tk, tv, kv));
}

TEST_CASE("flexjit run --check-buffers names the first out-of-bounds load on the CPU",
          "[check_buffers][cli][cpu][errors]") {
  test::TempDir dir;
  const std::string mods = (dir.path() / "doc_bias.fx").string();
  {
    std::FILE* f = std::fopen(mods.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs(
        "buffer doc_id: i32[S]\nbuffer doc_bias: f32[N]\n"
        "score_mod = score + doc_bias[doc_id[q_idx]]\n",
        f);
    std::fclose(f);
  }
  npy::Array doc = npy::make_array(DType::I32, {64});
  for (int i = 0; i < 64; ++i)
    doc.as<int>()[i] = i / 16;
  doc.as<int>()[50] = 4;
  npy::Array bias = npy::make_array(DType::F32, {4});
  for (int i = 0; i < 4; ++i)
    bias.as<float>()[i] = 0.5f * static_cast<float>(i);
  const std::string doc_path = (dir.path() / "doc.npy").string();
  const std::string bias_path = (dir.path() / "bias.npy").string();
  npy::write(doc_path, doc);
  npy::write(bias_path, bias);
  const std::string args = "run --device cpu --mods " + mods +
                           " --random 1,2,64,16 --buffer doc_id=" + doc_path +
                           " --buffer doc_bias=" + bias_path;
  std::string output;
  CHECK(test::run_cli(args, &output) == 0);  // unchecked: clamped, silently
  INFO(output);
  CHECK(test::run_cli(args + " --check-buffers", &output) == 1);
  CHECK_THAT(output, Catch::Contains("buffer 'doc_bias': index 4 is out of bounds for dim 0 of "
                                     "extent 4 (at doc_bias[4])") &&
                         Catch::Contains("q_idx=50"));
  CHECK(test::run_cli("run --help", &output) == 0);
  CHECK_THAT(output, Catch::Contains("--check-buffers"));
}
