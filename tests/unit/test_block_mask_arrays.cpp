// The host-side rules of block masks made from a framework's arrays: DeviceTensor::borrow's
// checks and owner, block_mask_meta's shape / dtype / layout checks and messages, and
// BlockMask::build_transposed refusing out-of-range kv_* (no GPU needed: nothing here touches
// device memory; DeviceBlockMask::from_arrays on a GPU is in tests/gpu/test_block_mask_arrays.cpp).
#include <flexjit/block_mask.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/device_tensor.h>
#include <flexjit/error.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <vector>

using namespace flexjit;

namespace {

// A CUDA TensorRef over an address no one dereferences (borrow never reads the memory).
TensorRef fake_cuda(std::vector<int64_t> shape, DType dtype = DType::I32, int device = 0) {
  return TensorRef::contiguous(reinterpret_cast<void*>(uintptr_t{0x10000}), dtype, std::move(shape),
                               TensorRef::Device::CUDA, device);
}

// The host arrays of a mask as TensorRefs (the CPU path of flexjit._block_mask_from_arrays).
struct HostViews {
  BlockMask mask;
  std::vector<TensorRef> refs;  // the 8 arrays, in BlockMaskArrayRefs order
  BlockMaskArrayRefs views() const {
    return {&refs[0], &refs[1], &refs[2], &refs[3], &refs[4], &refs[5], &refs[6], &refs[7]};
  }
};

HostViews views_of(BlockMask m) {
  HostViews v;
  v.mask = std::move(m);
  BlockMask& h = v.mask;
  const int64_t B = h.batch, H = h.heads, nq = h.num_q_blocks, nk = h.num_kv_blocks;
  auto ref = [](std::vector<int32_t>& a, std::vector<int64_t> shape) {
    return TensorRef::contiguous(a.data(), DType::I32, std::move(shape));
  };
  v.refs = {ref(h.kv_num_blocks, {B, H, nq}),      ref(h.kv_indices, {B, H, nq, nk}),
            ref(h.full_kv_num_blocks, {B, H, nq}), ref(h.full_kv_indices, {B, H, nq, nk}),
            ref(h.q_num_blocks, {B, H, nk}),       ref(h.q_indices, {B, H, nk, nq}),
            ref(h.full_q_num_blocks, {B, H, nk}),  ref(h.full_q_indices, {B, H, nk, nq})};
  return v;
}

BlockMask causal_mask(int batch, int heads, int sq, int skv, int block) {
  return block_mask_from_predicate([](int, int, int q, int kv) { return q >= kv; }, batch, heads,
                                   sq, skv, block, block);
}

}  // namespace

TEST_CASE("DeviceTensor::borrow views CUDA memory and keeps its owner alive",
          "[block_mask][borrow]") {
  auto released = std::make_shared<int>(0);
  {
    std::shared_ptr<void> owner(new int(7), [released](void* p) {
      delete static_cast<int*>(p);
      ++*released;
    });
    DeviceTensor a = DeviceTensor::borrow(fake_cuda({2, 3, 4}, DType::I32, 1), owner);
    owner.reset();
    REQUIRE(a.defined());
    CHECK(a.ref().data == reinterpret_cast<void*>(uintptr_t{0x10000}));
    CHECK(a.ref().shape == std::vector<int64_t>{2, 3, 4});
    CHECK(a.ref().strides == std::vector<int64_t>{12, 4, 1});
    CHECK(a.ref().device == TensorRef::Device::CUDA);
    CHECK(a.ref().device_index == 1);
    CHECK(a.bytes() == 2 * 3 * 4 * sizeof(int32_t));
    DeviceTensor copy = a;
    a = DeviceTensor();
    CHECK(*released == 0);  // the copy still holds the owner
    copy = DeviceTensor();
    CHECK(*released == 1);
  }
  // A null owner: the caller keeps the memory alive; the view is still a defined tensor.
  CHECK(DeviceTensor::borrow(fake_cuda({5}), nullptr).defined());
  // Empty tensors may have a null pointer.
  CHECK(DeviceTensor::borrow(
            TensorRef::contiguous(nullptr, DType::I32, {0, 4}, TensorRef::Device::CUDA), nullptr)
            .bytes() == 0);
}

