// The C++ front end of the mod language: leaves, operators and functions that build Exprs.
//
//   using namespace flexjit;
//   Buffer slopes("slopes", DType::F32, {"H"});
//   Param cap("cap", ScalarType::F32, 30.0);
//   auto alibi  = [&](Expr s, Expr b, Expr h, Expr q, Expr kv) { return s + slopes[h] * (kv - q);
//   }; auto causal = [](Expr b, Expr h, Expr q, Expr kv) { return q >= kv; }; Mods mods =
//   Mods::from(alibi, causal);
//
// Typing follows C: mixing i32 and f32 promotes to f32; comparisons give bool; && || ! take
// bool. Integer `/` is floor division and `%` a floor modulo (the sign follows the divisor),
// matching PyTorch's `//` and `%` on integer tensors; on f32, `/` is true division and `%` fmod
// with the divisor's sign (torch.remainder). Type errors throw CompileError naming the
// offending sub-expression.
#pragma once

#include <flexjit/export.h>

#include <flexjit/expr.h>

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flexjit {

namespace ir {
struct BufferDecl;
struct ParamDecl;
}  // namespace ir

// The five leaves a mod receives.
FLEXJIT_API Expr score();   // f32: scale * q·k for this (q_idx, kv_idx)
FLEXJIT_API Expr b_idx();   // i32: batch index
FLEXJIT_API Expr h_idx();   // i32: query head index
FLEXJIT_API Expr q_idx();   // i32: query position
FLEXJIT_API Expr kv_idx();  // i32: key/value position

// A captured buffer: a device tensor of `dtype` with 1 to 4 dims, indexed by expressions.
// `dims` name each extent for documentation and validation ("H", "Sq", "8192").
class FLEXJIT_API Buffer {
 public:
  Buffer(std::string name, DType dtype, std::vector<std::string> dims);
  explicit Buffer(std::shared_ptr<const ir::BufferDecl> decl) : decl_(std::move(decl)) {}

  const std::string& name() const;
  DType dtype() const;
  int rank() const;
  const std::shared_ptr<const ir::BufferDecl>& decl() const { return decl_; }

  // Full indexing: buf(i, j). The number of indices must equal rank().
  Expr operator()(std::vector<Expr> indices) const;
  template <typename... I>
  Expr operator()(I... i) const {
    return (*this)(std::vector<Expr>{Expr(i)...});
  }

  // Chained indexing: buf[i][j] converts to Expr once every dim is indexed.
  class Indexer;
  Indexer operator[](Expr i) const;

 private:
  std::shared_ptr<const ir::BufferDecl> decl_;
};

class FLEXJIT_API Buffer::Indexer {
 public:
  Indexer(Buffer buf, std::vector<Expr> idx) : buf_(std::move(buf)), idx_(std::move(idx)) {}
  Indexer operator[](Expr i) const;
  operator Expr() const;  // NOLINT: throws CompileError if the index count is wrong

 private:
  Buffer buf_;
  std::vector<Expr> idx_;
};

// A runtime scalar parameter: its value is a kernel argument, so changing it never recompiles.
class FLEXJIT_API Param {
 public:
  Param(std::string name, ScalarType type, std::optional<double> default_value = std::nullopt);
  explicit Param(std::shared_ptr<const ir::ParamDecl> decl) : decl_(std::move(decl)) {}
  const std::string& name() const;
  ScalarType type() const;
  const std::shared_ptr<const ir::ParamDecl>& decl() const { return decl_; }
  operator Expr() const;  // NOLINT
  Expr expr() const;

 private:
  std::shared_ptr<const ir::ParamDecl> decl_;
};

// Operators. Each operand converts to Expr (ints, floats, bools, Params, buffer indexers).
FLEXJIT_API Expr operator+(Expr a, Expr b);
FLEXJIT_API Expr operator-(Expr a, Expr b);
FLEXJIT_API Expr operator*(Expr a, Expr b);
FLEXJIT_API Expr operator/(Expr a, Expr b);
FLEXJIT_API Expr operator%(Expr a, Expr b);
FLEXJIT_API Expr operator-(Expr a);
FLEXJIT_API Expr operator==(Expr a, Expr b);
FLEXJIT_API Expr operator!=(Expr a, Expr b);
FLEXJIT_API Expr operator<(Expr a, Expr b);
FLEXJIT_API Expr operator<=(Expr a, Expr b);
FLEXJIT_API Expr operator>(Expr a, Expr b);
FLEXJIT_API Expr operator>=(Expr a, Expr b);
FLEXJIT_API Expr operator&&(Expr a, Expr b);
FLEXJIT_API Expr operator||(Expr a, Expr b);
FLEXJIT_API Expr operator!(Expr a);

// Functions.
FLEXJIT_API Expr where(Expr cond, Expr a, Expr b);  // cond ? a : b
FLEXJIT_API Expr min(Expr a, Expr b);
FLEXJIT_API Expr max(Expr a, Expr b);
FLEXJIT_API Expr abs(Expr a);
FLEXJIT_API Expr exp(Expr a);
FLEXJIT_API Expr exp2(Expr a);
FLEXJIT_API Expr log(Expr a);
FLEXJIT_API Expr log2(Expr a);
FLEXJIT_API Expr tanh(Expr a);
FLEXJIT_API Expr sigmoid(Expr a);
FLEXJIT_API Expr sqrt(Expr a);
FLEXJIT_API Expr rsqrt(Expr a);
FLEXJIT_API Expr floor(Expr a);
FLEXJIT_API Expr ceil(Expr a);
FLEXJIT_API Expr pow(Expr a, Expr b);
FLEXJIT_API Expr to_float(Expr a);  // float(x)
FLEXJIT_API Expr to_int(Expr a);    // int(x): truncates toward zero, like C

}  // namespace flexjit
