// Whether a mod divides by a value known only at run time: an i32 floor division or modulo whose
// divisor is not a literal (a param, a load, an index). Such a mask_mod costs a division
// sequence per score (a literal divisor compiles to a multiply and shifts), and at the sm_90a
// forward's 160 registers per thread of 192-row tiles it spilled 228-336 B and ran 20-42 %
// slower than 128-row tiles (chunked_local, dilated_sliding; docs/kernels/forward_sm90.md "Design
// notes"), so the forward's defaults keep 128 rows for it.
#pragma once

#include "ir/IR.h"

namespace flexjit::passes {

bool divides_by_runtime_value(const Expr& e);

}  // namespace flexjit::passes
