// Mods that see global positions: a shard's attention call computes rows and columns of the
// whole sequence's score matrix, so its mods must read the positions of the whole sequence,
// not the shard's local row numbers.
//
// with_global_positions(mods) rewrites every score_mod, mask_mod and sink_mod of `mods`,
// replacing
//
//     q_idx   by  q_idx + cp_q_offset
//     kv_idx  by  kv_idx + cp_kv_offset
//
// where cp_q_offset and cp_kv_offset are i32 runtime parameters (reserved names: a user's mods
// may not declare them). A call on query chunk [q0, q0 + n) and key chunk [k0, k0 + m) binds
// cp_q_offset = q0 and cp_kv_offset = k0; the kernel is the same for every chunk pair, so moving
// to another shard never recompiles. Buffers indexed by position (a document mask's doc_id[S])
// are bound whole: the mods index them at global positions.
//
// The passes keep recognising the shapes they know after the shift:
//   - mask analysis (passes/MaskAnalysis.h) is interval arithmetic; with the offsets among the
//     known parameters (TileBounds::params) q_idx + cp_q_offset is the exact interval of the
//     global rows, so causal, sliding-window, prefix-LM and chunked masks get the same Empty /
//     Full verdicts as the unsharded mask on the same global tiles;
//   - q_idx + cp_q_offset - (kv_idx + cp_kv_offset) is still a linear form with coefficients
//     (1, -1) (passes/LinearForm.h: a parameter is part of the rest), so a relative bias stays a
//     function of the position difference (passes/PositionDifference.h) and keeps the sm_90a
//     kernels' per-diagonal loads.
// tests/unit/test_cp_sharding.cpp checks both.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/mods.h>

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace flexjit::cp {

inline constexpr std::string_view kQOffsetParam = "cp_q_offset";
inline constexpr std::string_view kKvOffsetParam = "cp_kv_offset";

// The rewritten mods (name kept). CompileError when `mods` already declares a parameter or
// buffer named cp_q_offset or cp_kv_offset.
Mods with_global_positions(const Mods& mods);

// `bindings` with the two offsets added, each only when `shifted` (a with_global_positions
// result) declares it (a mod that never reads kv_idx has no cp_kv_offset to bind).
ModBindings with_offsets(const ModBindings& bindings, const Mods& shifted, int64_t q_offset,
                         int64_t kv_offset);

}  // namespace flexjit::cp
