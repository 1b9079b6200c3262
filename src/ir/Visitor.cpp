#include "ir/Visitor.h"

#include <vector>

namespace flexjit::ir {

void for_each_node(const Expr& e, const std::function<void(const Expr&)>& fn) {
  std::unordered_set<const Node*> seen;
  // Iterative post-order so that deep expressions cannot overflow the stack.
  std::vector<std::pair<Expr, size_t>> stack;
  if (!e.defined()) return;
  stack.emplace_back(e, 0);
  seen.insert(e.get());
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->args.size()) {
      const Expr& child = node->args[next++];
      if (seen.insert(child.get()).second) stack.emplace_back(child, 0);
      continue;
    }
    Expr done = node;
    stack.pop_back();
    fn(done);
  }
}

bool any_node(const Expr& e, const std::function<bool(const Expr&)>& pred) {
  bool found = false;
  for_each_node(e, [&](const Expr& n) { found = found || pred(n); });
  return found;
}

bool reads_var(const Expr& e, VarKind v) {
  return any_node(e, [v](const Expr& n) { return n->op == Op::Var && n->var == v; });
}

bool loads_at(const Expr& e, VarKind v) {
  return any_node(e, [v](const Expr& n) {
    if (n->op != Op::Load) return false;
    for (const Expr& index : n->args)
      if (reads_var(index, v)) return true;
    return false;
  });
}

Expr Mutator::mutate(const Expr& e) {
  if (!e.defined()) return e;
  auto it = memo_.find(e.get());
  if (it != memo_.end()) return it->second;
  Expr r = visit(e);
  memo_.emplace(e.get(), r);
  return r;
}

Expr Mutator::mutate_args(const Expr& e) {
  if (e->args.empty()) return e;
  std::vector<Expr> args;
  args.reserve(e->args.size());
  for (const auto& a : e->args)
    args.push_back(mutate(a));
  return with_args(e, std::move(args));
}

namespace {
class VarSubstituter : public Mutator {
 public:
  explicit VarSubstituter(const std::unordered_map<VarKind, Expr>& v) : values_(v) {}

 protected:
  Expr visit(const Expr& e) override {
    if (e->op == Op::Var) {
      auto it = values_.find(e->var);
      return it == values_.end() ? e : it->second;
    }
    return mutate_args(e);
  }

 private:
  const std::unordered_map<VarKind, Expr>& values_;
};
}  // namespace

Expr substitute_vars(const Expr& e, const std::unordered_map<VarKind, Expr>& values) {
  VarSubstituter s(values);
  return s.mutate(e);
}

}  // namespace flexjit::ir
