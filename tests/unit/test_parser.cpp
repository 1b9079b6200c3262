// The `.fx` parser: what it accepts, what it builds, and the exact diagnostics it gives.
#include <flexjit/dsl.h>
#include <flexjit/mods.h>

#include "dsl/Parser.h"
#include "ir/IR.h"
#include "ir/Printer.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cmath>

#include <random>

using namespace flexjit;

namespace {

struct Diag {
  std::string message;
  int line = 0;
  int col = 0;
  std::string what;
};

// The CompileError that parsing `text` gives; fails the test if it parses.
Diag diag(const std::string& text) {
  try {
    Mods m = parse_mods(text, "t.fx");
    FAIL("parsed without error:\n" << text << "\nas\n" << m.to_text());
  } catch (const CompileError& e) {
    CHECK(e.loc().file == "t.fx");
    return {e.message(), e.loc().line, e.loc().col, e.what()};
  }
  return {};
}

// Checks message, position, and that what() shows the line with a caret under the column.
void check_diag(const std::string& text, int line, int col, const std::string& message) {
  INFO("input:\n" << text);
  Diag d = diag(text);
  CHECK(d.message == message);
  CHECK(d.line == line);
  CHECK(d.col == col);
  std::string prefix = "t.fx:" + std::to_string(line) + ":" + std::to_string(col) + ": error: ";
  CHECK(d.what.rfind(prefix + message, 0) == 0);
  // The source line, then a caret at the column (both indented by two spaces).
  size_t nl = d.what.find('\n');
  if (nl != std::string::npos) {
    std::string rest = d.what.substr(nl + 1);
    size_t nl2 = rest.find('\n');
    REQUIRE(nl2 != std::string::npos);
    std::string caret = rest.substr(nl2 + 1);
    CHECK(caret == std::string(static_cast<size_t>(col) + 1, ' ') + "^");
  }
}

// What() of an error in full, for the few goldens that pin the exact format.
std::string what_of(const std::string& text) {
  return diag(text).what;
}

Expr parse_score(const std::string& text) {
  return parse_mods(text).score_mod;
}
Expr parse_mask(const std::string& text) {
  return parse_mods(text).mask_mod;
}

}  // namespace

TEST_CASE("diagnostics show file:line:col, the line and a caret", "[dsl][parser][errors]") {
  CHECK(what_of("param w: i32 = 4\nmask_mod = q_idx >= kvidx\n") ==
        "t.fx:2:21: error: unknown identifier 'kvidx' (did you mean 'kv_idx'?)\n"
        "  mask_mod = q_idx >= kvidx\n"
        "                      ^");
  // Tabs are shown as spaces so that the caret stays under the column.
  CHECK(what_of("mask_mod =\tq_idx >= kvidx") ==
        "t.fx:1:21: error: unknown identifier 'kvidx' (did you mean 'kv_idx'?)\n"
        "  mask_mod = q_idx >= kvidx\n"
        "                      ^");
}

