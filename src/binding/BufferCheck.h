// The buffer check of the GPU kernels (AttentionOptions::check_buffers): the record that a checked
// kernel writes when a captured-buffer load's index falls outside the bound buffer's extent, the
// load sites it names, and the host's words for it.
//
// A captured buffer's indices are data or arithmetic the host cannot see (bias[doc_id[q_idx]]):
// bind_mod_args checks every extent the host knows before a launch, but an index computed on the
// device is only checked there. With check_buffers, codegen (codegen/cuda/ModCodegen.h,
// BufferChecks::Record) gives FjModParams each buffer's extents and a pointer to one record
// (binding/ModParamLayout.h) and guards every load: an index outside [0, extent) reads 0 instead
// of memory, and the first such load the device meets claims the record (atomicCAS on word 0)
// and fills it in. The host zeroes the record before the launches and reads it after them
// (runtime/BufferCheck.h), then throws RuntimeError with buffer_check_message().
//
// The record: kBufferCheckWords 64-bit words (signed values stored two's complement):
//   [kClaimed]    0 until a load claims the record, then 1
//   [kSite]       the load site: an index into load_sites(mods) (-1: not one of them)
//   [kBuffer]     the buffer: an index into Mods::buffers
//   [kDim]        the first dim whose index is out of bounds
//   [kIndex]      that index
//   [kMod]        which mod evaluated the load (CheckedMod)
//   [kAt]         which of b, h, q_idx, kv_idx the position below holds (CheckPosition)
//   [kB .. kKv]   b, h, q_idx (or the diagonal d = q_idx - kv_idx), kv_idx
//   [kIndices..]  every index of the load (rank <= 4)
#pragma once

#include <flexjit/mods.h>

#include "binding/ModArgs.h"
#include "ir/IR.h"

#include <cstdint>
#include <string>
#include <vector>

namespace flexjit::runtime {

namespace buffer_check {
inline constexpr int kClaimed = 0;
inline constexpr int kSite = 1;
inline constexpr int kBuffer = 2;
inline constexpr int kDim = 3;
inline constexpr int kIndex = 4;
inline constexpr int kMod = 5;
inline constexpr int kAt = 6;
inline constexpr int kB = 7;
inline constexpr int kH = 8;
inline constexpr int kQ = 9;
inline constexpr int kKv = 10;
inline constexpr int kIndices = 11;  // 4 words
inline constexpr int kWords = 16;
}  // namespace buffer_check

inline constexpr int kBufferCheckWords = buffer_check::kWords;

// The mod whose evaluation made a load (the backward's derivatives count as the score_mod).
enum class CheckedMod : int { ScoreMod = 0, MaskMod = 1, SinkMod = 2 };

// The position a load was evaluated at, as the emitting function knows it.
enum class CheckPosition : int {
  Element = 0,   // (b, h, q_idx, kv_idx): fj_score_mod, fj_mask_mod, the score_mod's derivatives
  Row = 1,       // (b, h, q_idx): fj_sink_mod and its gradient
  Column = 2,    // (b, h, kv_idx): the mask_mod's column load (kFjColLoad)
  Diagonal = 3,  // (b, h, d = q_idx - kv_idx): the score_mod's diagonal load (kFjDiagLoad)
  Head = 4,      // (b, h): a per-head gradient address (fj_bufgrad_flush)
};

// A load of a captured buffer in the mods: its buffer and index expressions.
struct LoadSite {
  int buffer = -1;                        // index into Mods::buffers
  Expr load;                              // the Load node
  CheckedMod mod = CheckedMod::ScoreMod;  // the first mod that has it
};

// Every distinct load of `mods` (structurally equal loads once): the score_mod's, then the
// mask_mod's, then the sink_mod's, each children before parents. Codegen numbers a load by its
// place here; the host names it from the same list.
std::vector<LoadSite> load_sites(const Mods& mods);
// The place in `sites` of a load of `buffer` at `indices` (structurally equal); -1 if absent.
int load_site_index(const std::vector<LoadSite>& sites, const ir::BufferDecl& buffer,
                    const std::vector<Expr>& indices);

// Which check found a bad load: the GPU kernels' record, or the CPU backend's walk over the
// call's positions before its kernels run (cpu/BufferIndexCheck.h).
enum class CheckedOn { Gpu, Cpu };

// The RuntimeError text for a claimed record of `mods` bound to `args`, in the interpreter's
// words for an out-of-bounds load ("buffer 'bias': index 12 is out of bounds for dim 0 of extent
// 10 (at bias[12])"), then the load, where it was evaluated and what to fix.
std::string buffer_check_message(const Mods& mods, const BoundModArgs& args,
                                 const std::vector<int64_t>& record, CheckedOn on = CheckedOn::Gpu);

}  // namespace flexjit::runtime
