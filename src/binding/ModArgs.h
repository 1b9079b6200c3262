// Mod bindings: the one place where the values a caller binds to a Mods (ModBindings: tensors for
// captured buffers, numbers for runtime parameters, by name) are matched to its declarations and
// checked, for either backend. Every path that runs a mod goes through bind_mod_args: the GPU
// forward and create_block_mask (then pack_mod_params, the FjModParams bytes), the CPU backend's
// forward, backward and block masks (then llvmjit::pack_cpu_mod_params), and the interpreter's
// host block masks (then eval_env_of). So a typo in a name is the same error everywhere.
#pragma once

#include <flexjit/attention.h>
#include <flexjit/mods.h>
#include <flexjit/tensor.h>

#include "ir/Evaluate.h"

#include <cstdint>
#include <vector>

namespace flexjit::runtime {

// The ranges of a call's index leaves (b < batch, h < heads_q, q_idx < seqlen_q,
// kv_idx < seqlen_kv) and its KV heads, which a buffer's named dims must cover; -1 where the host
// does not know one (a KV cache's lengths live on the device).
struct CallExtents {
  int64_t batch = -1, heads_q = -1, heads_kv = -1, seqlen_q = -1, seqlen_kv = -1;
  static CallExtents of(const QkvShape& s) {
    return {s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_kv};
  }
};

// The bindings of `mods` matched to its declarations, in declaration order.
struct BoundModArgs {
  std::vector<const TensorRef*> buffers;  // per mods.buffers; never null
  std::vector<double> params;             // per mods.params: the bound value, else the default
};

// Matches `bindings` to the buffers and params of `mods`, for a kernel running on `device`
// (CUDA: device number `device_index`; CPU: host tensors, the index is ignored). Throws
// RuntimeError with a precise message when:
//  - a binding names no buffer / param of the mods ("a value is given for param 'windw', which
//    the mods 'sliding_window' do not declare (their params: window)"), or names one twice;
//  - a declared buffer is not bound ("buffer 'slopes' (f32[H]) is not bound; ...");
//  - a bound tensor's dtype, rank, numeric extent ("8192") or device disagrees with the
//    declaration, an extent is negative, or its data pointer is null while it has elements;
//  - a param without a default is not given, an i32 param value is not an integer in the i32
//    range, a bool param value is not 0 or 1;
//  - with `call`: a bound buffer is shorter than the call needs in a dim named B, H / Hq, Hkv,
//    S, Sq or Skv (S covers both q_idx and kv_idx) — "buffer 'slopes' (declared f32[H]): dim 0
//    (H) has 4 entries, but this call has 8 query heads (h < 8)". A shorter buffer used to run
//    with its loads clamped (CPU) or out of bounds (GPU). Other dim names (R, N) are not checked.
// With `declared` (a superset of `mods`, e.g. the Mods that mask_only(declared) == mods
// came from, for a block mask), names are checked against `declared`, and bindings of names that
// only `declared` has are skipped: binding a score_mod buffer does not stop create_block_mask.
// `bindings` must outlive the result (it points at the bound tensors).
BoundModArgs bind_mod_args(const Mods& mods, const ModBindings& bindings, TensorRef::Device device,
                           int device_index = 0, const Mods* declared = nullptr,
                           const CallExtents* call = nullptr);

// The bytes of FjModParams for `mods` with `args` from bind_mod_args(mods, ...), laid out as
// cuda::layout_of(mods) says (src/binding/ModParamLayout.h). At least 8 bytes and a
// multiple of 8 (the struct is alignas(8)). With `check_record` (a device buffer of
// kBufferCheckWords words, binding/BufferCheck.h): the layout with buffer checks, the bound
// extents and that pointer after the unchecked bytes.
std::vector<uint64_t> pack_mod_params(const Mods& mods, const BoundModArgs& args,
                                      void* check_record = nullptr);

// pack_mod_params(mods, bind_mod_args(mods, bindings, CUDA, device_index)).
std::vector<uint64_t> pack_mod_params(const Mods& mods, const ModBindings& bindings,
                                      int device_index);

// The interpreter's environment (ir/Evaluate.h) for `mods` bound to `args`: every buffer and
// param value by name; the leaves (score, b, h, q_idx, kv_idx) are left 0.
ir::EvalEnv eval_env_of(const Mods& mods, const BoundModArgs& args);

}  // namespace flexjit::runtime