TEST_CASE("unexpected tokens say what was expected", "[dsl][parser][errors]") {
  check_diag("score_mod = score +", 1, 20, "expected an expression, found end of file");
  check_diag("score_mod = score +\n", 1, 20, "expected an expression, found end of line");
  check_diag("mask_mod = q_idx >= kv_idx)", 1, 27,
             "expected an operator or the end of the statement (a newline or ';'), found ')'");
  check_diag("score_mod = score score", 1, 19,
             "expected an operator or the end of the statement (a newline or ';'), found "
             "identifier 'score'");
  check_diag("score_mod = exp(score", 1, 22,
             "expected ',' or ')' to close the '(' of exp() at 1:16, found end of file");
  check_diag("score_mod = (score", 1, 19,
             "expected ')' to close the '(' at 1:13, found end of file");
  check_diag("score_mod = q_idx >= kv_idx ? score", 1, 36,
             "expected ':' in `c ? a : b`, found end of file");
  check_diag("score_mod score", 1, 11, "expected '=' after 'score_mod', found identifier 'score'");
  check_diag("scoremod = score", 1, 1,
             "expected a statement (buffer, param, let, score_mod = ..., mask_mod = ... or "
             "sink_mod = ...), "
             "found identifier 'scoremod' (did you mean 'score_mod'?)");
  check_diag("= 3", 1, 1,
             "expected a statement (buffer, param, let, score_mod = ..., mask_mod = ... or "
             "sink_mod = ...), "
             "found '='");
  check_diag("buffer x f32[S]", 1, 10,
             "expected ':' after the buffer name (buffer NAME: DTYPE[DIMS]), found identifier "
             "'f32'");
  check_diag("buffer x: f32[S, ]", 1, 18, "expected a dim (a name like S or a number), found ']'");
  check_diag("buffer x: f32[S T]", 1, 17,
             "expected ',' or ']' in the dims of buffer 'x' (opened at column 14), found "
             "identifier 'T'");
  check_diag("param w: i32 = 3 + 1", 1, 18,
             "expected the end of the statement (a newline or ';'), found '+'");
  check_diag("buffer t: f32[H] x", 1, 18,
             "expected the end of the statement (a newline or ';'), found identifier 'x'");
  check_diag("param 3: f32", 1, 7, "expected a param name, found number '3'");
  check_diag("let = 3", 1, 5, "expected a name after 'let', found '='");
  check_diag("mask_mod = q_idx @ kv_idx", 1, 18, "unexpected character '@'");
  check_diag("mask_mod = q_idx >= kv_idx & true", 1, 28,
             "unexpected '&' (the logical and is '&&')");
  check_diag("mask_mod = q_idx == kv_idx | true", 1, 28, "unexpected '|' (the logical or is '||')");
  check_diag("score_mod = score\x01", 1, 18, "unexpected character byte 0x01");
  check_diag("score_mod = 1e+", 1, 13, "malformed number '1e+': the exponent needs digits");
  check_diag("score_mod = 3abc", 1, 13, "malformed number '3abc'");
  check_diag("score_mod = 1.2.3", 1, 13, "malformed number '1.2.3'");
}

TEST_CASE("unknown identifiers suggest the closest known name", "[dsl][parser][errors]") {
  check_diag("mask_mod = q_idx >= kv_id", 1, 21,
             "unknown identifier 'kv_id' (did you mean 'kv_idx'?)");
  check_diag("score_mod = scroe", 1, 13, "unknown identifier 'scroe' (did you mean 'score'?)");
  check_diag("param window: i32\nmask_mod = q_idx - kv_idx <= windw", 2, 30,
             "unknown identifier 'windw' (did you mean 'window'?)");
  check_diag("mask_mod = q >= kv_idx", 1, 12, "unknown identifier 'q' (did you mean 'q_idx'?)");
  check_diag("score_mod = zzzzzz", 1, 13, "unknown identifier 'zzzzzz'");
  check_diag("score_mod = tahn(score)", 1, 13, "'tahn' is not a function (did you mean 'tanh'?)");
  check_diag("score_mod = exp", 1, 13, "'exp' is a builtin function; call it as exp(x)");
  check_diag("score_mod = let", 1, 13, "'let' is a keyword and cannot be used in an expression");
}

TEST_CASE("declarations: redeclaration and shadowing are errors", "[dsl][parser][errors]") {
  check_diag("param w: i32\nparam w: f32\nmask_mod = q_idx >= kv_idx", 2, 7,
             "'w' is already declared as a param on line 1");
  check_diag("buffer w: f32[H]\nlet w = 3", 2, 5, "'w' is already declared as a buffer on line 1");
  check_diag("let a = 1\nlet a = 2", 2, 5, "'a' is already declared as a let on line 1");
  check_diag("let h = 3", 1, 5,
             "cannot declare let 'h': 'h' is a leaf of the mods (score, b, h, q_idx, kv_idx)");
  check_diag("param score: f32", 1, 7,
             "cannot declare param 'score': 'score' is a leaf of the mods (score, b, h, q_idx, "
             "kv_idx)");
  check_diag("buffer exp: f32[H]", 1, 8,
             "cannot declare buffer 'exp': 'exp' is a builtin function");
  check_diag("let inf = 3", 1, 5, "cannot declare let 'inf': 'inf' is a literal");
  check_diag("let mask_mod = 3", 1, 5, "cannot declare let 'mask_mod': 'mask_mod' is a keyword");
  check_diag("let x = x + 1", 1, 9, "unknown identifier 'x'");
}

