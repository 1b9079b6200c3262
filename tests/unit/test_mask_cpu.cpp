// The interpreted block-mask builder (cpu/InterpretedBlockMask.h) against brute force, the analysis
// that lets create_block_mask skip tiles, the generated GPU builder source through NVRTC, and
// `flexjit mask show`.
#include <flexjit/block_mask.h>
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "cpu/InterpretedBlockMask.h"
#include "cpu/TileHints.h"
#include "ir/Evaluate.h"
#include "support/KernelDescs.h"

#include <catch2/catch.hpp>

#include "support/BlockMaskCompare.h"
#include "support/CliPath.h"
#include "support/HostBindings.h"

#include <array>
#include <cstdio>
#include <string>

using namespace flexjit;

namespace {

// Every position evaluated by the interpreter.
BlockMask brute_force(const Mods& m, int B, int H, int Sq, int Skv, int block,
                      const ir::EvalEnv& bindings) {
  ir::Evaluator eval(m.mask_mod);
  ir::EvalEnv env = bindings;
  return block_mask_from_predicate(
      [&](int b, int h, int q, int kv) {
        env.b = b;
        env.h = h;
        env.q_idx = q;
        env.kv_idx = kv;
        return eval.run(env).as_bool();
      },
      B, H, Sq, Skv, block, block);
}

std::vector<int32_t> uneven_doc_ids(int S) {
  std::vector<int32_t> ids(static_cast<size_t>(S));
  int doc = 0, left = 37;
  for (int i = 0; i < S; ++i) {
    ids[static_cast<size_t>(i)] = doc;
    if (--left == 0) left = 37 + 113 * (++doc % 4);
  }
  return ids;
}

std::string run(const std::string& args) {
  std::string out;
  const std::string cmd = flexjit::test::cli_path() + " " + args + " 2>/dev/null";
  if (FILE* p = popen(cmd.c_str(), "r")) {
    std::array<char, 4096> buf;
    while (size_t n = fread(buf.data(), 1, buf.size(), p))
      out.append(buf.data(), n);
    pclose(p);
  }
  return out;
}

}  // namespace

TEST_CASE("CPU block mask builder equals brute force for the standard masks", "[mask][cpu]") {
  struct Case {
    std::string mods;
    std::vector<std::pair<std::string, double>> params;
  };
  const std::vector<Case> cases = {
      {"causal", {}},
      {"sliding_window", {{"window", 200}}},
      {"sliding_window", {}},  // default window 1024
      {"prefix_lm", {{"prefix", 300}}},
      {"chunked_local", {{"chunk", 256}}},
      {"chunked_local", {{"chunk", 100}}},
      {"dilated_sliding", {{"window", 300}, {"dilation", 3}}},
      {"document", {}},
      {"document_causal", {}},
  };
  const std::vector<std::array<int, 3>> shapes = {
      {1024, 1024, 128}, {1000, 900, 128}, {777, 1500, 64}, {300, 300, 512}};
  for (const Case& c : cases) {
    for (const auto& [sq, skv, block] : shapes) {
      const Mods m = standard_mods(c.mods);
      const int S = std::max(sq, skv);
      const std::vector<int32_t> ids = uneven_doc_ids(S);
      ir::EvalEnv env;
      for (const auto& [n, v] : c.params)
        env.params[n] = v;
      if (!m.buffers.empty())
        env.buffers["doc_id"] = ir::BufferView{ids.data(), DType::I32, {S}, {}};
      INFO(c.mods << " Sq=" << sq << " Skv=" << skv << " block=" << block);
      const BlockMask got =
          cpu::build_block_mask_interpreted(m, 1, 1, sq, skv, block, test::host_bindings(m, env));
      got.validate();
      test::require_same(got, brute_force(m, 1, 1, sq, skv, block, env));
    }
  }
}

TEST_CASE("CPU block mask builder follows b and h", "[mask][cpu]") {
  const Mods m = parse_mods("mask_mod = q_idx - kv_idx >= h * 100 - b * 250");
  const BlockMask got = cpu::build_block_mask_interpreted(m, 2, 3, 700, 650, 128, {});
  CHECK(got.batch == 2);
  CHECK(got.heads == 3);
  test::require_same(got, brute_force(m, 2, 3, 700, 650, 128, {}));
  // Head 2 of batch 0 is shifted by 200 positions: tile (1, 0) is no longer full.
  CHECK(got.tile(0, 0, 1, 0) == TileKind::Full);
  CHECK(got.tile(0, 2, 1, 0) != TileKind::Full);
}

