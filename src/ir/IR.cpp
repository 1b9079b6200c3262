#include "ir/IR.h"

#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace flexjit::ir {

std::string_view to_string(VarKind v) {
  switch (v) {
    case VarKind::Score:
      return "score";
    case VarKind::B:
      return "b";
    case VarKind::H:
      return "h";
    case VarKind::QIdx:
      return "q_idx";
    case VarKind::KvIdx:
      return "kv_idx";
  }
  FJ_ASSERT(false, "bad VarKind");
}

ScalarType var_type(VarKind v) {
  return v == VarKind::Score ? ScalarType::F32 : ScalarType::I32;
}

std::string_view op_name(Op op) {
  switch (op) {
#define FLEXJIT_X(name) \
  case Op::name:        \
    return #name;
#define FLEXJIT_XS(name, spelling) \
  case Op::name:                   \
    return #name;
    FLEXJIT_IR_OTHER_NODES(FLEXJIT_X)
    FLEXJIT_IR_UNARY_OPS(FLEXJIT_XS)
    FLEXJIT_IR_BINARY_OPS(FLEXJIT_XS)
#undef FLEXJIT_X
#undef FLEXJIT_XS
  }
  FJ_ASSERT(false, "bad Op");
}

std::string_view op_spelling(Op op) {
  switch (op) {
#define FLEXJIT_X(name) \
  case Op::name:        \
    return "";
#define FLEXJIT_XS(name, spelling) \
  case Op::name:                   \
    return spelling;
    FLEXJIT_IR_OTHER_NODES(FLEXJIT_X)
    FLEXJIT_IR_UNARY_OPS(FLEXJIT_XS)
    FLEXJIT_IR_BINARY_OPS(FLEXJIT_XS)
#undef FLEXJIT_X
#undef FLEXJIT_XS
  }
  FJ_ASSERT(false, "bad Op");
}

bool is_unary(Op op) {
  switch (op) {
#define FLEXJIT_XS(name, spelling) case Op::name:
    FLEXJIT_IR_UNARY_OPS(FLEXJIT_XS)
#undef FLEXJIT_XS
    return true;
    default:
      return false;
  }
}

bool is_binary(Op op) {
  switch (op) {
#define FLEXJIT_XS(name, spelling) case Op::name:
    FLEXJIT_IR_BINARY_OPS(FLEXJIT_XS)
#undef FLEXJIT_XS
    return true;
    default:
      return false;
  }
}

bool is_comparison(Op op) {
  return op == Op::EQ || op == Op::NE || op == Op::LT || op == Op::LE || op == Op::GT ||
         op == Op::GE;
}

bool is_commutative(Op op) {
  return op == Op::Add || op == Op::Mul || op == Op::Min || op == Op::Max || op == Op::EQ ||
         op == Op::NE || op == Op::And || op == Op::Or;
}

int op_arity(Op op) {
  if (is_unary(op)) return 1;
  if (is_binary(op)) return 2;
  switch (op) {
    case Op::Cast:
      return 1;
    case Op::Select:
      return 3;
    case Op::Load:
      return -1;
    default:
      return 0;
  }
}

Node::~Node() {
  std::vector<Expr> pending = std::move(args);
  while (!pending.empty()) {
    Expr e = std::move(pending.back());
    pending.pop_back();
    if (e.ptr().use_count() == 1) {
      // We hold the last reference: take its children so that destroying it recurses no deeper.
      auto& child_args = const_cast<Node*>(e.get())->args;
      for (auto& a : child_args)
        pending.push_back(std::move(a));
      child_args.clear();
    }
  }
}

bool equal(const BufferDecl& a, const BufferDecl& b) {
  return a.name == b.name && a.dtype == b.dtype && a.dims == b.dims;
}

bool equal(const ParamDecl& a, const ParamDecl& b) {
  return a.name == b.name && a.type == b.type;
}

