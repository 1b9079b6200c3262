// The IR of the mod language: immutable, typed, shared expression nodes.
//
// Every node kind is listed once in FLEXJIT_IR_NODES; visitors, the printer, equality, hashing
// and codegen expand that list. A node is a uniform record (op, type, payload, args) built only
// through the make_* functions below, each of which checks the node's invariants with
// FJ_ASSERT (a failure is a flexjit bug: front ends type-check and insert casts before
// building nodes; see passes/TypeCheck.h).
//
// Node kinds (args are Exprs; T is the node's ScalarType):
//   IntImm        i32 constant (value in `ival`, fits in int32)
//   FloatImm      f32 constant (value in `fval`, exactly representable as float)
//   BoolImm       bool constant (`ival` 0 or 1)
//   Var           a leaf: `var` is score (f32) or b, h, q_idx, kv_idx (i32)
//   Param         a runtime scalar parameter (`param`); its value is a kernel argument
//   Load          buffer[args...]: `buffer` has rank == args.size(); every arg is i32;
//                 T = load_type(buffer dtype)
//   Cast          convert args[0] to T (i32<->f32, bool->i32/f32); f32->i32 truncates
//   Select        args[0] ? args[1] : args[2]; args[0] bool, args[1].type == args[2].type == T
//   unary ops     one arg of type T (Not: bool; Neg/Abs: i32 or f32; math functions: f32)
//   binary ops    two args of one type; arithmetic T = that type; comparisons T = bool;
//                 And/Or take and give bool; Pow is f32 only
#pragma once

#include <flexjit/error.h>
#include <flexjit/expr.h>
#include <flexjit/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flexjit::ir {

// X(Name, spelling). Unary math ops print as functions: exp(x); Neg/Not as prefix operators.
#define FLEXJIT_IR_UNARY_OPS(X) \
  X(Neg, "-")                   \
  X(Not, "!")                   \
  X(Abs, "abs")                 \
  X(Exp, "exp")                 \
  X(Exp2, "exp2")               \
  X(Log, "log")                 \
  X(Log2, "log2")               \
  X(Tanh, "tanh")               \
  X(Sigmoid, "sigmoid")         \
  X(Sqrt, "sqrt")               \
  X(Rsqrt, "rsqrt")             \
  X(Floor, "floor")             \
  X(Ceil, "ceil")

// X(Name, spelling). Min/Max/Pow print as functions; the rest as infix operators.
#define FLEXJIT_IR_BINARY_OPS(X) \
  X(Add, "+")                    \
  X(Sub, "-")                    \
  X(Mul, "*")                    \
  X(Div, "/")                    \
  X(Mod, "%")                    \
  X(Min, "min")                  \
  X(Max, "max")                  \
  X(Pow, "pow")                  \
  X(EQ, "==")                    \
  X(NE, "!=")                    \
  X(LT, "<")                     \
  X(LE, "<=")                    \
  X(GT, ">")                     \
  X(GE, ">=")                    \
  X(And, "&&")                   \
  X(Or, "||")

#define FLEXJIT_IR_OTHER_NODES(X) \
  X(IntImm)                       \
  X(FloatImm)                     \
  X(BoolImm)                      \
  X(Var)                          \
  X(Param)                        \
  X(Load)                         \
  X(Cast)                         \
  X(Select)

enum class Op : uint8_t {
#define FLEXJIT_X(name) name,
#define FLEXJIT_XS(name, spelling) name,
  FLEXJIT_IR_OTHER_NODES(FLEXJIT_X) FLEXJIT_IR_UNARY_OPS(FLEXJIT_XS)
      FLEXJIT_IR_BINARY_OPS(FLEXJIT_XS)
#undef FLEXJIT_X
#undef FLEXJIT_XS
};

// The leaves a mod receives.
enum class VarKind : uint8_t { Score, B, H, QIdx, KvIdx };
std::string_view to_string(VarKind v);  // "score", "b", "h", "q_idx", "kv_idx"
ScalarType var_type(VarKind v);

std::string_view op_name(Op op);      // "Add"
std::string_view op_spelling(Op op);  // "+", "exp", ... ("" for the other nodes)
bool is_unary(Op op);
bool is_binary(Op op);
bool is_comparison(Op op);   // EQ NE LT LE GT GE
bool is_commutative(Op op);  // Add Mul Min Max EQ NE And Or
int op_arity(Op op);         // fixed arity; -1 for Load

struct BufferDecl {
  std::string name;
  DType dtype;
  std::vector<std::string> dims;  // one entry per dim: a symbol ("H") or a number ("8192")
  SourceLoc loc;                  // where declared (text front end); not compared
  int rank() const { return static_cast<int>(dims.size()); }
};
bool equal(const BufferDecl& a, const BufferDecl& b);  // name, dtype, dims

struct ParamDecl {
  std::string name;
  ScalarType type;
  std::optional<double> default_value;  // not compared, not hashed
  SourceLoc loc;
};
bool equal(const ParamDecl& a, const ParamDecl& b);  // name, type

struct Node {
  Op op;
  ScalarType type;
  int64_t ival = 0;   // IntImm / BoolImm value
  double fval = 0.0;  // FloatImm value
  VarKind var = VarKind::Score;
  std::shared_ptr<const BufferDecl> buffer;  // Load
  std::shared_ptr<const ParamDecl> param;    // Param
  std::vector<Expr> args;
  uint64_t hash = 0;  // structural hash, computed at construction

  Node() = default;
  Node(Node&&) = default;
  Node& operator=(Node&&) = default;
  Node(const Node&) = default;
  Node& operator=(const Node&) = default;
  // Releases a long chain of sole-owned children iteratively: a recursive destructor would
  // overflow the stack on expressions hundreds of thousands of nodes deep.
  ~Node();
};

// Constructors. All check their invariants; none does type promotion (see passes/TypeCheck).
Expr make_int(int64_t v);
Expr make_float(double v);
Expr make_bool(bool v);
Expr make_var(VarKind v);
Expr make_param(std::shared_ptr<const ParamDecl> p);
Expr make_load(std::shared_ptr<const BufferDecl> buf, std::vector<Expr> indices);
Expr make_cast(ScalarType to, Expr a);
Expr make_select(Expr c, Expr a, Expr b);
Expr make_unary(Op op, Expr a);
Expr make_binary(Op op, Expr a, Expr b);
// Rebuilds `e` with new args (same op and payload); returns `e` itself if all args are same_as.
Expr with_args(const Expr& e, std::vector<Expr> args);

// Structural equality: same ops, types, payloads and args; decls compared with equal().
bool equal(const Expr& a, const Expr& b);
// Structural hash (xxHash64 of the op tree). Equal expressions hash equal; parameter values
// and buffer contents never enter it; buffer and parameter *names* do (they are the binding
// names users pass tensors and values by).
uint64_t hash(const Expr& e);

}  // namespace flexjit::ir
