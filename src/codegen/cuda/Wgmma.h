// The wgmma.mma_async instructions an sm_90a kernel uses, as generated inline-PTX wrappers.
//
// Each shape m64nNk16 has its own operand list (N / 2 f32 accumulator registers), so rather
// than spelling every N out in a template, the variant asks for the N values its config needs:
//
//   void fj_wgmma_ss(float (&d)[N / 8][4], fj_u64 desc_a, fj_u64 desc_b, int accumulate);
//     D (+)= A B^T, A (64 x 16) and B (N x 16) both K-major in shared memory (descriptors);
//     accumulate == 0 overwrites D.
//   void fj_wgmma_rs(float (&d)[N / 8][4], const fj_u32 (&a)[4], fj_u64 desc_b, int accumulate);
//     D (+)= A B, A (64 x 16) from registers (the m16n8k16 A fragment of each warp's 16 rows), B
//     (16 x N) MN-major in shared memory.
//   void fj_wgmma_tt(float (&d)[N / 8][4], fj_u64 desc_a, fj_u64 desc_b, int accumulate);
//     D (+)= A B, A (64 x 16) and B (16 x N) both MN-major in shared memory (the transpose bits
//     set): the backward's dQ = dS K reads dS from the dK/dV kernel's dS^T tile this way.
//
// Overloads differ by the accumulator's extent, so a kernel calls fj_wgmma_ss(s, ...) for any
// generated N. Operands are bf16 or f16 with f32 accumulation; scale-a/b are +1.
// For e4m3 (float8_e4m3fn) the same names wrap m64nNk32 .f32.e4m3.e4m3: A (64 x 32) and B
// (N x 32) 1-byte elements, both shared-memory operands K-major (no fj_wgmma_tt), the register
// A fragment 4 x 4 e4m3 (CUTLASS ALayout_64x32; forward_sm90.cuh fj_fp8_vt_key).
#pragma once

#include <flexjit/types.h>

#include <string>
#include <vector>

namespace flexjit::cuda {

// The wrappers for `dtype` (BF16, F16 or E4M3 without tt_n; InternalError otherwise) and the N of
// each form (duplicates ignored; each N a multiple of 8 in [8, 256], else InternalError).
std::string wgmma_wrappers(DType dtype, const std::vector<int>& ss_n, const std::vector<int>& rs_n,
                           const std::vector<int>& tt_n = {});

}  // namespace flexjit::cuda
