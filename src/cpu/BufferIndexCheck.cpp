#include "cpu/BufferIndexCheck.h"

#include <flexjit/error.h>

#include "binding/BufferCheck.h"
#include "ir/Evaluate.h"
#include "ir/Visitor.h"

#include <algorithm>
#include <cstdint>

namespace flexjit::cpu {

namespace {

bool reads(const Expr& e, ir::VarKind v) {
  return ir::any_node(e, [v](const Expr& n) { return n->op == ir::Op::Var && n->var == v; });
}

}  // namespace

void check_buffer_indices(const Mods& mods, const runtime::BoundModArgs& args,
                          const runtime::CallExtents& extents, const std::vector<int>* kv_lengths) {
  using namespace runtime::buffer_check;
  FJ_ASSERT(
      extents.batch >= 0 && extents.heads_q >= 0 && extents.seqlen_q >= 0 && extents.seqlen_kv >= 0,
      "check_buffer_indices without the call's extents");
  const std::vector<runtime::LoadSite> sites = runtime::load_sites(mods);
  ir::EvalEnv env = runtime::eval_env_of(mods, args);
  for (size_t si = 0; si < sites.size(); ++si) {
    const runtime::LoadSite& site = sites[si];
    const std::vector<Expr>& indices = site.load->args;
    const TensorRef& bound = *args.buffers[static_cast<size_t>(site.buffer)];
    bool rb = false, rh = false, rq = false, rkv = false;
    std::vector<ir::Evaluator> evals;
    for (const Expr& e : indices) {
      rb = rb || reads(e, ir::VarKind::B);
      rh = rh || reads(e, ir::VarKind::H);
      rq = rq || reads(e, ir::VarKind::QIdx);
      rkv = rkv || reads(e, ir::VarKind::KvIdx);
      evals.emplace_back(e);
    }
    const bool row = site.mod == runtime::CheckedMod::SinkMod;  // no kv_idx
    // An unread leaf stays at 0 (any of its values gives the same index); a leaf with an empty
    // range means the mods are never evaluated.
    // With a KV cache every b has its own kv_idx range.
    const int64_t nb =
        rb || kv_lengths != nullptr ? extents.batch : std::min<int64_t>(extents.batch, 1);
    const int64_t nh = rh ? extents.heads_q : std::min<int64_t>(extents.heads_q, 1);
    const int64_t nq = rq ? extents.seqlen_q : std::min<int64_t>(extents.seqlen_q, 1);
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t skv =
          kv_lengths != nullptr ? (*kv_lengths)[static_cast<size_t>(b)] : extents.seqlen_kv;
      const int64_t nkv = row ? 1 : rkv ? skv : std::min<int64_t>(skv, 1);
      for (int64_t h = 0; h < nh; ++h) {
        for (int64_t q = 0; q < nq; ++q) {
          for (int64_t kv = 0; kv < nkv; ++kv) {
            env.b = static_cast<int32_t>(b);
            env.h = static_cast<int32_t>(h);
            env.q_idx = static_cast<int32_t>(q);
            env.kv_idx = static_cast<int32_t>(kv);
            std::vector<int64_t> idx;
            int bad = -1;
            for (size_t d = 0; d < evals.size(); ++d) {
              idx.push_back(evals[d].run(env).i);
              if (bad < 0 && (idx[d] < 0 || idx[d] >= bound.shape[d])) bad = static_cast<int>(d);
            }
            if (bad < 0) continue;
            std::vector<int64_t> r(kWords, 0);
            r[kClaimed] = 1;
            r[kSite] = static_cast<int64_t>(si);
            r[kBuffer] = site.buffer;
            r[kDim] = bad;
            r[kIndex] = idx[static_cast<size_t>(bad)];
            r[kMod] = static_cast<int64_t>(site.mod);
            r[kAt] = static_cast<int64_t>(row ? runtime::CheckPosition::Row
                                              : runtime::CheckPosition::Element);
            r[kB] = env.b;
            r[kH] = env.h;
            r[kQ] = env.q_idx;
            r[kKv] = env.kv_idx;
            for (size_t d = 0; d < idx.size() && d < 4; ++d)
              r[kIndices + static_cast<int>(d)] = idx[d];
            throw RuntimeError(
                runtime::buffer_check_message(mods, args, r, runtime::CheckedOn::Cpu));
          }
        }
      }
    }
  }
}

}  // namespace flexjit::cpu
