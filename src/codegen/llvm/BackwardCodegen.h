// The JIT'ed functions of the CPU attention backward (cpu/BackwardKernel.h): the derivatives of a
// score_mod that passes::differentiate derives, lowered with ModLowering into their own module
// (OrcJit kind "backward", cached apart from the forward's "mods" module).
//
//   void fj_dscore_row(const uint64_t* params, float* d, const float* pre,
//                      int b, int h, int q, int kv0, int n);
//       d[i] *= d score_mod / d score at (pre[i], b, h, q, kv0 + i)       (branch-free)
//   void fj_bufgrad_<k>(const uint64_t* params, float* grad, const float* ds, const float* pre,
//                       int b, int h, int q, int kv0, int n);
//   void fj_bufgrad_<k>_f64(..., double* grad, const double* ds, ...);
//       for every i with ds[i] != 0 where load site k is reached:
//         grad[idx] += ds[i] * d score_mod / d buf[idx]
//       idx: the load's indices, clamped into the buffer's extents like the forward's load;
//       grad is contiguous row-major over the bound buffer's extents (params' extent slots).
//
// `params` is the forward's slot array (CpuModParams.h). Header free of LLVM types.
#pragma once

#include <flexjit/mods.h>

#include "codegen/llvm/OrcJit.h"

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace flexjit::llvmjit {

using CpuDScoreRowFn = void (*)(const uint64_t* params, float* d, const float* pre, int32_t b,
                                int32_t h, int32_t q, int32_t kv0, int32_t n);
using CpuBufGradRowFn = void (*)(const uint64_t* params, float* grad, const float* ds,
                                 const float* pre, int32_t b, int32_t h, int32_t q, int32_t kv0,
                                 int32_t n);
using CpuBufGradRowF64Fn = void (*)(const uint64_t* params, double* grad, const double* ds,
                                    const float* pre, int32_t b, int32_t h, int32_t q, int32_t kv0,
                                    int32_t n);

struct CpuBackwardFunctions {
  std::shared_ptr<const CpuModule> module;
  CpuDScoreRowFn dscore_row = nullptr;  // null when the score_mod is undefined (identity)
  struct BufferGrad {
    int buffer = 0;  // index into Mods::buffers
    CpuBufGradRowFn f32 = nullptr;
    CpuBufGradRowF64Fn f64 = nullptr;
  };
  std::vector<BufferGrad> buffers;  // one per float load site of the score_mod
};

inline constexpr std::string_view kBackwardKind = "backward";

// Differentiates the score_mod and compiles the functions above (cached per structure).
// Throws CompileError if the mods do not type check.
CpuBackwardFunctions compile_cpu_backward(const Mods& mods);

}  // namespace flexjit::llvmjit
