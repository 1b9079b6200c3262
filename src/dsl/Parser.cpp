#include "dsl/Parser.h"

#include "dsl/Lexer.h"
#include "ir/IR.h"
#include "ir/Operators.h"
#include "ir/Visitor.h"
#include "util/Suggest.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

namespace flexjit {

namespace dsl {

namespace {

using ir::Op;

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kI32MinMagnitude = -static_cast<int64_t>(std::numeric_limits<int32_t>::min());

// The builtin functions: name, arity, and what they build.
enum class FnKind : uint8_t { Unary, Binary, Select, CastF32, CastI32 };
struct Builtin {
  const char* name;
  int arity;
  FnKind kind;
  Op op;
};
constexpr Builtin kBuiltins[] = {
    {"where", 3, FnKind::Select, Op::Select},   {"min", 2, FnKind::Binary, Op::Min},
    {"max", 2, FnKind::Binary, Op::Max},        {"pow", 2, FnKind::Binary, Op::Pow},
    {"abs", 1, FnKind::Unary, Op::Abs},         {"exp", 1, FnKind::Unary, Op::Exp},
    {"exp2", 1, FnKind::Unary, Op::Exp2},       {"log", 1, FnKind::Unary, Op::Log},
    {"log2", 1, FnKind::Unary, Op::Log2},       {"tanh", 1, FnKind::Unary, Op::Tanh},
    {"sigmoid", 1, FnKind::Unary, Op::Sigmoid}, {"sqrt", 1, FnKind::Unary, Op::Sqrt},
    {"rsqrt", 1, FnKind::Unary, Op::Rsqrt},     {"floor", 1, FnKind::Unary, Op::Floor},
    {"ceil", 1, FnKind::Unary, Op::Ceil},       {"float", 1, FnKind::CastF32, Op::Cast},
    {"int", 1, FnKind::CastI32, Op::Cast},
};

constexpr const char* kKeywords[] = {"buffer", "param", "let", "score_mod", "mask_mod", "sink_mod"};
constexpr const char* kLiteralNames[] = {"true", "false", "inf", "nan"};

const Builtin* find_builtin(std::string_view name) {
  for (const auto& b : kBuiltins) {
    if (name == b.name) return &b;
  }
  return nullptr;
}

bool is_keyword(std::string_view name) {
  return std::find(std::begin(kKeywords), std::end(kKeywords), name) != std::end(kKeywords);
}

bool is_literal_name(std::string_view name) {
  return std::find(std::begin(kLiteralNames), std::end(kLiteralNames), name) !=
         std::end(kLiteralNames);
}

std::optional<ir::VarKind> find_leaf(std::string_view name) {
  for (auto v : {ir::VarKind::Score, ir::VarKind::B, ir::VarKind::H, ir::VarKind::QIdx,
                 ir::VarKind::KvIdx}) {
    if (name == ir::to_string(v)) return v;
  }
  return std::nullopt;
}

// " (did you mean 'kv_idx'?)" for the closest candidate, or "" when none is close.
std::string suggestion(std::string_view name, const std::vector<std::string>& candidates) {
  return did_you_mean(name, candidates);
}

// An expression being parsed, with the bounds that keep later recursive walks safe.
struct Value {
  Expr e;
  int depth = 0;      // IR tree depth (a leaf is 0)
  int64_t nodes = 1;  // IR tree size, counting shared sub-expressions once per use
};

// A declared name.
struct Binding {
  enum Kind { Param, Buffer, Let } kind;
  int line;
  std::shared_ptr<const ir::ParamDecl> param;
  std::shared_ptr<const ir::BufferDecl> buffer;
  Value value;  // Let
  bool uses_score = false;
};

class Parser {
 public:
  explicit Parser(const Source& src) : src_(src), toks_(tokenize(src)) {}

  Mods parse_file() {
    while (!at_end()) {
      if (peek().kind == TokenKind::EndOfStmt) {
        ++pos_;
        continue;
      }
      bool ends_with_expr = statement();
      if (peek().kind != TokenKind::EndOfStmt && !at_end()) {
        fail(peek(), fmt::format("expected {}the end of the statement (a newline or ';'), found {}",
                                 ends_with_expr ? "an operator or " : "", describe(peek())));
      }
    }
    if (!mods_.score_mod.defined() && !mods_.mask_mod.defined() && !mods_.sink_mod.defined()) {
      fail(peek(),
           "no score_mod, mask_mod or sink_mod: a mods file defines at least one of them, e.g. "
           "`mask_mod = q_idx >= kv_idx`");
    }
    mods_.name = src_.file();
    mods_.check();
    return std::move(mods_);
  }

