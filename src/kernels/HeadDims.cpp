#include "kernels/HeadDims.h"

#include <fmt/format.h>

namespace flexjit::kernels {

std::optional<int> tile_head_dim(int head_dim, std::initializer_list<int> tiles) {
  if (head_dim <= 0 || head_dim % kHeadDimQuantum != 0) return std::nullopt;
  for (int t : tiles) {
    if (t >= head_dim) return t;
  }
  return std::nullopt;
}

std::string real_head_dims_line(int head_dim_qk, int head_dim_v) {
  return fmt::format("static constexpr int kRealDimQK = {}, kRealDimV = {};", head_dim_qk,
                     head_dim_v);
}

std::optional<std::string> head_dim_reason(const std::string& who, const char* what, int head_dim,
                                           std::initializer_list<int> tiles) {
  if (tile_head_dim(head_dim, tiles)) return std::nullopt;
  int largest = 0;
  for (int t : tiles)
    largest = t > largest ? t : largest;
  return fmt::format(
      "{} does not support {} = {}; supported: multiples of {} from {} to {} (computed in tiles "
      "of {})",
      who, what, head_dim, kHeadDimQuantum, kHeadDimQuantum, largest, fmt::join(tiles, ", "));
}

}  // namespace flexjit::kernels
