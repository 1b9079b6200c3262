// Block masks on the device: built there by create_block_mask (a JIT-compiled kernel that
// evaluates the mask_mod per tile) or uploaded from a host BlockMask.
#pragma once

#include <flexjit/export.h>

#include <flexjit/attention.h>
#include <flexjit/block_mask.h>
#include <flexjit/context.h>
#include <flexjit/device_tensor.h>

#include <memory>

namespace flexjit {

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

  // The mask's shape, block sizes and mods (array fields of the result are empty).
  const BlockMask& meta() const { return meta_; }
  // Downloads every array (synchronous).
  BlockMask to_host() const;

  // Device arrays, int32, the layouts of include/flexjit/block_mask.h.
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