 private:
  // --- tokens -----------------------------------------------------------------------------
  const Token& peek(size_t ahead = 0) const {
    return toks_[std::min(pos_ + ahead, toks_.size() - 1)];
  }
  const Token& next() {
    const Token& t = peek();
    if (pos_ < toks_.size() - 1) ++pos_;
    return t;
  }
  bool at_end() const { return peek().kind == TokenKind::End; }
  bool accept(std::string_view punct) {
    if (!peek().is(punct)) return false;
    ++pos_;
    return true;
  }
  const Token& expect(std::string_view punct, std::string_view context) {
    if (!peek().is(punct)) {
      fail(peek(), fmt::format("expected '{}' {}, found {}", punct, context, describe(peek())));
    }
    return next();
  }
  const Token& expect_ident(std::string_view what) {
    if (peek().kind != TokenKind::Ident) {
      fail(peek(), fmt::format("expected {}, found {}", what, describe(peek())));
    }
    return next();
  }
  [[noreturn]] void fail(const Token& t, const std::string& msg) const { src_.error_at(t, msg); }

  // --- statements ---------------------------------------------------------------------------
  // Parses one statement; returns whether it ends with an expression.
  bool statement() {
    const Token& t = peek();
    if (t.is_ident("buffer") || t.is_ident("param")) {
      t.is_ident("buffer") ? buffer_decl() : param_decl();
      return false;
    }
    if (t.is_ident("let")) {
      let_decl();
      return true;
    }
    if (t.is_ident("score_mod") || t.is_ident("mask_mod") || t.is_ident("sink_mod")) {
      mod_def();
      return true;
    }
    std::string hint;
    if (t.kind == TokenKind::Ident) {
      hint =
          suggestion(t.text, std::vector<std::string>(std::begin(kKeywords), std::end(kKeywords)));
    }
    fail(t, fmt::format("expected a statement (buffer, param, let, score_mod = ..., "
                        "mask_mod = ... or sink_mod = ...), found {}{}",
                        describe(t), hint));
  }

  // Checks that `t` may name a new declaration.
  void check_new_name(const Token& t, std::string_view what) {
    std::string name(t.text);
    if (find_leaf(name)) {
      fail(t, fmt::format("cannot declare {} '{}': '{}' is a leaf of the mods (score, b, h, "
                          "q_idx, kv_idx)",
                          what, name, name));
    }
    if (find_builtin(name)) {
      fail(t, fmt::format("cannot declare {} '{}': '{}' is a builtin function", what, name, name));
    }
    if (is_literal_name(name)) {
      fail(t, fmt::format("cannot declare {} '{}': '{}' is a literal", what, name, name));
    }
    if (is_keyword(name)) {
      fail(t, fmt::format("cannot declare {} '{}': '{}' is a keyword", what, name, name));
    }
    auto it = names_.find(name);
    if (it != names_.end()) {
      static constexpr const char* kKindNames[] = {"a param", "a buffer", "a let"};
      fail(t, fmt::format("'{}' is already declared as {} on line {}", name,
                          kKindNames[it->second.kind], it->second.line));
    }
  }

