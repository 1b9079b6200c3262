#include "ir/Printer.h"

#include <fmt/format.h>

#include <cmath>

namespace flexjit::ir {

int precedence(Op op) {
  switch (op) {
    case Op::Or:
      return 1;
    case Op::And:
      return 2;
    case Op::EQ:
    case Op::NE:
      return 3;
    case Op::LT:
    case Op::LE:
    case Op::GT:
    case Op::GE:
      return 4;
    case Op::Add:
    case Op::Sub:
      return 5;
    case Op::Mul:
    case Op::Div:
    case Op::Mod:
      return 6;
    case Op::Neg:
    case Op::Not:
      return 7;
    default:
      return 8;
  }
}

std::string float_literal(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", static_cast<float>(v));
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

namespace {

bool is_literal(const Expr& e) {
  return e->op == Op::IntImm || e->op == Op::FloatImm || e->op == Op::BoolImm;
}

// A literal that prints with a leading '-' binds like a prefix operator.
int print_precedence(const Expr& e) {
  if (e->op == Op::IntImm && e->ival < 0) return 7;
  if (e->op == Op::FloatImm && std::signbit(e->fval) && !std::isnan(e->fval)) return 7;
  return precedence(e->op);
}

void print(const Expr& e, std::string& out);

void print_operand(const Expr& e, bool parens, std::string& out) {
  if (parens) out += '(';
  print(e, out);
  if (parens) out += ')';
}

void print(const Expr& e, std::string& out) {
  const Node& n = *e.get();
  switch (n.op) {
    case Op::IntImm:
      out += fmt::format("{}", n.ival);
      return;
    case Op::FloatImm:
      out += float_literal(n.fval);
      return;
    case Op::BoolImm:
      out += n.ival ? "true" : "false";
      return;
    case Op::Var:
      out += to_string(n.var);
      return;
    case Op::Param:
      out += n.param->name;
      return;
    case Op::Load:
      out += n.buffer->name;
      for (const auto& i : n.args) {
        out += '[';
        print(i, out);
        out += ']';
      }
      return;
    case Op::Cast:
      out += n.type == ScalarType::F32 ? "float(" : "int(";
      print(n.args[0], out);
      out += ')';
      return;
    case Op::Select:
      out += "where(";
      print(n.args[0], out);
      out += ", ";
      print(n.args[1], out);
      out += ", ";
      print(n.args[2], out);
      out += ')';
      return;
    default:
      break;
  }
  int p = precedence(n.op);
  if (n.op == Op::Neg || n.op == Op::Not) {
    out += op_spelling(n.op);
    // -(3) keeps Neg(3) distinct from the literal -3; --x would lex as a different token.
    bool parens = print_precedence(n.args[0]) < p || is_literal(n.args[0]) ||
                  print_precedence(n.args[0]) == 7;
    print_operand(n.args[0], parens, out);
    return;
  }
  if (p == 8) {  // function-style: exp(x), min(a, b), pow(a, b)
    out += op_spelling(n.op);
    out += '(';
    for (size_t i = 0; i < n.args.size(); ++i) {
      if (i) out += ", ";
      print(n.args[i], out);
    }
    out += ')';
    return;
  }
  // Infix, left-associative: the right operand needs parens at equal precedence.
  print_operand(n.args[0], print_precedence(n.args[0]) < p, out);
  out += fmt::format(" {} ", op_spelling(n.op));
  print_operand(n.args[1], print_precedence(n.args[1]) <= p, out);
}

}  // namespace

std::string to_text(const Expr& e) {
  if (!e.defined()) return "<undefined>";
  std::string out;
  print(e, out);
  return out;
}

}  // namespace flexjit::ir
