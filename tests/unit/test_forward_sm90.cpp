// forward/sm90a_wgmma without a GPU: what it serves and refuses (with reasons), its configs,
// the wgmma wrappers it generates, the TMA blockers, and NVRTC compiles of every standard mod
// and head-dim combination with their register / spill / shared-memory budget.
#include <flexjit/error.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "codegen/cuda/Wgmma.h"
#include "device/TensorMap.h"
#include "kernels/Registry.h"
#include "kernels/forward/Forward.h"
#include "kernels/forward/Sm90Wgmma.h"
#include "passes/RuntimeDivision.h"
#include "support/KernelDescs.h"
#include "support/Parallel.h"
#include "tune/Prune.h"

#include <flexjit_abi.h>
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <limits>
#include <mutex>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

KernelDesc sm90_desc(DType dtype, int dqk, int dv, const Params& overrides = {},
                     int gqa_ratio = 1) {
  return test::forward_desc("sm_90a", dtype, dqk, dv, gqa_ratio, "sm90a_wgmma", overrides);
}

}  // namespace

TEST_CASE("sm90a_wgmma serves sm_90a bf16 / f16 and says why it cannot serve the rest",
          "[sm90][kernels]") {
  const ForwardSm90Wgmma v;
  auto problem = [](const char* arch, DType dt, int dqk = 128, int dv = 128) {
    return forward_problem(cuda::Arch::parse(arch), dt, dqk, dv, 1, false, true);
  };
  CHECK_FALSE(v.unsupported(problem("sm_90a", DType::BF16), {}).has_value());
  CHECK_FALSE(v.unsupported(problem("sm_90a", DType::F16, 64, 256), {}).has_value());
  CHECK(v.unsupported(problem("sm_90", DType::BF16), {}).value() ==
        "wgmma and setmaxnreg need sm_90a, not sm_90");
  CHECK_THAT(v.unsupported(problem("sm_80", DType::BF16), {}).value(), Catch::Contains("sm_80"));
  CHECK_THAT(v.unsupported(problem("sm_90a", DType::F32), {}).value(),
             Catch::Contains("f32 inputs run on the tf32 tensor cores of sm80_mma"));
  // Every multiple of 8 up to 256, qk and v independently (computed in tiles of 64 / 128 / 192 /
  // 256); anything else is refused naming what is supported.
  for (auto [dqk, dv] : {std::pair{96, 96}, {8, 8}, {80, 80}, {192, 128}, {96, 64}, {248, 40}}) {
    INFO("d=" << dqk << "/" << dv);
    CHECK_FALSE(v.unsupported(problem("sm_90a", DType::BF16, dqk, dv), {}).has_value());
  }
  CHECK(v.unsupported(problem("sm_90a", DType::BF16, 100), {}).value() ==
        "forward/sm90a_wgmma does not support head_dim_qk = 100; supported: multiples of 8 from "
        "8 to 256 (computed in tiles of 64, 128, 192, 256)");
  CHECK_THAT(v.unsupported(problem("sm_90a", DType::BF16, 128, 264), {}).value(),
             Catch::Contains("head_dim_v = 264") && Catch::Contains("from 8 to 256"));

  InputFacts facts;
  facts.tma_blocker = "k's sequence stride is 0 bytes; ...";
  CHECK(v.unsupported(problem("sm_90a", DType::BF16), facts).value() == facts.tma_blocker);
  // A softmax scale that is not positive runs elsewhere (the kernel folds a positive one into
  // the exponent after the row max); the call's scale sets the fact (default 1 / sqrt(d): > 0).
  InputFacts nonpositive;
  nonpositive.scale_positive = false;
  CHECK_THAT(v.unsupported(problem("sm_90a", DType::BF16), nonpositive).value(),
             Catch::Contains("softmax scale is not positive"));
  // e4m3 q, k, v (whose scale meets the descales on the device) keep any sign: nothing else
  // runs them.
  CHECK_FALSE(v.unsupported(problem("sm_90a", DType::E4M3), nonpositive).has_value());
  ForwardInputs scaled;
  CHECK(forward_facts(scaled).scale_positive);
  for (float sc : {0.0f, -0.125f, std::numeric_limits<float>::quiet_NaN()}) {
    INFO("scale " << sc);
    scaled.scale = sc;
    CHECK_FALSE(forward_facts(scaled).scale_positive);
  }
  scaled.scale = 1e-6f;
  CHECK(forward_facts(scaled).scale_positive);
  InputFacts mask64;
  mask64.mask_q_block = mask64.mask_kv_block = 64;
  CHECK_THAT(v.unsupported(problem("sm_90a", DType::BF16), mask64).value(),
             Catch::Contains("q block size 64") && Catch::Contains("128-row tiles"));
  InputFacts mask_128x64;
  mask_128x64.mask_q_block = 128;
  mask_128x64.mask_kv_block = 64;
  CHECK_FALSE(v.unsupported(problem("sm_90a", DType::BF16), mask_128x64).has_value());
  // The block mask's KV tile shrinks block_n to fit, unless the caller fixed it.
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16), {}, mask_128x64).at("block_n") == 64);
  CHECK_THROWS_WITH(
      v.resolve_config(problem("sm_90a", DType::BF16), {{"block_n", 128}}, mask_128x64),
      Catch::Contains("not multiples") && Catch::Contains("128x128 tiles"));
  // At head dim 64, 192-row tiles over a 128-row block mask (the union schedule) are the default
  // where they cover at most 1/8 more rows: S = 2048 (2112 rows against 2048) but not S = 256
  // (384 against 256); asked for, they take a mask of 128- or 256-row blocks.
  InputFacts mask128;
  mask128.mask_q_block = mask128.mask_kv_block = 128;
  mask128.seqlen_q = mask128.seqlen_kv = 2048;
  mask128.mask_mod = true;
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16, 64, 64), {}, mask128).at("block_m") == 192);
  mask128.seqlen_q = 256;
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16, 64, 64), {}, mask128).at("block_m") == 128);
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16, 64, 64), {{"block_m", 192}}, mask128)
            .at("block_m") == 192);
  // Without a mask_mod (a block mask from tiles or a dense mask, none given) the kernel has no
  // union loop: 128 rows by default, 192 refused.
  InputFacts no_mod = mask128;
  no_mod.mask_mod = false;
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16, 64, 64), {}, no_mod).at("block_m") == 128);
  CHECK_THROWS_WITH(
      v.resolve_config(problem("sm_90a", DType::BF16, 64, 64), {{"block_m", 192}}, no_mod),
      Catch::Contains("needs the call's mask_mod"));
  // A mask_mod that divides by a run-time value per score keeps 128 rows by default (192 rows
  // spilled and ran 20-42 % slower: chunked_local, dilated_sliding); asked for, 192 is taken.
  CHECK(passes::divides_by_runtime_value(standard_mods("chunked_local").mask_mod));
  CHECK(passes::divides_by_runtime_value(standard_mods("dilated_sliding").mask_mod));
  for (const char* m : {"causal", "document_causal", "sliding_window", "prefix_lm"})
    CHECK_FALSE(passes::divides_by_runtime_value(standard_mods(m).mask_mod));
  CHECK_FALSE(passes::divides_by_runtime_value(
      parse_mods("mask_mod = q_idx / 128 == kv_idx / 128 && q_idx % 2 == 0").mask_mod));
  InputFacts divides = mask128;
  divides.seqlen_q = 2048;
  divides.mask_mod_divides = true;
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16, 64, 64), {}, divides).at("block_m") == 128);
  divides.mask_kv_block = divides.mask_q_block = 0;  // no block mask: the same
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16, 64, 64), {}, divides).at("block_m") == 128);
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16, 64, 64), {{"block_m", 192}}, divides)
            .at("block_m") == 192);
  // A union schedule takes at most kFjUnionMaxTiles KV tiles.
  InputFacts huge = mask128;
  huge.seqlen_kv = int64_t{128} * kFjUnionMaxTiles + 1;
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16, 64, 64), {}, huge).at("block_m") == 128);
  CHECK_THROWS_WITH(
      v.resolve_config(problem("sm_90a", DType::BF16, 64, 64), {{"block_m", 192}}, huge),
      Catch::Contains("at most 32768 KV tiles"));
  // At d 128 likewise, with the serial loop and 2 stages, and for head dims below that tile (d 80,
  // 96, 112) unless the score_mod reads kv_idx; not for a wider qk tile (192 / 128), nor when the
  // caller fixed a tile key.
  InputFacts main128 = mask128;
  main128.seqlen_q = main128.seqlen_kv = 4096;
  const Params c128 = v.resolve_config(problem("sm_90a", DType::BF16, 128, 128), {}, main128);
  CHECK(c128.at("block_m") == 192);
  CHECK(c128.at("num_stages") == 2);
  InputFacts reads_kv = main128;  // alibi, relative biases: 128 rows below d 128
  reads_kv.score_mod_reads_kv = true;
  for (int d : {80, 96, 112}) {
    CHECK(v.resolve_config(problem("sm_90a", DType::BF16, d, d), {}, main128).at("block_m") == 192);
    CHECK(v.resolve_config(problem("sm_90a", DType::BF16, d, d), {}, reads_kv).at("block_m") ==
          128);
  }
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16, 128, 128), {}, reads_kv).at("block_m") ==
        192);
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16, 96, 96), {{"block_m", 128}}, main128)
            .at("block_m") == 128);
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16, 96, 64), {}, main128).at("block_m") == 128);
  InputFacts dense128 = main128;
  dense128.mask_q_block = dense128.mask_kv_block = 0;
  dense128.mask_mod = false;
  CHECK(v.resolve_config(problem("sm_90a", DType::F16, 128, 128), {}, dense128).at("block_m") ==
        192);
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16, 192, 128), {}, main128).at("block_m") ==
        128);
  for (const Params& fixed : {Params{{"num_stages", 2}}, Params{{"block_n", 128}},
                              Params{{"q_tiles", 1}}, Params{{"block_m", 128}}}) {
    INFO(fixed.str());
    CHECK(
        v.resolve_config(problem("sm_90a", DType::BF16, 128, 128), fixed, main128).at("block_m") ==
        128);
  }
  InputFacts short128 = main128;
  short128.seqlen_q = 256;
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16, 128, 128), {}, short128).at("block_m") ==
        128);
  InputFacts mask256 = mask128;
  mask256.mask_q_block = mask256.mask_kv_block = 256;
  CHECK(v.resolve_config(problem("sm_90a", DType::BF16, 64, 64), {{"block_m", 192}}, mask256)
            .at("block_n") == 128);
  // The union schedule's bytes: 32-byte row headers, then the entries rounded up to 16 bytes.
  CHECK(fj_forward_sm90_union_bytes(11, 16) == 11 * 32 + 11 * 16 * 4);
  CHECK(fj_forward_sm90_union_bytes(3, 5) == 3 * 32 + 64);
}

