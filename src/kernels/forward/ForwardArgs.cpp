#include "kernels/forward/ForwardArgs.h"

#include <cmath>

namespace flexjit::kernels {

FjFwdArgs make_fwd_args(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                        const TensorRef& out, const TensorRef* lse, const QkvShape& s,
                        std::optional<float> scale) {
  FjFwdArgs a{};
  a.q = q.data;
  a.k = k.data;
  a.v = v.data;
  a.out = out.data;
  a.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  a.q_stride_b = q.strides[0], a.q_stride_h = q.strides[1], a.q_stride_s = q.strides[2];
  a.k_stride_b = k.strides[0], a.k_stride_h = k.strides[1], a.k_stride_s = k.strides[2];
  a.v_stride_b = v.strides[0], a.v_stride_h = v.strides[1], a.v_stride_s = v.strides[2];
  a.o_stride_b = out.strides[0], a.o_stride_h = out.strides[1], a.o_stride_s = out.strides[2];
  if (lse) a.lse_stride_b = lse->strides[0], a.lse_stride_h = lse->strides[1];
  a.batch = static_cast<int>(s.batch);
  a.heads_q = static_cast<int>(s.heads_q);
  a.heads_kv = static_cast<int>(s.heads_kv);
  a.seqlen_q = static_cast<int>(s.seqlen_q);
  a.seqlen_kv = static_cast<int>(s.seqlen_kv);
  a.scale =
      scale ? *scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim_qk)));
  return a;
}

namespace {

// FjBlockMaskArgs over a [batch, heads, rows(, cols)] pair of arrays (batch / heads of 1
// broadcast): rows of row_block positions, columns of col_block.
FjBlockMaskArgs mask_args(int batch, int heads, fj_i64 rows, fj_i64 cols, int row_block,
                          int col_block, const int* num, const int* idx, const int* full_num,
                          const int* full_idx) {
  FjBlockMaskArgs out{};
  out.kv_num_blocks = num;
  out.kv_indices = idx;
  out.full_kv_num_blocks = full_num;
  out.full_kv_indices = full_idx;
  out.num_stride_h = heads == 1 ? 0 : rows;
  out.num_stride_b = batch == 1 ? 0 : heads * rows;
  out.idx_stride_m = cols;
  out.idx_stride_h = heads == 1 ? 0 : rows * cols;
  out.idx_stride_b = batch == 1 ? 0 : heads * rows * cols;
  out.q_block_size = row_block;
  out.kv_block_size = col_block;
  return out;
}

const int* device_ptr(const DeviceTensor& t) {
  return t.defined() ? static_cast<const int*>(t.ref().data) : nullptr;
}

}  // namespace

FjBlockMaskArgs block_mask_args(const BlockMask& mask, const int* kv_num_blocks,
                                const int* kv_indices, const int* full_kv_num_blocks,
                                const int* full_kv_indices) {
  return mask_args(mask.batch, mask.heads, mask.num_q_blocks, mask.num_kv_blocks, mask.q_block_size,
                   mask.kv_block_size, kv_num_blocks, kv_indices, full_kv_num_blocks,
                   full_kv_indices);
}

FjBlockMaskArgs block_mask_args(const DeviceBlockMask& d, bool with_full_blocks) {
  const bool full =
      with_full_blocks && d.full_kv_num_blocks.defined() && d.full_kv_indices.defined();
  return block_mask_args(d.meta(), device_ptr(d.kv_num_blocks), device_ptr(d.kv_indices),
                         full ? device_ptr(d.full_kv_num_blocks) : nullptr,
                         full ? device_ptr(d.full_kv_indices) : nullptr);
}

FjBlockMaskArgs transposed_block_mask_args(const DeviceBlockMask& d, bool with_full_blocks) {
  const BlockMask& m = d.meta();
  const bool full = with_full_blocks && d.full_q_num_blocks.defined() && d.full_q_indices.defined();
  return mask_args(m.batch, m.heads, m.num_kv_blocks, m.num_q_blocks, m.kv_block_size,
                   m.q_block_size, device_ptr(d.q_num_blocks), device_ptr(d.q_indices),
                   full ? device_ptr(d.full_q_num_blocks) : nullptr,
                   full ? device_ptr(d.full_q_indices) : nullptr);
}

}  // namespace flexjit::kernels
