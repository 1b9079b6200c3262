// e4m3 KV caches without a GPU: validate_kv_cache's checks of the pools, q and the scales; the
// decode_split problem and config of an e4m3 cache (flag kv_e4m3) and its refusals; NVRTC
// compiles of the e4m3 split kernel for sm_89 / sm_90a ([nvrtc]); and the CPU backend on an e4m3
// cache (flex_attention_cpu dequantizes while gathering) against the fp64 reference on the
// dequantized values ([cpu]).
#include <flexjit/attention.h>
#include <flexjit/cpu.h>
#include <flexjit/error.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>
#include <flexjit/paged_kv.h>

#include "Pipeline.h"
#include "ir/Evaluate.h"
#include "kernels/Registry.h"
#include "kernels/decode/Decode.h"
#include "kernels/decode/DecodeSplit.h"
#include "support/CliPath.h"
#include "support/CpuReference.h"
#include "support/Parallel.h"
#include "util/Npy.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <random>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

TensorRef fake_cuda(DType dtype, std::vector<int64_t> shape, uintptr_t addr = 0x100000) {
  return TensorRef::contiguous(reinterpret_cast<void*>(addr), dtype, std::move(shape),
                               TensorRef::Device::CUDA, 0);
}

KernelDesc fp8_desc(const std::string& arch, int dqk, int dv, int gqa, int sq, int page,
                    const Params& overrides = {}, DType dtype = DType::BF16) {
  return Registry::global().complete(
      decode_split_problem(cuda::Arch::parse(arch), dtype, dqk, dv, gqa, decode_rows(gqa, sq), page,
                           /*full_blocks=*/true, /*kv_fp8=*/true),
      InputFacts{}, overrides);
}

}  // namespace