TEST_CASE("Mask analysis decides every causal tile but the diagonal", "[mask][cpu]") {
  const Mods causal = standard_mods("causal");
  const cpu::TileHints h = cpu::analyze_tiles(causal, 1, 1, 65536, 65536, 128, {},
                                              cpu::default_analysis_budget(512, 512));
  CHECK(h.unknown.size() == 512);  // the diagonal tiles, which are partial
  for (int32_t t : h.unknown)
    CHECK(t / 512 == t % 512);
  CHECK(h.kinds[1] == static_cast<uint8_t>(TileKind::Empty));
  CHECK(h.kinds[512] == static_cast<uint8_t>(TileKind::Full));
  CHECK(h.analyze_calls <= cpu::default_analysis_budget(512, 512));

  // A cut last tile proven "true everywhere in range" is partial, never full.
  const cpu::TileHints cut = cpu::analyze_tiles(causal, 1, 1, 1000, 1000, 128, {}, 100000);
  CHECK(cut.kinds[7 * 8 + 0] == static_cast<uint8_t>(TileKind::Partial));

  // document_causal: loads are unknown, but `&& q_idx >= kv_idx` proves the upper triangle.
  const cpu::TileHints doc =
      cpu::analyze_tiles(standard_mods("document_causal"), 1, 1, 4096, 4096, 128, {}, 100000);
  CHECK(doc.unknown.size() == 32 * 33 / 2);
  // document alone: nothing provable; the analysis gives up early instead of spending its budget.
  const cpu::TileHints none =
      cpu::analyze_tiles(standard_mods("document"), 1, 1, 65536, 65536, 128, {}, 100000);
  CHECK(none.unknown.size() == 512u * 512u);
  CHECK(none.analyze_calls < 100);
}

TEST_CASE("CPU block mask builder reports bad input", "[mask][cpu]") {
  CHECK_THROWS_AS(
      cpu::build_block_mask_interpreted(standard_mods("alibi"), 1, 1, 128, 128, 128, {}),
      CompileError);
  CHECK_THROWS_WITH(
      cpu::build_block_mask_interpreted(standard_mods("causal"), 1, 1, 0, 128, 128, {}),
      Catch::Contains("must be positive"));
  // document without its buffer bound: named before anything is evaluated.
  CHECK_THROWS_WITH(
      cpu::build_block_mask_interpreted(standard_mods("document"), 1, 1, 256, 256, 128, {}),
      Catch::Contains("buffer 'doc_id' (i32[S]) is not bound"));
  // A grid too large to hold is an error, not std::bad_alloc.
  CHECK_THROWS_WITH(cpu::build_block_mask_interpreted(standard_mods("causal"), 1, 1, 2147483647,
                                                      2147483647, 128, {}),
                    Catch::Contains("16777216 x 16777216 tiles"));
}

TEST_CASE("The GPU block-mask builder compiles through NVRTC", "[mask][nvrtc]") {
  jit::CacheSettings s;
  s.enabled = false;
  KernelBuilder builder(s);
  for (const char* name : {"causal", "document_causal", "sliding_window", "alibi_causal"}) {
    INFO(name);
    const Mods mask = mask_only(standard_mods(name));
    CHECK(mask.buffers.size() == (std::string(name) == "document_causal" ? 1u : 0u));
    const BuiltKernel k = builder.build(standard_mods(name), test::block_mask_desc("sm_90a", 128));
    CHECK(k.desc.family_variant() == "block_mask/warp_per_tile");
    CHECK(k.source->source.find("struct FjBlockMaskConfig { static constexpr int kQBlock = 128") !=
          std::string::npos);
    // Only the mask_mod reaches the source: alibi_causal's score_mod and its buffer do not.
    CHECK(k.source->source.find("slopes") == std::string::npos);
    CHECK(!k.compiled.kernel->cubin.empty());
  }
  CHECK_THROWS_AS(mask_only(standard_mods("alibi")), CompileError);
  CHECK_THROWS_AS(builder.build(standard_mods("alibi"), test::block_mask_desc("sm_90a", 128)),
                  CompileError);
}

TEST_CASE("flexjit mask show draws the tiles", "[mask][cli]") {
  CHECK(run("mask show --mask-mod causal --seqlen 512 --block-size 128") ==
        "block mask b=0 h=0: 4 x 4 tiles of 128x128 (Sq=512, Skv=512)\n"
        "░···\n"
        "█░··\n"
        "██░·\n"
        "███░\n"
        "█ full  ░ partial  · empty  density 62.50%\n");
  CHECK(run("mask show --cpu --mask-mod sliding_window --param window=128 --seqlen 512 "
            "--seqlen-kv 384 --json")
            .find("\"tiles\": [\n    \"P..\",\n    \"PP.\",\n    \".PP\",\n    \"..P\"\n  ]") !=
        std::string::npos);
  CHECK(run("mask show --mask-mod causal --seqlen 512 --param nope=abc").empty());
}
