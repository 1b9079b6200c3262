// The parser of the `.fx` mod language: text -> Mods (grammar and semantics: docs/dsl.md).
//
// A hand-written recursive-descent parser over the tokens of dsl/Lexer.h. It builds IR only
// through the typed builders of ir/Operators.h and relocates their CompileErrors to the token
// that caused them, so every diagnostic reads "file:line:col: error: ...", the line, a caret.
// `let` names are substituted inline (the IR has no Let node; shared sub-expressions stay
// shared). The public entry point is flexjit::parse_mods (include/flexjit/mods.h).
//
// The parser is total: any byte sequence either parses or throws CompileError. Recursion and
// expression size are bounded (the limits below), so no input overflows the stack or makes a
// later pass (printing, hashing) blow up.
#pragma once

#include <flexjit/mods.h>

#include <cstdint>
#include <string>

namespace flexjit::dsl {

// Deepest IR tree a statement may produce once lets are substituted (bounds every recursive
// walk of the IR downstream: printer, equality, codegen).
constexpr int kMaxExprDepth = 250;
// Deepest syntactic nesting of parentheses, calls, indices, `?:` and prefix operators. Printing
// adds at most two levels per IR level (`-(-x)`), so every expression the parser accepts prints
// as text it accepts again.
constexpr int kMaxNesting = 2 * kMaxExprDepth + 12;
// Most nodes an expression may have as a tree once lets are substituted (a let used twice
// counts twice): bounds the printed size of an expression that doubles through lets.
constexpr int64_t kMaxExprNodes = 100000;

// Parses `.fx` text; `file` names it in diagnostics. Runs Mods::check() before returning.
Mods parse(const std::string& text, const std::string& file);

}  // namespace flexjit::dsl