TEST_CASE("sm90a_wgmma configs: defaults, the space, and precise refusals", "[sm90][kernels]") {
  const ForwardSm90Wgmma v;
  for (DType dt : {DType::BF16, DType::F16}) {
    for (auto [dqk, dv] : {std::pair{64, 64},
                           {128, 128},
                           {256, 256},
                           {128, 64},
                           {64, 256},
                           {96, 96},
                           {80, 80},
                           {192, 192},
                           {192, 128},
                           {96, 64},
                           {256, 128},
                           {160, 160},
                           {40, 200}}) {
      INFO(to_string(dt) << " d=" << dqk << "/" << dv);
      const KernelDesc d = sm90_desc(dt, dqk, dv);
      CHECK(d.variant == "sm90a_wgmma");
      CHECK_NOTHROW(v.validate(d));
      const std::vector<Params> space = v.config_space(d);
      CHECK(std::find(space.begin(), space.end(), d.config) != space.end());
      for (const Params& c : space) {
        KernelDesc e = d;
        e.config = c;
        CHECK(v.smem_bytes(e) <= 232448u);  // sm_90's 227 KiB per block
      }
    }
  }
  CHECK_THROWS_WITH(sm90_desc(DType::BF16, 128, 128, {{"block_n", 96}}),
                    Catch::Contains("block_n = 96") && Catch::Contains("64, 128, 176"));
  CHECK_THROWS_WITH(sm90_desc(DType::BF16, 128, 128, {{"num_warps", 8}}),
                    Catch::Contains("num_warps"));
  CHECK_THROWS_WITH(sm90_desc(DType::BF16, 128, 128, {{"num_stages", 4}}),
                    Catch::Contains("shared memory") && Catch::Contains("lower num_stages"));
  CHECK_THROWS_WITH(sm90_desc(DType::BF16, 256, 256, {{"block_n", 176}}),
                    Catch::Contains("registers per consumer thread"));
  // Three consumer warpgroups have 160 registers each: d_v 64 with the overlapped loop, d_v 128
  // with the serial one (2 stages fit at d 128), nothing wider.
  CHECK_NOTHROW(sm90_desc(DType::BF16, 64, 64, {{"block_m", 192}}));
  CHECK(sm90_desc(DType::BF16, 128, 128, {{"block_m", 192}}).config.at("num_stages") == 2);
  CHECK_THROWS_WITH(
      sm90_desc(DType::BF16, 128, 128, {{"block_m", 192}, {"block_n", 176}}),
      Catch::Contains("registers per consumer thread") && Catch::Contains("block_m = 192"));
  CHECK_THROWS_WITH(
      sm90_desc(DType::BF16, 256, 256, {{"block_m", 192}, {"block_n", 64}}),
      Catch::Contains("registers per consumer thread") && Catch::Contains("block_m = 192"));
  CHECK_THROWS_WITH(sm90_desc(DType::BF16, 64, 64, {{"block_m", 256}}),
                    Catch::Contains("block_m = 256") && Catch::Contains("128, 192"));
  CHECK_THROWS_WITH(sm90_desc(DType::BF16, 64, 64, {{"q_tiles", 3}}),
                    Catch::Contains("q_tiles = 3") && Catch::Contains("1, 2"));
  CHECK(sm90_desc(DType::BF16, 64, 64, {{"q_tiles", 2}}).config.at("q_tiles") == 2);
  // Persistent CTAs claim single query tiles (q_tiles 1, the d 64 default) or pairs of them
  // (q_tiles 2), with two Q buffers either way; each key asked for alone keeps the other's
  // default.
  const KernelDesc pd = sm90_desc(DType::BF16, 64, 64, {{"persistent", 1}});
  CHECK(pd.config.at("persistent") == 1);
  CHECK(pd.config.at("q_tiles") == 1);
  CHECK(pd.config == sm90_desc(DType::BF16, 64, 64).config);
  const KernelDesc pd2 = sm90_desc(DType::BF16, 64, 64, {{"q_tiles", 2}});
  CHECK(pd2.config.at("persistent") == 1);
  CHECK(pd2.config.at("q_tiles") == 2);
  CHECK(v.smem_bytes(pd2) == v.smem_bytes(pd));
  CHECK(sm90_desc(DType::BF16, 128, 128, {{"persistent", 1}}).config.at("q_tiles") == 1);
  CHECK_THROWS_WITH(sm90_desc(DType::BF16, 64, 64, {{"persistent", 2}}),
                    Catch::Contains("persistent = 2") && Catch::Contains("0, 1"));
  CHECK(sm90_desc(DType::BF16, 64, 64, {{"persistent", 0}}).config.at("q_tiles") == 1);
  // Head dims run in their tile dims: 96 as 128 (the d 128 defaults, the same shared memory),
  // 192 / 128 in FlashAttention-3's 128 x 128 tiles with two stages, 256 / 128 in 64-key tiles.
  const KernelDesc d96 = sm90_desc(DType::BF16, 96, 96);
  CHECK(d96.config == sm90_desc(DType::BF16, 128, 128).config);
  CHECK(v.smem_bytes(d96) == v.smem_bytes(sm90_desc(DType::BF16, 128, 128)));
  const KernelDesc d192 = sm90_desc(DType::BF16, 192, 128);
  CHECK(d192.config.at("block_n") == 128);
  CHECK(d192.config.at("num_stages") == 2);
  CHECK(v.smem_bytes(d192) ==
        static_cast<unsigned>(fj_forward_sm90_smem_bytes(128, 128, 192, 128, 2, 2)));
  const KernelDesc d256 = sm90_desc(DType::BF16, 256, 128);
  CHECK(d256.config.at("block_n") == 64);
  CHECK(v.smem_bytes(sm90_desc(DType::BF16, 200, 136)) ==
        v.smem_bytes(sm90_desc(DType::BF16, 256, 192)));
  // A refusal names the head dims and their tiles.
  CHECK_THROWS_WITH(sm90_desc(DType::BF16, 200, 200, {{"block_n", 176}}),
                    Catch::Contains("head_dim_v = 200 (tile 256)"));
  // The layout formula: 1024 bytes of alignment slack, the Q buffers (the wider head dim), the
  // stages, per Q buffer 2 and per stage 3 mbarriers of 8 bytes (rounded up to 16), and per Q
  // buffer a 16-byte tile slot.
  CHECK(fj_forward_sm90_smem_bytes(128, 128, 128, 128, 2, 2) ==
        1024 + 2 * (128 * 128 + 2 * 128 * 256) + 64 + 16);
  CHECK(fj_forward_sm90_smem_bytes(128, 128, 128, 128, 2, 3) ==
        1024 + 2 * (128 * 128 + 3 * 128 * 256) + 96 + 16);
  CHECK(fj_forward_sm90_smem_bytes(128, 128, 64, 64, 2, 4, 2) ==
        1024 + 2 * (2 * 128 * 64 + 4 * 128 * 128) + 128 + 32);
  // The persistent workspace: the counter's 16 bytes, a 16-byte slot per CTA and Q buffer.
  CHECK(fj_forward_sm90_persistent_workspace_bytes(132, 2) == 16 + 132 * 2 * 16);
  const KernelDesc d = sm90_desc(DType::BF16, 128, 128);
  CHECK(v.smem_bytes(d) ==
        static_cast<unsigned>(fj_forward_sm90_smem_bytes(128, 128, 128, 128, 2, 3)));
  // Persistent CTAs take two Q buffers: at d 64 with its 4 stages; at d 128 the default's 3
  // stages would need 262 KB, so asked for alone it comes with 2, and 3 asked for is refused.
  CHECK(v.smem_bytes(pd) ==
        static_cast<unsigned>(fj_forward_sm90_smem_bytes(128, 128, 64, 64, 2, 4, 2)));
  const KernelDesc pd128 = sm90_desc(DType::BF16, 128, 128, {{"persistent", 1}});
  CHECK(pd128.config.at("num_stages") == 2);
  CHECK(v.smem_bytes(pd128) ==
        static_cast<unsigned>(fj_forward_sm90_smem_bytes(128, 128, 128, 128, 2, 2, 2)));
  CHECK_THROWS_WITH(sm90_desc(DType::BF16, 128, 128, {{"persistent", 1}, {"num_stages", 3}}),
                    Catch::Contains("lower num_stages"));
  // Two query tiles per CTA without persistence: a second Q buffer only where it fits.
  CHECK(v.smem_bytes(sm90_desc(DType::BF16, 128, 128, {{"q_tiles", 2}})) ==
        static_cast<unsigned>(fj_forward_sm90_smem_bytes(128, 128, 128, 128, 2, 3, 1)));
}

