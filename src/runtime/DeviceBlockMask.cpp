// DeviceBlockMask::upload / to_host: copies of a host BlockMask's arrays to and from the device;
// from_arrays / block_mask_meta: a mask over arrays already on the device (borrowed ones).
// (create_block_mask, the GPU builder, is in CreateBlockMask.cpp.)
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>

#include "device/MaskScheduleCache.h"
#include "plan/ContextImpl.h"
#include "runtime/BlockMaskGeometry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <optional>
#include <string>
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

// The (count, indices) arrays of `rows` rows without a tile: counts 0, each row's indices
// ascending (the layout write_row gives an empty row).
void empty_rows(size_t rows, int cols, std::vector<int32_t>& num, std::vector<int32_t>& idx) {
  num.assign(rows, 0);
  idx.resize(rows * static_cast<size_t>(cols));
  for (size_t r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c)
      idx[r * cols + c] = c;
  }
}

// Fills what a host mask downloaded from the device lacks: full_* without full tiles, q_* by
// the transposition.
void complete(BlockMask& m) {
  const size_t bh = static_cast<size_t>(m.batch) * m.heads;
  if (m.full_kv_num_blocks.empty() && m.full_kv_indices.empty()) {
    empty_rows(bh * m.num_q_blocks, m.num_kv_blocks, m.full_kv_num_blocks, m.full_kv_indices);
  }
  if (m.q_num_blocks.empty() || m.q_indices.empty() || m.full_q_num_blocks.empty() ||
      m.full_q_indices.empty()) {
    m.build_transposed();
  }
}

std::string dims_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

const char* const kArrayNames[8] = {"kv_num_blocks",     "kv_indices",    "full_kv_num_blocks",
                                    "full_kv_indices",   "q_num_blocks",  "q_indices",
                                    "full_q_num_blocks", "full_q_indices"};

std::array<const TensorRef*, 8> as_list(const BlockMaskArrayRefs& a) {
  return {a.kv_num_blocks, a.kv_indices, a.full_kv_num_blocks, a.full_kv_indices,
          a.q_num_blocks,  a.q_indices,  a.full_q_num_blocks,  a.full_q_indices};
}

std::array<DeviceTensor*, 8> as_list(DeviceBlockMaskArrays& a) {
  return {&a.kv_num_blocks, &a.kv_indices, &a.full_kv_num_blocks, &a.full_kv_indices,
          &a.q_num_blocks,  &a.q_indices,  &a.full_q_num_blocks,  &a.full_q_indices};
}

}  // namespace

