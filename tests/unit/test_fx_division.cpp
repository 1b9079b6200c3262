// `//` and `/` in .fx text against Python (issue 34, "Errors in the user's terms"): .fx's `/`
// floors between i32 values and `//` starts a comment, so Python's `q_idx // 256` pasted into
// .fx used to cut the line (`mask_mod = q_idx`: "mask_mod must return bool") or, worse, parse to
// something else (`score + q_idx // 2` as `score + q_idx`). Such a `//` is now an error naming
// the operator to use; comments after code still work. docs/dsl.md, "Division".
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include <catch2/catch.hpp>

#include <string>

using namespace flexjit;

TEST_CASE(".fx: a `//` that reads as Python's floor division is an error naming `/`",
          "[dsl][parser][errors]") {
  const std::string hint = "for floor division write `/` (between i32 values it floors";
  CHECK_THROWS_AS(parse_mods("mask_mod = q_idx // 256 == kv_idx // 256", "m.fx"), CompileError);
  CHECK_THROWS_WITH(
      parse_mods("mask_mod = q_idx // 256 == kv_idx // 256", "m.fx"),
      Catch::StartsWith("m.fx:1:18: error: `//` starts a comment in .fx") && Catch::Contains(hint));
  // It used to parse, silently, as `score + q_idx`.
  CHECK_THROWS_WITH(parse_mods("score_mod = score + q_idx // 2", "s.fx"), Catch::Contains(hint));
  CHECK_THROWS_WITH(parse_mods("param n: i32 = 64\nmask_mod = (q_idx // n) * n == kv_idx"),
                    Catch::Contains(hint));
  CHECK_THROWS_WITH(parse_mods("let c = kv_idx\nmask_mod = q_idx // c == 0"),
                    Catch::Contains(hint));
  // What it should be: `/`, which floors.
  const Mods m = parse_mods("mask_mod = q_idx / 256 == kv_idx / 256");
  CHECK(m.mask_mod.defined());
  // Comments stay comments: on their own line, after code with prose, with `#`.
  CHECK_NOTHROW(parse_mods("// chunked\nmask_mod = q_idx >= kv_idx // causal"));
  CHECK_NOTHROW(parse_mods("mask_mod = q_idx >= kv_idx // see docs/dsl.md"));
  CHECK_NOTHROW(parse_mods("mask_mod = q_idx >= kv_idx # 256 // 2 == 128"));
  CHECK_NOTHROW(parse_mods("mask_mod = q_idx >= kv_idx\n// 256 // 2 == 128"));
}