  // buffer NAME: DTYPE[DIM, ...]
  void buffer_decl() {
    next();
    const Token& name = expect_ident("a buffer name");
    check_new_name(name, "buffer");
    expect(":", "after the buffer name (buffer NAME: DTYPE[DIMS])");
    const Token& ty = expect_ident("a dtype (f32, f16, bf16, i32 or bool)");
    std::optional<DType> dtype = parse_dtype(ty.text);
    if (dtype == DType::E4M3) {
      fail(ty, fmt::format("buffer '{}' is {}: a buffer is f32, f16, bf16, i32 or bool (e4m3 is "
                           "supported only for q, k and v of the sm_90a forward kernel)",
                           name.text, ty.text));
    }
    if (!dtype) {
      fail(ty, fmt::format("unknown dtype '{}'; a buffer is f32, f16, bf16, i32 or bool{}", ty.text,
                           suggestion(ty.text, {"f32", "f16", "bf16", "i32", "bool"})));
    }
    const Token& open = expect("[", "after the dtype (buffer NAME: DTYPE[DIMS])");
    auto decl = std::make_shared<ir::BufferDecl>();
    decl->name = std::string(name.text);
    decl->dtype = *dtype;
    decl->loc = src_.loc(name);
    if (peek().is("]")) fail(peek(), fmt::format("buffer '{}' needs 1 to 4 dims", name.text));
    do {
      const Token& d = peek();
      if (decl->dims.size() == 4) {
        fail(d, fmt::format("buffer '{}' has more than 4 dims; a buffer has 1 to 4", name.text));
      }
      if (d.kind == TokenKind::Ident) {
        decl->dims.emplace_back(d.text);
      } else if (d.kind == TokenKind::Int) {
        std::optional<int64_t> v = int_value(d);
        if (!v || *v < 1 || *v > kI32Max) {
          fail(d, fmt::format("a dim must be a positive i32 (1 to {}), not {}", kI32Max, d.text));
        }
        decl->dims.push_back(std::to_string(*v));
      } else {
        fail(d, fmt::format("expected a dim (a name like S or a number), found {}", describe(d)));
      }
      next();
    } while (accept(","));
    if (!peek().is("]")) {
      fail(peek(), fmt::format("expected ',' or ']' in the dims of buffer '{}' (opened at "
                               "column {}), found {}",
                               name.text, open.col, describe(peek())));
    }
    next();
    Binding b{Binding::Buffer, name.line, nullptr, decl, {}, false};
    names_.emplace(decl->name, b);
    mods_.buffers.emplace_back(std::move(decl));
  }

  // param NAME: TYPE [= literal]
  void param_decl() {
    next();
    const Token& name = expect_ident("a param name");
    check_new_name(name, "param");
    expect(":", "after the param name (param NAME: TYPE)");
    const Token& ty = expect_ident("a param type (f32, i32 or bool)");
    std::optional<ScalarType> type = parse_scalar_type(ty.text);
    if (!type) {
      fail(ty, fmt::format("unknown param type '{}'; a param is f32, i32 or bool{}", ty.text,
                           suggestion(ty.text, {"f32", "i32", "bool"})));
    }
    auto decl = std::make_shared<ir::ParamDecl>();
    decl->name = std::string(name.text);
    decl->type = *type;
    decl->loc = src_.loc(name);
    if (accept("=")) decl->default_value = param_default(*decl);
    Binding b{Binding::Param, name.line, decl, nullptr, {}, false};
    names_.emplace(decl->name, b);
    mods_.params.emplace_back(std::move(decl));
  }

  // A literal default value: [-] (integer | float | inf | nan | true | false).
  double param_default(const ir::ParamDecl& p) {
    const Token& start = peek();
    bool negative = accept("-");
    const Token& t = next();
    std::string what = fmt::format("the default of param '{}: {}'", p.name, to_string(p.type));
    auto bad = [&](std::string_view expected) {
      return fmt::format("{} must be {}, found {}", what, expected,
                         negative ? "'-' " + describe(t) : describe(t));
    };
    if (p.type == ScalarType::Bool) {
      if (negative || !(t.is_ident("true") || t.is_ident("false")))
        fail(start, bad("true or false"));
      return t.text == "true" ? 1.0 : 0.0;
    }
    if (t.kind == TokenKind::Int) {
      std::optional<int64_t> v = int_value(t);
      int64_t limit = negative ? kI32MinMagnitude : kI32Max;
      if (p.type == ScalarType::I32 && (!v || *v > limit)) {
        fail(start, fmt::format("{} {}{} does not fit in i32", what, negative ? "-" : "", t.text));
      }
      if (p.type == ScalarType::I32) return negative ? -static_cast<double>(*v) : *v;
      return negative ? -float_value(t) : float_value(t);
    }
    if (p.type == ScalarType::I32) fail(start, bad("an integer literal"));
    if (t.kind == TokenKind::Float) return negative ? -float_value(t) : float_value(t);
    if (t.is_ident("inf")) return negative ? -HUGE_VAL : HUGE_VAL;
    if (t.is_ident("nan") && !negative) return std::numeric_limits<double>::quiet_NaN();
    fail(start, bad("a number literal"));
  }

