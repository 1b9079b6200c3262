// Expr: a handle to an immutable, typed expression of the mod language.
//
// Exprs are cheap to copy (a shared pointer to an ir::Node). They are built through the
// operators and functions of <flexjit/dsl.h> or by parsing text (<flexjit/mods.h>); the node
// kinds and their invariants are documented in src/ir/IR.h.
#pragma once

#include <flexjit/export.h>

#include <flexjit/types.h>

#include <cstdint>
#include <memory>
#include <string>

namespace flexjit {

namespace ir {
struct Node;
}

class FLEXJIT_API Expr {
 public:
  Expr() = default;
  Expr(int v);      // NOLINT(google-explicit-constructor): i32 constant
  Expr(int64_t v);  // NOLINT: i32 constant; must fit in 32 bits
  Expr(float v);    // NOLINT: f32 constant
  Expr(double v);   // NOLINT: f32 constant (rounded to float)
  Expr(bool v);     // NOLINT: bool constant
  explicit Expr(std::shared_ptr<const ir::Node> node) : node_(std::move(node)) {}

  bool defined() const { return node_ != nullptr; }
  ScalarType type() const;
  const ir::Node* get() const { return node_.get(); }
  const ir::Node* operator->() const { return node_.get(); }
  const std::shared_ptr<const ir::Node>& ptr() const { return node_; }
  // Pointer identity (not structural equality; see ir::equal).
  bool same_as(const Expr& o) const { return node_ == o.node_; }

  // The expression as DSL text (parses back to an equal expression).
  std::string str() const;

 private:
  std::shared_ptr<const ir::Node> node_;
};

}  // namespace flexjit