TEST_CASE("buffer and param declarations are checked", "[dsl][parser][errors]") {
  check_diag("buffer x: f64[S]", 1, 11,
             "unknown dtype 'f64'; a buffer is f32, f16, bf16, i32 or bool");
  check_diag(
      "buffer x: bf61[S]", 1, 11,
      "unknown dtype 'bf61'; a buffer is f32, f16, bf16, i32 or bool (did you mean 'bf16'?)");
  check_diag("param x: f16", 1, 10, "unknown param type 'f16'; a param is f32, i32 or bool");
  check_diag("buffer x: f32[]", 1, 15, "buffer 'x' needs 1 to 4 dims");
  check_diag("buffer x: f32[A, B, C, D, E]", 1, 27,
             "buffer 'x' has more than 4 dims; a buffer has 1 to 4");
  check_diag("buffer x: f32[0]", 1, 15, "a dim must be a positive i32 (1 to 2147483647), not 0");
  check_diag("buffer x: f32[2147483648]", 1, 15,
             "a dim must be a positive i32 (1 to 2147483647), not 2147483648");
  check_diag("param w: i32 = 1.5", 1, 16,
             "the default of param 'w: i32' must be an integer literal, found number '1.5'");
  check_diag("param w: i32 = 2147483648", 1, 16,
             "the default of param 'w: i32' 2147483648 does not fit in i32");
  check_diag("param w: bool = 1", 1, 17,
             "the default of param 'w: bool' must be true or false, found number '1'");
  check_diag("param w: f32 = q_idx", 1, 16,
             "the default of param 'w: f32' must be a number literal, found identifier 'q_idx'");
  check_diag("param w: f32 = -nan", 1, 16,
             "the default of param 'w: f32' must be a number literal, found '-' identifier 'nan'");

  Mods m = parse_mods(
      "param a: i32 = -2147483648\nparam c: f32 = 3\nparam d: f32 = -inf\nparam e: bool = "
      "true\nbuffer t: bf16[B, H, 0008, S]\nmask_mod = q_idx >= kv_idx");
  REQUIRE(m.params.size() == 4);
  CHECK(*m.params[0].decl()->default_value == -2147483648.0);
  CHECK(*m.params[1].decl()->default_value == 3.0);
  CHECK(*m.params[2].decl()->default_value == -HUGE_VAL);
  CHECK(*m.params[3].decl()->default_value == 1.0);
  REQUIRE(m.buffers.size() == 1);
  CHECK(m.buffers[0].decl()->dims == std::vector<std::string>{"B", "H", "8", "S"});
  CHECK(m.buffers[0].dtype() == DType::BF16);
  CHECK(m.buffers[0].decl()->loc.line == 5);
  CHECK(m.buffers[0].decl()->loc.col == 8);
}

TEST_CASE("integer literals must fit in i32", "[dsl][parser][errors]") {
  check_diag("score_mod = float(2147483648)", 1, 19,
             "integer literal 2147483648 does not fit in i32 (-2147483648 to 2147483647; write "
             "2147483648.0 for an f32)");
  check_diag("score_mod = float(-2147483649)", 1, 19,
             "integer literal -2147483649 does not fit in i32 (-2147483648 to 2147483647; write "
             "2147483649.0 for an f32)");
  check_diag("score_mod = float(99999999999999999999999)", 1, 19,
             "integer literal 99999999999999999999999 does not fit in i32 (-2147483648 to "
             "2147483647; write 99999999999999999999999.0 for an f32)");
  CHECK(parse_score("score_mod = float(-2147483648)")->args[0]->ival == -2147483648LL);
  check_diag("score_mod = 1e39", 1, 13,
             "float literal 1e39 is out of f32 range (largest is 3.4028235e+38; write inf for "
             "infinity)");
  check_diag("score_mod = 1e-50", 1, 13,
             "float literal 1e-50 is too small for f32 and would round to 0");
}