  // let NAME = expr
  void let_decl() {
    next();
    const Token& name = expect_ident("a name after 'let'");
    check_new_name(name, "let");
    expect("=", fmt::format("after 'let {}'", name.text));
    bool score_seen_before = score_seen_;
    score_seen_ = false;
    Value v = expression();
    Binding b{Binding::Let, name.line, nullptr, nullptr, v, score_seen_};
    score_seen_ = score_seen_before || score_seen_;
    names_.emplace(std::string(name.text), std::move(b));
  }

  // score_mod = expr | mask_mod = expr | sink_mod = expr
  void mod_def() {
    const Token& kw = next();
    bool is_score = kw.text == "score_mod";
    bool is_sink = kw.text == "sink_mod";
    int& defined_line = is_score ? score_mod_line_ : is_sink ? sink_mod_line_ : mask_mod_line_;
    if (defined_line) {
      fail(kw, fmt::format("{} is already defined on line {}", kw.text, defined_line));
    }
    defined_line = kw.line;
    expect("=", fmt::format("after '{}'", kw.text));
    const Token& start = peek();
    in_mask_ = !is_score && !is_sink;
    in_sink_ = is_sink;
    Value v = expression();
    in_mask_ = false;
    in_sink_ = false;
    const bool is_f32 = is_score || is_sink;
    ScalarType want = is_f32 ? ScalarType::F32 : ScalarType::Bool;
    if (v.e.type() != want) {
      std::string hint = is_f32 ? (v.e.type() == ScalarType::I32 ? " (use float(x))" : "")
                                : " (compare it, e.g. `... != 0`)";
      fail(start, fmt::format("{} must return {}, but {} is {}{}", kw.text, to_string(want),
                              ir::describe(v.e), to_string(v.e.type()), hint));
    }
    (is_score ? mods_.score_mod : is_sink ? mods_.sink_mod : mods_.mask_mod) = v.e;
  }

  // --- expressions --------------------------------------------------------------------------
  // Counts one level of syntactic nesting for the lifetime of the guard.
  class NestingGuard {
   public:
    NestingGuard(Parser& p, const Token& at) : p_(p) {
      if (++p_.nesting_ > kMaxNesting) {
        p_.fail(at, fmt::format("expression nested too deeply (more than {} levels)", kMaxNesting));
      }
    }
    ~NestingGuard() { --p_.nesting_; }
    NestingGuard(const NestingGuard&) = delete;
    NestingGuard& operator=(const NestingGuard&) = delete;

   private:
    Parser& p_;
  };

  Value expression() { return ternary(); }

  // or ['?' ternary ':' ternary]   (right-associative)
  Value ternary() {
    NestingGuard guard(*this, peek());
    Value c = binary(1);
    if (!peek().is("?")) return c;
    const Token& q = next();
    Value a = ternary();
    expect(":", "in `c ? a : b`");
    Value b = ternary();
    return build(q, {&c, &a, &b}, [&] { return ir::build_select(c.e, a.e, b.e); });
  }

  // The infix operators and their ir::precedence() levels: 1 || ... 6 * / %.
  static std::optional<std::pair<Op, int>> infix_op(const Token& t) {
    if (t.kind != TokenKind::Punct) return std::nullopt;
    static const std::map<std::string_view, std::pair<Op, int>> kOps = {
        {"||", {Op::Or, 1}}, {"&&", {Op::And, 2}}, {"==", {Op::EQ, 3}}, {"!=", {Op::NE, 3}},
        {"<", {Op::LT, 4}},  {"<=", {Op::LE, 4}},  {">", {Op::GT, 4}},  {">=", {Op::GE, 4}},
        {"+", {Op::Add, 5}}, {"-", {Op::Sub, 5}},  {"*", {Op::Mul, 6}}, {"/", {Op::Div, 6}},
        {"%", {Op::Mod, 6}},
    };
    auto it = kOps.find(t.text);
    if (it == kOps.end()) return std::nullopt;
    return it->second;
  }

  // Precedence climbing, left-associative: recursion only where precedence rises, so a
  // parenthesis costs a few stack frames whatever the number of levels.
  Value binary(int min_level) {
    Value lhs = unary();
    for (;;) {
      std::optional<std::pair<Op, int>> op = infix_op(peek());
      if (!op || op->second < min_level) return lhs;
      const Token& t = next();
      Value rhs = binary(op->second + 1);
      lhs = build(t, {&lhs, &rhs}, [&] { return ir::build_binary(op->first, lhs.e, rhs.e); });
    }
  }