namespace {

uint64_t mix(uint64_t seed, const void* data, size_t n) {
  return XXH64(data, n, seed);
}
template <typename T>
uint64_t mix(uint64_t seed, const T& v) {
  return mix(seed, &v, sizeof(v));
}
uint64_t mix(uint64_t seed, const std::string& s) {
  seed = mix(seed, s.size());
  return mix(seed, s.data(), s.size());
}

// Computes the node's structural hash from its payload and its args' cached hashes.
uint64_t compute_hash(const Node& n) {
  uint64_t h = mix(0x9e3779b97f4a7c15ull, static_cast<uint8_t>(n.op));
  h = mix(h, static_cast<uint8_t>(n.type));
  switch (n.op) {
    case Op::IntImm:
    case Op::BoolImm:
      h = mix(h, n.ival);
      break;
    case Op::FloatImm: {
      float f = static_cast<float>(n.fval);
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      h = mix(h, bits);
      break;
    }
    case Op::Var:
      h = mix(h, static_cast<uint8_t>(n.var));
      break;
    case Op::Param:
      h = mix(h, n.param->name);
      h = mix(h, static_cast<uint8_t>(n.param->type));
      break;
    case Op::Load:
      h = mix(h, n.buffer->name);
      h = mix(h, static_cast<uint8_t>(n.buffer->dtype));
      for (const auto& d : n.buffer->dims)
        h = mix(h, d);
      break;
    default:
      break;
  }
  h = mix(h, n.args.size());
  for (const auto& a : n.args)
    h = mix(h, a->hash);
  return h;
}

Expr finish(Node n) {
  n.hash = compute_hash(n);
  // Created non-const so that ~Node may detach the args of sole-owned children.
  return Expr(std::shared_ptr<const Node>(std::make_shared<Node>(std::move(n))));
}

Node node(Op op, ScalarType t, std::vector<Expr> args = {}) {
  Node n;
  n.op = op;
  n.type = t;
  n.args = std::move(args);
  for (const auto& a : n.args)
    FJ_ASSERT(a.defined(), "IR node with an undefined argument");
  return n;
}

}  // namespace

Expr make_int(int64_t v) {
  FJ_ASSERT(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
            "IntImm out of i32 range");
  Node n = node(Op::IntImm, ScalarType::I32);
  n.ival = v;
  return finish(std::move(n));
}

Expr make_float(double v) {
  Node n = node(Op::FloatImm, ScalarType::F32);
  // One NaN: its sign and payload are not part of the language, and a canonical NaN prints,
  // parses, compares and hashes the same everywhere.
  n.fval = std::isnan(v) ? std::numeric_limits<double>::quiet_NaN()
                         : static_cast<double>(static_cast<float>(v));
  return finish(std::move(n));
}

Expr make_bool(bool v) {
  Node n = node(Op::BoolImm, ScalarType::Bool);
  n.ival = v ? 1 : 0;
  return finish(std::move(n));
}

Expr make_var(VarKind v) {
  Node n = node(Op::Var, var_type(v));
  n.var = v;
  return finish(std::move(n));
}

Expr make_param(std::shared_ptr<const ParamDecl> p) {
  FJ_ASSERT(p != nullptr, "Param without a declaration");
  Node n = node(Op::Param, p->type);
  n.param = std::move(p);
  return finish(std::move(n));
}

Expr make_load(std::shared_ptr<const BufferDecl> buf, std::vector<Expr> indices) {
  FJ_ASSERT(buf != nullptr, "Load without a buffer");
  FJ_ASSERT(buf->rank() >= 1 && buf->rank() <= 4, "buffer rank must be 1..4");
  FJ_ASSERT(static_cast<int>(indices.size()) == buf->rank(), "Load index count != buffer rank");
  for (const auto& i : indices) {
    FJ_ASSERT(i.defined() && i.type() == ScalarType::I32, "Load index must be i32");
  }
  Node n = node(Op::Load, load_type(buf->dtype), std::move(indices));
  n.buffer = std::move(buf);
  return finish(std::move(n));
}

Expr make_cast(ScalarType to, Expr a) {
  FJ_ASSERT(a.defined(), "Cast of undefined");
  FJ_ASSERT(to != ScalarType::Bool, "Cast to bool is not a node (use x != 0)");
  FJ_ASSERT(a.type() != to, "Cast to the same type");
  return finish(node(Op::Cast, to, {std::move(a)}));
}