TEST_CASE("score_mod and mask_mod: once each, at least one, right types", "[dsl][parser][errors]") {
  check_diag("score_mod = score\nscore_mod = score", 2, 1,
             "score_mod is already defined on line 1");
  check_diag("mask_mod = true\n\nmask_mod = false", 3, 1, "mask_mod is already defined on line 1");
  check_diag("", 1, 1,
             "no score_mod, mask_mod or sink_mod: a mods file defines at least one of them, e.g. "
             "`mask_mod = q_idx >= kv_idx`");
  check_diag("// just a comment\nparam w: i32\n", 3, 1,
             "no score_mod, mask_mod or sink_mod: a mods file defines at least one of them, e.g. "
             "`mask_mod = q_idx >= kv_idx`");
  check_diag("score_mod = q_idx >= kv_idx", 1, 13,
             "score_mod must return f32, but `q_idx >= kv_idx` (bool) is bool");
  check_diag("score_mod = q_idx - kv_idx", 1, 13,
             "score_mod must return f32, but `q_idx - kv_idx` (i32) is i32 (use float(x))");
  check_diag("mask_mod = q_idx - kv_idx", 1, 12,
             "mask_mod must return bool, but `q_idx - kv_idx` (i32) is i32 (compare it, e.g. "
             "`... != 0`)");
  check_diag("mask_mod = score > 0.0", 1, 12,
             "mask_mod cannot use `score`: it receives only b, h, q_idx and kv_idx");
  check_diag("let s = score * 2.0\nmask_mod = s > 0.0", 2, 12,
             "mask_mod cannot use `score`, which 's' (line 1) uses: mask_mod receives only b, h, "
             "q_idx and kv_idx");
}

TEST_CASE("type errors point at the operator and name the operand", "[dsl][parser][errors]") {
  check_diag("mask_mod = q_idx + (q_idx >= kv_idx) > 0", 1, 18,
             "operand of '+' must be a number, but `q_idx >= kv_idx` (bool) is bool (use int(x) "
             "or float(x), or where(x, 1, 0))");
  check_diag("mask_mod = q_idx && kv_idx", 1, 18,
             "operand of '&&' must be bool, but `q_idx` (i32) is not");
  check_diag("mask_mod = !q_idx", 1, 12, "operand of '!' must be bool, but `q_idx` (i32) is not");
  check_diag("score_mod = where(q_idx, score, 0.0)", 1, 13,
             "condition of where(c, a, b) must be bool, but `q_idx` (i32) is not");
  check_diag("score_mod = q_idx > 0 ? score : true", 1, 23,
             "branches of where(c, a, b) have different types: `score` (f32) and `true` (bool)");
  check_diag("buffer t: f32[H, S]\nscore_mod = t[h]", 2, 13,
             "buffer 't' has 2 dims but is indexed with 1 index");
  check_diag("buffer t: f32[H]\nscore_mod = t[score]", 2, 13,
             "index 0 of buffer 't' must be i32, but `score` (f32) is not (use int(x))");
  check_diag("buffer t: f32[H]\nscore_mod = t", 2, 13,
             "buffer 't' must be indexed: t[...] with 1 index");
  check_diag("buffer t: f32[H]\nscore_mod = t[h][h][h][h][h]", 2, 27,
             "buffer 't' has 1 dim but is indexed with more than 4 indexes");
  check_diag("score_mod = score[h]", 1, 18,
             "'score' is a leaf, not a buffer; only buffers can be indexed");
  check_diag("param p: i32\nscore_mod = p[h]", 2, 14,
             "'p' is a param, not a buffer; only buffers can be indexed");
  check_diag("score_mod = pow(score)", 1, 22, "pow() takes 2 arguments, but 1 is given");
  check_diag("score_mod = exp(score, score)", 1, 24, "exp() takes 1 argument, but more are given");
  check_diag("score_mod = where()", 1, 19, "where() takes 3 arguments, but 0 are given");
  check_diag(
      "score_mod = float(q_idx > 0) + int(true) + float(score > 0.0 && true) + q_idx % "
      "2.0 + pow(true, 2)",
      1, 87,
      "operand of 'pow' must be a number, but `true` (bool) is bool (use int(x) or "
      "float(x), or where(x, 1, 0))");
}