TEST_CASE("DeviceTensor::borrow refuses host, strided and null memory", "[block_mask][borrow]") {
  std::vector<int32_t> host(8);
  CHECK_THROWS_WITH(
      DeviceTensor::borrow(TensorRef::contiguous(host.data(), DType::I32, {8}), nullptr),
      Catch::StartsWith("a borrowed tensor must be in CUDA device memory: i32[8]"));
  TensorRef strided = fake_cuda({2, 8});
  strided.strides = {1, 2};
  CHECK_THROWS_WITH(DeviceTensor::borrow(strided, nullptr),
                    "a borrowed tensor must be C-contiguous: i32[2, 8] strides [1, 2] cuda:0");
  TensorRef null = fake_cuda({3});
  null.data = nullptr;
  CHECK_THROWS_WITH(DeviceTensor::borrow(null, nullptr),
                    Catch::StartsWith("a borrowed tensor has a null data pointer"));
  TensorRef negative = fake_cuda({3});
  negative.shape = {-3};
  CHECK_THROWS_WITH(DeviceTensor::borrow(negative, nullptr),
                    Catch::StartsWith("a borrowed tensor has negative extent -3 in dim 0"));
}

TEST_CASE("block_mask_meta takes Bm and Hm from kv_num_blocks and the tiles from the lengths",
          "[block_mask][from_arrays]") {
  const HostViews v = views_of(causal_mask(2, 3, 1000, 900, 128));
  const BlockMask m = block_mask_meta(v.views(), 1000, 900, 128, 128);
  CHECK(m.batch == 2);
  CHECK(m.heads == 3);
  CHECK(m.seqlen_q == 1000);
  CHECK(m.seqlen_kv == 900);
  CHECK(m.num_q_blocks == 8);
  CHECK(m.num_kv_blocks == 8);
  CHECK(m.kv_indices.empty());  // the meta has no arrays

  // Only kv_* (no full tiles, the transposition computed later) is enough.
  BlockMaskArrayRefs kv_only;
  kv_only.kv_num_blocks = &v.refs[0];
  kv_only.kv_indices = &v.refs[1];
  CHECK(block_mask_meta(kv_only, 1000, 900, 128, 128).heads == 3);

  // Broadcast masks (Bm = Hm = 1) and other block sizes.
  const HostViews b = views_of(causal_mask(1, 1, 777, 1500, 64));
  const BlockMask mb = block_mask_meta(b.views(), 777, 1500, 64, 64);
  CHECK(mb.num_q_blocks == 13);
  CHECK(mb.num_kv_blocks == 24);
}

