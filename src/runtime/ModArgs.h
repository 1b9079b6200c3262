// Packing of the FjModParams kernel argument: the device pointers and element strides of the
// captured buffers and the values of the runtime parameters, laid out byte for byte as
// cuda::layout_of(mods) says (src/codegen/cuda/ModParamLayout.h).
#pragma once

#include <flexjit/attention.h>
#include <flexjit/mods.h>

#include <cstdint>
#include <vector>

namespace flexjit::runtime {

// The bytes of FjModParams for `mods` bound to `bindings`, for tensors on CUDA device
// `device_index`. Throws RuntimeError with a precise message when:
//  - a binding names no buffer / param of the mods, or names one twice;
//  - a declared buffer is not bound ("buffer 'slopes' (f32[H]) is not bound; ...");
//  - a bound tensor's dtype, rank, numeric extent ("8192") or device disagrees with the
//    declaration, or its data pointer is null while it has elements;
//  - a param without a default is not given, an i32 param value is not an integer in the i32
//    range, a bool param value is not 0 or 1.
// The result is at least 8 bytes and a multiple of 8 (the struct is alignas(8)).
std::vector<uint64_t> pack_mod_params(const Mods& mods, const ModBindings& bindings,
                                      int device_index);

}  // namespace flexjit::runtime