Expr make_select(Expr c, Expr a, Expr b) {
  FJ_ASSERT(c.defined() && a.defined() && b.defined(), "Select of undefined");
  FJ_ASSERT(c.type() == ScalarType::Bool, "Select condition must be bool");
  FJ_ASSERT(a.type() == b.type(), "Select branches of mismatched types");
  ScalarType t = a.type();
  return finish(node(Op::Select, t, {std::move(c), std::move(a), std::move(b)}));
}

Expr make_unary(Op op, Expr a) {
  FJ_ASSERT(is_unary(op), "make_unary of a non-unary op");
  FJ_ASSERT(a.defined(), "unary op of undefined");
  ScalarType t = a.type();
  switch (op) {
    case Op::Not:
      FJ_ASSERT(t == ScalarType::Bool, "Not of non-bool");
      break;
    case Op::Neg:
    case Op::Abs:
      FJ_ASSERT(t != ScalarType::Bool, "Neg/Abs of bool");
      break;
    default:
      FJ_ASSERT(t == ScalarType::F32, "math function of non-f32");
      break;
  }
  return finish(node(op, t, {std::move(a)}));
}

Expr make_binary(Op op, Expr a, Expr b) {
  FJ_ASSERT(is_binary(op), "make_binary of a non-binary op");
  FJ_ASSERT(a.defined() && b.defined(), "binary op of undefined");
  FJ_ASSERT(a.type() == b.type(), "binary op of mismatched types");
  ScalarType t = a.type();
  ScalarType result = t;
  if (op == Op::And || op == Op::Or) {
    FJ_ASSERT(t == ScalarType::Bool, "And/Or of non-bool");
  } else if (is_comparison(op)) {
    FJ_ASSERT(t != ScalarType::Bool || op == Op::EQ || op == Op::NE, "ordering of bools");
    result = ScalarType::Bool;
  } else if (op == Op::Pow) {
    FJ_ASSERT(t == ScalarType::F32, "Pow of non-f32");
  } else {
    FJ_ASSERT(t != ScalarType::Bool, "arithmetic on bool");
  }
  return finish(node(op, result, {std::move(a), std::move(b)}));
}

Expr with_args(const Expr& e, std::vector<Expr> args) {
  FJ_ASSERT(args.size() == e->args.size(), "with_args: arity changed");
  bool same = true;
  for (size_t i = 0; i < args.size(); ++i)
    same = same && args[i].same_as(e->args[i]);
  if (same) return e;
  const Node& n = *e.get();
  switch (n.op) {
    case Op::Load:
      return make_load(n.buffer, std::move(args));
    case Op::Cast:
      return make_cast(n.type, std::move(args[0]));
    case Op::Select:
      return make_select(std::move(args[0]), std::move(args[1]), std::move(args[2]));
    default:
      break;
  }
  if (is_unary(n.op)) return make_unary(n.op, std::move(args[0]));
  if (is_binary(n.op)) return make_binary(n.op, std::move(args[0]), std::move(args[1]));
  FJ_ASSERT(false, "with_args on a leaf");
}

bool equal(const Expr& a, const Expr& b) {
  if (a.same_as(b)) return true;
  if (!a.defined() || !b.defined()) return false;
  const Node& x = *a.get();
  const Node& y = *b.get();
  if (x.hash != y.hash || x.op != y.op || x.type != y.type || x.args.size() != y.args.size()) {
    return false;
  }
  switch (x.op) {
    case Op::IntImm:
    case Op::BoolImm:
      if (x.ival != y.ival) return false;
      break;
    case Op::FloatImm:
      if (!(x.fval == y.fval || (std::isnan(x.fval) && std::isnan(y.fval)))) return false;
      if (std::signbit(x.fval) != std::signbit(y.fval)) return false;
      break;
    case Op::Var:
      if (x.var != y.var) return false;
      break;
    case Op::Param:
      if (!equal(*x.param, *y.param)) return false;
      break;
    case Op::Load:
      if (!equal(*x.buffer, *y.buffer)) return false;
      break;
    default:
      break;
  }
  for (size_t i = 0; i < x.args.size(); ++i) {
    if (!equal(x.args[i], y.args[i])) return false;
  }
  return true;
}

uint64_t hash(const Expr& e) {
  return e.defined() ? e->hash : 0;
}

}  // namespace flexjit::ir
