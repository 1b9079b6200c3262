#include "binding/BufferCheck.h"

#include "ir/Printer.h"
#include "ir/Visitor.h"

#include <fmt/format.h>

#include <set>

namespace flexjit::runtime {

namespace {

bool same_load(const ir::Node& n, const ir::BufferDecl& buffer, const std::vector<Expr>& indices) {
  if (n.op != ir::Op::Load || !ir::equal(*n.buffer, buffer) || n.args.size() != indices.size()) {
    return false;
  }
  for (size_t d = 0; d < indices.size(); ++d)
    if (!ir::equal(n.args[d], indices[d])) return false;
  return true;
}

std::string_view mod_name(int64_t mod) {
  switch (static_cast<CheckedMod>(mod)) {
    case CheckedMod::ScoreMod:
      return "score_mod";
    case CheckedMod::MaskMod:
      return "mask_mod";
    case CheckedMod::SinkMod:
      return "sink_mod";
  }
  return "mods";
}

std::string position(const std::vector<int64_t>& r) {
  using namespace buffer_check;
  switch (static_cast<CheckPosition>(r[kAt])) {
    case CheckPosition::Element:
      return fmt::format("b={}, h={}, q_idx={}, kv_idx={}", r[kB], r[kH], r[kQ], r[kKv]);
    case CheckPosition::Row:
      return fmt::format("b={}, h={}, q_idx={}", r[kB], r[kH], r[kQ]);
    case CheckPosition::Column:
      return fmt::format("b={}, h={}, kv_idx={}", r[kB], r[kH], r[kKv]);
    case CheckPosition::Diagonal:
      return fmt::format("b={}, h={} on the diagonal q_idx - kv_idx = {}", r[kB], r[kH], r[kQ]);
    case CheckPosition::Head:
      return fmt::format("b={}, h={}", r[kB], r[kH]);
  }
  return "an unknown position";
}

// What the index of `site` is computed from, as the fix names it.
std::string what_to_fix(const LoadSite& site, const std::string& buffer) {
  std::set<std::string> buffers, params;
  for (const Expr& index : site.load->args) {
    ir::for_each_node(index, [&](const Expr& n) {
      if (n->op == ir::Op::Load) buffers.insert("'" + n->buffer->name + "'");
      if (n->op == ir::Op::Param) params.insert("'" + n->param->name + "'");
    });
  }
  if (!buffers.empty()) {
    return fmt::format("fix the entries of {} that it is computed from, or bind a larger '{}'",
                       fmt::join(buffers, ", "), buffer);
  }
  if (!params.empty()) {
    return fmt::format("fix the param {} that it is computed from, or bind a larger '{}'",
                       fmt::join(params, ", "), buffer);
  }
  return fmt::format("fix the index expression, or bind a larger '{}'", buffer);
}

}  // namespace

std::vector<LoadSite> load_sites(const Mods& mods) {
  std::vector<LoadSite> sites;
  for (const auto& side : {std::pair{&mods.score_mod, CheckedMod::ScoreMod},
                           std::pair{&mods.mask_mod, CheckedMod::MaskMod},
                           std::pair{&mods.sink_mod, CheckedMod::SinkMod}}) {
    // Not a structured binding: the lambda below captures the side (clang 16 rejects capturing
    // a structured binding).
    const Expr* root = side.first;
    const CheckedMod mod = side.second;
    if (!root->defined()) continue;
    ir::for_each_node(*root, [&](const Expr& n) {
      if (n->op != ir::Op::Load || load_site_index(sites, *n->buffer, n->args) >= 0) return;
      LoadSite site;
      site.load = n;
      site.mod = mod;
      for (size_t i = 0; i < mods.buffers.size(); ++i) {
        if (mods.buffers[i].name() == n->buffer->name) site.buffer = static_cast<int>(i);
      }
      FJ_ASSERT(site.buffer >= 0,
                "a load of a buffer missing from Mods::buffers: " + n->buffer->name);
      sites.push_back(std::move(site));
    });
  }
  return sites;
}

int load_site_index(const std::vector<LoadSite>& sites, const ir::BufferDecl& buffer,
                    const std::vector<Expr>& indices) {
  for (size_t i = 0; i < sites.size(); ++i)
    if (same_load(*sites[i].load.get(), buffer, indices)) return static_cast<int>(i);
  return -1;
}

std::string buffer_check_message(const Mods& mods, const BoundModArgs& args,
                                 const std::vector<int64_t>& r, CheckedOn on) {
  using namespace buffer_check;
  FJ_ASSERT(r.size() == static_cast<size_t>(kWords) && r[kClaimed] != 0,
            "buffer_check_message of an unclaimed record");
  const auto buffer = static_cast<size_t>(r[kBuffer]);
  FJ_ASSERT(buffer < mods.buffers.size() && buffer < args.buffers.size(),
            "a buffer check record names no buffer of the mods");
  const std::string& name = mods.buffers[buffer].name();
  const TensorRef& bound = *args.buffers[buffer];
  const int rank = mods.buffers[buffer].rank();
  const auto dim = static_cast<size_t>(r[kDim]);
  FJ_ASSERT(dim < bound.shape.size(), "a buffer check record names no dim of the buffer");
  std::string at = name;
  for (int d = 0; d < rank && d < 4; ++d)
    at += fmt::format("[{}]", r[kIndices + d]);
  // The interpreter's words for an out-of-bounds load (ir/Evaluate.cpp), then the GPU's details.
  std::string msg =
      fmt::format("buffer '{}': index {} is out of bounds for dim {} of extent {} (at {})", name,
                  r[kIndex], dim, bound.shape[dim], at);
  const std::vector<LoadSite> sites = load_sites(mods);
  const int64_t site = r[kSite];
  const bool known = site >= 0 && site < static_cast<int64_t>(sites.size());
  msg += fmt::format(
      ": the {}'s load {}at {}, found by check_buffers {}. Every index a mod computes must lie in "
      "[0, extent) at every position of the call, in both branches of a where(): ",
      mod_name(r[kMod]),
      known ? ir::to_text(sites[static_cast<size_t>(site)].load) + " " : std::string(), position(r),
      on == CheckedOn::Gpu ? "on the GPU (the first out-of-bounds load the kernels recorded; it "
                             "read 0 there)"
                           : "before the CPU kernels ran (the first such position in b, h, "
                             "q_idx, kv_idx order)");
  msg += known ? what_to_fix(sites[static_cast<size_t>(site)], name)
               : fmt::format("fix the index, or bind a larger '{}'", name);
  return msg;
}

}  // namespace flexjit::runtime
