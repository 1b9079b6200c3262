#include <flexjit/block_mask.h>
#include <flexjit/error.h>

#include "flexjit_abi.h"
#include "support/CacheTest.h"
#include "support/Nvrtc.h"
#include "util/Embedded.h"

#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

using namespace flexjit;

namespace {

// The brute-force class of a tile, with positions past the sequence end masked.
TileKind brute_tile(const std::function<bool(int, int, int, int)>& pred, const BlockMask& m, int b,
                    int h, int qb, int kvb) {
  int hits = 0;
  for (int i = 0; i < m.q_block_size; ++i) {
    for (int j = 0; j < m.kv_block_size; ++j) {
      const int q = qb * m.q_block_size + i, kv = kvb * m.kv_block_size + j;
      if (q < m.seqlen_q && kv < m.seqlen_kv && pred(b, h, q, kv)) ++hits;
    }
  }
  if (hits == 0) return TileKind::Empty;
  return hits == m.q_block_size * m.kv_block_size ? TileKind::Full : TileKind::Partial;
}

void check_against_brute_force(const std::function<bool(int, int, int, int)>& pred,
                               const BlockMask& m) {
  REQUIRE_NOTHROW(m.validate());
  for (int b = 0; b < m.batch; ++b) {
    for (int h = 0; h < m.heads; ++h) {
      for (int qb = 0; qb < m.num_q_blocks; ++qb) {
        for (int kvb = 0; kvb < m.num_kv_blocks; ++kvb) {
          INFO("b=" << b << " h=" << h << " qb=" << qb << " kvb=" << kvb);
          REQUIRE(m.tile(b, h, qb, kvb) == brute_tile(pred, m, b, h, qb, kvb));
        }
      }
    }
  }
}

bool causal(int, int, int q, int kv) {
  return q >= kv;
}

}  // namespace

TEST_CASE("causal block mask matches brute force, including cut boundary tiles", "[blockmask]") {
  for (auto [sq, skv, bs] : {std::tuple{256, 256, 64}, {300, 300, 64}, {100, 260, 32}}) {
    BlockMask m = block_mask_from_predicate(causal, 1, 1, sq, skv, bs, bs);
    CHECK(m.num_q_blocks == (sq + bs - 1) / bs);
    check_against_brute_force(causal, m);
  }
  BlockMask m = block_mask_from_predicate(causal, 1, 1, 256, 256, 64, 64);
  // Row 2 of a 4x4 causal mask: tiles 0 and 1 full, tile 2 (diagonal) partial.
  CHECK(m.full_kv_num_blocks[2] == 2);
  CHECK(m.kv_num_blocks[2] == 1);
  CHECK(m.kv_indices[2 * 4] == 2);
  CHECK(m.density() == Approx(10.0 / 16.0));
}

TEST_CASE("sliding-window and random dense masks match brute force", "[blockmask]") {
  auto sliding = [](int, int, int q, int kv) { return q >= kv && q - kv <= 100; };
  check_against_brute_force(sliding, block_mask_from_predicate(sliding, 1, 1, 512, 512, 32, 64));

  // Per-(b, h) random masks with whole tiles planted all-true and all-false.
  const int B = 2, H = 3, S = 96, bs = 16;
  std::mt19937 rng(7);
  std::vector<uint8_t> dense(static_cast<size_t>(B) * H * S * S);
  for (auto& v : dense)
    v = static_cast<uint8_t>(rng() % 7 == 0);
  auto at = [&](int b, int h, int q, int kv) -> uint8_t& {
    return dense[((static_cast<size_t>(b) * H + h) * S + q) * S + kv];
  };
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int qb = 0; qb < S / bs; ++qb) {
        for (int kvb = 0; kvb < S / bs; ++kvb) {
          const int r = static_cast<int>(rng() % 3);
          if (r == 2) continue;
          for (int i = 0; i < bs; ++i) {
            for (int j = 0; j < bs; ++j)
              at(b, h, qb * bs + i, kvb * bs + j) = r;
          }
        }
      }
    }
  }
  BlockMask m = block_mask_from_dense(dense, B, H, S, S, bs, bs);
  check_against_brute_force([&](int b, int h, int q, int kv) { return at(b, h, q, kv) != 0; }, m);
  CHECK_THROWS_WITH(block_mask_from_dense(dense, B, H, S, S + 1, bs, bs),
                    Catch::Contains("dense mask has 55296 elements; expected 55872"));
}

TEST_CASE("document-id block mask matches brute force and carries its mask_mod", "[blockmask]") {
  std::vector<int32_t> doc(200);
  for (size_t i = 0; i < doc.size(); ++i)
    doc[i] = i < 50 ? 0 : i < 130 ? 1 : 2;
  BlockMask m = block_mask_from_document_ids(doc, true, 32, 32);
  check_against_brute_force([&](int, int, int q, int kv) { return doc[q] == doc[kv] && q >= kv; },
                            m);
  REQUIRE(m.mods.mask_mod.defined());
  CHECK(m.mods.mask_mod.str() == "doc_ids[q_idx] == doc_ids[kv_idx] && q_idx >= kv_idx");
  REQUIRE(m.mods.buffers.size() == 1);
  CHECK(m.mods.buffers[0].name() == "doc_ids");
  BlockMask nc = block_mask_from_document_ids(doc, false, 32, 32);
  CHECK(nc.density() > m.density());
}

