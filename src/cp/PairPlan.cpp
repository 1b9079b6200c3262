#include "cp/PairPlan.h"

#include <flexjit/error.h>

#include "cp/GlobalPositions.h"
#include "passes/MaskAnalysis.h"

namespace flexjit::cp {

std::string_view to_string(PairKind k) {
  switch (k) {
    case PairKind::Empty:
      return "empty";
    case PairKind::Full:
      return "full";
    case PairKind::Partial:
      break;
  }
  return "partial";
}

std::unordered_map<std::string, double> known_params(const Mods& mods,
                                                     const ModBindings& bindings) {
  std::unordered_map<std::string, double> out;
  for (const Param& p : mods.params) {
    if (p.decl()->default_value) out[p.name()] = *p.decl()->default_value;
  }
  for (const auto& [name, value] : bindings.params)
    out[name] = value;
  return out;
}

namespace {

// An inclusive i32 range [lo, hi]; positions past the i32 range are refused before this.
passes::IntRange range(int64_t lo, int64_t hi) {
  passes::IntRange r;
  r.lo = static_cast<int32_t>(lo);
  r.hi = static_cast<int32_t>(hi);
  return r;
}

}  // namespace

PairKind classify_pair(const Mods& shifted, const std::unordered_map<std::string, double>& params,
                       int64_t batch, int64_t heads, const Chunk& q, const Chunk& kv) {
  if (!shifted.mask_mod.defined()) return PairKind::Full;
  if (q.length <= 0 || kv.length <= 0) return PairKind::Empty;
  passes::TileBounds tile;
  tile.b = range(0, batch - 1);
  tile.h = range(0, heads - 1);
  tile.q_idx = range(0, q.length - 1);
  tile.kv_idx = range(0, kv.length - 1);
  tile.params = params;
  tile.params[std::string(kQOffsetParam)] = static_cast<double>(q.start);
  tile.params[std::string(kKvOffsetParam)] = static_cast<double>(kv.start);
  switch (passes::analyze_tile(shifted.mask_mod, tile)) {
    case passes::TileVerdict::Empty:
      return PairKind::Empty;
    case passes::TileVerdict::Full:
      return PairKind::Full;
    case passes::TileVerdict::Unknown:
      break;
  }
  return PairKind::Partial;
}

Mods mods_for_pair(const Mods& shifted, PairKind kind) {
  FJ_ASSERT(kind != PairKind::Empty, "an empty pair makes no call");
  if (kind == PairKind::Partial) return shifted;
  Mods m = shifted;
  m.mask_mod = Expr();
  return m;
}

}  // namespace flexjit::cp