// A head dim below its tile dim compiles the tile's kernel: the same source but for the line of
// the real dims (kRealDimQK / kRealDimV, which the k16 steps of Q K^T and the stores read) and
// the lines naming the problem.
TEST_CASE("sm90a_wgmma: a head dim below its tile compiles the tile's layouts", "[sm90][codegen]") {
  const ForwardSm90Wgmma v;
  auto lines_without = [](const KernelDesc& d, const std::string& text) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at < text.size()) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(at, end - at);
      const std::string dims = fmt::format(" d={}/{} ", d.head_dim_qk, d.head_dim_v);
      if (line.find("kRealDimQK") == std::string::npos && line.find(dims) == std::string::npos &&
          line.find("source key") == std::string::npos)
        out.push_back(line);
      at = end + 1;
    }
    return out;
  };
  for (auto [real, tile] : {std::pair{96, 128}, {200, 256}, {48, 64}, {136, 192}}) {
    INFO("d=" << real << " in " << tile);
    const KernelDesc a = sm90_desc(DType::BF16, real, real);
    const KernelDesc b = sm90_desc(DType::BF16, tile, tile);
    const Mods mods = standard_mods("causal");
    const std::string sa = v.generate(mods, a).source, sb = v.generate(mods, b).source;
    CHECK_THAT(sa, Catch::Contains(fmt::format("kHeadDimQK = {}, kHeadDimV = {}", tile, tile)));
    CHECK_THAT(sa, Catch::Contains(fmt::format("kRealDimQK = {}, kRealDimV = {}", real, real)));
    CHECK_THAT(sb, Catch::Contains(fmt::format("kRealDimQK = {}, kRealDimV = {}", tile, tile)));
    CHECK(lines_without(a, sa) == lines_without(b, sb));
  }
}

