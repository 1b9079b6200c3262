// Block masks on the device: built there by create_block_mask (a JIT-compiled kernel that
// evaluates the mask_mod per tile), uploaded from a host BlockMask, or assembled from arrays
// that already are on the device (DeviceBlockMask::from_arrays: a framework's tensors viewed
// through DeviceTensor::borrow, no copy).
#pragma once

#include <flexjit/export.h>

#include <flexjit/attention.h>
#include <flexjit/block_mask.h>
#include <flexjit/context.h>
#include <flexjit/device_tensor.h>

#include <memory>

namespace flexjit {

// Views of a block mask's eight int32 arrays (the layouts of block_mask.h), on the host or a
// device; null where absent.
struct BlockMaskArrayRefs {
  const TensorRef* kv_num_blocks = nullptr;  // [Bm, Hm, nq]; required
  const TensorRef* kv_indices = nullptr;     // [Bm, Hm, nq, nk]; required
  const TensorRef* full_kv_num_blocks = nullptr;
  const TensorRef* full_kv_indices = nullptr;
  const TensorRef* q_num_blocks = nullptr;  // [Bm, Hm, nk]
  const TensorRef* q_indices = nullptr;     // [Bm, Hm, nk, nq]
  const TensorRef* full_q_num_blocks = nullptr;
  const TensorRef* full_q_indices = nullptr;
};

// Checks arrays handed over from outside (a framework's tensors) and returns the mask's meta: a
// BlockMask without arrays, of these sizes, Bm and Hm taken from kv_num_blocks, nq =
// ceil(seqlen_q / q_block_size) and nk = ceil(seqlen_kv / kv_block_size). Each given array must
// be int32, C-contiguous, on kv_num_blocks's device and of its layout's shape; kv_* are
// required, every other (num_blocks, indices) pair is given whole or not at all, and full_q_*
// only with full_kv_*. Throws RuntimeError naming the first problem: "kv_indices has shape
// [1, 1, 8, 7]; expected [Bm, Hm, 8, 8] (Bm, Hm = 1, 1 from kv_num_blocks; ...)". Only shapes,
// dtypes and layouts are checked here, never the contents (BlockMask::validate does that).
FLEXJIT_API BlockMask block_mask_meta(const BlockMaskArrayRefs& arrays, int seqlen_q, int seqlen_kv,
                                      int q_block_size, int kv_block_size);

// The eight int32 arrays of a block mask on the device, for DeviceBlockMask::from_arrays;
// undefined where absent.
struct DeviceBlockMaskArrays {
  DeviceTensor kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices;
  DeviceTensor q_num_blocks, q_indices, full_q_num_blocks, full_q_indices;
};

class DeviceBlockMask;
namespace runtime {
class MaskScheduleCache;
MaskScheduleCache* schedule_cache_of(const DeviceBlockMask& mask);
}  // namespace runtime

class FLEXJIT_API DeviceBlockMask {
 public:
  DeviceBlockMask() = default;
  // Copies a host mask's arrays to the device.
  static DeviceBlockMask upload(Context& ctx, const BlockMask& mask);
  // A mask over arrays that already are on ctx's device, used in place (no copy): tensors of
  // another framework through DeviceTensor::borrow, or DeviceTensor::empty ones a kernel of
  // yours filled. `meta` gives the sizes and mods (its arrays, if any, are ignored; its batch
  // and heads must be kv_num_blocks's Bm and Hm). The arrays are checked as block_mask_meta
  // checks them, and must be on ctx's device (RuntimeError naming the first problem, before
  // anything touches the device). Absent transposed arrays (q_*, and full_q_* when full_kv_*
  // are given) are computed from kv_*: a one-time cost of a device synchronization, a download
  // of kv_*, BlockMask::build_transposed and an upload (RuntimeError when kv_*'s contents are out
  // of range). With `validate`, every array is downloaded and checked by BlockMask::validate.
  // The mask keeps its own schedules (arrays_changed() below), as an uploaded or created one.
  static DeviceBlockMask from_arrays(Context& ctx, const BlockMask& meta,
                                     DeviceBlockMaskArrays arrays, bool validate = false);

  // The mask's shape, block sizes and mods (array fields of the result are empty).
  const BlockMask& meta() const { return meta_; }
  // Downloads every array (synchronous). Arrays absent on the device are filled in, so that the
  // result is a complete host mask: full_* without full tiles (zero counts), q_* by
  // BlockMask::build_transposed.
  BlockMask to_host() const;

  // Device arrays, int32, the layouts of include/flexjit/block_mask.h. full_* may be undefined
  // (no full tiles: every visited tile applies the mask_mod).
  DeviceTensor kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices;
  DeviceTensor q_num_blocks, q_indices, full_q_num_blocks, full_q_indices;

  // Calls keep what they derive from the arrays with the mask (shared by its copies): the
  // sm_90a forward's schedule for 192-row query tiles (docs/kernels/forward_sm90.md) is built by
  // the first call that needs it and read by every later one, such as every layer of a model.
  // After writing into the arrays in place (copy_from_host, fill_bytes, a kernel of your own),
  // call arrays_changed() so that the next call derives them again; like the write itself, only
  // while no call that uses the mask is running. Assigning other tensors to the fields needs
  // nothing (the schedules are keyed by the arrays' addresses).
  void arrays_changed() const;

 private:
  friend DeviceBlockMask create_block_mask(Context&, const Mods&, int, int, int, int, int,
                                           const ModBindings&);
  friend runtime::MaskScheduleCache* runtime::schedule_cache_of(const DeviceBlockMask& mask);
  BlockMask meta_;
  // Null for a default-constructed mask: its calls derive the schedules each time.
  std::shared_ptr<runtime::MaskScheduleCache> schedules_;
};

// Evaluates `mask.mask_mod` over every (b, h, q tile, kv tile) on the GPU and returns the block
// mask, with the transposed q_* arrays. batch or heads of 1 broadcast. Throws CompileError if
// `mask` has no mask_mod, RuntimeError for bad sizes or bindings.
FLEXJIT_API DeviceBlockMask create_block_mask(Context& ctx, const Mods& mask, int batch, int heads,
                                              int seqlen_q, int seqlen_kv, int block_size = 128,
                                              const ModBindings& bindings = {});

}  // namespace flexjit
