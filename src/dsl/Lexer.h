// The tokenizer of the `.fx` mod language (grammar: docs/dsl.md).
//
// Turns the whole text into tokens up front. Statements end at a newline or ';'; a newline
// inside parentheses or brackets is whitespace, so a long expression may span lines. Comments
// run from `//` or `#` to the end of the line. A byte that starts no token is a CompileError
// pointing at it; the lexer never fails any other way, whatever the input.
#pragma once

#include <flexjit/error.h>

#include <string>
#include <string_view>
#include <vector>

namespace flexjit::dsl {

enum class TokenKind : uint8_t {
  Ident,      // [A-Za-z_][A-Za-z0-9_]*
  Int,        // digits only: 123
  Float,      // 1.0 .5 1. 1e-3 2.5e+4
  Punct,      // + - * / % == != < <= > >= && || ! ? : = ( ) [ ] ,
  EndOfStmt,  // a newline (outside brackets) or ';'
  End,        // end of the text
};

struct Token {
  TokenKind kind;
  std::string_view text;  // a view into the source ("\n" for a newline, "" at the end)
  int line = 1;           // 1-based
  int col = 1;            // 1-based, in bytes
  size_t offset = 0;      // byte offset into the source

  bool is(std::string_view punct) const { return kind == TokenKind::Punct && text == punct; }
  bool is_ident(std::string_view name) const { return kind == TokenKind::Ident && text == name; }
};

// The source of one `.fx` text: owns the text, splits lines and formats diagnostics.
class Source {
 public:
  Source(std::string text, std::string file);
  const std::string& text() const { return text_; }
  const std::string& file() const { return file_; }
  // The text of a 1-based line, without its newline; tabs and unprintable bytes are shown as
  // spaces / '?' so that the caret under it lines up.
  std::string line_text(int line) const;
  SourceLoc loc(const Token& t) const { return SourceLoc{file_, t.line, t.col}; }
  // A CompileError at `t` with the line and a caret.
  [[noreturn]] void error_at(const Token& t, const std::string& message) const;
  [[noreturn]] void error_at(int line, int col, const std::string& message) const;

 private:
  std::string text_;
  std::string file_;
  std::vector<size_t> line_starts_;
};

// Tokenizes the whole source; the last token is always End. Throws CompileError on a byte that
// starts no token or on a malformed number ("1e", "3abc").
std::vector<Token> tokenize(const Source& src);

// How diagnostics name a token: "identifier 'x'", "number '3'", "'+'", "end of line",
// "end of file".
std::string describe(const Token& t);

}  // namespace flexjit::dsl
