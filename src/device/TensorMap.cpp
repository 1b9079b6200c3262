#include "device/TensorMap.h"

#include <flexjit/error.h>

#include "device/CudaDriver.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>

namespace flexjit::runtime {

namespace {
constexpr int64_t kMaxStride = int64_t{1} << 40;
}

TensorRef tma_unit_view(const TensorRef& t) {
  if (t.dtype != DType::E4M3) return t;
  FJ_ASSERT(t.ndim() == 4 && t.shape[3] % 2 == 0, "tma_unit_view of an odd e4m3 row");
  TensorRef u = t;
  u.dtype = DType::BF16;  // a 16-bit stand-in: TMA copies bytes
  u.shape[3] = t.shape[3] / 2;
  for (int i = 0; i < 3; ++i) {
    FJ_ASSERT(t.shape[i] <= 1 || t.strides[i] % 2 == 0, "tma_unit_view of an odd e4m3 stride");
    u.strides[i] = t.strides[i] / 2;
  }
  return u;
}

std::optional<std::string> bhsd_tma_blocker(const TensorRef& t, const char* name) {
  if (t.ndim() != 4) return fmt::format("{} is not 4-D ({})", name, t.str());
  if (t.dtype == DType::E4M3) {
    // Read as 16-bit units (tma_unit_view): rows of whole 16-byte units, even strides.
    if (t.shape[3] % 16 != 0) {
      return fmt::format("{}'s head dim {} (e4m3) is not a multiple of 16 (16-byte rows)", name,
                         t.shape[3]);
    }
    for (int i = 0; i < 3; ++i) {
      if (t.shape[i] > 1 && t.strides[i] % 16 != 0) {
        return fmt::format(
            "{}'s stride {} in dim {} is not a multiple of 16 bytes (TMA tensor maps)", name,
            t.strides[i], i);
      }
    }
    if (t.shape[3] > 1 && t.strides[3] != 1) {
      return fmt::format("{}'s last dim is not contiguous", name);
    }
    return bhsd_tma_blocker(tma_unit_view(t), name);
  }
  if (dtype_size(t.dtype) != 2) {
    return fmt::format("{} has {} elements; the TMA path reads 16-bit ones", name,
                       to_string(t.dtype));
  }
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) {
    return fmt::format("{}'s data pointer is not 16-byte aligned", name);
  }
  if (t.shape[3] > 1 && t.strides[3] != 1) {
    return fmt::format("{}'s last dim is not contiguous", name);
  }
  static const char* dims[] = {"batch", "head", "sequence"};
  for (int i = 0; i < 3; ++i) {
    if (t.shape[i] > (int64_t{1} << 31) - 1) {
      return fmt::format("{}'s {} extent {} is past 2^31", name, dims[i], t.shape[i]);
    }
    if (t.shape[i] <= 1) continue;
    const int64_t bytes = t.strides[i] * 2;
    if (bytes <= 0 || bytes % 16 != 0 || bytes >= kMaxStride) {
      return fmt::format(
          "{}'s {} stride is {} bytes; a TMA tensor map needs a positive multiple of 16 below "
          "2^40",
          name, dims[i], bytes);
    }
  }
  return std::nullopt;
}

FjTmaDesc encode_bhsd_tma(const TensorRef& t_in, int box_rows, const char* name) {
  if (auto why = bhsd_tma_blocker(t_in, name)) throw UnsupportedError(*why);
  const TensorRef t = tma_unit_view(t_in);
  FJ_ASSERT(box_rows >= 1 && box_rows <= 256, "TMA box rows must be in [1, 256]");
  const Driver& driver = Driver::get();
  driver.require();
  // Innermost first: d, s, h, b. A dim of extent 1 gets a harmless valid stride (its
  // coordinate is always 0). The extents are the tensor's own, the head dim included: a box
  // past them (rows past S; the columns of a kernel's tile dim past a head dim that is not a
  // multiple of 64, kernels/HeadDims.h) is zero-filled in shared memory (PTX ISA 5.5.3.3, "Out
  // of Boundary Access", zero fill mode: CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), and the copy
  // still completes the whole box's bytes on its mbarrier, so the kernels' expect_tx counts are
  // those of full boxes (FlashAttention-3 pads head dims like 96 to its tiles the same way).
  cuuint64_t dims[4] = {static_cast<cuuint64_t>(t.shape[3]), static_cast<cuuint64_t>(t.shape[2]),
                        static_cast<cuuint64_t>(t.shape[1]), static_cast<cuuint64_t>(t.shape[0])};
  cuuint64_t strides[3];
  const int64_t row_bytes = ((t.shape[3] * 2 + 15) / 16) * 16;
  for (int i = 0; i < 3; ++i) {
    const int dim = 2 - i;  // s, h, b
    strides[i] = static_cast<cuuint64_t>(t.shape[dim] > 1 ? t.strides[dim] * 2 : row_bytes);
  }
  cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type =
      t.dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap map;
  FJ_CU(cuTensorMapEncodeTiled, fmt::format("the tensor map of {} ({})", name, t.str()), &map, type,
        4, t.data, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  static_assert(sizeof(CUtensorMap) == sizeof(FjTmaDesc), "CUtensorMap is 128 bytes");
  FjTmaDesc out;
  std::memcpy(&out, &map, sizeof(out));
  return out;
}

}  // namespace flexjit::runtime
