// The checks of a KV cache's lengths and page entries on host copies of them. Beside
// validate_kv_cache (include/flexjit/paged_kv.h, which checks the tensors' shapes, dtypes and
// devices): the CPU backend gathers a cache through them (cpu/KvCacheGather.cpp) and the device
// check (runtime::check_kv_cache_on_device, runtime/Decode.h) words its errors the same way.
#pragma once

#include <flexjit/paged_kv.h>

#include <cstdint>
#include <string>
#include <vector>

namespace flexjit::runtime {

// RuntimeError for the first bad entry, sequences in order: a length below 0 or beyond the
// cache's capacity, then (paged) a page entry of that sequence outside the pool. `seq_lens` [B],
// `table` [B, max_pages] with row stride `table_stride` (unused when the cache is not paged).
// The reference for the device check's order and messages (unit-tested).
void check_kv_cache_entries(const std::vector<int>& seq_lens, const std::vector<int>& table,
                            int64_t table_stride, const KvCacheShape& shape);

// The messages: "seq_lens[1] = 65 is beyond the page table's capacity of 64 keys (max_pages 4 x
// page_size 16)", "page_table[0][2] = 9 is not a page of the pool (0 .. 7); sequence 0 reads it
// (seq_lens[0] = 40)".
std::string kv_cache_length_error(int64_t b, int len, const KvCacheShape& shape);
std::string kv_cache_page_error(int64_t b, int64_t p, int entry, int len,
                                const KvCacheShape& shape);

}  // namespace flexjit::runtime
