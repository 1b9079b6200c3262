// TensorRef: how tensors cross flexjit's API, host or device. A non-owning descriptor (pointer,
// dtype, shape, element strides, device), made directly, from DLPack's DLTensor (PyTorch, JAX,
// CuPy ...), from an owning DeviceTensor (device_tensor.h) or, in the CLI, from an .npy array
// (src/util/Npy.h, npy::Array::view). The CPU backend's kernels take TensorRefs too.
#pragma once

#include <flexjit/export.h>

#include <flexjit/types.h>

#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>
#include <vector>

namespace flexjit {

struct FLEXJIT_API TensorRef {
  enum class Device { CPU, CUDA };

  void* data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements, one per dim
  Device device = Device::CPU;
  int device_index = 0;

  // A tensor with C-order (row-major) strides.
  static TensorRef contiguous(void* data, DType dtype, std::vector<int64_t> shape,
                              Device device = Device::CPU, int device_index = 0);

  int ndim() const { return static_cast<int>(shape.size()); }
  // Product of shape; 1 for a 0-dim tensor. RuntimeError when it overflows int64 (a shape no
  // memory can hold, "tensor f32[7623851, 1229673, 3935371, 64] ... has more than 2^63
  // elements").
  int64_t numel() const;
  // The last dim has stride 1, or extent <= 1 (its stride is then irrelevant).
  bool is_last_dim_contiguous() const;
  bool is_contiguous() const;  // C order (dims of extent 1 may have any stride)
  // "bf16[2, 8, 1024, 128] strides [1048576, 131072, 128, 1] cuda:0"
  std::string str() const;
};

FLEXJIT_API std::string to_string(TensorRef::Device d, int index);  // "cpu", "cuda:1"

// Views a DLTensor. Element types: kDLFloat 32/16 -> f32/f16, kDLBfloat 16 -> bf16, kDLInt 32 ->
// i32, kDLBool 8 (DLPack >= 0.8, code 6) and kDLUInt 8 -> bool, kDLFloat8_e4m3fn 8 (DLPack >=
// 1.1, code 10) -> e4m3; one lane only. Devices: kDLCPU
// and kDLCUDAHost -> CPU, kDLCUDA and kDLCUDAManaged -> CUDA. Null strides mean C order;
// byte_offset is folded into data. Anything else throws RuntimeError naming the code, bits and
// lanes (or the device type).
FLEXJIT_API TensorRef from_dlpack(const DLTensor& t);

// What validate_qkv learned about an attention call's inputs.
struct QkvShape {
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_kv = 0;
  int64_t head_dim_qk = 0, head_dim_v = 0;
  // True when every data pointer is 16-byte aligned and every stride is a multiple of 16 bytes
  // (vectorized loads, cp.async / TMA). Otherwise fast_path_blocker says what prevents it.
  bool fast_path = true;
  std::string fast_path_blocker;
};

// Checks q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv] for one attention call and
// throws RuntimeError with a precise message on the first problem: rank ("k has 3 dims;
// expected [B, Hkv, Skv, D]"), dtype, device, batch / heads / lengths that disagree, head dims
// ("q and k head dims differ: 128 vs 64"), GQA ("Hq=12 is not a multiple of Hkv=5"), layout
// ("last dim of v is not contiguous (stride 2)", negative strides, null data).
// q, k and v of e4m3 are refused here (UnsupportedError naming where e4m3 runs): only the forward
// takes them (validate_forward_qkv).
FLEXJIT_API QkvShape validate_qkv(const TensorRef& q, const TensorRef& k, const TensorRef& v);
// The same for the forward, which also takes e4m3 (float8_e4m3fn) q, k, v.
FLEXJIT_API QkvShape validate_forward_qkv(const TensorRef& q, const TensorRef& k,
                                          const TensorRef& v);
// The dtype of attention's out for inputs of `qkv`: the inputs' own, bf16 for e4m3.
FLEXJIT_API DType attention_out_dtype(DType qkv);

}  // namespace flexjit
