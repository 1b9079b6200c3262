// Split-KV decoding without a GPU: the decode_split / decode_combine descriptions, validation
// and config, the split heuristic, the two-step plan and its workspace, the KV-cache checks
// (validate_kv_cache, check_pages), emit through the public API and the CLI, and NVRTC compiles
// of both templates for every arch ([nvrtc]).
#include <flexjit/attention.h>
#include <flexjit/error.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>
#include <flexjit/paged_kv.h>

#include "Pipeline.h"
#include "binding/KvCache.h"
#include "kernels/Registry.h"
#include "kernels/decode/Decode.h"
#include "kernels/decode/DecodeCombine.h"
#include "kernels/decode/DecodeSplit.h"
#include "runtime/Decode.h"
#include "support/CliPath.h"
#include "support/Parallel.h"
#include "util/Npy.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <thread>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

KernelDesc split_desc(const std::string& arch, DType dtype, int dqk, int dv, int gqa, int sq,
                      int page_size, const Params& overrides = {}) {
  return Registry::global().complete(
      decode_split_problem(cuda::Arch::parse(arch), dtype, dqk, dv, gqa, decode_rows(gqa, sq),
                           page_size, /*full_blocks=*/true),
      InputFacts{}, overrides);
}

KernelDesc combine_desc(const std::string& arch, DType dtype, int dv) {
  return Registry::global().complete(decode_combine_problem(cuda::Arch::parse(arch), dtype, dv),
                                     InputFacts{});
}

// A device tensor descriptor whose memory is never touched (validation only).
TensorRef fake_cuda(DType dtype, std::vector<int64_t> shape, uintptr_t addr = 0x100000) {
  return TensorRef::contiguous(reinterpret_cast<void*>(addr), dtype, std::move(shape),
                               TensorRef::Device::CUDA, 0);
}

// The results of a batch of compile jobs: every failure reported, then every build within the
// register file and without spills.
template <class Job>
void check_builds(const std::vector<std::string>& failures, const std::vector<Job>& jobs,
                  const std::vector<std::string>& usage, const std::vector<int>& registers,
                  const std::vector<int>& spills) {
  for (const auto& f : failures)
    FAIL_CHECK(f);
  for (size_t i = 0; i < jobs.size(); ++i) {
    INFO(jobs[i].mods << " " << usage[i] << ": " << registers[i] << " registers, " << spills[i]
                      << " spill bytes");
    CHECK(registers[i] > 0);
    CHECK(registers[i] <= 255);
    CHECK(spills[i] == 0);
  }
}

}  // namespace

TEST_CASE("decode: descriptions, defaults and text / JSON round trips", "[decode][desc]") {
  const KernelDesc d = split_desc("sm_90a", DType::BF16, 128, 128, 4, 1, 16);
  CHECK(d.str() ==
        "decode_split/sm80_mma sm_90a bf16 d=128/128 gqa=4 fast_math=1 full_blocks=1 page_size=16 "
        "rows=16 | block_n=64 kv_copy=0 num_splits=0 num_stages=3 num_warps=4");
  CHECK(KernelDesc::parse(d.str()) == d);
  CHECK(KernelDesc::from_json(d.to_json()) == d);
  // Contiguous K / V take 2 stages (a paged cache 3: its page-table lookups want the deeper
  // ring; d = 256 also 3).
  CHECK(split_desc("sm_90a", DType::BF16, 128, 128, 4, 1, 0).config.at("num_stages") == 2);
  CHECK(split_desc("sm_90a", DType::BF16, 256, 256, 1, 1, 0).config.at("num_stages") == 3);
  const KernelDesc c = combine_desc("sm_80", DType::F16, 256);
  CHECK(c.str() == "decode_combine/warp_batched sm_80 f16 d=256/256 gqa=1 | num_warps=4");
  CHECK(KernelDesc::parse(c.str()) == c);
  CHECK(KernelDesc::from_json(c.to_json()) == c);
  // Packed rows: GQA group x query tokens, rounded up to 16 / 32 / 64 / 128.
  CHECK(decode_rows(1, 1) == 16);
  CHECK(decode_rows(3, 5) == 16);
  CHECK(decode_rows(7, 3) == 32);
  CHECK(decode_rows(8, 16) == 128);
  CHECK(decode_rows(32, 16) == 128);
  CHECK(decode_row_groups(32, 16, 128) == 4);
  CHECK(decode_row_groups(5, 16, 128) == 1);
  // Defaults follow the shape: 8 warps for 128 rows; 32-key tiles for d = 256; fewer stages
  // where shared memory is short (sm_86: 99 KB).
  CHECK(split_desc("sm_80", DType::BF16, 128, 128, 8, 16, 0).config.at("num_warps") == 8);
  CHECK(split_desc("sm_80", DType::BF16, 256, 256, 1, 1, 0).config.at("block_n") == 32);
  CHECK(split_desc("sm_86", DType::BF16, 128, 128, 1, 1, 0).config.at("num_stages") == 2);
  // Every default and every config_space entry validates, smem within the arch.
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"}) {
    for (int dim : {64, 128, 256}) {
      for (int gqa : {1, 3, 8}) {
        const KernelDesc k = split_desc(arch, DType::F16, dim, dim, gqa, 4, 0);
        const Variant& v = Registry::global().get(Family::DecodeSplit, "sm80_mma");
        INFO(k.str());
        CHECK(static_cast<int>(v.smem_bytes(k)) <= cuda::max_smem_per_block(k.arch));
        const auto space = v.config_space(k);
        CHECK(space.size() >= 7);  // at least one tile config x the 7 split counts
        for (const Params& p : space) {
          KernelDesc kk = k;
          kk.config = p;
          CHECK_NOTHROW(v.validate(kk));
        }
      }
    }
  }
}