BlockMask block_mask_meta(const BlockMaskArrayRefs& arrays, int seqlen_q, int seqlen_kv,
                          int q_block_size, int kv_block_size) {
  runtime::check_block_mask_lengths(seqlen_q, seqlen_kv, q_block_size, kv_block_size);
  const std::array<const TensorRef*, 8> list = as_list(arrays);
  // The pairs: given whole or not at all; kv_* required, full_q_* only with full_kv_*.
  for (int p = 0; p < 8; p += 2) {
    if ((list[p] == nullptr) != (list[p + 1] == nullptr)) {
      const int given = list[p] != nullptr ? p : p + 1;
      throw RuntimeError(fmt::format("{} is given but {} is not; give both or neither",
                                     kArrayNames[given], kArrayNames[given ^ 1]));
    }
  }
  if (arrays.kv_num_blocks == nullptr) {
    throw RuntimeError("a block mask needs kv_num_blocks and kv_indices (the partial tiles)");
  }
  if (arrays.full_q_num_blocks != nullptr && arrays.full_kv_num_blocks == nullptr) {
    throw RuntimeError(
        "full_q_num_blocks / full_q_indices are given without full_kv_num_blocks / "
        "full_kv_indices; give full_kv_* too, or neither (no full tiles)");
  }
  const TensorRef& first = *arrays.kv_num_blocks;
  const std::string device = to_string(first.device, first.device_index);
  for (int i = 0; i < 8; ++i) {
    const TensorRef* t = list[i];
    if (t == nullptr) continue;
    if (t->dtype != DType::I32) {
      throw RuntimeError(
          fmt::format("{} has dtype {}; flexjit takes int32 for {} (block mask arrays are int32)",
                      kArrayNames[i], framework_name(t->dtype), kArrayNames[i]));
    }
    const std::string dev = to_string(t->device, t->device_index);
    if (dev != device) {
      throw RuntimeError(
          fmt::format("{} is on {} but kv_num_blocks is on {}; a block mask's "
                      "arrays are on one device",
                      kArrayNames[i], dev, device));
    }
    if (t->strides.size() != t->shape.size()) {
      throw RuntimeError(fmt::format("{} has {} strides for {} dims", kArrayNames[i],
                                     t->strides.size(), t->shape.size()));
    }
  }
  const int64_t nq = runtime::block_count(seqlen_q, q_block_size);
  const int64_t nk = runtime::block_count(seqlen_kv, kv_block_size);
  const std::string tiles = fmt::format("{} x {} tiles of {} x {} for seqlen_q {}, seqlen_kv {}",
                                        nq, nk, q_block_size, kv_block_size, seqlen_q, seqlen_kv);
  if (first.ndim() != 3 || first.shape[2] != nq || first.shape[0] < 1 || first.shape[1] < 1) {
    throw RuntimeError(
        fmt::format("kv_num_blocks has shape {}; expected [Bm, Hm, {}] with Bm, "
                    "Hm >= 1 ({})",
                    dims_str(first.shape), nq, tiles));
  }
  const int64_t bm = first.shape[0], hm = first.shape[1];
  if (bm > INT32_MAX || hm > INT32_MAX) {  // the tile count alone allows any with 0 tiles
    throw RuntimeError(
        fmt::format("kv_num_blocks has shape {}; Bm and Hm must fit int32", dims_str(first.shape)));
  }
  runtime::check_block_mask_tiles(bm, hm, nq, nk);
  const std::vector<int64_t> expected[8] = {{bm, hm, nq},     {bm, hm, nq, nk}, {bm, hm, nq},
                                            {bm, hm, nq, nk}, {bm, hm, nk},     {bm, hm, nk, nq},
                                            {bm, hm, nk},     {bm, hm, nk, nq}};
  for (int i = 0; i < 8; ++i) {
    const TensorRef* t = list[i];
    if (t == nullptr) continue;
    if (t->shape != expected[i]) {
      const bool rows_of_q = i < 4;
      std::string want = "[Bm, Hm";
      for (size_t d = 2; d < expected[i].size(); ++d)
        want += fmt::format(", {}", expected[i][d]);
      want += "]";
      throw RuntimeError(
          fmt::format("{} has shape {}; expected {} (Bm, Hm = {}, {} from kv_num_blocks; {}{})",
                      kArrayNames[i], dims_str(t->shape), want, bm, hm, tiles,
                      rows_of_q ? "" : "; the q_* arrays are the transpose of kv_*"));
    }
    if (!t->is_contiguous()) {
      throw RuntimeError(
          fmt::format("{} is not C-contiguous (shape {}, strides {}); pass a "
                      "contiguous array",
                      kArrayNames[i], dims_str(t->shape), dims_str(t->strides)));
    }
    if (t->data == nullptr && t->numel() > 0) {
      throw RuntimeError(fmt::format("{} has a null data pointer", kArrayNames[i]));
    }
  }
  BlockMask m;
  m.batch = static_cast<int>(bm);
  m.heads = static_cast<int>(hm);
  m.seqlen_q = seqlen_q;
  m.seqlen_kv = seqlen_kv;
  m.q_block_size = q_block_size;
  m.kv_block_size = kv_block_size;
  m.num_q_blocks = static_cast<int>(nq);
  m.num_kv_blocks = static_cast<int>(nk);
  return m;
}

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

