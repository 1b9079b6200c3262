// Equality of two block masks, array by array, as tests assert it.
#pragma once

#include <flexjit/block_mask.h>

#include <catch2/catch.hpp>

namespace flexjit::test {

inline void require_same(const BlockMask& a, const BlockMask& b) {
  REQUIRE(a.batch == b.batch);
  REQUIRE(a.heads == b.heads);
  REQUIRE(a.num_q_blocks == b.num_q_blocks);
  REQUIRE(a.num_kv_blocks == b.num_kv_blocks);
  CHECK(a.kv_num_blocks == b.kv_num_blocks);
  CHECK(a.kv_indices == b.kv_indices);
  CHECK(a.full_kv_num_blocks == b.full_kv_num_blocks);
  CHECK(a.full_kv_indices == b.full_kv_indices);
  CHECK(a.q_num_blocks == b.q_num_blocks);
  CHECK(a.q_indices == b.q_indices);
  CHECK(a.full_q_num_blocks == b.full_q_num_blocks);
  CHECK(a.full_q_indices == b.full_q_indices);
}

}  // namespace flexjit::test