TEST_CASE("decode fp8: validate_kv_cache checks e4m3 pools, q and the scales",
          "[decode][fp8][errors]") {
  const int B = 2, Hkv = 4, D = 128;
  const TensorRef q = fake_cuda(DType::BF16, {B, 8, 1, D});
  const TensorRef k = fake_cuda(DType::E4M3, {10, 16, Hkv, D});
  const TensorRef v = fake_cuda(DType::E4M3, {10, 16, Hkv, D});
  KvCache cache;
  cache.seq_lens = fake_cuda(DType::I32, {B});
  cache.page_table = fake_cuda(DType::I32, {B, 3});
  cache.k_scale = fake_cuda(DType::F32, {Hkv});
  cache.v_scale = fake_cuda(DType::F32, {Hkv});
  const KvCacheShape ok = validate_kv_cache(q, k, v, cache);
  CHECK(ok.fp8);
  CHECK(ok.paged);
  CHECK(ok.qkv.heads_kv == Hkv);
  CHECK(ok.qkv.fast_path);
  // Contiguous e4m3 K / V with lengths.
  KvCache ragged = cache;
  ragged.page_table = {};
  CHECK(validate_kv_cache(q, fake_cuda(DType::E4M3, {B, Hkv, 100, D}),
                          fake_cuda(DType::E4M3, {B, Hkv, 100, D}), ragged)
            .fp8);

  auto fails = [&](const KvCache& c, const TensorRef& qq, const TensorRef& kk,
                   const TensorRef& vv) {
    try {
      validate_kv_cache(qq, kk, vv, c);
    } catch (const RuntimeError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  KvCache c = cache;
  c.v_scale = {};
  CHECK_THAT(fails(c, q, k, v),
             Catch::Contains("an e4m3 KV cache needs v_scale: [Hkv] = [4] f32, one "
                             "dequantization scale per kv head"));
  c = cache;
  c.k_scale = fake_cuda(DType::F32, {1});
  CHECK_THAT(fails(c, q, k, v), Catch::Contains("k_scale has shape [1]; expected [Hkv] = [4]"));
  c = cache;
  c.k_scale = fake_cuda(DType::F16, {Hkv});
  CHECK_THAT(fails(c, q, k, v), Catch::Contains("k_scale has dtype f16; expected f32"));
  c = cache;
  std::vector<float> host(Hkv);
  c.v_scale = TensorRef::contiguous(host.data(), DType::F32, {Hkv});
  CHECK_THAT(fails(c, q, k, v), Catch::Contains("v_scale is on cpu but q is on cuda:0"));
  c = cache;
  c.k_scale.strides = {2};
  CHECK_THAT(fails(c, q, k, v), Catch::Contains("k_scale is not contiguous (strides [2])"));
  CHECK_THAT(fails(cache, q, k, fake_cuda(DType::BF16, {10, 16, Hkv, D})),
             Catch::Contains("k is e4m3 and v is bf16; an e4m3 KV cache has both k and v in e4m3"));
  CHECK_THAT(fails(cache, fake_cuda(DType::F32, {B, 8, 1, D}), k, v),
             Catch::Contains("q has dtype f32; with an e4m3 KV cache q is bf16 or f16"));
  CHECK_THAT(
      fails(cache, fake_cuda(DType::BF16, {B, 8, 1, D}), fake_cuda(DType::BF16, {10, 16, Hkv, D}),
            fake_cuda(DType::BF16, {10, 16, Hkv, D})),
      Catch::Contains("the KV cache has k_scale but k and v are bf16; the scales "
                      "dequantize e4m3 pools only"));
  // The shape checks still apply (as for bf16 pools), with the pools' shapes in the message.
  CHECK_THAT(fails(cache, q, k, fake_cuda(DType::E4M3, {10, 8, Hkv, D})),
             Catch::Contains("the k and v pools differ in pages or page size"));
  // Alignment in bytes: an e4m3 head dim of 8 is 8 bytes, and so is the head stride of such a
  // pool (with 2-byte elements both would pass).
  const TensorRef q8 = fake_cuda(DType::BF16, {B, 8, 1, 8});
  const KvCacheShape small = validate_kv_cache(q8, fake_cuda(DType::E4M3, {10, 16, Hkv, 8}),
                                               fake_cuda(DType::E4M3, {10, 16, Hkv, 8}), cache);
  CHECK_FALSE(small.qkv.fast_path);
  CHECK_THAT(small.qkv.fast_path_blocker,
             Catch::Contains("stride of k in dim 2 (8 e4m3 elements = bytes) is not a multiple "
                             "of 16 bytes"));
  // Keys 16 bytes apart (a padded layout): only the head dim is short.
  KvCache one = ragged;
  one.seq_lens = fake_cuda(DType::I32, {1});
  one.k_scale = fake_cuda(DType::F32, {1});
  one.v_scale = fake_cuda(DType::F32, {1});
  TensorRef padded = fake_cuda(DType::E4M3, {1, 1, 32, 8});
  padded.strides = {512, 512, 16, 1};
  const KvCacheShape row =
      validate_kv_cache(fake_cuda(DType::BF16, {1, 1, 1, 8}), padded, padded, one);
  CHECK_FALSE(row.qkv.fast_path);
  CHECK_THAT(row.qkv.fast_path_blocker,
             Catch::Contains("head dim of k (8 e4m3 bytes) is not a multiple of 16 bytes"));
}

TEST_CASE("decode fp8: the e4m3 split problem, its config and refusals", "[decode][fp8][desc]") {
  const KernelDesc d = fp8_desc("sm_90a", 128, 128, 4, 1, 16);
  CHECK(d.str() ==
        "decode_split/sm80_mma sm_90a bf16 d=128/128 gqa=4 fast_math=1 full_blocks=1 kv_e4m3=1 "
        "page_size=16 rows=16 | block_n=64 kv_copy=0 num_splits=0 num_stages=4 num_warps=4");
  CHECK(KernelDesc::parse(d.str()) == d);
  const Variant& v = Registry::global().get(Family::DecodeSplit, "sm80_mma");
  // Q 16 x 256 B and 4 stages of e4m3 K + V 64 x 256 B (converted in registers: no 2-byte tiles).
  CHECK(v.smem_bytes(d) == 16u * 256 + 4 * 64 * 256);
  CHECK_THAT(v.generate(standard_mods("alibi"), d).source, Catch::Contains("kKvFp8 = true;"));
  CHECK_THAT(v.generate(standard_mods("alibi"), fp8_desc("sm_90a", 128, 128, 4, 1, 0)).source,
             Catch::Contains("kKvFp8 = true;"));
  // The bf16 problem's description has no kv_e4m3 flag, and its source kKvFp8 = false.
  const KernelDesc bf16 = Registry::global().complete(
      decode_split_problem(cuda::Arch::parse("sm_90a"), DType::BF16, 128, 128, 4, 16, 16, true),
      InputFacts{});
  CHECK_FALSE(bf16.flags.has("kv_e4m3"));
  CHECK_THAT(v.generate(standard_mods("alibi"), bf16).source, Catch::Contains("kKvFp8 = false;"));
  // Every config of the space validates; no bulk copies for e4m3.
  for (const Params& p : v.config_space(d)) {
    KernelDesc k = d;
    k.config = p;
    CHECK_NOTHROW(v.validate(k));
    CHECK(p.at("kv_copy") == 0);
  }
  CHECK_THROWS_WITH(
      fp8_desc("sm_80", 128, 128, 4, 1, 16),
      Catch::Contains("an e4m3 KV cache needs sm_89 or newer") && Catch::Contains("not sm_80"));
  CHECK_THROWS_WITH(fp8_desc("sm_90a", 72, 72, 4, 1, 16),
                    Catch::Contains("head dims that are multiples of 16") &&
                        Catch::Contains("head_dim_qk is 72"));
  CHECK_THROWS_WITH(fp8_desc("sm_90a", 128, 128, 4, 1, 16, Params{{"kv_copy", 1}}),
                    Catch::Contains("kv_copy = 1 does not take an e4m3 KV cache"));
}

TEST_CASE("decode fp8: the e4m3 split kernel compiles for sm_89 and sm_90a",
          "[decode][fp8][nvrtc]") {
  struct Job {
    std::string mods, arch;
    DType dtype;
    int dqk, dv, gqa, sq, page;
    Params overrides;
  };
  std::vector<Job> jobs;
  for (const std::string arch : {"sm_89", "sm_90a"}) {
    jobs.push_back({"noop", arch, DType::BF16, 128, 128, 4, 1, 0, {}});  // the anchors'
    jobs.push_back({"noop", arch, DType::F16, 128, 128, 4, 4, 16, {}});
    jobs.push_back({"alibi_causal", arch, DType::BF16, 64, 64, 3, 5, 1, {}});
    jobs.push_back({"document_causal", arch, DType::BF16, 64, 64, 8, 16, 64, {}});  // 128 rows
    jobs.push_back({"relative_bias", arch, DType::F16, 256, 256, 1, 1, 256, {}});
    jobs.push_back({"softcap", arch, DType::BF16, 128, 64, 7, 3, 32, {}});
    jobs.push_back({"noop", arch, DType::BF16, 96, 96, 2, 8, 128, {}});
    jobs.push_back({"noop", arch, DType::BF16, 128, 128, 4, 1, 0,
                    Params{{"block_n", 32}, {"num_warps", 2}, {"num_stages", 1}}});
    // Odd chunk counts (the zero chunk after the real dim is read, its mma skipped): 5 / 3 k16
    // steps of K and 16-dim chunks of V, and 13 / 7 in the 256 tile, both q dtypes.
    jobs.push_back({"alibi", arch, DType::BF16, 80, 48, 4, 1, 16, {}});
    jobs.push_back({"noop", arch, DType::F16, 208, 112, 2, 2, 0, {}});
    // bf16 q at d = 256: Q is not kept in registers, so the mainloop stays in bf16 (no f16 Q).
    jobs.push_back({"alibi", arch, DType::BF16, 256, 256, 4, 1, 16, {}});
    // 128-key tiles (2 x 32 KB of stages).
    jobs.push_back({"sliding_window", arch, DType::BF16, 128, 128, 4, 1, 16,
                    Params{{"block_n", 128}, {"num_warps", 4}, {"num_stages", 2}}});
  }
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<int> registers(jobs.size(), -1), spills(jobs.size(), -1);
  std::vector<std::string> names(jobs.size());
  test::run_parallel(jobs.size(), [&](size_t i) {
    const Job& j = jobs[i];
    try {
      const KernelDesc d = fp8_desc(j.arch, j.dqk, j.dv, j.gqa, j.sq, j.page, j.overrides, j.dtype);
      BuiltKernel k = builder.build(standard_mods(j.mods), d);
      registers[i] = k.compiled.kernel->usage.registers;
      spills[i] = k.compiled.kernel->usage.spill_store_bytes;
      names[i] = j.mods + " " + d.str();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(j.mods + " " + j.arch + ": " + e.what());
    }
  });
  for (const auto& f : failures)
    FAIL_CHECK(f);
  for (size_t i = 0; i < jobs.size(); ++i) {
    INFO(names[i] << ": " << registers[i] << " registers, " << spills[i] << " spill bytes");
    CHECK(registers[i] > 0);
    CHECK(registers[i] <= 255);
    CHECK(spills[i] == 0);
  }
}

TEST_CASE("decode fp8: the CPU backend dequantizes an e4m3 cache", "[decode][fp8][cpu]") {
  std::mt19937_64 rng(std::random_device{}());
  const uint64_t seed = rng();
  INFO("seed " << seed);
  rng.seed(seed);
  const int B = 3, Hkv = 2, gqa = 3, Hq = Hkv * gqa, Sq = 2, D = 64, ps = 4, max_pages = 5;
  const int cap = ps * max_pages;
  const std::vector<int> lens = {20, 7, 0};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<float> k_scale = {0.01f, 0.03f}, v_scale = {0.02f, 0.005f};
  // q (bf16 bits and values), logical K / V [B, Hkv, cap, D] as e4m3 and dequantized.
  std::vector<uint16_t> q_bits(static_cast<size_t>(B) * Hq * Sq * D);
  std::vector<float> q_vals(q_bits.size());
  for (size_t i = 0; i < q_bits.size(); ++i) {
    const float x = normal(rng);
    uint32_t u;
    std::memcpy(&u, &x, 4);
    q_bits[i] = static_cast<uint16_t>(u >> 16);  // truncated to bf16
    q_vals[i] = ir::bf16_bits_to_float(q_bits[i]);
  }
  const size_t n = static_cast<size_t>(B) * Hkv * cap * D;
  std::vector<uint8_t> k8(n), v8(n);
  std::vector<float> kd(n), vd(n);
  for (size_t i = 0; i < n; ++i) {
    const int h = static_cast<int>(i / D / cap % Hkv);
    k8[i] = ir::float_to_e4m3_bits(normal(rng) / k_scale[h]);
    v8[i] = ir::float_to_e4m3_bits(normal(rng) / v_scale[h]);
    kd[i] = ir::e4m3_bits_to_float(k8[i]) * k_scale[h];
    vd[i] = ir::e4m3_bits_to_float(v8[i]) * v_scale[h];
  }
  // Pools in shuffled pages (page b * max_pages + p of the logical cache at perm[...]).
  std::vector<int> perm(B * max_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<uint8_t> kp(n), vp(n);
  for (int b = 0; b < B; ++b)
    for (int p = 0; p < max_pages; ++p)
      for (int s = 0; s < ps; ++s)
        for (int h = 0; h < Hkv; ++h)
          for (int d = 0; d < D; ++d) {
            const size_t src = ((static_cast<size_t>(b) * Hkv + h) * cap + p * ps + s) * D + d;
            const size_t dst =
                ((static_cast<size_t>(perm[b * max_pages + p]) * ps + s) * Hkv + h) * D + d;
            kp[dst] = k8[src];
            vp[dst] = v8[src];
          }
  KvCache cache;
  std::vector<int> lens_copy = lens;
  cache.seq_lens = TensorRef::contiguous(lens_copy.data(), DType::I32, {B});
  cache.page_table = TensorRef::contiguous(perm.data(), DType::I32, {B, max_pages});
  std::vector<float> ks = k_scale, vs = v_scale;
  cache.k_scale = TensorRef::contiguous(ks.data(), DType::F32, {Hkv});
  cache.v_scale = TensorRef::contiguous(vs.data(), DType::F32, {Hkv});
  AttentionOptions o;
  o.mods = standard_mods("alibi");
  std::vector<float> slopes(Hq);
  for (int h = 0; h < Hq; ++h)
    slopes[h] = -0.1f * (h + 1);
  o.bindings.buffers.emplace_back("slopes", TensorRef::contiguous(slopes.data(), DType::F32, {Hq}));
  o.kv_cache = &cache;
  CpuRunOptions cro;
  cro.reference_f64 = true;
  const CpuAttentionResult got = flex_attention_cpu(
      TensorRef::contiguous(q_bits.data(), DType::BF16, {B, Hq, Sq, D}),
      TensorRef::contiguous(kp.data(), DType::E4M3, {B * max_pages, ps, Hkv, D}),
      TensorRef::contiguous(vp.data(), DType::E4M3, {B * max_pages, ps, Hkv, D}), o, cro);

  // The reference: the dequantized logical cache, the lengths as a mask.
  test::AttentionShape s;
  s.batch = B, s.heads_q = Hq, s.heads_kv = Hkv, s.seqlen_q = Sq, s.seqlen_kv = cap;
  s.head_dim_qk = s.head_dim_v = D;
  const Mods ref_mods =
      combine(o.mods, parse_mods("buffer fj_ref_len: i32[B]\nmask_mod = kv_idx < fj_ref_len[b]",
                                 "reference_lengths.fx"));
  ir::EvalEnv env;
  env.buffers["slopes"] = ir::BufferView{slopes.data(), DType::F32, {Hq}, {}};
  env.buffers["fj_ref_len"] = ir::BufferView{lens_copy.data(), DType::I32, {B}, {}};
  const test::ReferenceResult ref = test::cpu_reference_attention(
      ref_mods, s, q_vals, kd, vd, 1.0f / std::sqrt(static_cast<float>(D)), env);
  REQUIRE(got.out.size() == ref.out.size());
  CHECK(test::relative_error(got.out, ref.out) < 1e-6);
  // Sequence 2 (length 0): out 0, lse -inf.
  for (int h = 0; h < Hq; ++h)
    for (int qi = 0; qi < Sq; ++qi) {
      const size_t row = (static_cast<size_t>(2) * Hq + h) * Sq + qi;
      CHECK((std::isinf(got.lse[row]) && got.lse[row] < 0));
      for (int d = 0; d < D; ++d)
        CHECK(got.out[row * D + d] == 0.0f);
    }
}

TEST_CASE("decode fp8: flexjit run --device cpu reads an e4m3 cache with --k-scale / --v-scale",
          "[decode][fp8][cli][cpu]") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("flexjit-decode-fp8-cpu-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto path = [&](const char* name) { return (dir / name).string(); };
  std::mt19937 rng(4242);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  // Two sequences of 37 and 12 keys in a shuffled pool of ten 8-key pages, 2 kv heads, GQA 2.
  const int B = 2, Hkv = 2, Hq = 4, Sq = 3, D = 32, ps = 8, pages = 10;
  const std::vector<float> k_scale = {0.02f, 0.05f}, v_scale = {0.01f, 0.04f};
  npy::Array q = npy::make_array(DType::F16, {B, Hq, Sq, D});
  std::vector<float> q_vals(static_cast<size_t>(q.numel()));
  for (int64_t i = 0; i < q.numel(); ++i) {
    const uint16_t bits = ir::float_to_f16_bits(dist(rng));
    q.as<uint16_t>()[i] = bits;
    q_vals[static_cast<size_t>(i)] = ir::f16_bits_to_float(bits);
  }
  npy::Array k = npy::make_array(DType::E4M3, {pages, ps, Hkv, D});
  npy::Array v = npy::make_array(DType::E4M3, {pages, ps, Hkv, D});
  for (int64_t i = 0; i < k.numel(); ++i) {
    const int h = static_cast<int>(i / D % Hkv);
    k.as<uint8_t>()[i] = ir::float_to_e4m3_bits(dist(rng) / k_scale[h]);
    v.as<uint8_t>()[i] = ir::float_to_e4m3_bits(dist(rng) / v_scale[h]);
  }
  const std::vector<int32_t> table = {3, 7, 0, 9, 5, 2, 8, -1, -1, -1};
  const std::vector<int32_t> lens = {37, 12};
  auto int_array = [](std::vector<int64_t> shape, const std::vector<int32_t>& values) {
    npy::Array a = npy::make_array(DType::I32, std::move(shape));
    std::copy(values.begin(), values.end(), a.as<int32_t>());
    return a;
  };
  auto f32_array = [](const std::vector<float>& values) {
    npy::Array a = npy::make_array(DType::F32, {static_cast<int64_t>(values.size())});
    std::copy(values.begin(), values.end(), a.as<float>());
    return a;
  };
  npy::write(path("q.npy"), q);
  npy::write(path("k.npy"), k);
  npy::write(path("v.npy"), v);
  npy::write(path("table.npy"), int_array({B, 5}, table));
  npy::write(path("lens.npy"), int_array({B}, lens));
  npy::write(path("ks.npy"), f32_array(k_scale));
  npy::write(path("vs.npy"), f32_array(v_scale));
  const std::string cache_args = " --q " + path("q.npy") + " --k " + path("k.npy") + " --v " +
                                 path("v.npy") + " --page-table " + path("table.npy") +
                                 " --seq-lens " + path("lens.npy") + " --out " + path("out.npy");
  const std::string args = "run --device cpu --mods causal" + cache_args + " --k-scale " +
                           path("ks.npy") + " --v-scale " + path("vs.npy") +
                           " --check --repeat 1 --json";
  std::string out;
  REQUIRE(test::run_cli(args, &out) == 0);
  INFO(out);
  const nlohmann::json j = nlohmann::json::parse(out.substr(out.find('{')));
  CHECK(j.at("nan").get<int64_t>() == 0);
  CHECK(j.at("max_rel_error_vs_fp64").get<double>() <= 1e-5);

  // The output against this test's own dequantization of the logical cache.
  const int cap = 5 * ps;
  std::vector<float> kd(static_cast<size_t>(B) * Hkv * cap * D, 0.0f), vd(kd.size(), 0.0f);
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < lens[b]; ++n)
      for (int h = 0; h < Hkv; ++h)
        for (int d = 0; d < D; ++d) {
          const int64_t src =
              ((static_cast<int64_t>(table[b * 5 + n / ps]) * ps + n % ps) * Hkv + h) * D + d;
          const size_t dst = ((static_cast<size_t>(b) * Hkv + h) * cap + n) * D + d;
          kd[dst] = ir::e4m3_bits_to_float(k.as<uint8_t>()[src]) * k_scale[h];
          vd[dst] = ir::e4m3_bits_to_float(v.as<uint8_t>()[src]) * v_scale[h];
        }
  test::AttentionShape s;
  s.batch = B, s.heads_q = Hq, s.heads_kv = Hkv, s.seqlen_q = Sq, s.seqlen_kv = cap;
  s.head_dim_qk = s.head_dim_v = D;
  std::vector<int32_t> lens_copy = lens;
  ir::EvalEnv env;
  env.buffers["fj_ref_len"] = ir::BufferView{lens_copy.data(), DType::I32, {B}, {}};
  const Mods ref_mods = combine(
      standard_mods("causal"),
      parse_mods("buffer fj_ref_len: i32[B]\nmask_mod = kv_idx < fj_ref_len[b]", "lengths.fx"));
  const test::ReferenceResult ref = test::cpu_reference_attention(
      ref_mods, s, q_vals, kd, vd, 1.0f / std::sqrt(static_cast<float>(D)), env);
  const npy::Array o = npy::read(path("out.npy"));
  REQUIRE(o.shape == std::vector<int64_t>{B, Hq, Sq, D});
  std::vector<float> got(static_cast<size_t>(o.numel()));
  for (int64_t i = 0; i < o.numel(); ++i)
    got[static_cast<size_t>(i)] = o.as<float>()[i];
  CHECK(test::relative_error(got, ref.out) <= 1e-5);

  // Without the scales: the missing one named.
  CHECK(test::run_cli("run --device cpu" + cache_args, &out) == 1);
  CHECK_THAT(out, Catch::Contains("an e4m3 KV cache needs k_scale"));
  std::filesystem::remove_all(dir);
}

// KernelQuery::kv_e4m3 and `flexjit emit / inspect --kv-e4m3`: the e4m3-cache kernels of the
// decode and the chunked-prefill forward, as a call on such a cache builds them (the same
// description), and an error for the families that do not read a KV cache.
TEST_CASE("decode fp8: emit and inspect build the e4m3-cache kernels (--kv-e4m3)",
          "[decode][fp8][cli]") {
  KernelQuery q;
  q.family = "decode_split";
  q.arch = "sm_90a";
  q.gqa_ratio = 4;
  q.page_size = 16;
  q.kv_e4m3 = true;
  const KernelSource split = emit_kernel(standard_mods("alibi"), q);
  CHECK(split.description == fp8_desc("sm_90a", 128, 128, 4, 1, 16).str());
  CHECK_THAT(split.source, Catch::Contains("kKvFp8 = true;"));
  q.family = "forward";
  const KernelSource fwd = emit_kernel(standard_mods("causal"), q);
  CHECK_THAT(fwd.description,
             Catch::StartsWith("forward/sm90a_wgmma sm_90a bf16 d=128/128 gqa=4") &&
                 Catch::Contains("kv_e4m3=1 page_size=16 seq_lens=1"));
  CHECK_THAT(fwd.source, Catch::Contains("#define FJ_FWD_KV_FP8"));
  q.page_size = 0;  // the cache's contiguous ragged layout
  CHECK_THAT(emit_kernel(standard_mods("causal"), q).description,
             Catch::Contains("kv_e4m3=1 seq_lens=1") && !Catch::Contains("page_size"));

  std::string out;
  REQUIRE(test::run_cli("emit --kernel decode_split --kv-e4m3 --gqa 4 --page-size 16 --arch sm_89",
                        &out) == 0);
  CHECK_THAT(out, Catch::Contains("decode_split/sm80_mma sm_89") && Catch::Contains("kv_e4m3=1"));
  REQUIRE(test::run_cli("emit --kernel forward --mods causal --kv-e4m3 --page-size 16 --arch "
                        "sm_90a",
                        &out) == 0);
  CHECK_THAT(out, Catch::Contains("forward/sm90a_wgmma") && Catch::Contains("kv_e4m3=1"));
  // sm80_mma does not read e4m3 caches: the refusal says where they run.
  REQUIRE(test::run_cli("emit --kernel forward --kv-e4m3 --page-size 16 --arch sm_80", &out) == 1);
  CHECK_THAT(out, Catch::Contains("does not read e4m3 KV caches"));
  REQUIRE(test::run_cli("emit --kernel backward_dkdv --kv-e4m3 --arch sm_90a", &out) == 1);
  CHECK_THAT(out, Catch::Contains("--kv-e4m3 (an e4m3 KV cache) applies to --kernel forward | "
                                  "decode_split, not backward_dkdv"));
}
