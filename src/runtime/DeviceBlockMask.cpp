// DeviceBlockMask::upload / to_host: copies of a host BlockMask's arrays to and from the device.
// (create_block_mask, the GPU builder, is in CreateBlockMask.cpp.)
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>

#include "runtime/ContextImpl.h"
#include "runtime/MaskScheduleCache.h"

#include <cstdint>
#include <vector>

namespace flexjit {

namespace {

DeviceTensor upload_array(Context& ctx, const std::vector<int32_t>& host,
                          std::vector<int64_t> shape) {
  if (host.empty()) return {};
  DeviceTensor t = DeviceTensor::empty(ctx, DType::I32, std::move(shape));
  t.copy_from_host(host.data());
  return t;
}

std::vector<int32_t> download(const DeviceTensor& t) {
  return t.defined() ? t.to_host<int32_t>() : std::vector<int32_t>{};
}

}  // namespace

DeviceBlockMask DeviceBlockMask::upload(Context& ctx, const BlockMask& mask) {
  mask.validate();
  const int64_t bm = mask.batch, hm = mask.heads, nq = mask.num_q_blocks, nkv = mask.num_kv_blocks;
  DeviceBlockMask d;
  d.kv_num_blocks = upload_array(ctx, mask.kv_num_blocks, {bm, hm, nq});
  d.kv_indices = upload_array(ctx, mask.kv_indices, {bm, hm, nq, nkv});
  d.full_kv_num_blocks = upload_array(ctx, mask.full_kv_num_blocks, {bm, hm, nq});
  d.full_kv_indices = upload_array(ctx, mask.full_kv_indices, {bm, hm, nq, nkv});
  d.q_num_blocks = upload_array(ctx, mask.q_num_blocks, {bm, hm, nkv});
  d.q_indices = upload_array(ctx, mask.q_indices, {bm, hm, nkv, nq});
  d.full_q_num_blocks = upload_array(ctx, mask.full_q_num_blocks, {bm, hm, nkv});
  d.full_q_indices = upload_array(ctx, mask.full_q_indices, {bm, hm, nkv, nq});
  d.meta_ = mask;
  d.schedules_ = std::make_shared<runtime::MaskScheduleCache>(*impl_of(ctx).device);
  for (auto* v : {&d.meta_.kv_num_blocks, &d.meta_.kv_indices, &d.meta_.full_kv_num_blocks,
                  &d.meta_.full_kv_indices, &d.meta_.q_num_blocks, &d.meta_.q_indices,
                  &d.meta_.full_q_num_blocks, &d.meta_.full_q_indices}) {
    v->clear();
    v->shrink_to_fit();
  }
  return d;
}

void DeviceBlockMask::arrays_changed() const {
  if (schedules_) schedules_->arrays_changed();
}

runtime::MaskScheduleCache* runtime::schedule_cache_of(const DeviceBlockMask& mask) {
  return mask.schedules_.get();
}

BlockMask DeviceBlockMask::to_host() const {
  BlockMask m = meta_;
  m.kv_num_blocks = download(kv_num_blocks);
  m.kv_indices = download(kv_indices);
  m.full_kv_num_blocks = download(full_kv_num_blocks);
  m.full_kv_indices = download(full_kv_indices);
  m.q_num_blocks = download(q_num_blocks);
  m.q_indices = download(q_indices);
  m.full_q_num_blocks = download(full_q_num_blocks);
  m.full_q_indices = download(full_q_indices);
  return m;
}

}  // namespace flexjit
