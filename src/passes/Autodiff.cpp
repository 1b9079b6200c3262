#include "passes/Autodiff.h"

#include "ir/Visitor.h"
#include "passes/CSE.h"
#include "passes/Simplify.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>
#include <unordered_map>

namespace flexjit::passes {

using ir::Op;

namespace {

bool is_float_imm(const Expr& e, double v) {
  return e->op == Op::FloatImm && e->fval == v;
}
bool is_true(const Expr& e) {
  return e->op == Op::BoolImm && e->ival != 0;
}

// Builders for f32 / bool nodes that skip the trivial factors the rules would otherwise emit
// everywhere (the adjoint of the root is 1, most nodes are reached unconditionally).
Expr f32(double v) {
  return ir::make_float(v);
}
Expr add(const Expr& a, const Expr& b) {
  return ir::make_binary(Op::Add, a, b);
}
Expr sub(const Expr& a, const Expr& b) {
  return ir::make_binary(Op::Sub, a, b);
}
Expr mul(const Expr& a, const Expr& b) {
  if (is_float_imm(a, 1.0)) return b;
  if (is_float_imm(b, 1.0)) return a;
  return ir::make_binary(Op::Mul, a, b);
}
Expr div(const Expr& a, const Expr& b) {
  return ir::make_binary(Op::Div, a, b);
}
Expr neg(const Expr& a) {
  return ir::make_unary(Op::Neg, a);
}
Expr bin(Op op, const Expr& a, const Expr& b) {
  return ir::make_binary(op, a, b);
}
Expr un(Op op, const Expr& a) {
  return ir::make_unary(op, a);
}
Expr select(const Expr& c, const Expr& a, const Expr& b) {
  if (is_true(c)) return a;
  return ir::make_select(c, a, b);
}
Expr and_(const Expr& a, const Expr& b) {
  if (is_true(a)) return b;
  if (is_true(b)) return a;
  return ir::make_binary(Op::And, a, b);
}
Expr or_(const Expr& a, const Expr& b) {
  if (is_true(a) || is_true(b)) return ir::make_bool(true);
  return ir::make_binary(Op::Or, a, b);
}
Expr not_(const Expr& a) {
  return ir::make_unary(Op::Not, a);
}

// One reverse sweep: reach conditions top-down, then adjoints top-down (parents before children).
class ReverseSweep {
 public:
  explicit ReverseSweep(const Expr& root) {
    FJ_ASSERT(root.type() == ScalarType::F32,
              fmt::format("autodiff of a non-f32 score_mod: {}", root.str()));
    ir::for_each_node(root, [&](const Expr& n) { order_.push_back(n); });
    reach_[root.get()] = ir::make_bool(true);
    adjoint_[root.get()] = f32(1.0);
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      propagate_reach(*it);
      propagate_adjoint(*it);
    }
  }

  ScoreModGrads result() const {
    ScoreModGrads out;
    out.d_score = f32(0.0);
    for (const Expr& n : order_) {  // children first: loads in order of first appearance
      auto adj = adjoint_.find(n.get());
      if (adj == adjoint_.end()) continue;
      if (n->op == Op::Var && n->var == ir::VarKind::Score) out.d_score = adj->second;
      if (n->op != Op::Load) continue;
      const Expr& reached = reach_.at(n.get());
      BufferGrad* same = nullptr;
      for (BufferGrad& g : out.buffers) {
        if (!ir::equal(*g.buffer, *n->buffer) || g.indices.size() != n->args.size()) continue;
        bool eq = true;
        for (size_t i = 0; i < g.indices.size() && eq; ++i)
          eq = ir::equal(g.indices[i], n->args[i]);
        if (eq) same = &g;
      }
      if (same) {
        same->derivative = add(same->derivative, adj->second);
        same->reached = or_(same->reached, reached);
      } else {
        out.buffers.push_back(BufferGrad{n->buffer, n->args, adj->second, reached});
      }
    }
    HashConser pool;  // one pool: the results share their sub-expressions
    out.d_score = pool.intern(simplify(out.d_score));
    for (BufferGrad& g : out.buffers) {
      g.derivative = pool.intern(simplify(g.derivative));
      g.reached = pool.intern(simplify(g.reached));
    }
    return out;
  }

