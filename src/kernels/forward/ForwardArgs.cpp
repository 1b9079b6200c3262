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

FjBlockMaskArgs block_mask_args(const BlockMask& mask, const int* kv_num_blocks,
                                const int* kv_indices, const int* full_kv_num_blocks,
                                const int* full_kv_indices) {
  FjBlockMaskArgs out{};
  const fj_i64 nq = mask.num_q_blocks, nkv = mask.num_kv_blocks;
  out.kv_num_blocks = kv_num_blocks;
  out.kv_indices = kv_indices;
  out.full_kv_num_blocks = full_kv_num_blocks;
  out.full_kv_indices = full_kv_indices;
  out.num_stride_h = mask.heads == 1 ? 0 : nq;
  out.num_stride_b = mask.batch == 1 ? 0 : mask.heads * nq;
  out.idx_stride_m = nkv;
  out.idx_stride_h = mask.heads == 1 ? 0 : nq * nkv;
  out.idx_stride_b = mask.batch == 1 ? 0 : mask.heads * nq * nkv;
  out.q_block_size = mask.q_block_size;
  out.kv_block_size = mask.kv_block_size;
  return out;
}

FjBlockMaskArgs block_mask_args(const DeviceBlockMask& d, bool with_full_blocks) {
  auto ptr = [](const DeviceTensor& t) {
    return t.defined() ? static_cast<const int*>(t.ref().data) : nullptr;
  };
  const bool full =
      with_full_blocks && d.full_kv_num_blocks.defined() && d.full_kv_indices.defined();
  return block_mask_args(d.meta(), ptr(d.kv_num_blocks), ptr(d.kv_indices),
                         full ? ptr(d.full_kv_num_blocks) : nullptr,
                         full ? ptr(d.full_kv_indices) : nullptr);
}

}  // namespace flexjit::kernels
