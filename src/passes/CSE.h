// Common sub-expression elimination by hash-consing.
//
// After cse(), structurally equal sub-expressions are one shared node (the same pointer), so
// that codegen, whose SSA writer memoises by node identity, computes each value once. Nothing
// else changes: the result is structurally equal to the input. Structural equality is
// ir::equal (FloatImm by value and sign, NaN equal to NaN; buffers and params by declaration).
#pragma once

#include <flexjit/mods.h>

#include "ir/IR.h"

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace flexjit::passes {

Expr cse(const Expr& e);
// One table for both mods: a sub-expression of score_mod and mask_mod becomes one node.
Mods cse(const Mods& mods);

// The table behind cse(), for callers that hash-cons several expressions into one pool.
class HashConser {
 public:
  // The canonical node equal to `e` (all its sub-expressions canonical too).
  Expr intern(const Expr& e);

 private:
  std::unordered_map<uint64_t, std::vector<Expr>> table_;  // structural hash -> canonical nodes
  std::unordered_map<const ir::Node*, Expr> memo_;         // input node -> canonical node
  std::vector<Expr> inputs_;                               // keeps memo_'s keys alive
};

}  // namespace flexjit::passes