 private:
  // Whether the forward evaluates a node: where() and && / || evaluate only what they select.
  void propagate_reach(const Expr& e) {
    const Expr& r = reach_.at(e.get());
    const auto& a = e->args;
    switch (e->op) {
      case Op::Select:
        reach(a[0], r);
        reach(a[1], and_(r, a[0]));
        reach(a[2], and_(r, not_(a[0])));
        return;
      case Op::And:
        reach(a[0], r);
        reach(a[1], and_(r, a[0]));
        return;
      case Op::Or:
        reach(a[0], r);
        reach(a[1], and_(r, not_(a[0])));
        return;
      default:
        for (const Expr& c : a)
          reach(c, r);
    }
  }

  void reach(const Expr& child, const Expr& cond) {
    auto [it, fresh] = reach_.emplace(child.get(), cond);
    if (!fresh) it->second = or_(it->second, cond);
  }

  // Adds `d` to the adjoint of `child`. Contributions reference the forward values of `parent`
  // and its args, which exist only where `parent` is reached; guarding them keeps a derivative
  // from reading a load the forward skips (an out-of-bounds index in an unselected branch).
  void accumulate(const Expr& parent, const Expr& child, const Expr& d) {
    if (child.type() != ScalarType::F32) return;  // integer and bool values carry no adjoint
    Expr guarded = select(reach_.at(parent.get()), d, f32(0.0));
    auto [it, fresh] = adjoint_.emplace(child.get(), guarded);
    if (!fresh) it->second = add(it->second, guarded);
  }