  // ('-' | '!') unary | primary. A '-' touching a number or `inf` is part of the literal.
  Value unary() {
    const Token& t = peek();
    if (t.is("-")) {
      const Token& n = peek(1);
      bool touching = n.offset == t.offset + 1;
      if (touching && (n.kind == TokenKind::Int || n.kind == TokenKind::Float)) {
        next();
        next();
        return number(n, /*negative=*/true, t);
      }
      if (touching && n.is_ident("inf")) {
        next();
        next();
        return Value{ir::make_float(-HUGE_VAL)};
      }
    }
    if (t.is("-") || t.is("!")) {
      NestingGuard guard(*this, t);
      next();
      Value a = unary();
      Op op = t.is("-") ? Op::Neg : Op::Not;
      return build(t, {&a}, [&] { return ir::build_unary(op, a.e); });
    }
    return primary();
  }

  // The value of an integer token, or nullopt if it does not fit in int64.
  static std::optional<int64_t> int_value(const Token& t) {
    int64_t v = 0;
    auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
    if (r.ec != std::errc() || r.ptr != t.text.data() + t.text.size()) return std::nullopt;
    return v;
  }

  double float_value(const Token& t) const {
    float f = 0.0f;
    const char* end = t.text.data() + t.text.size();
    auto r = std::from_chars(t.text.data(), end, f);
    if (r.ec == std::errc::result_out_of_range) {
      // from_chars reports both overflow and underflow; a negative exponent means underflow.
      size_t e = t.text.find_first_of("eE");
      bool underflow = e != std::string_view::npos && e + 1 < t.text.size() && t.text[e + 1] == '-';
      if (!underflow) {
        fail(t, fmt::format("float literal {} is out of f32 range (largest is 3.4028235e+38; "
                            "write inf for infinity)",
                            t.text));
      }
      fail(t, fmt::format("float literal {} is too small for f32 and would round to 0", t.text));
    }
    if (r.ec != std::errc() || r.ptr != end) fail(t, fmt::format("malformed number '{}'", t.text));
    return f;
  }

  Value number(const Token& t, bool negative, const Token& start) {
    if (t.kind == TokenKind::Float) {
      double v = float_value(t);
      return Value{ir::make_float(negative ? -v : v)};
    }
    std::optional<int64_t> v = int_value(t);
    int64_t limit = negative ? kI32MinMagnitude : kI32Max;
    if (!v || *v > limit) {
      fail(start, fmt::format("integer literal {}{} does not fit in i32 (-2147483648 to "
                              "2147483647; write {}.0 for an f32)",
                              negative ? "-" : "", t.text, t.text));
    }
    return Value{ir::make_int(negative ? -*v : *v)};
  }

