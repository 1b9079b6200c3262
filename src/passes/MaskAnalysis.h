// Mask analysis: decides whether a mask_mod is true everywhere, false everywhere, or neither
// on a tile of (b, h, q_idx, kv_idx) space, without evaluating it at every point.
//
// create_block_mask skips evaluating tiles with a verdict, and the forward kernel skips the
// mask_mod on Full blocks. The analysis is SOUND: Full means mask_mod is true at every point of
// the tile, Empty that it is false at every point; Unknown promises nothing (the tile may still
// be uniform). It is interval arithmetic (passes/Interval.h), exact for masks that compare
// affine index expressions with each other (causal, sliding window, prefix-LM), and for floor
// division by a constant (chunked attention) on tiles aligned to the chunk; loads from buffers
// (document masks) are Unknown. Out-of-bounds loads are not considered: a verdict speaks of the
// mask's value where it has one.
#pragma once

#include "ir/IR.h"
#include "passes/Interval.h"

namespace flexjit::passes {

// Inclusive ranges of b, h, q_idx and kv_idx, and the parameter values known at analysis time
// (a parameter not listed may take any value).
using TileBounds = LeafBounds;

enum class TileVerdict { Empty, Full, Unknown };
const char* to_string(TileVerdict v);  // "empty", "full", "unknown"

// An undefined mask (attend everywhere) is Full.
TileVerdict analyze_tile(const Expr& mask, const TileBounds& tile);

}  // namespace flexjit::passes
