// TMA tensor maps (CUtensorMap) for the sm_90a kernels: encoded on the host through the driver
// (cuTensorMapEncodeTiled) and passed by value as a kernel parameter (FjTmaDesc in
// templates/flexjit_abi.h). cuda.h-free interface.
#pragma once

#include <flexjit/tensor.h>

#include <flexjit_abi.h>

#include <optional>
#include <string>

namespace flexjit::runtime {

// Why `t` ([B, H, S, D], D contiguous, 16-bit elements) cannot be read through the tiled tensor
// map encode_bhsd_tma builds: a stride that is not a positive multiple of 16 bytes below 2^40
// (a dim of extent 1 may have any stride), a pointer not 16-byte aligned, an extent past 2^31.
// nullopt when it can. Needs no driver (selection asks it before any launch). e4m3 tensors
// (1-byte elements) are read as 16-bit units (tma_unit_view): their head dim must be a multiple
// of 16.
std::optional<std::string> bhsd_tma_blocker(const TensorRef& t, const char* name);

// An e4m3 tensor [B, H, S, D] as [B, H, S, D / 2] 16-bit units (strides halved; D and the strides
// even): the maps of the e4m3 forward are those of a 16-bit tensor half as wide, so a box of 64
// units is a 128-byte swizzle row of 128 e4m3 elements. Other tensors are returned as they are.
TensorRef tma_unit_view(const TensorRef& t);

// The tensor map of `t` read in boxes of 64 elements (128 bytes; e4m3: 64 units of
// tma_unit_view, 128 elements) x `box_rows` rows of one (b, h), stored with the 128-byte swizzle;
// rows past S and columns past D read as zero. Coordinates (innermost first): d, s, h, b. Throws
// UnsupportedError (the blocker) or RuntimeError (the driver's refusal, naming `name`).
FjTmaDesc encode_bhsd_tma(const TensorRef& t, int box_rows, const char* name);

}  // namespace flexjit::runtime