  Value primary() {
    const Token& t = peek();
    if (t.kind == TokenKind::Int || t.kind == TokenKind::Float) {
      next();
      return number(t, false, t);
    }
    if (t.is("(")) {
      next();
      Value v = expression();
      if (!peek().is(")")) {
        fail(peek(), fmt::format("expected ')' to close the '(' at {}:{}, found {}", t.line, t.col,
                                 describe(peek())));
      }
      next();
      return v;
    }
    if (t.kind != TokenKind::Ident) {
      fail(t, fmt::format("expected an expression, found {}", describe(t)));
    }
    next();
    std::string name(t.text);
    if (name == "true" || name == "false") return Value{ir::make_bool(name == "true")};
    if (name == "inf") return Value{ir::make_float(HUGE_VAL)};
    if (name == "nan") return Value{ir::make_float(std::numeric_limits<double>::quiet_NaN())};
    if (const Builtin* fn = find_builtin(name)) return call(t, *fn);
    if (peek().is("(")) {
      fail(t, fmt::format("'{}' is not a function{}", name, suggestion(name, function_names())));
    }
    if (std::optional<ir::VarKind> leaf = find_leaf(name)) {
      if (*leaf == ir::VarKind::Score && in_mask_) {
        fail(t, "mask_mod cannot use `score`: it receives only b, h, q_idx and kv_idx");
      }
      if ((*leaf == ir::VarKind::Score || *leaf == ir::VarKind::KvIdx) && in_sink_) {
        fail(t, fmt::format("sink_mod cannot use `{}`: it receives only b, h and q_idx (one sink "
                            "per row)",
                            name));
      }
      if (*leaf == ir::VarKind::Score) score_seen_ = true;
      no_index(t, "a leaf");
      return Value{ir::make_var(*leaf)};
    }
    auto it = names_.find(name);
    if (it == names_.end()) {
      if (is_keyword(name)) {
        fail(t, fmt::format("'{}' is a keyword and cannot be used in an expression", name));
      }
      fail(t, fmt::format("unknown identifier '{}'{}", name, suggestion(name, known_names())));
    }
    const Binding& b = it->second;
    switch (b.kind) {
      case Binding::Param:
        no_index(t, "a param");
        return Value{ir::make_param(b.param)};
      case Binding::Let:
        if (in_mask_ && b.uses_score) {
          fail(t, fmt::format("mask_mod cannot use `score`, which '{}' (line {}) uses: mask_mod "
                              "receives only b, h, q_idx and kv_idx",
                              name, b.line));
        }
        if (in_sink_) {
          if (std::optional<ir::VarKind> leaf = row_independent_leaf(b.value.e)) {
            fail(t, fmt::format("sink_mod cannot use `{}`, which '{}' (line {}) uses: sink_mod "
                                "receives only b, h and q_idx (one sink per row)",
                                ir::to_string(*leaf), name, b.line));
          }
        }
        score_seen_ = score_seen_ || b.uses_score;
        no_index(t, "a let");
        return b.value;
      case Binding::Buffer:
        return load(t, b.buffer);
    }
    fail(t, "internal: unknown binding");
  }

  // The first of `score` and `kv_idx` that `e` uses (what a sink_mod may not read), if any.
  static std::optional<ir::VarKind> row_independent_leaf(const Expr& e) {
    std::optional<ir::VarKind> found;
    ir::for_each_node(e, [&](const Expr& n) {
      if (!found && n->op == ir::Op::Var &&
          (n->var == ir::VarKind::Score || n->var == ir::VarKind::KvIdx)) {
        found = n->var;
      }
    });
    return found;
  }

  void no_index(const Token& name, std::string_view what) {
    if (peek().is("[")) {
      fail(peek(),
           fmt::format("'{}' is {}, not a buffer; only buffers can be indexed", name.text, what));
    }
  }

  // buf[i][j] or buf[i, j] (or a mix).
  Value load(const Token& name, const std::shared_ptr<const ir::BufferDecl>& buf) {
    if (!peek().is("[")) {
      fail(name, fmt::format("buffer '{}' must be indexed: {}[...] with {} index{}", name.text,
                             name.text, buf->rank(), buf->rank() == 1 ? "" : "es"));
    }
    std::vector<Value> idx;
    while (peek().is("[")) {
      const Token& open = next();
      do {
        if (idx.size() >= 4) {
          fail(peek(), fmt::format("buffer '{}' has {} dim{} but is indexed with more than 4 "
                                   "indexes",
                                   name.text, buf->rank(), buf->rank() == 1 ? "" : "s"));
        }
        idx.push_back(expression());
      } while (accept(","));
      if (!peek().is("]")) {
        fail(peek(), fmt::format("expected ',' or ']' to close the '[' at {}:{}, found {}",
                                 open.line, open.col, describe(peek())));
      }
      next();
    }
    std::vector<const Value*> inputs;
    std::vector<Expr> exprs;
    for (const auto& v : idx) {
      inputs.push_back(&v);
      exprs.push_back(v.e);
    }
    return build(name, inputs, [&] { return ir::build_load(buf, exprs); });
  }

