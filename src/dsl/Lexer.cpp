#include "dsl/Lexer.h"

#include <fmt/format.h>

#include <algorithm>

namespace flexjit::dsl {

Source::Source(std::string text, std::string file)
    : text_(std::move(text)), file_(std::move(file)) {
  line_starts_.push_back(0);
  for (size_t i = 0; i < text_.size(); ++i) {
    if (text_[i] == '\n') line_starts_.push_back(i + 1);
  }
}

std::string Source::line_text(int line) const {
  if (line < 1 || static_cast<size_t>(line) > line_starts_.size()) return {};
  size_t begin = line_starts_[static_cast<size_t>(line) - 1];
  size_t end = text_.find('\n', begin);
  if (end == std::string::npos) end = text_.size();
  // Long lines are cut: the diagnostic is for a person, and the caret must stay in view.
  constexpr size_t kMaxShown = 400;
  std::string s = text_.substr(begin, std::min(end - begin, kMaxShown));
  for (char& c : s) {
    if (c == '\t' || c == '\r')
      c = ' ';
    else if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      c = '?';
  }
  while (!s.empty() && s.back() == ' ')
    s.pop_back();
  return s;
}

void Source::error_at(const Token& t, const std::string& message) const {
  error_at(t.line, t.col, message);
}

void Source::error_at(int line, int col, const std::string& message) const {
  throw CompileError(message, SourceLoc{file_, line, col}, line_text(line));
}

namespace {

bool is_ident_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_ident_char(char c) {
  return is_ident_start(c) || is_digit(c);
}

std::string printable(char c) {
  auto u = static_cast<unsigned char>(c);
  if (u >= 0x21 && u < 0x7f) return fmt::format("'{}'", c);
  return fmt::format("byte 0x{:02x}", u);
}

// Whether the `//` at `at` reads as Python's floor division rather than a comment: it follows an
// operand on the same line (a name, a number, `)` or `]`) and is followed by a number or by a
// name and an operator (`q_idx // 256 == kv_idx // 256`, `(q_idx // n) * n`). Prose after code
// (`q_idx >= kv_idx // causal`, `// see docs`) is a comment.
bool looks_like_floor_division(const std::string& s, size_t at, const std::vector<Token>& before,
                               int line) {
  if (before.empty() || before.back().line != line) return false;
  const Token& prev = before.back();
  const bool operand = prev.kind == TokenKind::Ident || prev.kind == TokenKind::Int ||
                       prev.kind == TokenKind::Float || prev.is(")") || prev.is("]");
  if (!operand) return false;
  size_t j = at + 2;
  while (j < s.size() && (s[j] == ' ' || s[j] == '\t'))
    ++j;
  if (j >= s.size()) return false;
  if (is_digit(s[j])) return true;
  if (!is_ident_start(s[j])) return false;
  while (j < s.size() && is_ident_char(s[j]))
    ++j;
  while (j < s.size() && (s[j] == ' ' || s[j] == '\t'))
    ++j;
  return j < s.size() && std::string_view("=!<>+-*/%&|?)]").find(s[j]) != std::string_view::npos;
}

}  // namespace

std::vector<Token> tokenize(const Source& src) {
  const std::string& s = src.text();
  std::vector<Token> out;
  int line = 1;
  size_t line_start = 0;
  int nesting = 0;  // open ( and [: newlines inside them are whitespace
  size_t i = 0;
  auto push = [&](TokenKind k, size_t begin, size_t len) {
    out.push_back(Token{k, std::string_view(s).substr(begin, len), line,
                        static_cast<int>(begin - line_start) + 1, begin});
  };
  auto fail = [&](size_t at, const std::string& msg) {
    src.error_at(line, static_cast<int>(at - line_start) + 1, msg);
  };
  while (i < s.size()) {
    char c = s[i];
    if (c == '\n') {
      if (nesting == 0) push(TokenKind::EndOfStmt, i, 1);
      ++i;
      ++line;
      line_start = i;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
      ++i;
      continue;
    }
    if (c == '#' || (c == '/' && i + 1 < s.size() && s[i + 1] == '/')) {
      if (c == '/' && looks_like_floor_division(s, i, out, line)) {
        fail(i,
             "`//` starts a comment in .fx, so the expression would end before it; for floor "
             "division write `/` (between i32 values it floors, as Python's `//` does), and "
             "start a comment after code with `#`");
      }
      while (i < s.size() && s[i] != '\n')
        ++i;
      continue;
    }
    if (is_ident_start(c)) {
      size_t b = i;
      while (i < s.size() && is_ident_char(s[i]))
        ++i;
      push(TokenKind::Ident, b, i - b);
      continue;
    }
    if (is_digit(c) || (c == '.' && i + 1 < s.size() && is_digit(s[i + 1]))) {
      size_t b = i;
      bool is_float = false;
      while (i < s.size() && is_digit(s[i]))
        ++i;
      if (i < s.size() && s[i] == '.') {
        is_float = true;
        ++i;
        while (i < s.size() && is_digit(s[i]))
          ++i;
      }
      if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        is_float = true;
        ++i;
        if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
        if (i >= s.size() || !is_digit(s[i])) {
          fail(b,
               fmt::format("malformed number '{}': the exponent needs digits", s.substr(b, i - b)));
        }
        while (i < s.size() && is_digit(s[i]))
          ++i;
      }
      if (i < s.size() && (is_ident_char(s[i]) || s[i] == '.')) {
        size_t e = i;
        while (e < s.size() && (is_ident_char(s[e]) || s[e] == '.') && e - b < 40)
          ++e;
        fail(b, fmt::format("malformed number '{}'", s.substr(b, e - b)));
      }
      push(is_float ? TokenKind::Float : TokenKind::Int, b, i - b);
      continue;
    }
    if (c == ';') {
      push(TokenKind::EndOfStmt, i, 1);
      ++i;
      continue;
    }
    // Two-character operators first.
    if (i + 1 < s.size()) {
      std::string_view two = std::string_view(s).substr(i, 2);
      if (two == "==" || two == "!=" || two == "<=" || two == ">=" || two == "&&" || two == "||") {
        push(TokenKind::Punct, i, 2);
        i += 2;
        continue;
      }
    }
    switch (c) {
      case '(':
      case '[':
        ++nesting;
        break;
      case ')':
      case ']':
        nesting = std::max(nesting - 1, 0);
        break;
      case '+':
      case '-':
      case '*':
      case '/':
      case '%':
      case '<':
      case '>':
      case '!':
      case '?':
      case ':':
      case '=':
      case ',':
        break;
      case '&':
        fail(i, "unexpected '&' (the logical and is '&&')");
        break;
      case '|':
        fail(i, "unexpected '|' (the logical or is '||')");
        break;
      default:
        fail(i, fmt::format("unexpected character {}", printable(c)));
    }
    push(TokenKind::Punct, i, 1);
    ++i;
  }
  out.push_back(Token{TokenKind::End, std::string_view(s).substr(s.size()), line,
                      static_cast<int>(s.size() - line_start) + 1, s.size()});
  return out;
}

std::string describe(const Token& t) {
  auto shown = [](std::string_view v) {
    return v.size() > 40 ? std::string(v.substr(0, 37)) + "..." : std::string(v);
  };
  switch (t.kind) {
    case TokenKind::Ident:
      return fmt::format("identifier '{}'", shown(t.text));
    case TokenKind::Int:
    case TokenKind::Float:
      return fmt::format("number '{}'", shown(t.text));
    case TokenKind::Punct:
      return fmt::format("'{}'", t.text);
    case TokenKind::EndOfStmt:
      return t.text == ";" ? "';'" : "end of line";
    case TokenKind::End:
      return "end of file";
  }
  return "token";
}

}  // namespace flexjit::dsl