// The autotuner prunes tiles by the variant's unit of query rows: 192-row tiles over 128-row
// masks (each 64-row warpgroup in one q block, the union schedule) are candidates where the call
// has a mask_mod, and refused with resolve_config's reason where it has none.
TEST_CASE("the autotuner tries sm90a_wgmma's 192-row tiles over 128-row block masks",
          "[sm90][tune]") {
  const ForwardSm90Wgmma v;
  const KernelDesc p =
      forward_problem(cuda::Arch::parse("sm_90a"), DType::BF16, 64, 64, 1, false, true);
  CHECK(v.mask_q_unit(Params{{"block_m", 192}}) == 64);
  CHECK(v.mask_q_unit(Params{{"block_m", 128}}) == 128);
  InputFacts f;
  f.mask_q_block = f.mask_kv_block = 128;
  f.seqlen_q = f.seqlen_kv = 4096;
  f.mask_mod = true;
  auto count_192 = [](const std::vector<Params>& configs) {
    return std::count_if(configs.begin(), configs.end(),
                         [](const Params& c) { return c.at("block_m") == 192; });
  };
  const tune::CandidateSet with_mod = tune::prune_configs(v, p, f);
  CHECK(with_mod.default_config.at("block_m") == 192);
  CHECK(count_192(with_mod.candidates) >= 4);  // block_n 64 / 128, stages, persistence
  for (const tune::PrunedConfig& pc : with_mod.pruned) {
    INFO(pc.config.str() << ": " << pc.reason);
    CHECK_THAT(pc.reason, !Catch::StartsWith("block_m = "));  // (block_n 192 is pruned)
  }
  f.mask_mod = false;
  const tune::CandidateSet no_mod = tune::prune_configs(v, p, f);
  CHECK(no_mod.default_config.at("block_m") == 128);
  CHECK(count_192(no_mod.candidates) == 0);
  bool said_why = false;
  for (const tune::PrunedConfig& pc : no_mod.pruned)
    said_why |= pc.config.at("block_m") == 192 &&
                pc.reason.find("needs the call's mask_mod") != std::string::npos;
  CHECK(said_why);
}