TEST_CASE("decode: validate and unsupported name the value and the limits",
          "[decode][desc][errors]") {
  const Variant& v = Registry::global().get(Family::DecodeSplit, "sm80_mma");
  KernelDesc d = split_desc("sm_80", DType::BF16, 128, 128, 4, 1, 0);
  auto with = [&](const char* name, int64_t value, bool flag = false) {
    KernelDesc x = d;
    (flag ? x.flags : x.config).set(name, value);
    return x;
  };
  CHECK_THROWS_WITH(v.validate(with("rows", 48, true)),
                    Catch::Contains("rows = 48; supported: 16, 32, 64, 128"));
  CHECK_THROWS_WITH(
      v.validate(with("page_size", 24, true)),
      Catch::Contains("page_size = 24") && Catch::Contains("power of two from 1 to 256"));
  CHECK_THROWS_WITH(v.validate(with("page_size", 512, true)), Catch::Contains("page_size = 512"));
  CHECK_THROWS_WITH(v.validate(with("num_splits", -1)), Catch::Contains("num_splits = -1"));
  CHECK_THROWS_WITH(v.validate(with("block_n", 48)),
                    Catch::Contains("block_n = 48; supported: 32, 64, 128"));
  // 64 packed rows need 4 warps along M.
  KernelDesc rows64 = with("rows", 64, true);
  rows64.config.set("num_warps", 2);
  CHECK_THROWS_WITH(v.validate(rows64), Catch::Contains("num_warps must be a multiple of 4"));
  // 8 warps along N over 64 keys: 8 keys each.
  KernelDesc narrow = with("num_warps", 8);
  narrow.config.set("block_n", 64);
  CHECK_THROWS_WITH(v.validate(narrow), Catch::Contains("8 keys per warp"));
  KernelDesc big = split_desc("sm_86", DType::BF16, 256, 256, 1, 1, 0);
  big.config.set("block_n", 128);
  big.config.set("num_stages", 4);
  CHECK_THROWS_WITH(v.validate(big),
                    Catch::Contains("bytes of shared memory") && Catch::Contains("sm_86"));
  // Problems no variant runs: f32 inputs, head dims that are not multiples of 8 or exceed 256.
  CHECK_THROWS_WITH(split_desc("sm_80", DType::F32, 128, 128, 1, 1, 0),
                    Catch::Contains("bf16 or f16 inputs, not f32"));
  CHECK_THROWS_WITH(split_desc("sm_80", DType::BF16, 100, 100, 1, 1, 0),
                    Catch::Contains("head_dim_qk = 100; supported: multiples of 8 from 8 to 256"));
  CHECK_THROWS_WITH(split_desc("sm_80", DType::BF16, 128, 264, 1, 1, 0),
                    Catch::Contains("head_dim_v = 264; supported: multiples of 8 from 8 to 256"));
  CHECK_THROWS_WITH(Registry::global().complete(d, {}, {{"block_m", 64}}),
                    Catch::Contains("no config parameter 'block_m'"));
  // Inputs: misaligned, and a block mask whose q block is shorter than the queries.
  InputFacts f;
  f.aligned16 = false;
  f.alignment_blocker = "stride of q in dim 2 is 6 bytes";
  CHECK_THAT(*v.unsupported(d, f),
             Catch::Contains("16-byte aligned") && Catch::Contains("6 bytes"));
  InputFacts m;
  m.mask_q_block = 8;
  m.mask_kv_block = 128;
  m.seqlen_q = 16;
  CHECK_THAT(*v.unsupported(d, m), Catch::Contains("Sq = 16 spans more than its q block size 8"));
  // The block mask's kv block shrinks an open block_n, and a fixed one that does not divide it
  // is an error.
  InputFacts m32;
  m32.mask_q_block = 128;
  m32.mask_kv_block = 32;
  const KernelDesc shrunk = Registry::global().complete(d, m32);
  CHECK(shrunk.config.at("block_n") == 32);
  CHECK(shrunk.config.at("num_warps") == 2);
  CHECK_THROWS_WITH(
      Registry::global().complete(d, m32, {{"block_n", 64}}),
      Catch::Contains("kv block size 32 is not a multiple") && Catch::Contains("block_n = 64"));
  const Variant& cv = Registry::global().get(Family::DecodeCombine, "warp_per_row");
  KernelDesc c = combine_desc("sm_80", DType::BF16, 128);
  c.config.set("num_warps", 3);
  CHECK_THROWS_WITH(cv.validate(c), Catch::Contains("num_warps = 3; supported: 1, 2, 4, 8"));
}

TEST_CASE("decode: the split heuristic fills the GPU once and keeps splits worth their cost",
          "[decode][splits]") {
  // The anchors' decode shape on an H100 (132 SMs, two CTAs per SM): 64 (b, kv head) CTAs.
  CHECK(decode_num_splits(8 * 8, 8192, 64, 132, 2) == 4);
  // One sequence of 128k keys, 8 kv heads: 33 splits of ~62 tiles.
  CHECK(decode_num_splits(8, 131072, 64, 132, 2) == 33);
  // Short KV: at least 2 tiles per split.
  CHECK(decode_num_splits(8, 17, 64, 132, 2) == 1);
  CHECK(decode_num_splits(1, 1000, 64, 132, 4) == 8);
  // Enough CTAs already: one split.
  CHECK(decode_num_splits(1024, 8192, 64, 132, 2) == 1);
  // Capped.
  CHECK(decode_num_splits(1, 1 << 24, 64, 1000, 4) == kMaxDecodeSplits);
  CHECK(decode_num_splits(1, 1 << 20, 64, 0, 0) == 1);  // no device facts: one split

  // resolve_num_splits: config num_splits wins; 0 asks the heuristic with the smem occupancy.
  DecodeInputs in;
  in.batch = 8, in.heads_q = 32, in.heads_kv = 8, in.seqlen_q = 1, in.seqlen_kv = 8192;
  in.head_dim_qk = in.head_dim_v = 128;
  in.sm_count = 132;
  const KernelDesc d = split_desc("sm_90a", DType::BF16, 128, 128, 4, 1, 0);
  // At most two CTAs per SM count (the default's 2-stage tiles would leave room for 3).
  const int per_sm =
      std::min(2, cuda::max_smem_per_block(d.arch) /
                      static_cast<int>(Registry::global().get(d.family, d.variant).smem_bytes(d)));
  CHECK(per_sm == 2);
  CHECK(resolve_num_splits(d, in) == decode_num_splits(64, 8192, 64, 132, per_sm));
  CHECK(resolve_num_splits(d, in) == 4);
  const KernelDesc fixed =
      split_desc("sm_90a", DType::BF16, 128, 128, 4, 1, 0, {{"num_splits", 7}});
  CHECK(resolve_num_splits(fixed, in) == 7);
}

