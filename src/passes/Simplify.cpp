#include "passes/Simplify.h"

#include "passes/SimplifyRules.h"

#include <unordered_map>
#include <vector>

namespace flexjit::passes {

namespace {

// Bottom-up to a fixed point. Memoised by node identity (a DAG stays a DAG); every node the
// memo names is kept alive so that a freed temporary's address cannot alias a new node.
class Simplifier {
 public:
  Expr run(const Expr& e) {
    if (!e.defined()) return e;
    auto it = memo_.find(e.get());
    if (it != memo_.end()) return it->second;
    std::vector<Expr> args;
    args.reserve(e->args.size());
    for (const auto& a : e->args)
      args.push_back(run(a));
    Expr r = e->args.empty() ? e : ir::with_args(e, std::move(args));
    Expr s = simplify_rules::rewrite(r);
    if (!s.same_as(r)) s = run(s);
    for (const Expr& k : {e, r, s}) {
      memo_[k.get()] = s;
      alive_.push_back(k);
    }
    return s;
  }

 private:
  std::unordered_map<const ir::Node*, Expr> memo_;
  std::vector<Expr> alive_;
};

}  // namespace

Expr simplify(const Expr& e) {
  return Simplifier().run(e);
}

Mods simplify(const Mods& mods) {
  Simplifier s;
  Mods out = mods;
  out.score_mod = s.run(mods.score_mod);
  out.mask_mod = s.run(mods.mask_mod);
  out.sink_mod = s.run(mods.sink_mod);
  return out;
}

}  // namespace flexjit::passes
