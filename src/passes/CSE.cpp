#include "passes/CSE.h"

#include "ir/Visitor.h"

namespace flexjit::passes {

Expr HashConser::intern(const Expr& root) {
  if (!root.defined()) return root;
  inputs_.push_back(root);
  // Children before parents, iteratively; each input node once.
  ir::for_each_node(root, [&](const Expr& n) {
    if (memo_.count(n.get())) return;
    Expr rebuilt = n;
    if (!n->args.empty()) {
      std::vector<Expr> args;
      args.reserve(n->args.size());
      for (const auto& a : n->args)
        args.push_back(memo_.at(a.get()));
      rebuilt = ir::with_args(n, std::move(args));
    }
    // The args are canonical, so ir::equal stops at them (same_as): a shallow comparison.
    std::vector<Expr>& bucket = table_[ir::hash(rebuilt)];
    Expr canonical;
    for (const Expr& c : bucket) {
      if (ir::equal(c, rebuilt)) {
        canonical = c;
        break;
      }
    }
    if (!canonical.defined()) {
      bucket.push_back(rebuilt);
      canonical = rebuilt;
    }
    memo_.emplace(n.get(), canonical);
  });
  return memo_.at(root.get());
}

Expr cse(const Expr& e) {
  return HashConser().intern(e);
}

Mods cse(const Mods& mods) {
  HashConser table;
  Mods out = mods;
  out.score_mod = table.intern(mods.score_mod);
  out.mask_mod = table.intern(mods.mask_mod);
  out.sink_mod = table.intern(mods.sink_mod);
  return out;
}

}  // namespace flexjit::passes