DeviceBlockMask DeviceBlockMask::from_arrays(Context& ctx, const BlockMask& meta,
                                             DeviceBlockMaskArrays arrays, bool validate) {
  // Every check before the device is touched.
  const std::array<DeviceTensor*, 8> list = as_list(arrays);
  std::array<TensorRef, 8> refs;
  BlockMaskArrayRefs views;
  const TensorRef** slots[8] = {
      &views.kv_num_blocks, &views.kv_indices, &views.full_kv_num_blocks, &views.full_kv_indices,
      &views.q_num_blocks,  &views.q_indices,  &views.full_q_num_blocks,  &views.full_q_indices};
  for (int i = 0; i < 8; ++i) {
    if (!list[i]->defined()) continue;
    refs[i] = list[i]->ref();
    *slots[i] = &refs[i];
  }
  BlockMask m =
      block_mask_meta(views, meta.seqlen_q, meta.seqlen_kv, meta.q_block_size, meta.kv_block_size);
  if (m.batch != meta.batch || m.heads != meta.heads) {
    throw RuntimeError(
        fmt::format("kv_num_blocks has shape {} but the meta's batch and heads (Bm, Hm) are {}, {}",
                    dims_str(arrays.kv_num_blocks.ref().shape), meta.batch, meta.heads));
  }
  const int device = impl_of(ctx).device->index();
  for (int i = 0; i < 8; ++i) {
    if (!list[i]->defined()) continue;
    const TensorRef& t = list[i]->ref();
    if (t.device != TensorRef::Device::CUDA || t.device_index != device) {
      throw RuntimeError(fmt::format("{} is on {}; the context's device is cuda:{}", kArrayNames[i],
                                     to_string(t.device, t.device_index), device));
    }
  }
  m.mods = meta.mods;

  DeviceBlockMask d;
  d.kv_num_blocks = std::move(arrays.kv_num_blocks);
  d.kv_indices = std::move(arrays.kv_indices);
  d.full_kv_num_blocks = std::move(arrays.full_kv_num_blocks);
  d.full_kv_indices = std::move(arrays.full_kv_indices);
  d.q_num_blocks = std::move(arrays.q_num_blocks);
  d.q_indices = std::move(arrays.q_indices);
  d.full_q_num_blocks = std::move(arrays.full_q_num_blocks);
  d.full_q_indices = std::move(arrays.full_q_indices);
  d.meta_ = m;
  const bool need_q = !d.q_num_blocks.defined();
  const bool need_full_q = d.full_kv_num_blocks.defined() && !d.full_q_num_blocks.defined();
  if (need_q || need_full_q) {
    // The arrays' writers may run on any stream: wait for all of them before reading.
    ctx.synchronize();
    BlockMask h = m;
    h.kv_num_blocks = download(d.kv_num_blocks);
    h.kv_indices = download(d.kv_indices);
    h.full_kv_num_blocks = download(d.full_kv_num_blocks);
    h.full_kv_indices = download(d.full_kv_indices);
    complete(h);  // build_transposed checks kv_*'s counts and indices first
    const int64_t bm = m.batch, hm = m.heads, nq = m.num_q_blocks, nkv = m.num_kv_blocks;
    // Allocated even when empty (Skv = 0), so that the arrays count as present.
    auto upload = [&](const std::vector<int32_t>& host, std::vector<int64_t> shape) {
      DeviceTensor t = DeviceTensor::empty(ctx, DType::I32, std::move(shape));
      t.copy_from_host(host.data());
      return t;
    };
    if (need_q) {
      d.q_num_blocks = upload(h.q_num_blocks, {bm, hm, nkv});
      d.q_indices = upload(h.q_indices, {bm, hm, nkv, nq});
    }
    if (need_full_q) {
      d.full_q_num_blocks = upload(h.full_q_num_blocks, {bm, hm, nkv});
      d.full_q_indices = upload(h.full_q_indices, {bm, hm, nkv, nq});
    }
  }
  if (validate) {
    if (!need_q && !need_full_q) ctx.synchronize();
    d.to_host().validate();
  }
  d.schedules_ = std::make_shared<runtime::MaskScheduleCache>(*impl_of(ctx).device);
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
  complete(m);
  return m;
}

}  // namespace flexjit