TEST_CASE("wgmma wrappers: one overload per N with N / 2 accumulators", "[sm90][codegen]") {
  const std::string bf = cuda::wgmma_wrappers(DType::BF16, {128, 128}, {64});
  CHECK_THAT(bf, Catch::Contains("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"));
  CHECK_THAT(bf, Catch::Contains("fj_wgmma_ss(float (&d)[16][4]"));
  CHECK_THAT(bf, Catch::Contains("fj_wgmma_rs(float (&d)[8][4]"));
  CHECK_THAT(bf, Catch::Contains("\"+f\"(d[15][3])") && !Catch::Contains("d[16][0]"));
  CHECK_THAT(bf, Catch::Contains("%63") && Catch::Contains("p, 1, 1, 0, 0;"));  // K-major B
  CHECK_THAT(bf, Catch::Contains("p, 1, 1, 1;"));  // the rs form's B is MN-major (V)
  // Duplicates are generated once.
  CHECK(bf.find("fj_wgmma_ss(") == bf.rfind("fj_wgmma_ss("));
  const std::string h = cuda::wgmma_wrappers(DType::F16, {176}, {256});
  CHECK_THAT(h, Catch::Contains("m64n176k16.f32.f16.f16") && Catch::Contains("m64n256k16"));
  CHECK_THAT(h, Catch::Contains("\"+f\"(d[31][3])"));
  CHECK_THROWS_AS(cuda::wgmma_wrappers(DType::F32, {128}, {}), InternalError);
  CHECK_THROWS_AS(cuda::wgmma_wrappers(DType::BF16, {100}, {}), InternalError);
}

