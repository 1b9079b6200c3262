#include "passes/LinearForm.h"

#include "ir/Visitor.h"

namespace flexjit::passes {

using ir::Op;
using ir::VarKind;

bool reads_positions(const Expr& e) {
  return ir::any_node(e, [](const Expr& n) {
    return n->op == Op::Var && (n->var == VarKind::QIdx || n->var == VarKind::KvIdx);
  });
}

namespace {

constexpr int64_t kLimit = int64_t{1} << 31;

std::optional<QkvCoefficients> checked(int64_t q, int64_t kv) {
  if (q < -kLimit || q >= kLimit || kv < -kLimit || kv >= kLimit) return std::nullopt;
  return QkvCoefficients{q, kv};
}

std::optional<QkvCoefficients> form(const Expr& e) {
  if (e.type() != ScalarType::I32) return std::nullopt;
  if (!reads_positions(e)) return QkvCoefficients{};
  const ir::Node& n = *e.get();
  switch (n.op) {
    case Op::Var:
      return n.var == VarKind::QIdx ? QkvCoefficients{1, 0} : QkvCoefficients{0, 1};
    case Op::Neg: {
      auto a = form(n.args[0]);
      if (!a) return std::nullopt;
      return checked(-a->q, -a->kv);
    }
    case Op::Add:
    case Op::Sub: {
      auto a = form(n.args[0]), b = form(n.args[1]);
      if (!a || !b) return std::nullopt;
      const int64_t s = n.op == Op::Add ? 1 : -1;
      return checked(a->q + s * b->q, a->kv + s * b->kv);
    }
    case Op::Mul: {
      // One factor an integer constant, the other a linear form.
      for (int i = 0; i < 2; ++i) {
        const Expr& k = n.args[static_cast<size_t>(i)];
        if (k->op != Op::IntImm) continue;
        auto a = form(n.args[static_cast<size_t>(1 - i)]);
        if (!a) return std::nullopt;
        return checked(a->q * k->ival, a->kv * k->ival);
      }
      return std::nullopt;
    }
    default:
      return std::nullopt;
  }
}

}  // namespace

std::optional<QkvCoefficients> qkv_linear_form(const Expr& e) {
  if (!e.defined()) return std::nullopt;
  return form(e);
}

}  // namespace flexjit::passes