TEST_CASE("nesting and size are bounded, never a stack overflow", "[dsl][parser][errors]") {
  std::string deep = "score_mod = " + std::string(5000, '(') + "score" + std::string(5000, ')');
  Diag d = diag(deep);
  CHECK(d.message ==
        fmt::format("expression nested too deeply (more than {} levels)", dsl::kMaxNesting));
  CHECK(d.line == 1);
  CHECK(d.col == 13 + dsl::kMaxNesting);  // the first '(' past the limit
  CHECK(diag("score_mod = " + std::string(100000, '-') + "score").message ==
        fmt::format("expression nested too deeply (more than {} levels)", dsl::kMaxNesting));
  CHECK(diag("mask_mod = " + std::string(100000, '!') + "true").line == 1);
  // 200 levels is fine.
  CHECK(parse_score("score_mod = " + std::string(200, '(') + "score" + std::string(200, ')'))->op ==
        ir::Op::Var);
  // A long flat chain is deep as IR: it is bounded too.
  std::string chain = "score_mod = score";
  for (int i = 0; i < 5000; ++i)
    chain += " + 1.0";
  d = diag(chain);
  CHECK(d.message == fmt::format("expression too deep (more than {} levels once lets are "
                                 "substituted)",
                                 dsl::kMaxExprDepth));
  // lets that double an expression would print exponentially large text: bounded.
  std::string doubling = "let a0 = score\n";
  for (int i = 1; i < 40; ++i) {
    doubling += fmt::format("let a{} = a{} + a{}\n", i, i - 1, i - 1);
  }
  doubling += "score_mod = a39\n";
  d = diag(doubling);
  CHECK(d.message == fmt::format("expression too large (more than {} nodes once lets are "
                                 "substituted)",
                                 dsl::kMaxExprNodes));
  CHECK(d.line == 17);
}

TEST_CASE("the grammar: precedence, associativity, literals", "[dsl][parser]") {
  Expr s = score(), q = q_idx(), kv = kv_idx(), b = b_idx(), h = h_idx();
  auto same = [](const Expr& a, const Expr& e) {
    INFO(ir::to_text(a) << " vs " << ir::to_text(e));
    CHECK(ir::equal(a, e));
  };
  same(parse_mask("mask_mod = q_idx - kv_idx - 1 < b * h + 2 % h"), (q - kv) - 1 < b * h + 2 % h);
  same(parse_mask("mask_mod = q_idx > 0 || kv_idx > 0 && b == h"), q > 0 || (kv > 0 && b == h));
  same(parse_mask("mask_mod = q_idx < kv_idx == b < h"), (q < kv) == (b < h));
  same(parse_score("score_mod = -score * 2.0"), (-s) * 2.0);
  same(parse_score("score_mod = score / 2.0 / 4.0"), (s / 2.0) / 4.0);
  // ?: is the lowest and right-associative, and builds the same Select as where().
  same(parse_score("score_mod = q_idx > 0 ? score : kv_idx > 0 ? 1.0 : 2.0"),
       where(q > 0, s, where(kv > 0, Expr(1.0), Expr(2.0))));
  same(parse_score("score_mod = where(q_idx > 0, score, 0)"), where(q > 0, s, Expr(0)));
  // A '-' touching a number folds into the literal; -(3) and '- 3' stay negations.
  CHECK(parse_score("score_mod = float(-3)")->args[0]->op == ir::Op::IntImm);
  CHECK(parse_score("score_mod = float(-3)")->args[0]->ival == -3);
  CHECK(parse_score("score_mod = float(-(3))")->args[0]->op == ir::Op::Neg);
  CHECK(parse_score("score_mod = float(- 3)")->args[0]->op == ir::Op::Neg);
  CHECK(parse_score("score_mod = -inf")->fval == -HUGE_VAL);
  CHECK(parse_score("score_mod = -2.5e-3")->fval == static_cast<double>(-2.5e-3f));
  same(parse_score("score_mod = score - -1.0"), s - Expr(-1.0));
  same(parse_score("score_mod = score -1.0"), s - Expr(1.0));
  // Literal spellings.
  CHECK(parse_score("score_mod = .5")->fval == 0.5);
  CHECK(parse_score("score_mod = 1.")->fval == 1.0);
  CHECK(parse_score("score_mod = 2.5e+4")->fval == 25000.0);
  CHECK(parse_score("score_mod = 1E3")->fval == 1000.0);
  CHECK(std::isnan(parse_score("score_mod = nan")->fval));
  CHECK(parse_mask("mask_mod = true")->ival == 1);
  // i32 and f32 mix promotes with an explicit cast.
  CHECK(ir::to_text(parse_score("score_mod = score + q_idx")) == "score + float(q_idx)");
  CHECK(ir::to_text(parse_score("score_mod = exp(q_idx)")) == "exp(float(q_idx))");
  CHECK(ir::to_text(parse_score("score_mod = float(int(score))")) == "float(int(score))");
  CHECK(ir::to_text(parse_score("score_mod = float(q_idx)")) == "float(q_idx)");
}