TEST_CASE("block_mask_meta names the array, its shape and the expected one",
          "[block_mask][from_arrays]") {
  const HostViews v = views_of(causal_mask(1, 1, 1024, 1024, 128));
  SECTION("a wrong last extent") {
    std::vector<int32_t> short_rows(64);
    TensorRef bad = TensorRef::contiguous(short_rows.data(), DType::I32, {1, 1, 8, 7});
    BlockMaskArrayRefs a = v.views();
    a.kv_indices = &bad;
    CHECK_THROWS_WITH(block_mask_meta(a, 1024, 1024, 128, 128),
                      "kv_indices has shape [1, 1, 8, 7]; expected [Bm, Hm, 8, 8] (Bm, Hm = 1, 1 "
                      "from kv_num_blocks; 8 x 8 tiles of 128 x 128 for seqlen_q 1024, seqlen_kv "
                      "1024)");
  }
  SECTION("a batch that is not kv_num_blocks's") {
    std::vector<int32_t> rows(2 * 8 * 8);
    TensorRef bad = TensorRef::contiguous(rows.data(), DType::I32, {2, 1, 8, 8});
    BlockMaskArrayRefs a = v.views();
    a.full_q_indices = &bad;
    CHECK_THROWS_WITH(block_mask_meta(a, 1024, 1024, 128, 128),
                      Catch::StartsWith("full_q_indices has shape [2, 1, 8, 8]; expected [Bm, Hm, "
                                        "8, 8] (Bm, Hm = 1, 1 from kv_num_blocks"));
  }
  SECTION("kv_num_blocks for other lengths") {
    CHECK_THROWS_WITH(block_mask_meta(v.views(), 2048, 1024, 128, 128),
                      "kv_num_blocks has shape [1, 1, 8]; expected [Bm, Hm, 16] with Bm, Hm >= 1 "
                      "(16 x 8 tiles of 128 x 128 for seqlen_q 2048, seqlen_kv 1024)");
  }
  SECTION("a dtype other than int32") {
    std::vector<float> f(8);
    TensorRef bad = TensorRef::contiguous(f.data(), DType::F32, {1, 1, 8});
    BlockMaskArrayRefs a = v.views();
    a.full_kv_num_blocks = &bad;
    CHECK_THROWS_WITH(block_mask_meta(a, 1024, 1024, 128, 128),
                      "full_kv_num_blocks has dtype float32; flexjit takes int32 for "
                      "full_kv_num_blocks (block mask arrays are int32)");
  }
  SECTION("a strided array") {
    TensorRef bad = v.refs[1];
    bad.strides = {64, 64, 1, 8};  // the transpose's layout
    BlockMaskArrayRefs a = v.views();
    a.kv_indices = &bad;
    CHECK_THROWS_WITH(block_mask_meta(a, 1024, 1024, 128, 128),
                      "kv_indices is not C-contiguous (shape [1, 1, 8, 8], strides [64, 64, 1, "
                      "8]); pass a contiguous array");
  }
  SECTION("arrays on two devices") {
    const TensorRef gpu = fake_cuda({1, 1, 8, 8});
    BlockMaskArrayRefs a = v.views();
    a.q_indices = &gpu;
    CHECK_THROWS_WITH(block_mask_meta(a, 1024, 1024, 128, 128),
                      "q_indices is on cuda:0 but kv_num_blocks is on cpu; a block mask's arrays "
                      "are on one device");
  }
  SECTION("half a pair, or full_q_* without full_kv_*") {
    BlockMaskArrayRefs a = v.views();
    a.q_indices = nullptr;
    CHECK_THROWS_WITH(block_mask_meta(a, 1024, 1024, 128, 128),
                      "q_num_blocks is given but q_indices is not; give both or neither");
    BlockMaskArrayRefs b = v.views();
    b.full_kv_num_blocks = b.full_kv_indices = nullptr;
    CHECK_THROWS_WITH(block_mask_meta(b, 1024, 1024, 128, 128),
                      Catch::StartsWith("full_q_num_blocks / full_q_indices are given without "
                                        "full_kv_num_blocks / full_kv_indices"));
    BlockMaskArrayRefs c;
    CHECK_THROWS_WITH(block_mask_meta(c, 1024, 1024, 128, 128),
                      Catch::StartsWith("a block mask needs kv_num_blocks and kv_indices"));
  }
  SECTION("bad sizes") {
    CHECK_THROWS_WITH(block_mask_meta(v.views(), 1024, 1024, 0, 128),
                      "block mask block sizes must be >= 1 (got 0 and 128)");
    CHECK_THROWS_WITH(block_mask_meta(v.views(), -1, 1024, 128, 128),
                      "block mask sequence lengths must be >= 0 (got -1 and 1024)");
  }
}

TEST_CASE("build_transposed refuses kv_* entries out of range instead of writing past the arrays",
          "[block_mask][from_arrays]") {
  BlockMask m = causal_mask(1, 2, 512, 512, 128);
  const BlockMask good = m;
  m.kv_indices[1 * 4 * 4 + 2 * 4 + 0] = 9;  // head 1, q tile 2: index 9 of 4 key tiles
  CHECK_THROWS_WITH(m.build_transposed(), "kv_indices[0, 1, 2, 0] = 9 is out of range [0, 4)");
  m = good;
  m.full_kv_num_blocks[3] = 5;
  CHECK_THROWS_WITH(m.build_transposed(), "full_kv_num_blocks[0, 0, 3] = 5 is outside [0, 4]");
  m = good;
  m.q_num_blocks.clear();
  m.q_indices.clear();
  m.build_transposed();
  CHECK(m.q_num_blocks == good.q_num_blocks);
  CHECK(m.q_indices == good.q_indices);
}
