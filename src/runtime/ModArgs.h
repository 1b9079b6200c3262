// Packing of the FjModParams kernel argument: the device pointers and element strides of the
// captured buffers and the values of the runtime parameters, laid out byte for byte as
// cuda::layout_of(mods) says (src/codegen/cuda/ModParamLayout.h).
#pragma once

#include <flexjit/attention.h>
#include <flexjit/mods.h>

#include <cstdint>
#include <vector>

namespace flexjit::runtime {

// The bindings of `mods` matched to its declarations, in declaration order.
struct BoundModArgs {
  std::vector<const TensorRef*> buffers;  // per mods.buffers; never null
  std::vector<double> params;             // per mods.params: the bound value, else the default
};

// Matches `bindings` to the buffers and params of `mods`, for tensors on CUDA device
// `device_index`. Throws RuntimeError with a precise message when:
//  - a binding names no buffer / param of the mods, or names one twice;
//  - a declared buffer is not bound ("buffer 'slopes' (f32[H]) is not bound; ...");
//  - a bound tensor's dtype, rank, numeric extent ("8192") or device disagrees with the
//    declaration, or its data pointer is null while it has elements;
//  - a param without a default is not given, an i32 param value is not an integer in the i32
//    range, a bool param value is not 0 or 1.
BoundModArgs bind_mod_args(const Mods& mods, const ModBindings& bindings, int device_index);

// The bytes of FjModParams for `mods` with `args` from bind_mod_args(mods, ...), laid out as
// cuda::layout_of(mods) says. At least 8 bytes and a multiple of 8 (the struct is alignas(8)).
std::vector<uint64_t> pack_mod_params(const Mods& mods, const BoundModArgs& args);

// pack_mod_params(mods, bind_mod_args(mods, bindings, device_index)).
std::vector<uint64_t> pack_mod_params(const Mods& mods, const ModBindings& bindings,
                                      int device_index);

// The bindings of `used`, a part of `declared` (e.g. cuda::mask_only(declared)): every name in
// `bindings` must be declared by `declared` (RuntimeError as in bind_mod_args otherwise); those
// `used` does not declare are left out, so a binding for a score_mod buffer does not stop
// create_block_mask.
ModBindings bindings_of_part(const Mods& declared, const Mods& used, const ModBindings& bindings);

}  // namespace flexjit::runtime
