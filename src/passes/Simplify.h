// Constant folding and algebraic simplification.
//
// simplify() rewrites bottom-up to a fixed point with rules that never change a result under
// the semantics of ir/Evaluate.h, bit for bit (NaN payloads aside), at every point of every
// environment: i32 rules rely only on arithmetic mod 2^32 (so (x + 3) + 4 -> x + 7 is fine but
// x + 1 < y + 1 -> x < y is not); f32 rules are exact IEEE identities only (x * 1 -> x, never
// x * 0 -> 0, x - x -> 0 or any reassociation); constants fold in float through the reference
// interpreter's own operations. Rules never introduce an evaluation error; they may remove one
// (an out-of-bounds load whose value cannot matter). The rules, one per line, are in
// SimplifyRules.cpp and listed in docs/passes.md.
//
// Canonical forms it produces: constants on the right of commutative i32 operators and of
// comparisons (3 < x -> x > 3); i32 `x - c` as `x + (-c)`; integer constants gathered outermost
// ((x + 3) + y -> (x + y) + 3).
#pragma once

#include <flexjit/mods.h>

#include "ir/IR.h"

namespace flexjit::passes {

Expr simplify(const Expr& e);
// Simplifies score_mod and mask_mod (buffers and params are kept as declared).
Mods simplify(const Mods& mods);

}  // namespace flexjit::passes
