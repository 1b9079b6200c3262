// The C++ front end: operators and functions over Expr, Buffer and Param.
#include <flexjit/dsl.h>

#include "ir/IR.h"
#include "ir/Operators.h"
#include "ir/Printer.h"

#include <fmt/format.h>

#include <limits>

namespace flexjit {

Expr::Expr(int v) : Expr(ir::make_int(v)) {}
Expr::Expr(int64_t v) {
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
    throw CompileError(fmt::format("integer constant {} does not fit in i32", v));
  }
  *this = ir::make_int(v);
}
Expr::Expr(float v) : Expr(ir::make_float(v)) {}
Expr::Expr(double v) : Expr(ir::make_float(v)) {}
Expr::Expr(bool v) : Expr(ir::make_bool(v)) {}

ScalarType Expr::type() const {
  FJ_ASSERT(defined(), "type() of an undefined Expr");
  return node_->type;
}

std::string Expr::str() const {
  return ir::to_text(*this);
}

Expr score() {
  return ir::make_var(ir::VarKind::Score);
}
Expr b_idx() {
  return ir::make_var(ir::VarKind::B);
}
Expr h_idx() {
  return ir::make_var(ir::VarKind::H);
}
Expr q_idx() {
  return ir::make_var(ir::VarKind::QIdx);
}
Expr kv_idx() {
  return ir::make_var(ir::VarKind::KvIdx);
}

Buffer::Buffer(std::string name, DType dtype, std::vector<std::string> dims) {
  if (dims.empty() || dims.size() > 4) {
    throw CompileError(fmt::format("buffer '{}' must have 1 to 4 dims, not {}", name, dims.size()));
  }
  if (dtype == DType::E4M3) {
    throw UnsupportedError(fmt::format(
        "buffer '{}' is e4m3: captured buffers are f32, f16, bf16, i32 or bool (e4m3 is "
        "supported only for q, k and v of the sm_90a forward kernel)",
        name));
  }
  auto d = std::make_shared<ir::BufferDecl>();
  d->name = std::move(name);
  d->dtype = dtype;
  d->dims = std::move(dims);
  decl_ = std::move(d);
}
const std::string& Buffer::name() const {
  return decl_->name;
}
DType Buffer::dtype() const {
  return decl_->dtype;
}
int Buffer::rank() const {
  return decl_->rank();
}
Expr Buffer::operator()(std::vector<Expr> indices) const {
  return ir::build_load(decl_, std::move(indices));
}
Buffer::Indexer Buffer::operator[](Expr i) const {
  return Indexer(*this, {std::move(i)});
}
Buffer::Indexer Buffer::Indexer::operator[](Expr i) const {
  std::vector<Expr> idx = idx_;
  idx.push_back(std::move(i));
  return Indexer(buf_, std::move(idx));
}
Buffer::Indexer::operator Expr() const {
  return buf_(idx_);
}

Param::Param(std::string name, ScalarType type, std::optional<double> default_value) {
  auto d = std::make_shared<ir::ParamDecl>();
  d->name = std::move(name);
  d->type = type;
  d->default_value = default_value;
  decl_ = std::move(d);
}
const std::string& Param::name() const {
  return decl_->name;
}
ScalarType Param::type() const {
  return decl_->type;
}
Expr Param::expr() const {
  return ir::make_param(decl_);
}
Param::operator Expr() const {
  return expr();
}

using ir::Op;
Expr operator+(Expr a, Expr b) {
  return ir::build_binary(Op::Add, std::move(a), std::move(b));
}
Expr operator-(Expr a, Expr b) {
  return ir::build_binary(Op::Sub, std::move(a), std::move(b));
}
Expr operator*(Expr a, Expr b) {
  return ir::build_binary(Op::Mul, std::move(a), std::move(b));
}
Expr operator/(Expr a, Expr b) {
  return ir::build_binary(Op::Div, std::move(a), std::move(b));
}
Expr operator%(Expr a, Expr b) {
  return ir::build_binary(Op::Mod, std::move(a), std::move(b));
}
Expr operator-(Expr a) {
  return ir::build_unary(Op::Neg, std::move(a));
}
Expr operator==(Expr a, Expr b) {
  return ir::build_binary(Op::EQ, std::move(a), std::move(b));
}
Expr operator!=(Expr a, Expr b) {
  return ir::build_binary(Op::NE, std::move(a), std::move(b));
}
Expr operator<(Expr a, Expr b) {
  return ir::build_binary(Op::LT, std::move(a), std::move(b));
}
Expr operator<=(Expr a, Expr b) {
  return ir::build_binary(Op::LE, std::move(a), std::move(b));
}
Expr operator>(Expr a, Expr b) {
  return ir::build_binary(Op::GT, std::move(a), std::move(b));
}
Expr operator>=(Expr a, Expr b) {
  return ir::build_binary(Op::GE, std::move(a), std::move(b));
}
Expr operator&&(Expr a, Expr b) {
  return ir::build_binary(Op::And, std::move(a), std::move(b));
}
Expr operator||(Expr a, Expr b) {
  return ir::build_binary(Op::Or, std::move(a), std::move(b));
}
Expr operator!(Expr a) {
  return ir::build_unary(Op::Not, std::move(a));
}

Expr where(Expr c, Expr a, Expr b) {
  return ir::build_select(std::move(c), std::move(a), std::move(b));
}
Expr min(Expr a, Expr b) {
  return ir::build_binary(Op::Min, std::move(a), std::move(b));
}
Expr max(Expr a, Expr b) {
  return ir::build_binary(Op::Max, std::move(a), std::move(b));
}
Expr pow(Expr a, Expr b) {
  return ir::build_binary(Op::Pow, std::move(a), std::move(b));
}
Expr abs(Expr a) {
  return ir::build_unary(Op::Abs, std::move(a));
}
Expr exp(Expr a) {
  return ir::build_unary(Op::Exp, std::move(a));
}
Expr exp2(Expr a) {
  return ir::build_unary(Op::Exp2, std::move(a));
}
Expr log(Expr a) {
  return ir::build_unary(Op::Log, std::move(a));
}
Expr log2(Expr a) {
  return ir::build_unary(Op::Log2, std::move(a));
}
Expr tanh(Expr a) {
  return ir::build_unary(Op::Tanh, std::move(a));
}
Expr sigmoid(Expr a) {
  return ir::build_unary(Op::Sigmoid, std::move(a));
}
Expr sqrt(Expr a) {
  return ir::build_unary(Op::Sqrt, std::move(a));
}
Expr rsqrt(Expr a) {
  return ir::build_unary(Op::Rsqrt, std::move(a));
}
Expr floor(Expr a) {
  return ir::build_unary(Op::Floor, std::move(a));
}
Expr ceil(Expr a) {
  return ir::build_unary(Op::Ceil, std::move(a));
}
Expr to_float(Expr a) {
  return ir::build_cast(ScalarType::F32, std::move(a));
}
Expr to_int(Expr a) {
  return ir::build_cast(ScalarType::I32, std::move(a));
}

}  // namespace flexjit