TEST_CASE("buffers index as b[i][j] or b[i, j]; lets substitute inline", "[dsl][parser]") {
  Mods a = parse_mods("buffer t: f16[H, S, 4]\nscore_mod = score + t[h][q_idx][1]");
  Mods b = parse_mods("buffer t: f16[H, S, 4]\nscore_mod = score + t[h, q_idx, 1]");
  Mods c = parse_mods("buffer t: f16[H, S, 4]\nscore_mod = score + t[h, q_idx][1]");
  CHECK(equal(a, b));
  CHECK(equal(a, c));
  Buffer t("t", DType::F16, {"H", "S", "4"});
  CHECK(ir::equal(a.score_mod, score() + t(h_idx(), q_idx(), 1)));

  Mods l = parse_mods(
      "param cap: f32 = 30.0\nlet s = score / cap\nscore_mod = cap * tanh(s)\nmask_mod = "
      "q_idx >= kv_idx");
  Param cap("cap", ScalarType::F32, 30.0);
  CHECK(ir::equal(l.score_mod, cap * tanh(score() / cap)));
  CHECK(l.params.size() == 1);
  // A let used twice is one shared node, not two copies.
  Mods twice = parse_mods("let d = q_idx - kv_idx\nmask_mod = d >= 0 && d < 8");
  CHECK(twice.mask_mod->args[0]->args[0].same_as(twice.mask_mod->args[1]->args[0]));
}

TEST_CASE("statements: newlines, ';', comments, multi-line expressions", "[dsl][parser]") {
  Mods m = parse_mods(
      "# hash comment\n"
      "  param w: i32 = 8 // trailing comment\r\n"
      "\n"
      "mask_mod = (q_idx >= kv_idx &&\n"
      "            q_idx - kv_idx <= w); score_mod = where(q_idx > 0,\n"
      "  score, 0.0) ;;\n");
  CHECK(m.mask_mod.defined());
  CHECK(m.score_mod.defined());
  CHECK(m.name == "<inline>");
  CHECK(parse_mods("mask_mod = true", "x.fx").name == "x.fx");
  // Declared but unused buffers and params stay: they are part of the mods' interface.
  Mods u = parse_mods("buffer z: f32[H]\nparam p: f32\nmask_mod = true");
  CHECK(u.buffers.size() == 1);
  CHECK(u.params.size() == 1);
  CHECK(equal(parse_mods(u.to_text()), u));
}

// Regression and robustness: mutated standard mods and random bytes either parse or give a
// CompileError with a known location, never another exception (this is what the fuzzer checks
// at scale; docs/fuzzing.md).
TEST_CASE("mutated inputs give CompileErrors, never crashes", "[dsl][parser][fuzz]") {
  std::mt19937_64 rng(12345);
  const std::string alphabet = "abhqkv_idx0123456789.e+-*/%<>=!&|?:()[],;#/ \n\tscoremaskletparam";
  std::vector<std::string> seeds;
  for (const auto& n : standard_mod_names())
    seeds.push_back(standard_mod_source(n));
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s = seeds[rng() % seeds.size()];
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      size_t at = rng() % s.size();
      switch (rng() % 4) {
        case 0:
          s.erase(at, 1 + rng() % 3);
          break;
        case 1:
          s.insert(at, 1, alphabet[rng() % alphabet.size()]);
          break;
        case 2:
          s[at] = static_cast<char>(rng() % 256);
          break;
        default:
          s.insert(at, s.substr(rng() % s.size(), rng() % 12));
          break;
      }
    }
    try {
      Mods m = parse_mods(s, "m.fx");
      Mods again = parse_mods(m.to_text(), "again.fx");
      INFO(s);
      REQUIRE(equal(m, again));
      ++parsed;
    } catch (const CompileError& e) {
      INFO(s << "\n" << e.what());
      REQUIRE(e.loc().known());
      REQUIRE(e.loc().file == "m.fx");
      ++rejected;
    }
  }
  CHECK(parsed > 100);
  CHECK(rejected > 100);
}
