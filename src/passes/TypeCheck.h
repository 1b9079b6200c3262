// Type checking: the pass the pipeline runs (and logs) before any other.
//
// verify() re-checks every node invariant listed in ir/IR.h (the ones make_* asserts, plus the
// cached structural hash) on every distinct node. Front ends build only valid nodes, so a
// failure is a flexjit bug: it throws InternalError naming the offending sub-expression.
//
// type_check() verifies both mods and then the rules a user can break, throwing CompileError
// with the offending sub-expression (ir::describe):
//   - score_mod returns f32, mask_mod returns bool, mask_mod does not use `score`;
//   - sink_mod returns f32 and uses neither `score` nor `kv_idx`;
//   - every buffer and param the mods use is declared in Mods::buffers / Mods::params, with the
//     same declaration; declared names are unique and are not a leaf's name;
//   - buffers have rank 1..4 and non-empty dim names; param defaults fit the param's type.
#pragma once

#include <flexjit/mods.h>

#include "ir/IR.h"

namespace flexjit::passes {

void verify(const Expr& e);
void type_check(const Mods& mods);

}  // namespace flexjit::passes
