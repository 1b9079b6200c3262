// Size arithmetic that cannot overflow silently: products of extents (element counts, byte
// counts, tile counts) come from user input (.npy headers, --random, --seqlen), and a wrapped
// product would size a buffer smaller than the loops that read it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace flexjit {

// a * b, or nullopt when it overflows int64.
inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The product of `dims` (1 for none), or nullopt when it overflows int64.
inline std::optional<int64_t> checked_product(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

}  // namespace flexjit
