// SourceWriter: the one place generated C/CUDA text is written, in the style of Halide's
// CodeGen_C: lines at a scoped indentation and SSA temporaries with a cache that reuses an
// identical right-hand side instead of computing it twice. Codegen never counts spaces.
//
//   SourceWriter w;
//   {
//     auto body = w.block("__device__ float f(float x)");   // writes "... {", indents
//     std::string t = w.ssa("float", "x * x");              // "const float t0 = x * x;"
//     w.ssa("float", "x * x");                              // cached: returns "t0" again
//     w.line("return " + t + ";");
//   }                                                       // writes "}"
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace flexjit::cuda {

class SourceWriter {
 public:
  explicit SourceWriter(int indent_width = 2) : indent_width_(indent_width) {}
  SourceWriter(const SourceWriter&) = delete;
  SourceWriter& operator=(const SourceWriter&) = delete;

  // Writes `text` as one line at the current indentation (an empty text writes an empty line).
  void line(std::string_view text);
  // Writes `text` (which may hold several lines) verbatim, adding a final newline if missing.
  void raw(std::string_view text);

  // Indents the lines written while the guard lives. Leaving the scope also forgets the SSA
  // temporaries defined inside it, so a cached temporary is never used out of its C scope.
  class [[nodiscard]] Indent {
   public:
    explicit Indent(SourceWriter& w);
    ~Indent();
    Indent(const Indent&) = delete;
    Indent& operator=(const Indent&) = delete;

   private:
    SourceWriter& w_;
  };
  Indent indent() { return Indent(*this); }

  // A braced C scope: writes "<header> {", indents, and on destruction writes "}<closer>"
  // ("};" for a struct: closer = ";").
  class [[nodiscard]] Block {
   public:
    Block(SourceWriter& w, std::string_view header, std::string closer);
    ~Block();
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;

   private:
    SourceWriter& w_;
    std::string closer_;
    Indent indent_;
  };
  Block block(std::string_view header, std::string closer = "") {
    return Block(*this, header, std::move(closer));
  }

  // Defines `const <type> tN = <rhs>;` and returns "tN", or returns the temporary already
  // holding the same type and right-hand side in an enclosing scope.
  std::string ssa(std::string_view type, std::string_view rhs);

  const std::string& str() const { return out_; }

 private:
  void pop_scope();

  struct Temp {
    std::string name;
    int depth;
  };
  int indent_width_;
  int depth_ = 0;
  int next_temp_ = 0;
  std::string out_;
  std::unordered_map<std::string, Temp> temps_;  // "<type>\n<rhs>" -> temporary
};

}  // namespace flexjit::cuda