TEST_CASE("decode: the plan is split then combine on one workspace slice", "[decode][plan]") {
  DecodeInputs in;
  in.q = fake_cuda(DType::BF16, {8, 32, 1, 128});
  in.k = fake_cuda(DType::BF16, {8, 8, 8192, 128});
  in.v = in.k;
  in.out = in.q;
  in.batch = 8, in.heads_q = 32, in.heads_kv = 8, in.seqlen_q = 1, in.seqlen_kv = 8192;
  in.head_dim_qk = in.head_dim_v = 128;
  in.sm_count = 132;
  in.mod_params.assign(1, 0);
  AttentionOptions o;
  o.config.params["num_splits"] = 5;
  const runtime::Plan plan =
      runtime::plan_decode(cuda::Arch::parse("sm_90a"), in, standard_mods("causal"), o);
  REQUIRE(plan.steps.size() == 2);
  CHECK(plan.steps[0].desc.family == Family::DecodeSplit);
  CHECK(plan.steps[0].desc.config.at("num_splits") == 5);
  CHECK(plan.steps[1].desc.family == Family::DecodeCombine);
  CHECK(plan.steps[1].workspace_of == 0);
  // o_part [256 rows, 5 splits, 128] + lse_part [256, 5] floats, one 256-byte aligned slice.
  const size_t bytes = 256 * 5 * 129 * 4;
  CHECK(plan.steps[0].workspace_bytes == bytes);
  CHECK(decode_workspace_bytes(in, 5) == bytes);
  CHECK(plan.workspace_bytes == (bytes + 255) / 256 * 256);
  // Launches: (splits, Hkv x row groups, B) CTAs; the combine reads the split's slice.
  auto* ws = reinterpret_cast<void*>(uintptr_t{0x7f0000000000});
  in.num_splits = 5;
  auto launches = plan.steps[0].launches(ws);
  REQUIRE(launches.size() == 1);
  CHECK(launches[0].grid.x == 5);
  CHECK(launches[0].grid.y == 8);
  CHECK(launches[0].grid.z == 8);
  CHECK(launches[0].block.x == 128);
  auto combine = plan.steps[1].launches(ws);
  REQUIRE(combine.size() == 1);
  CHECK(combine[0].grid.x == 64);  // 256 rows, 4 per CTA
  // FjDecodeArgs: the partials' pointers and the packed rows' groups.
  const FjDecodeArgs a = make_decode_args(in, 5, 16, ws);
  CHECK(a.o_part == static_cast<float*>(ws));
  CHECK(a.lse_part == static_cast<float*>(ws) + 256 * 5 * 128);
  CHECK(a.row_groups == 1);
  CHECK(a.page_table == nullptr);
  // Decode for any GQA ratio: 32:1 packs 32 rows; Sq = 16 at ratio 16 takes two row groups.
  in.heads_kv = 1;
  in.seqlen_q = 16;
  const FjDecodeArgs g = make_decode_args(in, 1, 128, ws);
  CHECK(g.row_groups == 4);
}

TEST_CASE("decode: flex_attention's dispatch reasons", "[decode][plan]") {
  DecodeInputs in;
  in.q = fake_cuda(DType::BF16, {2, 8, 4, 128});
  in.k = fake_cuda(DType::BF16, {2, 2, 1000, 128});
  in.v = in.k;
  in.out = in.q;
  in.batch = 2, in.heads_q = 8, in.heads_kv = 2, in.seqlen_q = 4, in.seqlen_kv = 1000;
  in.head_dim_qk = in.head_dim_v = 128;
  const cuda::Arch arch = cuda::Arch::parse("sm_80");
  AttentionOptions o;
  CHECK_FALSE(runtime::decode_unsupported(arch, in, o, true).has_value());
  in.seqlen_q = 17;
  CHECK_THAT(*runtime::decode_unsupported(arch, in, o, true),
             Catch::Contains("Sq = 17 is more than the 16 query tokens"));
  // A KV cache takes the decode kernels for any Sq.
  CHECK_FALSE(runtime::decode_unsupported(arch, in, o, false).has_value());
  in.seqlen_q = 4;
  o.variant = "sm80_mma";
  CHECK_THAT(*runtime::decode_unsupported(arch, in, o, true),
             Catch::Contains("names the forward variant 'sm80_mma'"));
  o.variant.clear();
  o.config.block_m = 64;
  CHECK_THAT(*runtime::decode_unsupported(arch, in, o, true), Catch::Contains("block_m = 64"));
  o.config.block_m = 0;
  // A forward config the decode kernel cannot take: the forward serves the call.
  o.config.block_n = 32;
  o.config.num_warps = 8;
  CHECK_THAT(*runtime::decode_unsupported(arch, in, o, true), Catch::Contains("keys per warp"));
  o.config = {};
  in.q.dtype = DType::F32;
  CHECK_THAT(*runtime::decode_unsupported(arch, in, o, true),
             Catch::Contains("bf16 or f16 inputs, not f32"));
  in.q.dtype = DType::BF16;
  in.aligned16 = false;
  in.alignment_blocker = "data pointer of out is not 16-byte aligned";
  CHECK_THAT(*runtime::decode_unsupported(arch, in, o, true),
             Catch::Contains("data pointer of out"));
}