  // One derivative rule per node kind; `g` is the node's adjoint, `e` its forward value.
  void propagate_adjoint(const Expr& e) {
    auto it = adjoint_.find(e.get());
    if (it == adjoint_.end()) return;  // not f32, or no f32 path to the root
    const Expr g = it->second;
    const auto& args = e->args;
    auto d = [&](int i, const Expr& v) { accumulate(e, args[i], v); };
    const double ln2 = std::numbers::ln2;
    switch (e->op) {
      case Op::IntImm:
      case Op::FloatImm:
      case Op::BoolImm:
      case Op::Var:
      case Op::Param:
      case Op::Load:
        return;  // leaves: read off in result()
      case Op::Cast:
        return;  // f32 only from i32 / bool: no gradient flows into integers
      case Op::Select: {
        const Expr& c = args[0];
        d(1, select(c, g, f32(0.0)));  // d/da c ? a : b = c
        d(2, select(c, f32(0.0), g));  // d/db c ? a : b = !c
        return;
      }
      case Op::Neg:
        d(0, neg(g));  // d/da -a = -1
        return;
      case Op::Abs: {
        const Expr& a = args[0];
        Expr sign = select(bin(Op::GT, a, f32(0.0)), f32(1.0),
                           select(bin(Op::LT, a, f32(0.0)), f32(-1.0), f32(0.0)));
        d(0, mul(g, sign));  // d/da |a| = sign(a), 0 at 0
        return;
      }
      case Op::Exp:
        d(0, mul(g, e));  // d/da exp(a) = exp(a)
        return;
      case Op::Exp2:
        d(0, mul(g, mul(e, f32(ln2))));  // d/da exp2(a) = ln2 * exp2(a)
        return;
      case Op::Log:
        d(0, div(g, args[0]));  // d/da log(a) = 1 / a
        return;
      case Op::Log2:
        d(0, div(g, mul(args[0], f32(ln2))));  // d/da log2(a) = 1 / (a * ln2)
        return;
      case Op::Tanh:
        d(0, mul(g, sub(f32(1.0), mul(e, e))));  // d/da tanh(a) = 1 - tanh(a)^2
        return;
      case Op::Sigmoid:
        d(0, mul(g, mul(e, sub(f32(1.0), e))));  // d/da sigmoid(a) = s * (1 - s)
        return;
      case Op::Sqrt:
        d(0, div(g, mul(f32(2.0), e)));  // d/da sqrt(a) = 1 / (2 * sqrt(a))
        return;
      case Op::Rsqrt:
        d(0, mul(g, mul(f32(-0.5), div(e, args[0]))));  // d/da a^-1/2 = -1/2 * rsqrt(a) / a
        return;
      case Op::Floor:
      case Op::Ceil:
        return;  // d/da floor(a) = d/da ceil(a) = 0 (almost everywhere)
      case Op::Add:
        d(0, g);  // d/da a + b = 1
        d(1, g);  // d/db a + b = 1
        return;
      case Op::Sub:
        d(0, g);       // d/da a - b = 1
        d(1, neg(g));  // d/db a - b = -1
        return;
      case Op::Mul:
        d(0, mul(g, args[1]));  // d/da a * b = b
        d(1, mul(g, args[0]));  // d/db a * b = a
        return;
      case Op::Div:
        d(0, div(g, args[1]));               // d/da a / b = 1 / b
        d(1, neg(div(mul(g, e), args[1])));  // d/db a / b = -a / b^2 = -(a / b) / b
        return;
      case Op::Mod: {
        // f32 a % b = a - b * floor(a / b)
        d(0, g);                                                  // d/da a % b = 1
        d(1, neg(mul(g, un(Op::Floor, div(args[0], args[1])))));  // d/db a % b = -floor(a / b)
        return;
      }
      case Op::Min: {
        Expr first = bin(Op::LE, args[0], args[1]);  // ties go to a
        d(0, select(first, g, f32(0.0)));            // d/da min(a, b) = a <= b
        d(1, select(first, f32(0.0), g));            // d/db min(a, b) = !(a <= b)
        return;
      }
      case Op::Max: {
        Expr first = bin(Op::GE, args[0], args[1]);  // ties go to a
        d(0, select(first, g, f32(0.0)));            // d/da max(a, b) = a >= b
        d(1, select(first, f32(0.0), g));            // d/db max(a, b) = !(a >= b)
        return;
      }
      case Op::Pow: {
        const Expr& a = args[0];
        const Expr& b = args[1];
        // d/da pow(a, b) = b * pow(a, b - 1)
        d(0, mul(g, mul(b, bin(Op::Pow, a, sub(b, f32(1.0))))));
        // d/db pow(a, b) = log(a) * pow(a, b); 0 where a <= 0 (log undefined)
        d(1, select(bin(Op::GT, a, f32(0.0)), mul(g, mul(un(Op::Log, a), e)), f32(0.0)));
        return;
      }
      default:
        // Comparisons, Not, And, Or are bool: they never carry an adjoint.
        FJ_ASSERT(false,
                  fmt::format("autodiff: f32 node {} has no derivative rule", ir::op_name(e->op)));
    }
  }

  std::vector<Expr> order_;  // children before parents
  std::unordered_map<const ir::Node*, Expr> reach_;
  std::unordered_map<const ir::Node*, Expr> adjoint_;
};

}  // namespace

ScoreModGrads differentiate(const Expr& score_mod) {
  if (!score_mod.defined()) return ScoreModGrads{f32(1.0), {}};  // identity
  // Hash-cons first so that structurally equal sub-expressions are one node: their adjoints are
  // then summed once, and equal load sites meet in one node.
  return ReverseSweep(cse(score_mod)).result();
}

Expr d_score(const Expr& score_mod) {
  return differentiate(score_mod).d_score;
}

std::vector<BufferGrad> buffer_grads(const Expr& score_mod) {
  return differentiate(score_mod).buffers;
}

}  // namespace flexjit::passes