TEST_CASE("TMA blockers name the stride a tensor map cannot express", "[sm90][runtime]") {
  alignas(16) static char storage[64];
  TensorRef t = TensorRef::contiguous(storage, DType::BF16, {2, 4, 100, 128});
  CHECK_FALSE(runtime::bhsd_tma_blocker(t, "q").has_value());
  // [B, S, H, D] views (heads interleaved in the sequence) are fine: any positive multiple of 16.
  t.strides = {100 * 4 * 128, 128, 4 * 128, 1};
  CHECK_FALSE(runtime::bhsd_tma_blocker(t, "q").has_value());
  t.strides = {100 * 4 * 128, 0, 4 * 128, 1};  // a broadcast head
  CHECK(runtime::bhsd_tma_blocker(t, "k").value() ==
        "k's head stride is 0 bytes; a TMA tensor map needs a positive multiple of 16 below 2^40");
  t.strides = {100 * 4 * 128, 128, 4 * 128 + 4, 1};
  CHECK_THAT(runtime::bhsd_tma_blocker(t, "v").value(),
             Catch::Contains("v's sequence stride is 1032 bytes"));
  t = TensorRef::contiguous(storage, DType::F32, {1, 1, 8, 64});
  CHECK_THAT(runtime::bhsd_tma_blocker(t, "q").value(), Catch::Contains("16-bit"));
  t = TensorRef::contiguous(storage + 2, DType::BF16, {1, 1, 8, 64});
  CHECK_THAT(runtime::bhsd_tma_blocker(t, "q").value(), Catch::Contains("16-byte aligned"));
  // Extent-1 dims may have any stride (their coordinate is always 0).
  t = TensorRef::contiguous(storage, DType::BF16, {1, 1, 8, 64});
  t.strides = {0, 3, 64, 1};
  CHECK_FALSE(runtime::bhsd_tma_blocker(t, "q").has_value());
}

