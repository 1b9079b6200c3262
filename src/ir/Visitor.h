// Walking and rewriting IR.
//
// for_each_node visits every distinct node once (shared sub-expressions once), children before
// parents. Mutator rebuilds bottom-up and returns the original node when no child changed, as
// Halide's IRMutator does; it memoises by node identity so a DAG stays a DAG.
#pragma once

#include "ir/IR.h"

#include <functional>
#include <unordered_map>
#include <unordered_set>

namespace flexjit::ir {

void for_each_node(const Expr& e, const std::function<void(const Expr&)>& fn);
// Whether some node of `e` (undefined: none) satisfies `pred`.
bool any_node(const Expr& e, const std::function<bool(const Expr&)>& pred);
// Whether `e` (undefined: no) reads the variable `v` (score, b, h, q_idx, kv_idx).
bool reads_var(const Expr& e, VarKind v);
// Whether `e` (undefined: no) loads a buffer at indices that read the variable `v` (a document
// mask's doc[b, kv_idx] for kv_idx).
bool loads_at(const Expr& e, VarKind v);

class Mutator {
 public:
  virtual ~Mutator() = default;
  // Rewrites `e` (memoised). Subclasses override visit() and call mutate_args() for children.
  Expr mutate(const Expr& e);

 protected:
  // Default: rebuild with mutated args (the original node if none changed).
  virtual Expr visit(const Expr& e) { return mutate_args(e); }
  Expr mutate_args(const Expr& e);

 private:
  std::unordered_map<const Node*, Expr> memo_;
};

// Replaces Var leaves by the given Exprs (leaves not in `values` stay).
Expr substitute_vars(const Expr& e, const std::unordered_map<VarKind, Expr>& values);

}  // namespace flexjit::ir