  Value call(const Token& name, const Builtin& fn) {
    if (!peek().is("(")) {
      fail(name, fmt::format("'{}' is a builtin function; call it as {}({})", fn.name, fn.name,
                             fn.arity == 1 ? "x" : (fn.arity == 2 ? "a, b" : "c, a, b")));
    }
    const Token& open = next();
    std::vector<Value> args;
    if (!peek().is(")")) {
      do {
        if (static_cast<int>(args.size()) == fn.arity) {
          fail(peek(), fmt::format("{}() takes {} argument{}, but more are given", fn.name,
                                   fn.arity, fn.arity == 1 ? "" : "s"));
        }
        args.push_back(expression());
      } while (accept(","));
    }
    if (!peek().is(")")) {
      fail(peek(), fmt::format("expected ',' or ')' to close the '(' of {}() at {}:{}, found {}",
                               fn.name, open.line, open.col, describe(peek())));
    }
    if (static_cast<int>(args.size()) != fn.arity) {
      fail(peek(),
           fmt::format("{}() takes {} argument{}, but {} {} given", fn.name, fn.arity,
                       fn.arity == 1 ? "" : "s", args.size(), args.size() == 1 ? "is" : "are"));
    }
    next();
    std::vector<const Value*> inputs;
    for (const auto& a : args)
      inputs.push_back(&a);
    return build(name, inputs, [&]() -> Expr {
      switch (fn.kind) {
        case FnKind::Unary:
          return ir::build_unary(fn.op, args[0].e);
        case FnKind::Binary:
          return ir::build_binary(fn.op, args[0].e, args[1].e);
        case FnKind::Select:
          return ir::build_select(args[0].e, args[1].e, args[2].e);
        case FnKind::CastF32:
          return ir::build_cast(ScalarType::F32, args[0].e);
        case FnKind::CastI32:
          return ir::build_cast(ScalarType::I32, args[0].e);
      }
      return {};
    });
  }

  // Runs a builder, relocating its CompileError to `at`, and bounds the result's size.
  template <typename F>
  Value build(const Token& at, const std::vector<const Value*>& inputs, F&& fn) {
    Value v;
    try {
      v.e = fn();
    } catch (const CompileError& err) {
      if (err.loc().known()) throw;
      fail(at, err.message());
    }
    measure(v.e, inputs, v.depth, v.nodes);
    if (v.depth > kMaxExprDepth) {
      fail(at, fmt::format("expression too deep (more than {} levels once lets are substituted)",
                           kMaxExprDepth));
    }
    if (v.nodes > kMaxExprNodes) {
      fail(at, fmt::format("expression too large (more than {} nodes once lets are substituted)",
                           kMaxExprNodes));
    }
    return v;
  }
  template <typename F>
  Value build(const Token& at, std::initializer_list<const Value*> inputs, F&& fn) {
    return build(at, std::vector<const Value*>(inputs), std::forward<F>(fn));
  }

  // Depth and tree size of `e`, whose sub-expressions are `inputs` plus nodes the builder added
  // (the new node and promotion casts).
  static void measure(const Expr& e, const std::vector<const Value*>& inputs, int& depth,
                      int64_t& nodes) {
    for (const Value* in : inputs) {
      if (e.same_as(in->e)) {
        depth = in->depth;
        nodes = in->nodes;
        return;
      }
    }
    depth = 0;
    nodes = 1;
    for (const auto& a : e->args) {
      int d = 0;
      int64_t n = 0;
      measure(a, inputs, d, n);
      depth = std::max(depth, d + 1);
      nodes += n;
    }
  }

  std::vector<std::string> function_names() const {
    std::vector<std::string> out;
    for (const auto& b : kBuiltins)
      out.emplace_back(b.name);
    return out;
  }

  std::vector<std::string> known_names() const {
    std::vector<std::string> out = {"score", "b", "h", "q_idx", "kv_idx"};
    for (const auto& [name, b] : names_)
      out.push_back(name);
    for (const auto& n : kLiteralNames)
      out.emplace_back(n);
    for (const auto& b : kBuiltins)
      out.emplace_back(b.name);
    return out;
  }

  const Source& src_;
  std::vector<Token> toks_;
  size_t pos_ = 0;
  int nesting_ = 0;
  bool in_mask_ = false;
  bool in_sink_ = false;
  bool score_seen_ = false;  // the current let's expression uses score
  int score_mod_line_ = 0;
  int mask_mod_line_ = 0;
  int sink_mod_line_ = 0;
  std::map<std::string, Binding> names_;
  Mods mods_;
};

}  // namespace

Mods parse(const std::string& text, const std::string& file) {
  Source src(text, file);
  Parser p(src);
  return p.parse_file();
}

}  // namespace dsl

Mods parse_mods(const std::string& text, const std::string& file) {
  return dsl::parse(text, file);
}

}  // namespace flexjit