TEST_CASE("sm90a_wgmma compiles for every standard mod and head dim without spills",
          "[sm90][nvrtc]") {
  struct Job {
    std::string mods;
    DType dtype;
    int dqk, dv;
    Params overrides;
    bool divisible = false;  // lengths that divide the tiles (the benchmark's shapes)
  };
  std::vector<Job> jobs;
  for (const std::string& m : standard_mod_names())
    jobs.push_back({m, DType::BF16, 128, 128, {}});
  for (auto [dqk, dv] : {std::pair{64, 64}, {256, 256}, {128, 64}, {64, 256}}) {
    jobs.push_back({"alibi_causal", DType::F16, dqk, dv, {}});
    jobs.push_back({"softcap", DType::BF16, dqk, dv, {}});
  }
  jobs.push_back({"noop", DType::BF16, 128, 128, {{"block_n", 176}}});
  jobs.push_back({"causal", DType::BF16, 64, 64, {{"block_n", 176}, {"num_stages", 4}}});
  jobs.push_back({"document_causal", DType::BF16, 128, 128, {{"block_n", 64}}});
  // The head-dim-64 candidates (issue 10): three consumer warpgroups, wider KV tiles.
  // Every standard mod whose d 64 default takes 192 rows (with a mask_mod that does not divide
  // by a run-time value; chunked_local and dilated_sliding keep 128).
  for (const char* m : {"noop", "causal", "alibi_causal", "softcap_causal", "document_causal",
                        "document", "sliding_window", "prefix_lm"})
    jobs.push_back({m, DType::BF16, 64, 64, {{"block_m", 192}}});
  for (const char* m : {"document_causal", "document"})
    jobs.push_back({m, DType::BF16, 64, 64, {{"block_m", 192}, {"block_n", 64}}});
  jobs.push_back({"document", DType::BF16, 64, 64, {{"block_m", 128}}});
  // Document masks at d 64 with lengths that divide 192-row tiles (S = 3072, ...; persistent):
  // 12 B until the thread's row came from its warp and lane there (forward_sm90.cuh, q_row0).
  for (const char* m : {"document_causal", "document"})
    jobs.push_back({m, DType::BF16, 64, 64, {{"block_m", 192}}, true});
  jobs.push_back({"causal", DType::F16, 64, 64, {{"block_m", 192}, {"num_stages", 2}}});
  jobs.push_back({"causal", DType::BF16, 128, 64, {{"block_m", 192}, {"num_stages", 3}}});
  jobs.push_back({"noop", DType::BF16, 64, 64, {{"block_n", 192}}});
  jobs.push_back({"causal", DType::F16, 64, 64, {{"block_n", 192}}});
  // Two query tiles per CTA (the epilogue stores from registers).
  for (const char* m : {"noop", "causal", "alibi_causal", "document_causal"})
    jobs.push_back({m, DType::BF16, 64, 64, {{"q_tiles", 2}}});
  jobs.push_back({"causal", DType::BF16, 128, 128, {{"q_tiles", 2}, {"num_stages", 2}}});
  jobs.push_back({"softcap", DType::F16, 256, 256, {{"q_tiles", 2}}});
  jobs.push_back({"relative_bias_causal", DType::BF16, 128, 128, {{"q_tiles", 2}}});
  // The diagonal loads (kFjDiagLoad) at both head dims, three consumer warpgroups, wide tiles.
  jobs.push_back({"relative_bias_causal", DType::BF16, 64, 64, {}});
  jobs.push_back({"relative_bias", DType::F16, 64, 64, {{"block_m", 192}}});
  jobs.push_back({"relative_bias_causal", DType::BF16, 64, 64, {{"block_m", 192}}});
  jobs.push_back({"relative_bias_causal", DType::BF16, 64, 64, {{"block_n", 192}}});
  jobs.push_back({"relative_bias", DType::BF16, 128, 64, {{"block_m", 192}, {"num_stages", 3}}});
  // Persistent CTAs (the d 64 default, above) at d 128: 2 stages, the producer's 40 registers.
  for (const char* m : {"noop", "causal", "alibi_causal", "relative_bias_causal"})
    jobs.push_back({m, DType::BF16, 128, 128, {{"persistent", 1}}});
  jobs.push_back({"causal", DType::BF16, 64, 64, {{"persistent", 0}, {"q_tiles", 1}}});
  // Head dims below their tile dims (issue 28): the defaults of d 96, 80, 192 / 128, 96 / 64 and
  // one of each other tile, noop, causal and a captured buffer.
  for (auto [dqk, dv] : {std::pair{96, 96}, {80, 80}, {192, 128}, {96, 64}}) {
    for (const char* m : {"noop", "causal", "alibi_causal"})
      jobs.push_back({m, DType::BF16, dqk, dv, {}});
  }
  jobs.push_back({"causal", DType::BF16, 40, 40, {}});
  jobs.push_back({"document_causal", DType::BF16, 112, 112, {}});
  jobs.push_back({"softcap", DType::F16, 160, 160, {}});
  jobs.push_back({"causal", DType::BF16, 192, 192, {}});
  jobs.push_back({"alibi_causal", DType::BF16, 256, 128, {}});
  jobs.push_back({"noop", DType::BF16, 48, 48, {{"block_m", 192}}});
  jobs.push_back({"causal", DType::BF16, 96, 96, {{"persistent", 1}}});
  // Three consumers at d 128 (the serial loop, 2 stages): the defaults of the main shape's mods
  // and of d 96, one CTA per tile and (the default) persistent. Not here: document_causal with one
  // CTA per tile (8 B; docs/kernels/forward_sm90.md "Three consumer warpgroups at d 128").
  for (const char* m : {"noop", "causal", "alibi_causal", "softcap_causal", "relative_bias_causal",
                        "sliding_window", "prefix_lm", "document", "alibi", "t5_bucketed_bias",
                        "sinks_sliding_window"})
    jobs.push_back({m, DType::BF16, 128, 128, {{"block_m", 192}}});
  // Persistent 192-row tiles, with and without `divisible`: document_causal spilled 12 B until
  // its row came from the thread index where used (FjSm90Consumer::row0). Not here: softcap with
  // `divisible` (8 B: the lane index and the tile count across the loop).
  const Params persistent192 = {{"block_m", 192}, {"num_stages", 2}, {"persistent", 1}};
  for (const char* m : {"document_causal", "document", "softcap"}) {
    for (bool divisible : {false, true}) {
      if (std::string(m) == "softcap" && divisible) continue;
      jobs.push_back({m, DType::BF16, 128, 128, persistent192, divisible});
    }
  }
  jobs.push_back({"causal", DType::F16, 96, 96, {{"block_m", 192}}});

  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::mutex mu;
  std::vector<std::string> failures, report;
  test::run_parallel(jobs.size(), [&](size_t i) {
    const Job& j = jobs[i];
    try {
      KernelDesc d = sm90_desc(j.dtype, j.dqk, j.dv, j.overrides);
      if (j.divisible) d.flags.set("divisible", 1);
      const BuiltKernel k = builder.build(standard_mods(j.mods), d);
      const auto& u = k.compiled.kernel->usage;
      std::lock_guard<std::mutex> lock(mu);
      report.push_back(fmt::format("{} {}: {} registers (launch bound), {} B spills, {} B smem",
                                   d.str(), j.mods, u.registers, u.spill_store_bytes,
                                   ForwardSm90Wgmma().smem_bytes(d)));
      // None, every config here (docs/kernels/forward_sm90.md "Design notes"): document(_causal) at
      // d 128 spilled 4 B until v17, t5_bucketed_bias 8 B until v12, relative_bias(_causal) 52 B
      // until its table was read once per diagonal, softcap_causal at 192 rows 24 B and the union
      // loop's first shapes 150-350 B until v18, document at 192 rows 32 B and document_causal 4 B
      // (8 B with persistent 128-row tiles) until v19 read the document ids once per warp
      // (kFjColLoad) and took the thread's row offset per query tile.
      if (u.spill_store_bytes > 0 || u.spill_load_bytes > 0) {
        failures.push_back(fmt::format("{} {}: {} / {} bytes of spill stores / loads", d.str(),
                                       j.mods, u.spill_store_bytes, u.spill_load_bytes));
      }
      // Nor wgmma serialized by ptxas (which it may do instead of spilling).
      if (!u.wgmma_serialized.empty()) {
        failures.push_back(
            fmt::format("{} {}: wgmma serialized ({})", d.str(), j.mods, u.wgmma_serialized));
      }
      for (const char* needle :
           {"wgmma.mma_async", "cp.async.bulk.tensor.4d", "setmaxnreg.inc", "mbarrier.try_wait"}) {
        if (k.source->source.find(needle) == std::string::npos)
          failures.push_back(fmt::format("{} {}: source lacks {}", d.str(), j.mods, needle));
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(j.mods + ": " + e.what());
    }
  });
  std::sort(report.begin(), report.end());
  WARN(fmt::format("{}", fmt::join(report, "\n")));
  CHECK(failures.empty());
  for (const std::string& f : failures)
    FAIL_CHECK(f);
}

TEST_CASE("sm90a_wgmma reads a score_mod's diagonal load once per diagonal", "[sm90][nvrtc]") {
  // A reversed sign into a per-head f16 table, a load reached only under a where(), and two
  // sites of one table (the second stays a load per score); both head dims, with and without
  // divisible lengths, three consumer warpgroups.
  const std::vector<std::string> texts = {
      "buffer rel: f16[H, R]\nparam off: i32\nscore_mod = score + 2.0 * rel[h, kv_idx - q_idx + "
      "off]\nmask_mod = kv_idx <= q_idx + 50",
      "buffer bias: f32[R]\nparam offset: i32\nscore_mod = where(q_idx >= kv_idx, score + "
      "bias[q_idx - kv_idx + offset], score * 0.5)",
      "buffer bias: f32[R]\nparam offset: i32\nscore_mod = score + bias[q_idx - kv_idx + "
      "offset] + 0.5 * bias[q_idx - kv_idx + offset - 1]"};
  struct Job {
    size_t text;
    int d;
    bool divisible;
    Params overrides;
  };
  std::vector<Job> jobs;
  for (size_t t = 0; t < texts.size(); ++t) {
    for (int d : {64, 128})
      for (bool divisible : {false, true})
        jobs.push_back({t, d, divisible, {}});
    jobs.push_back({t, 64, false, {{"block_m", 192}}});
  }
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::mutex mu;
  std::vector<std::string> failures;
  test::run_parallel(jobs.size(), [&](size_t i) {
    const Job& j = jobs[i];
    try {
      KernelDesc d = sm90_desc(DType::BF16, j.d, j.d, j.overrides);
      d.flags.set("divisible", j.divisible ? 1 : 0);
      const BuiltKernel k = builder.build(parse_mods(texts[j.text]), d);
      const auto& u = k.compiled.kernel->usage;
      std::lock_guard<std::mutex> lock(mu);
      if (k.source->source.find("static constexpr bool kFjDiagLoad = true;") == std::string::npos)
        failures.push_back(fmt::format("{} mod {}: no diagonal load", d.str(), j.text));
      // No spills at the default tiles, except for the two sites (the second still loads at
      // every score: 56-88 bytes, as relative_bias_causal spilled before). Three consumer
      // warpgroups (160 registers per thread) spill with a mask or a where() beside the load
      // (68-240 bytes; 320-490 without the diagonal load): not a default config.
      const bool strict = j.text != 2 && j.overrides.empty();
      if (strict && (u.spill_store_bytes > 0 || u.spill_load_bytes > 0)) {
        failures.push_back(fmt::format("{} mod {}: {} / {} bytes of spill stores / loads", d.str(),
                                       j.text, u.spill_store_bytes, u.spill_load_bytes));
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(fmt::format("mod {}: {}", j.text, e.what()));
    }
  });
  CHECK(failures.empty());
  for (const std::string& f : failures)
    FAIL_CHECK(f);
}