TEST_CASE("and_masks / or_masks combine tiles and mask_mods", "[blockmask]") {
  BlockMask c = block_mask_from_predicate(causal, 1, 1, 256, 256, 32, 32);
  c.mods = Mods::from_mask([](Expr, Expr, Expr q, Expr kv) { return q >= kv; });
  auto window = [](int, int, int q, int kv) { return q - kv <= 40 && kv - q <= 40; };
  BlockMask w = block_mask_from_predicate(window, 2, 1, 256, 256, 32, 32);  // Bm=2 broadcasts c
  w.mods =
      Mods::from_mask([](Expr, Expr, Expr q, Expr kv) { return q - kv <= 40 && kv - q <= 40; });

  BlockMask a = and_masks(c, w);
  BlockMask o = or_masks(c, w);
  REQUIRE_NOTHROW(a.validate());
  REQUIRE_NOTHROW(o.validate());
  CHECK(a.batch == 2);
  for (int b = 0; b < 2; ++b) {
    for (int qb = 0; qb < 8; ++qb) {
      for (int kvb = 0; kvb < 8; ++kvb) {
        const TileKind x = c.tile(0, 0, qb, kvb), y = w.tile(b, 0, qb, kvb);
        const TileKind want_and = (x == TileKind::Empty || y == TileKind::Empty) ? TileKind::Empty
                                  : (x == TileKind::Full && y == TileKind::Full)
                                      ? TileKind::Full
                                      : TileKind::Partial;
        const TileKind want_or = (x == TileKind::Full || y == TileKind::Full) ? TileKind::Full
                                 : (x == TileKind::Empty && y == TileKind::Empty)
                                     ? TileKind::Empty
                                     : TileKind::Partial;
        CHECK(a.tile(b, 0, qb, kvb) == want_and);
        CHECK(o.tile(b, 0, qb, kvb) == want_or);
      }
    }
  }
  CHECK(a.mods.mask_mod.str() ==
        "q_idx >= kv_idx && (q_idx - kv_idx <= 40 && kv_idx - q_idx <= 40)");
  CHECK(o.mods.mask_mod.str() == "q_idx >= kv_idx || q_idx - kv_idx <= 40 && kv_idx - q_idx <= 40");
  // A mask built from dense data has no known mask_mod; neither has its combination.
  BlockMask d = block_mask_from_predicate(causal, 1, 1, 256, 256, 32, 32);
  CHECK_FALSE(and_masks(d, w).mods.mask_mod.defined());

  BlockMask other = block_mask_from_predicate(causal, 1, 1, 256, 256, 64, 64);
  CHECK_THROWS_WITH(and_masks(c, other),
                    Catch::Contains("differ in sequence lengths or block sizes"));
  BlockMask h3 = block_mask_from_predicate(causal, 1, 3, 256, 256, 32, 32);
  BlockMask h2 = block_mask_from_predicate(causal, 1, 2, 256, 256, 32, 32);
  CHECK_THROWS_WITH(or_masks(h3, h2), Catch::Contains("masks differ in heads (3 vs 2)"));
}

TEST_CASE("q_* arrays are the transpose of kv_*; validate() names corruption", "[blockmask]") {
  auto pred = [](int, int h, int q, int kv) {
    return (q / 7 + kv / 5 + h) % 3 != 0 && q >= kv - 30;
  };
  BlockMask m = block_mask_from_predicate(pred, 1, 2, 160, 224, 16, 32);
  REQUIRE_NOTHROW(m.validate());
  for (int h = 0; h < 2; ++h) {
    for (int kvb = 0; kvb < m.num_kv_blocks; ++kvb) {
      const size_t row = static_cast<size_t>(h) * m.num_kv_blocks + kvb;
      for (int qb = 0; qb < m.num_q_blocks; ++qb) {
        const TileKind k = m.tile(0, h, qb, kvb);
        auto listed = [&](const std::vector<int32_t>& num, const std::vector<int32_t>& idx) {
          const int32_t* r = idx.data() + row * m.num_q_blocks;
          return std::find(r, r + num[row], qb) != r + num[row];
        };
        CHECK(listed(m.q_num_blocks, m.q_indices) == (k == TileKind::Partial));
        CHECK(listed(m.full_q_num_blocks, m.full_q_indices) == (k == TileKind::Full));
      }
    }
  }
  BlockMask bad = m;
  bad.kv_num_blocks[0] = 2;
  bad.kv_indices[0] = 3;
  bad.kv_indices[1] = 1;
  CHECK_THROWS_WITH(
      bad.validate(),
      Catch::Contains("kv_indices[0, 0, 0, 1] = 1 is not above the previous index 3"));
  bad = m;
  bad.kv_num_blocks[1] = 1;
  bad.kv_indices[m.num_kv_blocks] = 9;
  CHECK_THROWS_WITH(bad.validate(),
                    Catch::Contains("kv_indices[0, 0, 1, 0] = 9 is out of range [0, 7)"));
  bad = m;
  const auto row = std::find_if(bad.q_num_blocks.begin(), bad.q_num_blocks.end(),
                                [](int32_t n) { return n > 0; });
  REQUIRE(row != bad.q_num_blocks.end());
  *row -= 1;
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("not the transpose of kv_*"));
}