TEST_CASE("decode: validate_kv_cache names the tensor, the value and what is accepted",
          "[decode][errors]") {
  const TensorRef q = fake_cuda(DType::BF16, {2, 8, 1, 128});
  const TensorRef pool = fake_cuda(DType::BF16, {64, 16, 2, 128});
  const TensorRef vpool = fake_cuda(DType::BF16, {64, 16, 2, 64});
  KvCache c;
  c.page_table = fake_cuda(DType::I32, {2, 10});
  c.seq_lens = fake_cuda(DType::I32, {2});
  const KvCacheShape s = validate_kv_cache(q, pool, vpool, c);
  CHECK(s.paged);
  CHECK(s.num_pages == 64);
  CHECK(s.page_size == 16);
  CHECK(s.max_pages == 10);
  CHECK(s.qkv.seqlen_kv == 160);
  CHECK(s.qkv.heads_kv == 2);
  CHECK(s.qkv.head_dim_v == 64);
  CHECK(s.qkv.fast_path);

  auto fails = [&](const TensorRef& k, const TensorRef& v, const KvCache& cache) {
    try {
      validate_kv_cache(q, k, v, cache);
    } catch (const RuntimeError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  KvCache bad = c;
  bad.page_table = fake_cuda(DType::F32, {2, 10});
  CHECK_THAT(fails(pool, vpool, bad), Catch::Contains("page_table has dtype f32; expected i32"));
  bad.page_table = fake_cuda(DType::I32, {3, 10});
  CHECK_THAT(fails(pool, vpool, bad),
             Catch::Contains("page_table has shape [3, 10]; expected [B = 2, max_pages]"));
  bad.page_table = fake_cuda(DType::I32, {20});
  CHECK_THAT(fails(pool, vpool, bad),
             Catch::Contains("page_table has 1 dims") && Catch::Contains("[B, max_pages]"));
  bad.page_table = c.page_table;
  bad.page_table.device = TensorRef::Device::CPU;
  CHECK_THAT(fails(pool, vpool, bad), Catch::Contains("page_table is on cpu but q is on cuda:0"));
  bad = c;
  bad.seq_lens = fake_cuda(DType::I32, {4});
  CHECK_THAT(fails(pool, vpool, bad),
             Catch::Contains("seq_lens has shape [4]; expected [B] = [2]"));
  bad.seq_lens = fake_cuda(DType::I32, {2, 1});
  CHECK_THAT(fails(pool, vpool, bad), Catch::Contains("seq_lens has 2 dims"));
  bad.seq_lens = TensorRef{};
  CHECK_THAT(fails(pool, vpool, bad), Catch::Contains("a paged KV cache needs seq_lens"));
  // Pools.
  CHECK_THAT(
      fails(fake_cuda(DType::BF16, {64, 24, 2, 128}), fake_cuda(DType::BF16, {64, 24, 2, 64}), c),
      Catch::Contains("page size 24") && Catch::Contains("power of two from 1 to 256"));
  CHECK_THAT(
      fails(fake_cuda(DType::BF16, {64, 512, 2, 128}), fake_cuda(DType::BF16, {64, 512, 2, 64}), c),
      Catch::Contains("page size 512"));
  CHECK_THAT(fails(pool, fake_cuda(DType::BF16, {64, 32, 2, 64}), c),
             Catch::Contains("the k and v pools differ"));
  CHECK_THAT(fails(fake_cuda(DType::BF16, {64, 16, 128}), vpool, c),
             Catch::Contains("k is a page pool [num_pages, page_size, Hkv, D]; it has 3 dims"));
  CHECK_THAT(
      fails(fake_cuda(DType::BF16, {64, 16, 3, 128}), fake_cuda(DType::BF16, {64, 16, 3, 64}), c),
      Catch::Contains("Hq=8 is not a multiple of Hkv=3"));
  CHECK_THAT(fails(fake_cuda(DType::F16, {64, 16, 2, 128}), vpool, c),
             Catch::Contains("must share one dtype"));
  KvCache huge = c;
  huge.page_table = fake_cuda(DType::I32, {2, int64_t{1} << 28});
  CHECK_THAT(fails(fake_cuda(DType::BF16, {64, 256, 2, 128}),
                   fake_cuda(DType::BF16, {64, 256, 2, 64}), huge),
             Catch::Contains("at most 2^31 - 1"));
  // Ragged contiguous K / V: lengths without a table.
  KvCache ragged;
  ragged.seq_lens = fake_cuda(DType::I32, {2});
  const KvCacheShape r = validate_kv_cache(q, fake_cuda(DType::BF16, {2, 2, 300, 128}),
                                           fake_cuda(DType::BF16, {2, 2, 300, 128}), ragged);
  CHECK_FALSE(r.paged);
  CHECK(r.qkv.seqlen_kv == 300);
  CHECK_THAT(fails(fake_cuda(DType::BF16, {2, 2, 300, 128}),
                   fake_cuda(DType::BF16, {2, 2, 300, 128}), KvCache{}),
             Catch::Contains("neither seq_lens nor a page_table"));
  // Host tensors are accepted (the CPU backend runs them), but the lengths must be on q's device.
  TensorRef hq = q;
  hq.device = TensorRef::Device::CPU;
  KvCache hc = ragged;
  TensorRef hk = fake_cuda(DType::BF16, {2, 2, 300, 128});
  hk.device = TensorRef::Device::CPU;
  CHECK_THROWS_WITH(validate_kv_cache(hq, hk, hk, hc),
                    Catch::Contains("seq_lens is on cuda:0 but q is on cpu"));
  hc.seq_lens.device = TensorRef::Device::CPU;
  CHECK(validate_kv_cache(hq, hk, hk, hc).qkv.seqlen_kv == 300);
}

TEST_CASE("decode: check_pages reports the first bad length or page entry", "[decode][errors]") {
  KvCacheShape s;
  s.paged = true;
  s.num_pages = 8;
  s.page_size = 16;
  s.max_pages = 4;
  s.qkv.seqlen_kv = 64;
  // Sequence 0 reads pages 0..1 (20 keys); sequence 1 reads 3 pages (40 keys). Entries past a
  // length are never read, so -1 there is fine.
  std::vector<int> table = {3, 5, -1, -1, 3, 7, 2, -1};
  CHECK_NOTHROW(runtime::check_kv_cache_entries({20, 40}, table, 4, s));
  table[6] = 8;
  CHECK_THROWS_WITH(runtime::check_kv_cache_entries({20, 40}, table, 4, s),
                    Catch::Contains("page_table[1][2] = 8 is not a page of the pool (0 .. 7)") &&
                        Catch::Contains("seq_lens[1] = 40"));
  table[6] = 2;
  CHECK_THROWS_WITH(runtime::check_kv_cache_entries({20, 65}, table, 4, s),
                    Catch::Contains("seq_lens[1] = 65 is beyond the page table's capacity of 64 "
                                    "keys (max_pages 4 x page_size 16)"));
  CHECK_THROWS_WITH(runtime::check_kv_cache_entries({-2, 40}, table, 4, s),
                    Catch::Contains("seq_lens[0] = -2 is negative"));
  KvCacheShape flat;
  flat.qkv.seqlen_kv = 300;
  CHECK_THROWS_WITH(runtime::check_kv_cache_entries({300, 301}, {}, 0, flat),
                    Catch::Contains("seq_lens[1] = 301 is beyond the 300 keys of k and v"));
}

TEST_CASE("decode: emit through the public API and the CLI", "[decode][api]") {
  KernelQuery q;
  q.family = "decode_split";
  q.arch = "sm_90a";
  q.gqa_ratio = 5;
  q.seqlen_q = 4;
  q.page_size = 16;
  const KernelSource src = emit_kernel(standard_mods("alibi_causal"), q);
  CHECK(src.kernel_name == "flexjit_decode_split");
  CHECK_THAT(src.description,
             Catch::StartsWith("decode_split/sm80_mma sm_90a bf16 d=128/128 gqa=5") &&
                 Catch::Contains("page_size=16 rows=32"));
  CHECK_THAT(src.source, Catch::Contains("kRows = 32, kBlockN = 64, kNumWarps = 4") &&
                             Catch::Contains("kGqaRatio = 5, kPageSize = 16"));
  q.family = "decode_combine";
  q.head_dim_v = 64;
  const KernelSource comb = emit_kernel(standard_mods("alibi_causal"), q);
  CHECK(comb.kernel_name == "flexjit_decode_combine");
  CHECK_THAT(comb.source, Catch::Contains("flexjit_decode_check_pages(const FjDecodeCheckArgs"));
  CHECK_THAT(comb.source, Catch::Contains("kNumWarps = 4, kHeadDimV = 64"));
  // The combine kernel carries no mods: one per dtype and Dv.
  CHECK_THAT(comb.source, !Catch::Contains("slopes"));

  std::string out;
  REQUIRE(test::run_cli("emit --kernel decode_split --mods softcap --gqa 3 --queries 2 --page-size "
                        "1 --head-dim 64 --arch sm_80",
                        &out) == 0);
  CHECK_THAT(out, Catch::Contains("decode_split/sm80_mma sm_80 bf16 d=64/64 gqa=3") &&
                      Catch::Contains("flexjit_decode_split"));
  REQUIRE(test::run_cli("emit --kernel decode_split --page-size 3 --arch sm_80", &out) == 1);
  CHECK_THAT(out, Catch::Contains("page_size = 3"));
  REQUIRE(test::run_cli("kernels", &out) == 0);
  CHECK_THAT(out, Catch::Contains("decode_split/sm80_mma") &&
                      Catch::Contains("decode_combine/warp_per_row"));
}

TEST_CASE("decode: both templates compile for every arch, mods, head dims and layouts",
          "[decode][nvrtc]") {
  struct Job {
    std::string mods, arch;
    DType dtype;
    int dqk, dv, gqa, sq, page;
  };
  std::vector<Job> jobs;
  const std::vector<std::string> archs = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"};
  for (const std::string& arch : archs) {
    jobs.push_back({"noop", arch, DType::BF16, 128, 128, 4, 1, 0});
    jobs.push_back({"alibi_causal", arch, DType::F16, 64, 64, 3, 5, 16});       // buffer, 16 rows
    jobs.push_back({"relative_bias", arch, DType::BF16, 256, 256, 1, 1, 256});  // buffer + param
    jobs.push_back({"document_causal", arch, DType::BF16, 128, 64, 8, 16, 1});  // qk != v, 128 rows
    jobs.push_back({"softcap", arch, DType::F16, 128, 128, 7, 3, 0});           // 32 rows
  }
  for (const char* mods : {"t5_bucketed_bias", "sliding_window", "prefix_lm"}) {
    jobs.push_back({mods, "sm_80", DType::BF16, 128, 128, 6, 8, 64});
    jobs.push_back({mods, "sm_90a", DType::BF16, 64, 128, 2, 1, 32});
  }
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::string> usage(jobs.size());
  std::vector<int> registers(jobs.size(), -1), spills(jobs.size(), -1);
  auto worker = [&] {
    for (size_t i; (i = next++) < jobs.size();) {
      const Job& j = jobs[i];
      try {
        const KernelDesc d = split_desc(j.arch, j.dtype, j.dqk, j.dv, j.gqa, j.sq, j.page);
        BuiltKernel k = builder.build(standard_mods(j.mods), d);
        registers[i] = k.compiled.kernel->usage.registers;
        spills[i] = k.compiled.kernel->usage.spill_store_bytes;
        usage[i] = d.str();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back(j.mods + " " + j.arch + ": " + e.what());
      }
    }
  };
  std::vector<std::thread> pool;
  const unsigned n = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  for (unsigned t = 0; t < n; ++t)
    pool.emplace_back(worker);
  for (auto& t : pool)
    t.join();
  check_builds(failures, jobs, usage, registers, spills);
  // The combine kernel: every arch, every dtype it writes, every Dv.
  for (const std::string& arch : archs) {
    for (DType dt : {DType::BF16, DType::F16}) {
      for (int dv : {64, 128, 256}) {
        INFO(arch << " " << to_string(dt) << " dv=" << dv);
        BuiltKernel k = builder.build(standard_mods("alibi"), combine_desc(arch, dt, dv));
        CHECK(k.compiled.kernel->usage.registers > 0);
        CHECK(k.compiled.kernel->usage.spill_store_bytes == 0);
      }
    }
  }
}

TEST_CASE("decode: warp_batched is the default combine; the L2-hint splits are opt-in",
          "[decode][variants]") {
  Registry& reg = Registry::global();
  const KernelDesc problem =
      decode_split_problem(cuda::Arch::parse("sm_90a"), DType::BF16, 128, 128, 4, 16, 0, true);
  const KernelDesc combine_problem =
      decode_combine_problem(cuda::Arch::parse("sm_90a"), DType::BF16, 128);
  for (const char* name : {"sm80_ef", "sm80_ef256"}) {
    const Variant& v = reg.get(Family::DecodeSplit, name);
    CHECK(v.experimental());
    CHECK(v.priority() > reg.get(Family::DecodeSplit, "sm80_mma").priority());
  }
  CHECK_FALSE(reg.get(Family::DecodeCombine, "warp_batched").experimental());
  CHECK(reg.get(Family::DecodeCombine, "warp_batched").priority() >
        reg.get(Family::DecodeCombine, "warp_per_row").priority());
  CHECK_FALSE(reg.get(Family::DecodeSplit, "sm80_mma").experimental());
  CHECK_FALSE(reg.get(Family::DecodeCombine, "warp_per_row").experimental());

  // Not enabled: the defaults, with the experimental ones passed over and named.
  Selection sel;
  CHECK(reg.complete(problem, InputFacts{}, {}, {}, &sel).variant == "sm80_mma");
  CHECK_THAT(sel.str(), Catch::Contains("decode_split/sm80_ef: experimental") &&
                            Catch::Contains("FLEXJIT_ENABLE_VARIANTS=decode_split/sm80_ef"));
  CHECK(reg.complete(combine_problem, InputFacts{}).variant == "warp_batched");
  CHECK(reg.complete(combine_problem, InputFacts{}, {}, "warp_per_row").variant == "warp_per_row");

  // Enabled (FLEXJIT_ENABLE_VARIANTS): they win, with the same config as the default.
  const std::vector<std::string> before = reg.enabled();
  reg.set_enabled({"decode_split/sm80_ef"});
  const KernelDesc ef = reg.complete(problem, InputFacts{});
  const KernelDesc cb = reg.complete(combine_problem, InputFacts{});
  reg.set_enabled({"decode_split/sm80_ef256"});
  const KernelDesc ef256 = reg.complete(problem, InputFacts{});
  reg.set_enabled(before);
  CHECK(ef.variant == "sm80_ef");
  CHECK(ef256.variant == "sm80_ef256");
  CHECK(cb.variant == "warp_batched");
  const KernelDesc base = reg.complete(problem, InputFacts{}, {}, "sm80_mma");
  CHECK(ef.config.str() == base.config.str());
  CHECK(ef256.config.str() == base.config.str());
  // Config overrides and the split count apply to them as to sm80_mma.
  const KernelDesc ef_s2 =
      reg.complete(problem, InputFacts{}, Params{{"num_stages", 2}, {"num_splits", 6}}, "sm80_ef");
  CHECK(ef_s2.config.at("num_stages") == 2);
  DecodeInputs in;
  in.batch = 8, in.heads_q = 32, in.heads_kv = 8, in.seqlen_q = 1, in.seqlen_kv = 8192;
  in.head_dim_qk = in.head_dim_v = 128, in.sm_count = 132;
  CHECK(resolve_num_splits(ef, in) == resolve_num_splits(base, in));
  CHECK(resolve_num_splits(ef_s2, in) == 6);

  // The source: kKvHint in FjConfig, the cache policy only where asked for; kSplitLanes likewise.
  const Mods mods = standard_mods("alibi");
  const std::string src0 = reg.get(Family::DecodeSplit, "sm80_mma").generate(mods, base).source;
  const std::string src1 = reg.get(Family::DecodeSplit, "sm80_ef").generate(mods, ef).source;
  const std::string src2 = reg.get(Family::DecodeSplit, "sm80_ef256").generate(mods, ef256).source;
  CHECK_THAT(src0, Catch::Contains("kKvHint = 0, kKvCopy = 0;"));
  CHECK_THAT(src1, Catch::Contains("kKvHint = 1, kKvCopy = 0;"));
  CHECK_THAT(src2, Catch::Contains("kKvHint = 2, kKvCopy = 0;"));
  const KernelDesc cb0 = reg.complete(combine_problem, InputFacts{}, {}, "warp_per_row");
  CHECK_THAT(reg.get(Family::DecodeCombine, "warp_per_row").generate(mods, cb0).source,
             Catch::Contains("kSplitLanes = false;"));
  CHECK_THAT(reg.get(Family::DecodeCombine, "warp_batched").generate(mods, cb).source,
             Catch::Contains("kSplitLanes = true;"));
}

TEST_CASE("decode: the L2-hint and batched-combine variants compile for sm_80 and sm_90a",
          "[decode][nvrtc][variants]") {
  struct Job {
    std::string variant, mods, arch;
    DType dtype;
    int dqk, dv, gqa, sq, page;
    Params overrides;
  };
  std::vector<Job> jobs;
  for (const std::string arch : {"sm_80", "sm_90a"}) {
    for (const std::string v : {"sm80_ef", "sm80_ef256"}) {
      jobs.push_back({v, "noop", arch, DType::BF16, 128, 128, 4, 1, 0, {}});       // the anchors'
      jobs.push_back({v, "noop", arch, DType::BF16, 128, 128, 4, 1, 16, {}});      // paged16
      jobs.push_back({v, "noop", arch, DType::BF16, 128, 128, 4, 4, 0, {}});       // spec4
      jobs.push_back({v, "alibi_causal", arch, DType::F16, 64, 64, 3, 5, 1, {}});  // 1-key pages
      jobs.push_back({v, "document_causal", arch, DType::BF16, 128, 64, 8, 16, 256, {}});
      jobs.push_back({v, "relative_bias", arch, DType::BF16, 256, 256, 1, 1, 32, {}});
      jobs.push_back({v, "softcap", arch, DType::BF16, 128, 128, 4, 1, 0,
                      Params{{"block_n", 32}, {"num_warps", 2}, {"num_stages", 4}}});
      jobs.push_back({v, "noop", arch, DType::BF16, 128, 128, 4, 1, 0,
                      Params{{"block_n", 128}, {"num_warps", 4}, {"num_stages", 2}}});
    }
  }
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::string> usage(jobs.size());
  std::vector<int> registers(jobs.size(), -1), spills(jobs.size(), -1);
  test::run_parallel(jobs.size(), [&](size_t i) {
    const Job& j = jobs[i];
    try {
      const KernelDesc d = Registry::global().complete(
          decode_split_problem(cuda::Arch::parse(j.arch), j.dtype, j.dqk, j.dv, j.gqa,
                               decode_rows(j.gqa, j.sq), j.page, /*full_blocks=*/true),
          InputFacts{}, j.overrides, j.variant);
      BuiltKernel k = builder.build(standard_mods(j.mods), d);
      registers[i] = k.compiled.kernel->usage.registers;
      spills[i] = k.compiled.kernel->usage.spill_store_bytes;
      usage[i] = d.str();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(j.variant + " " + j.mods + " " + j.arch + ": " + e.what());
    }
  });
  check_builds(failures, jobs, usage, registers, spills);
  for (const std::string arch : {"sm_80", "sm_90a"}) {
    for (DType dt : {DType::BF16, DType::F16}) {
      for (int dv : {64, 128, 256}) {
        INFO(arch << " " << to_string(dt) << " dv=" << dv);
        const KernelDesc d =
            Registry::global().complete(decode_combine_problem(cuda::Arch::parse(arch), dt, dv),
                                        InputFacts{}, {}, "warp_batched");
        BuiltKernel k = builder.build(standard_mods("alibi"), d);
        CHECK(k.compiled.kernel->usage.registers > 0);
        CHECK(k.compiled.kernel->usage.spill_store_bytes == 0);
      }
    }
  }
}

TEST_CASE("decode: kv_copy (bulk K / V copies) is a config key of sm_90 and newer",
          "[decode][desc][errors][kv_copy]") {
  Registry& reg = Registry::global();
  const Variant& v = reg.get(Family::DecodeSplit, "sm80_mma");
  // The default stays cp.async, and the tuner searches only it: the bulk modes measured slower
  // on the H100 (55-59 % of copy against 84 %) and stay selectable by name.
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"}) {
    const KernelDesc d = split_desc(arch, DType::BF16, 128, 128, 4, 1, 16);
    INFO(d.str());
    CHECK(d.config.at("kv_copy") == 0);
    std::set<int64_t> modes;
    for (const Params& p : v.config_space(d))
      modes.insert(p.at("kv_copy"));
    CHECK(modes == std::set<int64_t>{0});
  }
  // Named errors: the arch, the value.
  CHECK_THROWS_WITH(split_desc("sm_80", DType::BF16, 128, 128, 4, 1, 0, Params{{"kv_copy", 1}}),
                    Catch::Contains("kv_copy = 1 (cp.async.bulk") &&
                        Catch::Contains("needs sm_90 or newer, not sm_80"));
  CHECK_THROWS_WITH(split_desc("sm_90a", DType::BF16, 128, 128, 4, 1, 0, Params{{"kv_copy", 3}}),
                    Catch::Contains("kv_copy = 3; supported: 0, 1, 2"));
  // Shared memory: rows padded by 16 bytes and one 8-byte mbarrier per stage (the anchors'
  // shape: 16 x 256 B of Q + 2 x 64 x (272 + 272) B + 16 B).
  const KernelDesc bulk =
      split_desc("sm_90a", DType::BF16, 128, 128, 4, 1, 0, Params{{"kv_copy", 1}});
  CHECK(bulk.config.at("num_stages") == 2);
  CHECK(v.smem_bytes(bulk) == 16u * 256 + 2 * 64 * (272 + 272) + 2 * 8);
  CHECK(v.smem_bytes(split_desc("sm_90a", DType::BF16, 128, 128, 4, 1, 0)) ==
        16u * 256 + 2 * 64 * (256 + 256));
  // The source: kKvCopy in FjConfig; num_splits still a launch parameter.
  const Mods mods = standard_mods("alibi");
  CHECK_THAT(v.generate(mods, bulk).source, Catch::Contains("kKvCopy = 1;"));
  CHECK_THAT(reg.get(Family::DecodeSplit, "sm80_ef").generate(mods, bulk).source,
             Catch::Contains("kKvHint = 1, kKvCopy = 1;"));
}

TEST_CASE("decode: the bulk-copy split kernel compiles for sm_90 and sm_90a",
          "[decode][nvrtc][kv_copy]") {
  struct Job {
    std::string variant, mods, arch;
    DType dtype;
    int dqk, dv, gqa, sq, page;
    Params overrides;
  };
  std::vector<Job> jobs;
  auto cfg = [](int kv_copy, int bn = 0, int warps = 0, int stages = 0) {
    Params p{{"kv_copy", kv_copy}};
    if (bn) p.set("block_n", bn);
    if (warps) p.set("num_warps", warps);
    if (stages) p.set("num_stages", stages);
    return p;
  };
  for (int kv_copy : {1, 2}) {
    const std::string a = kv_copy == 1 ? "sm_90a" : "sm_90";
    jobs.push_back({"sm80_mma", "noop", "sm_90a", DType::BF16, 128, 128, 4, 1, 0, cfg(kv_copy)});
    jobs.push_back({"sm80_mma", "noop", "sm_90a", DType::BF16, 128, 128, 4, 1, 16, cfg(kv_copy)});
    jobs.push_back({"sm80_mma", "noop", a, DType::BF16, 128, 128, 4, 4, 0, cfg(kv_copy)});
    jobs.push_back({"sm80_mma", "alibi_causal", a, DType::F16, 64, 64, 3, 5, 1, cfg(kv_copy)});
    jobs.push_back(
        {"sm80_mma", "document_causal", a, DType::BF16, 128, 64, 8, 16, 256, cfg(kv_copy)});
    jobs.push_back({"sm80_mma", "relative_bias", a, DType::BF16, 256, 256, 1, 1, 32, cfg(kv_copy)});
    jobs.push_back({"sm80_mma", "softcap", a, DType::BF16, 40, 72, 2, 1, 8, cfg(kv_copy)});
    jobs.push_back({"sm80_mma", "noop", a, DType::BF16, 128, 128, 4, 1, 0, cfg(kv_copy, 32, 2, 4)});
    jobs.push_back(
        {"sm80_mma", "noop", a, DType::BF16, 128, 128, 4, 1, 0, cfg(kv_copy, 128, 4, 1)});
    jobs.push_back(
        {"sm80_mma", "sliding_window", a, DType::BF16, 128, 64, 5, 16, 64, cfg(kv_copy, 32, 8, 3)});
    jobs.push_back({"sm80_ef", "noop", "sm_90a", DType::BF16, 128, 128, 4, 1, 16, cfg(kv_copy)});
    jobs.push_back({"sm80_ef256", "noop", "sm_90a", DType::BF16, 128, 128, 4, 1, 0, cfg(kv_copy)});
  }
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::string> usage(jobs.size());
  std::vector<int> registers(jobs.size(), -1), spills(jobs.size(), -1);
  test::run_parallel(jobs.size(), [&](size_t i) {
    const Job& j = jobs[i];
    try {
      const KernelDesc d = Registry::global().complete(
          decode_split_problem(cuda::Arch::parse(j.arch), j.dtype, j.dqk, j.dv, j.gqa,
                               decode_rows(j.gqa, j.sq), j.page, /*full_blocks=*/true),
          InputFacts{}, j.overrides, j.variant);
      BuiltKernel k = builder.build(standard_mods(j.mods), d);
      registers[i] = k.compiled.kernel->usage.registers;
      spills[i] = k.compiled.kernel->usage.spill_store_bytes;
      usage[i] = d.str();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(j.variant + " " + j.mods + " " + j.arch + ": " + e.what());
    }
  });
  check_builds(failures, jobs, usage, registers, spills);
}

TEST_CASE("decode: flexjit run reads a paged KV cache and says what it needs", "[decode][cli]") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("flexjit-decode-cli-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto path = [&](const char* name) { return (dir / name).string(); };
  npy::write(path("q.npy"), npy::make_array(DType::BF16, {2, 4, 1, 64}));
  npy::write(path("k.npy"), npy::make_array(DType::BF16, {8, 16, 2, 64}));
  npy::write(path("table.npy"), npy::make_array(DType::I32, {2, 4}));
  npy::write(path("lens.npy"), npy::make_array(DType::I32, {2}));
  const std::string files = "--q " + path("q.npy") + " --k " + path("k.npy") + " --v " +
                            path("k.npy") + " --page-table " + path("table.npy") + " --seq-lens " +
                            path("lens.npy");
  std::string out;
  CHECK(test::run_cli("run --device cpu " + files + " --dout " + path("q.npy"), &out) == 1);
  CHECK_THAT(out, Catch::Contains("the backward (--dout) does not take a KV cache"));
  CHECK(test::run_cli("run --random 1,2,16,64 --page-table " + path("table.npy"), &out) == 1);
  CHECK_THAT(out, Catch::Contains("give --q, --k, --v too"));
  REQUIRE(test::run_cli("run --help", &out) == 0);
  CHECK_THAT(out, Catch::Contains("--page-table") && Catch::Contains("--seq-lens") &&
                      Catch::Contains("--check-pages"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("decode: flexjit run --device cpu runs a paged KV cache and --check reads each b",
          "[decode][cli][cpu]") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("flexjit-decode-cpu-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto path = [&](const char* name) { return (dir / name).string(); };
  // Two sequences of 37 and 12 keys in a shuffled pool of 8-key pages; the queries sit at the end
  // of each sequence (q_pos[b]), so a reference that ran every sequence as b = 0 would mask
  // sequence 1's rows against sequence 0's offset.
  std::mt19937 rng(12345);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto random_array = [&](std::vector<int64_t> shape) {
    npy::Array a = npy::make_array(DType::F32, std::move(shape));
    for (int64_t i = 0; i < a.numel(); ++i)
      a.as<float>()[i] = dist(rng);
    return a;
  };
  auto int_array = [](std::vector<int64_t> shape, const std::vector<int32_t>& values) {
    npy::Array a = npy::make_array(DType::I32, std::move(shape));
    std::copy(values.begin(), values.end(), a.as<int32_t>());
    return a;
  };
  npy::write(path("q.npy"), random_array({2, 4, 3, 32}));
  npy::write(path("k.npy"), random_array({10, 8, 2, 32}));
  npy::write(path("v.npy"), random_array({10, 8, 2, 32}));
  npy::write(path("table.npy"), int_array({2, 5}, {3, 7, 0, 9, 5, 2, 8, -1, -1, -1}));
  npy::write(path("lens.npy"), int_array({2}, {37, 12}));
  npy::write(path("qpos.npy"), int_array({2}, {34, 9}));
  const std::string args =
      "run --device cpu --mods 'buffer q_pos: i32[B]\nmask_mod = q_idx + q_pos[b] >= kv_idx' "
      "--q " +
      path("q.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") + " --page-table " +
      path("table.npy") + " --seq-lens " + path("lens.npy") +
      " --buffer q_pos=" + path("qpos.npy") + " --out " + path("out.npy") +
      " --check --repeat 1 --json";
  std::string out;
  REQUIRE(test::run_cli(args, &out) == 0);
  INFO(out);
  const nlohmann::json j = nlohmann::json::parse(out.substr(out.find('{')));
  CHECK(j.at("nan").get<int64_t>() == 0);
  CHECK(j.at("nonfinite_mismatches_vs_fp64").get<int64_t>() == 0);
  CHECK(j.at("max_rel_error_vs_fp64").get<double>() <= 1e-5);
  const npy::Array o = npy::read(path("out.npy"));
  CHECK(o.shape == std::vector<int64_t>{2, 4, 3, 32});
  // A page entry the sequence reads that is not in the pool: a precise error, nothing written.
  npy::write(path("table.npy"), int_array({2, 5}, {3, 7, 0, 9, 12, 2, 8, -1, -1, -1}));
  CHECK(test::run_cli(args, &out) == 1);
  CHECK_THAT(out, Catch::Contains("page_table[0][4] = 12 is not a page of the pool (0 .. 9)"));
  std::filesystem::remove_all(dir);
}
