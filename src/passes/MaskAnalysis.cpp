#include "passes/MaskAnalysis.h"

namespace flexjit::passes {

const char* to_string(TileVerdict v) {
  switch (v) {
    case TileVerdict::Empty:
      return "empty";
    case TileVerdict::Full:
      return "full";
    case TileVerdict::Unknown:
      return "unknown";
  }
  FJ_ASSERT(false, "bad TileVerdict");
}

TileVerdict analyze_tile(const Expr& mask, const TileBounds& tile) {
  if (!mask.defined()) return TileVerdict::Full;
  FJ_ASSERT(mask.type() == ScalarType::Bool, "analyze_tile of a non-bool expression");
  for (const IntRange* r : {&tile.b, &tile.h, &tile.q_idx, &tile.kv_idx}) {
    FJ_ASSERT(r->lo <= r->hi, "analyze_tile of an empty tile");
  }
  Interval v = bounds_of(mask, tile);
  if (v.is_true()) return TileVerdict::Full;
  if (v.is_false()) return TileVerdict::Empty;
  return TileVerdict::Unknown;
}

}  // namespace flexjit::passes