TEST_CASE("picture of a causal 4x4 block mask", "[blockmask]") {
  BlockMask m = block_mask_from_predicate(causal, 1, 1, 512, 512);
  CHECK(to_picture(m) ==
        "block mask b=0 h=0: 4 x 4 tiles of 128x128 (Sq=512, Skv=512)\n"
        "░···\n"
        "█░··\n"
        "██░·\n"
        "███░\n"
        "█ full  ░ partial  · empty  density 62.50%\n");
  // Downsampled: 8x8 tiles into 4x4 cells of 2x2 tiles; the diagonal cells mix classes.
  BlockMask big = block_mask_from_predicate(causal, 1, 1, 512, 512, 64, 64);
  const std::string pic = to_picture(big, 0, 0, 4);
  CHECK(pic.find("one cell per 2x2 tiles\n░···\n█░··\n██░·\n███░\n") != std::string::npos);
  CHECK_THROWS_WITH(to_picture(m, 0, -1), Catch::Contains("tile (0, -1) requested"));
  BlockMask two = block_mask_from_predicate(causal, 2, 1, 512, 512);
  CHECK_THROWS_WITH(to_picture(two, 2, 0), Catch::Contains("tile (2, 0) requested"));
}

TEST_CASE("write_ppm writes one grey level per tile class", "[blockmask]") {
  BlockMask m = block_mask_from_predicate(causal, 1, 1, 256, 256, 128, 128);
  flexjit::test::TempDir dir;
  const std::string path = (dir.path() / "mask.ppm").string();
  write_ppm(m, path, 0, 0, 2);
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  const std::string header = "P6\n4 4\n255\n";
  REQUIRE(data.size() == header.size() + 4 * 4 * 3);
  CHECK(data.substr(0, header.size()) == header);
  const auto px = [&](int x, int y) {
    return static_cast<unsigned char>(data[header.size() + (y * 4 + x) * 3]);
  };
  CHECK(px(0, 0) == 160);  // diagonal tile: partial
  CHECK(px(3, 0) == 255);  // above the diagonal: empty
  CHECK(px(0, 3) == 0);    // below the diagonal: full
  std::remove(path.c_str());
  CHECK_THROWS_AS(write_ppm(m, "/nonexistent-dir/x.ppm"), Error);
}

namespace {

// A hand-written stand-in for the generated parts the templates are spliced after.
constexpr const char* kStandInPrelude = R"(
struct fj_bf16 { unsigned short bits; };
struct fj_f16 { unsigned short bits; };
)";
constexpr const char* kStandInGenerated = R"(
struct FjBlockMaskConfig { static constexpr int kQBlock = 128, kKvBlock = 128, kNumWarps = 4; };
struct FjReferenceConfig {
  static constexpr int kDType = 2, kHeadDimQk = 128, kHeadDimV = 64, kGqaRatio = 2;
};
struct FjModParams { int unused_; };
__device__ inline bool fj_mask_mod(const FjModParams&, int b, int h, int q_idx, int kv_idx) {
  return q_idx >= kv_idx;
}
__device__ inline float fj_score_mod(const FjModParams&, float score, int b, int h, int q_idx,
                                     int kv_idx) {
  return score;
}
)";

std::string splice(const std::string& template_name) {
  std::string src(embedded::template_text("flexjit_abi.h"));
  bool has_prelude = false;
  for (const auto& f : embedded::templates())
    has_prelude |= std::string(f.name) == "prelude.cuh";
  src += has_prelude ? std::string(embedded::template_text("prelude.cuh")) : kStandInPrelude;
  src += kStandInGenerated;
  src += embedded::template_text(template_name);
  return src;
}

// Compiles to PTX for compute_80 and returns the NVRTC log ("" and ok = true on success).
bool nvrtc_compiles(const std::string& src, const std::string& name, std::string* log) {
  test::NvrtcOutput r =
      test::nvrtc_compile(src, name, {"--gpu-architecture=compute_80", "--std=c++17"});
  *log = std::move(r.log);
  return r.ok;
}

}  // namespace

// (tests/support/reference.cuh compiles through its variant: test_forward.cpp, "[reference]".)
TEST_CASE("block_mask.cuh compiles through NVRTC", "[blockmask][nvrtc]") {
  for (const char* t : {"block_mask.cuh"}) {
    std::string log;
    INFO(t << " NVRTC log:\n" << log);
    const bool ok = nvrtc_compiles(splice(t), t, &log);
    INFO(log);
    CHECK(ok);
  }
}
