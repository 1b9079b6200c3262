#include "ir/Operators.h"

#include "ir/Printer.h"

#include <fmt/format.h>

namespace flexjit::ir {

std::string describe(const Expr& e) {
  std::string text = to_text(e);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return fmt::format("`{}` ({})", text, to_string(e.type()));
}

namespace {

[[noreturn]] void type_error(const std::string& msg) {
  throw CompileError(msg);
}

Expr to_f32(Expr e) {
  return e.type() == ScalarType::F32 ? e : make_cast(ScalarType::F32, std::move(e));
}

void require_defined(const Expr& e, std::string_view what) {
  if (!e.defined()) type_error(fmt::format("operand of {} is an undefined expression", what));
}

// Brings two numeric operands to one type: i32 with f32 gives f32.
void unify_numeric(Expr& a, Expr& b, std::string_view what) {
  for (const Expr* e : {&a, &b}) {
    if (e->type() == ScalarType::Bool) {
      type_error(
          fmt::format("operand of '{}' must be a number, but {} is bool "
                      "(use int(x) or float(x), or where(x, 1, 0))",
                      what, describe(*e)));
    }
  }
  if (a.type() != b.type()) {
    a = to_f32(std::move(a));
    b = to_f32(std::move(b));
  }
}

}  // namespace

Expr build_unary(Op op, Expr a) {
  FJ_ASSERT(is_unary(op), "build_unary of a non-unary op");
  require_defined(a, op_spelling(op));
  if (op == Op::Not) {
    if (a.type() != ScalarType::Bool) {
      type_error(fmt::format("operand of '!' must be bool, but {} is not", describe(a)));
    }
    return make_unary(op, std::move(a));
  }
  if (a.type() == ScalarType::Bool) {
    type_error(fmt::format("operand of '{}' must be a number, but {} is bool", op_spelling(op),
                           describe(a)));
  }
  if (op == Op::Neg || op == Op::Abs) return make_unary(op, std::move(a));
  return make_unary(op, to_f32(std::move(a)));
}

Expr build_binary(Op op, Expr a, Expr b) {
  FJ_ASSERT(is_binary(op), "build_binary of a non-binary op");
  std::string_view sp = op_spelling(op);
  require_defined(a, sp);
  require_defined(b, sp);
  if (op == Op::And || op == Op::Or) {
    for (const Expr* e : {&a, &b}) {
      if (e->type() != ScalarType::Bool) {
        type_error(fmt::format("operand of '{}' must be bool, but {} is not", sp, describe(*e)));
      }
    }
    return make_binary(op, std::move(a), std::move(b));
  }
  if ((op == Op::EQ || op == Op::NE) && a.type() == ScalarType::Bool &&
      b.type() == ScalarType::Bool) {
    return make_binary(op, std::move(a), std::move(b));
  }
  unify_numeric(a, b, sp);
  if (op == Op::Pow) return make_binary(op, to_f32(std::move(a)), to_f32(std::move(b)));
  return make_binary(op, std::move(a), std::move(b));
}

Expr build_select(Expr c, Expr a, Expr b) {
  require_defined(c, "where");
  require_defined(a, "where");
  require_defined(b, "where");
  if (c.type() != ScalarType::Bool) {
    type_error(fmt::format("condition of where(c, a, b) must be bool, but {} is not", describe(c)));
  }
  if (a.type() != b.type()) {
    if (a.type() == ScalarType::Bool || b.type() == ScalarType::Bool) {
      type_error(fmt::format("branches of where(c, a, b) have different types: {} and {}",
                             describe(a), describe(b)));
    }
    a = to_f32(std::move(a));
    b = to_f32(std::move(b));
  }
  return make_select(std::move(c), std::move(a), std::move(b));
}

Expr build_cast(ScalarType to, Expr a) {
  require_defined(a, "a cast");
  if (to == ScalarType::Bool) {
    type_error(fmt::format("there is no cast to bool; compare instead ({} != 0)", describe(a)));
  }
  if (a.type() == to) return a;
  return make_cast(to, std::move(a));
}

Expr build_load(const std::shared_ptr<const BufferDecl>& buf, std::vector<Expr> indices) {
  FJ_ASSERT(buf != nullptr, "load from a null buffer");
  if (static_cast<int>(indices.size()) != buf->rank()) {
    type_error(fmt::format("buffer '{}' has {} dim{} but is indexed with {} index{}", buf->name,
                           buf->rank(), buf->rank() == 1 ? "" : "s", indices.size(),
                           indices.size() == 1 ? "" : "es"));
  }
  for (size_t i = 0; i < indices.size(); ++i) {
    require_defined(indices[i], "a buffer index");
    if (indices[i].type() != ScalarType::I32) {
      type_error(fmt::format("index {} of buffer '{}' must be i32, but {} is not (use int(x))", i,
                             buf->name, describe(indices[i])));
    }
  }
  return make_load(buf, std::move(indices));
}

}  // namespace flexjit::ir
