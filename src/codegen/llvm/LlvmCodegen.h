// Lowering of mods to LLVM IR functions with a fixed C ABI, and their compilation through the
// process-wide ORC JIT (OrcJit.h).
//
// For a mod set, one module defines (params is the CpuModParams.h slot array; b, h, q, kv are
// the language's i32 leaves; n counts kv positions starting at kv0):
//
//   float fj_score(params, score, b, h, q, kv)           score_mod (identity when undefined)
//   int   fj_mask(params, b, h, q, kv)                   mask_mod as 0 / 1 (1 when undefined)
//   void  fj_score_row(params, float* s, b, h, q, kv0, n)
//             s[i] = mask(kv0 + i) ? score_mod(s[i], kv0 + i) : -inf, in place
//   void  fj_score_row_nomask(params, float* s, b, h, q, kv0, n)   the same without the mask
//   void  fj_mask_row(params, uint8_t* keep, b, h, q, kv0, n)      keep[i] = mask(kv0 + i)
//   int   fj_mask_tile(params, b, h, q0, q1, kv0, kv1)
//             the mask over [q0, q1) x [kv0, kv1): 0 nothing kept (or an empty range),
//             1 partly kept, 2 all kept; stops at the first row that proves "partly"
//
// Semantics are the reference interpreter's (ir/Evaluate.h) bit for bit, with one deliberate
// difference: a load evaluates with every index clamped into [0, extent), so it never faults
// (the interpreter throws RuntimeError for an out-of-bounds load). Because no operation can
// trap — integer division and modulo by 0 or of INT_MIN by -1 are guarded — select, && and ||
// evaluate both operands branch-free, which keeps the row loops vectorisable; the result is the
// interpreter's whenever the interpreter does not throw.
#pragma once

#include <flexjit/mods.h>

#include <cstdint>
#include <memory>
#include <string_view>

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace flexjit::llvmjit {

class CpuModule;

using CpuScoreFn = float (*)(const uint64_t* params, float score, int32_t b, int32_t h, int32_t q,
                             int32_t kv);
using CpuMaskFn = int32_t (*)(const uint64_t* params, int32_t b, int32_t h, int32_t q, int32_t kv);
using CpuScoreRowFn = void (*)(const uint64_t* params, float* scores, int32_t b, int32_t h,
                               int32_t q, int32_t kv0, int32_t n);
using CpuMaskRowFn = void (*)(const uint64_t* params, uint8_t* keep, int32_t b, int32_t h,
                              int32_t q, int32_t kv0, int32_t n);
using CpuMaskTileFn = int32_t (*)(const uint64_t* params, int32_t b, int32_t h, int32_t q0,
                                  int32_t q1, int32_t kv0, int32_t kv1);

// Values returned by fj_mask_tile.
inline constexpr int32_t kTileEmpty = 0;
inline constexpr int32_t kTilePartial = 1;
inline constexpr int32_t kTileFull = 2;

// The compiled functions of one mod set. `module` keeps them alive (the JIT's cache does too).
struct CpuModFunctions {
  CpuScoreFn score = nullptr;
  CpuMaskFn mask = nullptr;
  CpuScoreRowFn score_row = nullptr;
  CpuScoreRowFn score_row_nomask = nullptr;
  CpuMaskRowFn mask_row = nullptr;
  CpuMaskTileFn mask_tile = nullptr;
  bool has_score_mod = false;
  bool has_mask_mod = false;
  std::shared_ptr<const CpuModule> module;
};

// The cache kind of the module above (OrcJit::get).
inline constexpr std::string_view kModsKind = "mods";

// Builds the module described above into `ctx`. Throws CompileError if the mods do not type
// check.
std::unique_ptr<llvm::Module> emit_mod_module(const Mods& mods, llvm::LLVMContext& ctx);

// The compiled functions for `mods`, from the JIT's memory cache or compiled now.
CpuModFunctions compile_cpu_mods(const Mods& mods);

}  // namespace flexjit::llvmjit
