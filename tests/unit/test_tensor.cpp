#include <flexjit/error.h>
#include <flexjit/tensor.h>

#include <catch2/catch.hpp>

using namespace flexjit;

namespace {

DLTensor dl(void* data, std::vector<int64_t>& shape, int64_t* strides, uint8_t code, uint8_t bits,
            uint16_t lanes = 1, DLDeviceType dev = kDLCUDA) {
  DLTensor t{};
  t.data = data;
  t.device = {dev, 1};
  t.ndim = static_cast<int>(shape.size());
  t.dtype = {code, bits, lanes};
  t.shape = shape.data();
  t.strides = strides;
  t.byte_offset = 0;
  return t;
}

// A CUDA tensor descriptor at a 256-byte aligned fake address.
TensorRef t4(DType dt, std::vector<int64_t> shape) {
  return TensorRef::contiguous(reinterpret_cast<void*>(uintptr_t{1} << 20), dt, std::move(shape),
                               TensorRef::Device::CUDA, 0);
}

}  // namespace

TEST_CASE("from_dlpack maps dtypes, devices and strides", "[runtime]") {
  std::vector<int64_t> shape = {2, 3, 4};
  alignas(16) static char buf[1024];
  TensorRef t = from_dlpack(dl(buf, shape, nullptr, kDLBfloat, 16));
  CHECK(t.dtype == DType::BF16);
  CHECK(t.strides == std::vector<int64_t>{12, 4, 1});
  CHECK(t.numel() == 24);
  CHECK(t.device == TensorRef::Device::CUDA);
  CHECK(t.str() == "bf16[2, 3, 4] strides [12, 4, 1] cuda:1");
  CHECK(from_dlpack(dl(buf, shape, nullptr, kDLFloat, 32)).dtype == DType::F32);
  CHECK(from_dlpack(dl(buf, shape, nullptr, kDLFloat, 16)).dtype == DType::F16);
  CHECK(from_dlpack(dl(buf, shape, nullptr, kDLInt, 32)).dtype == DType::I32);
  CHECK(from_dlpack(dl(buf, shape, nullptr, 6, 8)).dtype == DType::Bool);  // kDLBool

  int64_t strides[] = {1, 2, 6};  // a permuted view
  DLTensor view = dl(buf, shape, strides, kDLFloat, 32, 1, kDLCPU);
  view.byte_offset = 64;
  TensorRef v = from_dlpack(view);
  CHECK(v.data == buf + 64);
  CHECK(v.device == TensorRef::Device::CPU);
  CHECK_FALSE(v.is_last_dim_contiguous());
  CHECK_FALSE(v.is_contiguous());

  CHECK_THROWS_WITH(from_dlpack(dl(buf, shape, nullptr, kDLFloat, 64)),
                    Catch::StartsWith("unsupported DLPack dtype (code 2, bits 64, lanes 1)"));
  CHECK_THROWS_WITH(from_dlpack(dl(buf, shape, nullptr, kDLFloat, 16, 2)),
                    Catch::StartsWith("unsupported DLPack dtype (code 2, bits 16, lanes 2)"));
  CHECK_THROWS_WITH(from_dlpack(dl(buf, shape, nullptr, kDLFloat, 32, 1, kDLROCM)),
                    Catch::StartsWith("unsupported DLPack device type 10"));
}

TEST_CASE("validate_qkv accepts GQA and reports the fast path", "[runtime]") {
  QkvShape s = validate_qkv(t4(DType::BF16, {2, 12, 100, 128}), t4(DType::BF16, {2, 4, 300, 128}),
                            t4(DType::BF16, {2, 4, 300, 64}));
  CHECK(s.heads_q == 12);
  CHECK(s.heads_kv == 4);
  CHECK(s.seqlen_kv == 300);
  CHECK(s.head_dim_v == 64);
  CHECK(s.fast_path);

  TensorRef q = t4(DType::F16, {1, 2, 10, 64});
  q.strides = {2000, 1000, 100, 1};  // 100 elements = 200 bytes: not a multiple of 16
  s = validate_qkv(q, t4(DType::F16, {1, 2, 10, 64}), t4(DType::F16, {1, 2, 10, 64}));
  CHECK_FALSE(s.fast_path);
  CHECK(s.fast_path_blocker ==
        "stride of q in dim 2 (100 elements = 200 bytes) is not a multiple of 16 bytes");
  TensorRef k = t4(DType::F16, {1, 2, 10, 64});
  k.data = static_cast<char*>(k.data) + 2;
  s = validate_qkv(t4(DType::F16, {1, 2, 10, 64}), k, t4(DType::F16, {1, 2, 10, 64}));
  CHECK(s.fast_path_blocker == "data pointer of k is not 16-byte aligned");
}

TEST_CASE("validate_qkv messages name the offending tensor", "[runtime]") {
  auto q = t4(DType::BF16, {2, 12, 64, 128});
  auto k = t4(DType::BF16, {2, 4, 64, 128});
  auto v = t4(DType::BF16, {2, 4, 64, 128});
  CHECK_THROWS_WITH(validate_qkv(q, t4(DType::BF16, {4, 64, 128}), v),
                    "k has 3 dims; expected [B, Hkv, Skv, D]");
  CHECK_THROWS_WITH(validate_qkv(q, t4(DType::BF16, {2, 4, 64, 64}), v),
                    "q and k head dims differ: 128 vs 64");
  CHECK_THROWS_WITH(
      validate_qkv(q, t4(DType::BF16, {2, 5, 64, 128}), t4(DType::BF16, {2, 5, 64, 128})),
      "Hq=12 is not a multiple of Hkv=5");
  auto strided_v = v;
  strided_v.strides[3] = 2;
  CHECK_THROWS_WITH(validate_qkv(q, k, strided_v), "last dim of v is not contiguous (stride 2)");
  CHECK_THROWS_WITH(validate_qkv(q, t4(DType::F16, {2, 4, 64, 128}), v),
                    "q, k and v must share one dtype: q is bf16, k is f16, v is bf16");
  CHECK_THROWS_WITH(validate_qkv(q, k, t4(DType::BF16, {2, 4, 65, 128})),
                    "k and v sequence lengths differ: 64 vs 65");
  auto cpu_k = k;
  cpu_k.device = TensorRef::Device::CPU;
  CHECK_THROWS_WITH(validate_qkv(q, cpu_k, v), "q is on cuda:0 but k is on cpu");
  CHECK_THROWS_WITH(validate_qkv(t4(DType::I32, {2, 12, 64, 128}), k, v),
                    "q has dtype i32; attention takes f16, bf16, f32 or e4m3");
}
