// flexjit errors.
//
// Two families, kept apart as Halide and LLVM do:
//  - flexjit::Error and its subclasses: something the *user* caused (bad DSL text, a type error,
//    an unsupported head dim, an unwritable cache directory, a failed NVRTC compile of user
//    mods, a failed driver call). Library entry points throw these; the CLI prints what() and
//    exits with code 1.
//  - flexjit::InternalError: a broken invariant inside flexjit (a bug). Raised by FJ_ASSERT.
#pragma once

#include <flexjit/export.h>

#include <stdexcept>
#include <string>

namespace flexjit {

// A position in DSL text. line and col are 1-based; 0 means "unknown".
struct SourceLoc {
  std::string file;  // "<inline>" for text given on the command line or in C++
  int line = 0;
  int col = 0;
  bool known() const { return line > 0; }
};

class FLEXJIT_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A mistake in DSL text or in an expression: parse errors, unknown names, type errors.
// what() is the full diagnostic: "file:line:col: error: msg", the source line and a caret.
class FLEXJIT_API CompileError : public Error {
 public:
  CompileError(const std::string& message, SourceLoc loc = {}, const std::string& source_line = {});
  const std::string& message() const { return message_; }
  const SourceLoc& loc() const { return loc_; }

 private:
  std::string message_;
  SourceLoc loc_;
};

// A request flexjit cannot serve: unsupported head dim / dtype / arch / config.
class FLEXJIT_API UnsupportedError : public Error {
 public:
  using Error::Error;
};

// NVRTC rejected generated source. what() carries the log with numbered source lines.
class FLEXJIT_API JitError : public Error {
 public:
  using Error::Error;
};

// Disk cache problems the user can fix (unwritable directory, ...). Corrupt entries are misses,
// never errors.
class FLEXJIT_API CacheError : public Error {
 public:
  using Error::Error;
};

// A CUDA driver call failed, or a tensor / block mask given to the runtime is invalid.
class FLEXJIT_API RuntimeError : public Error {
 public:
  using Error::Error;
};

class FLEXJIT_API InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

[[noreturn]] FLEXJIT_API void throw_internal_error(const char* file, int line, const char* cond,
                                                   const std::string& msg);

}  // namespace flexjit

// Checks an internal invariant; a failure is a flexjit bug, never a user mistake.
#define FJ_ASSERT(cond, msg)                                                        \
  do {                                                                              \
    if (!(cond)) ::flexjit::throw_internal_error(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
