// Assembly of the naive reference kernel's CUDA source (templates/reference.cuh): fp32 math,
// scores materialized in a global workspace, the mask_mod applied at every position. Tests use
// it to check the forward kernel at shapes too large for the CPU reference; it shares the mods
// codegen with the forward kernel but none of its tiling, sparsity or online softmax.
//
// One self-contained translation unit, in this order: a comment block (versions, arch,
// configuration, the mods as text, `// source key: <sha256>` last), templates/flexjit_abi.h,
// templates/prelude.cuh, struct FjReferenceConfig, the mods (generate_mod_functions),
// templates/reference.cuh, which defines
//   extern "C" __global__ void flexjit_reference_forward(const FjFwdArgs, const FjModParams,
//                                                        float* workspace)
#pragma once

#include "codegen/cuda/ForwardSource.h"

#include <flexjit/mods.h>
#include <flexjit/types.h>

namespace flexjit::cuda {

struct ReferenceSpec {
  DType dtype = DType::BF16;  // of q, k, v and out: f32, f16 or bf16
  int head_dim_qk = 128;      // any positive value (the reference loops over d)
  int head_dim_v = 128;
  int gqa_ratio = 1;
  std::string str() const;  // "bf16 d=128/64 gqa=2"
};

// Type-checks `mods` (CompileError) and checks the spec (UnsupportedError for an i32 / bool
// dtype or non-positive sizes), then assembles the source with the embedded templates.
GeneratedSource generate_reference(const Mods& mods, const ReferenceSpec& spec,
                                   const std::string& arch);

}  // namespace flexjit::cuda
