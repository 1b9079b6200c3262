// validate_kv_cache (include/flexjit/paged_kv.h): the host-side checks of a call on a KV cache;
// the checks of its lengths and page entries (binding/KvCache.h).
#include "binding/KvCache.h"

#include <flexjit/error.h>
#include <flexjit/paged_kv.h>

#include <fmt/format.h>

#include <climits>
#include <cstdint>

namespace flexjit {

namespace {

bool given(const TensorRef& t) {
  return t.data != nullptr || !t.shape.empty();
}

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

// An int32 index tensor of `rank` dims on q's device with contiguous rows.
void check_index_tensor(const TensorRef& t, const char* name, const char* layout, int rank,
                        const TensorRef& q) {
  if (t.ndim() != rank) {
    throw RuntimeError(fmt::format("{} has {} dims (shape {}); expected {}", name, t.ndim(),
                                   shape_str(t.shape), layout));
  }
  if (t.strides.size() != t.shape.size()) {
    throw RuntimeError(
        fmt::format("{} has {} strides for {} dims", name, t.strides.size(), t.shape.size()));
  }
  if (t.dtype != DType::I32) {
    throw RuntimeError(fmt::format("{} has dtype {}; expected i32", name, to_string(t.dtype)));
  }
  if (t.device != q.device || t.device_index != q.device_index) {
    throw RuntimeError(fmt::format("{} is on {} but q is on {}; it is read on the device", name,
                                   to_string(t.device, t.device_index),
                                   to_string(q.device, q.device_index)));
  }
  if (!t.is_last_dim_contiguous()) {
    throw RuntimeError(
        fmt::format("last dim of {} is not contiguous (stride {})", name, t.strides.back()));
  }
  for (int i = 0; i < t.ndim(); ++i) {
    if (t.strides[i] < 0) {
      throw RuntimeError(
          fmt::format("{} has a negative stride in dim {} ({})", name, i, t.strides[i]));
    }
  }
  if (t.data == nullptr && t.numel() > 0) {
    throw RuntimeError(fmt::format("{} has a null data pointer", name));
  }
}

// The pool [num_pages, page_size, Hkv, D] as the [B, Hkv, page_size, D] view validate_qkv reads
// (dim 0 strides over pages; only its layout matters).
TensorRef pool_view(const TensorRef& pool, int64_t batch) {
  TensorRef v = pool;
  v.shape = {batch, pool.shape[2], pool.shape[1], pool.shape[3]};
  v.strides = {pool.strides[0], pool.strides[2], pool.strides[1], pool.strides[3]};
  return v;
}

// e4m3 pools: k and v both e4m3, q bf16 / f16. Returns whether the cache is e4m3.
bool check_fp8_dtypes(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                      const KvCache& cache) {
  const bool fp8 = k.dtype == DType::E4M3 || v.dtype == DType::E4M3;
  if (!fp8) {
    for (auto [t, name] : {std::pair{&cache.k_scale, "k_scale"}, {&cache.v_scale, "v_scale"}}) {
      if (given(*t)) {
        throw RuntimeError(fmt::format(
            "the KV cache has {} but k and v are {}; the scales dequantize e4m3 pools only", name,
            to_string(k.dtype)));
      }
    }
    return false;
  }
  if (k.dtype != v.dtype) {
    throw RuntimeError(fmt::format("k is {} and v is {}; an e4m3 KV cache has both k and v in e4m3",
                                   to_string(k.dtype), to_string(v.dtype)));
  }
  if (q.dtype != DType::BF16 && q.dtype != DType::F16) {
    throw RuntimeError(
        fmt::format("q has dtype {}; with an e4m3 KV cache q is bf16 or f16 (out has q's dtype)",
                    to_string(q.dtype)));
  }
  return true;
}

// An e4m3 cache's scale: [Hkv] f32 on q's device, contiguous.
void check_scale(const TensorRef& t, const char* name, int64_t heads_kv, const TensorRef& q) {
  if (!given(t)) {
    throw RuntimeError(fmt::format(
        "an e4m3 KV cache needs {}: [Hkv] = [{}] f32, one dequantization scale per kv head", name,
        heads_kv));
  }
  if (t.dtype != DType::F32) {
    throw RuntimeError(fmt::format("{} has dtype {}; expected f32", name, to_string(t.dtype)));
  }
  if (t.ndim() != 1 || t.shape[0] != heads_kv) {
    throw RuntimeError(
        fmt::format("{} has shape {}; expected [Hkv] = [{}]", name, shape_str(t.shape), heads_kv));
  }
  if (t.device != q.device || t.device_index != q.device_index) {
    throw RuntimeError(fmt::format("{} is on {} but q is on {}; it is read on the device", name,
                                   to_string(t.device, t.device_index),
                                   to_string(q.device, q.device_index)));
  }
  if (t.strides.size() != 1 || (heads_kv > 1 && t.strides[0] != 1)) {
    throw RuntimeError(
        fmt::format("{} is not contiguous (strides [{}])", name, fmt::join(t.strides, ", ")));
  }
  if (t.data == nullptr && heads_kv > 0) {
    throw RuntimeError(fmt::format("{} has a null data pointer", name));
  }
}

// `t` with q's dtype: the shape and layout checks of validate_qkv (which wants one dtype) on an
// e4m3 pool; its alignment is checked in bytes afterwards (check_fp8_alignment).
TensorRef as_dtype(const TensorRef& t, DType dtype) {
  TensorRef r = t;
  r.dtype = dtype;
  return r;
}

// The 16-byte alignment of an e4m3 tensor's pointer, strides and rows (1-byte elements), which
// the decode kernel's copies need: as validate_qkv's fast path, in bytes.
void check_fp8_alignment(const TensorRef& t, const char* name, QkvShape& s) {
  if (!s.fast_path) return;
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) {
    s.fast_path = false;
    s.fast_path_blocker = fmt::format("data pointer of {} is not 16-byte aligned", name);
    return;
  }
  for (int i = 0; i + 1 < t.ndim(); ++i) {
    if (t.shape[i] > 1 && t.strides[i] % 16 != 0) {
      s.fast_path = false;
      s.fast_path_blocker = fmt::format(
          "stride of {} in dim {} ({} e4m3 elements = bytes) is not a multiple of 16 bytes", name,
          i, t.strides[i]);
      return;
    }
  }
  if (t.shape.back() % 16 != 0) {
    s.fast_path = false;
    s.fast_path_blocker = fmt::format(
        "head dim of {} ({} e4m3 bytes) is not a multiple of 16 bytes", name, t.shape.back());
  }
}

}  // namespace

KvCacheShape validate_kv_cache(const TensorRef& q, const TensorRef& k_in, const TensorRef& v_in,
                               const KvCache& cache) {
  KvCacheShape out;
  out.paged = given(cache.page_table);
  if (q.ndim() != 4) {
    throw RuntimeError(fmt::format("q has {} dims; expected [B, Hq, Sq, D]", q.ndim()));
  }
  out.fp8 = check_fp8_dtypes(q, k_in, v_in, cache);
  // The shape checks below see e4m3 pools with q's dtype.
  const TensorRef k = out.fp8 ? as_dtype(k_in, q.dtype) : k_in;
  const TensorRef v = out.fp8 ? as_dtype(v_in, q.dtype) : v_in;
  const int64_t batch = q.shape[0];
  if (!out.paged) {
    out.qkv = validate_qkv(q, k, v);
    if (!given(cache.seq_lens)) {
      throw RuntimeError(
          "the KV cache has neither seq_lens nor a page_table; without either, call "
          "flex_attention with no kv_cache");
    }
  } else {
    for (auto [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
      if (t->ndim() != 4) {
        throw RuntimeError(fmt::format(
            "with a page table, {} is a page pool [num_pages, page_size, Hkv, D]; it has {} dims",
            name, t->ndim()));
      }
      if (t->strides.size() != 4) {
        throw RuntimeError(fmt::format("{} has {} strides for 4 dims", name, t->strides.size()));
      }
    }
    if (k.shape[0] != v.shape[0] || k.shape[1] != v.shape[1]) {
      throw RuntimeError(fmt::format(
          "the k and v pools differ in pages or page size: k {} vs v {} ([num_pages, page_size, "
          "Hkv, D])",
          shape_str(k.shape), shape_str(v.shape)));
    }
    out.num_pages = k.shape[0];
    out.page_size = k.shape[1];
    if (out.num_pages < 1) throw RuntimeError("the k and v pools have no pages");
    if (out.page_size < 1 || out.page_size > 256 || (out.page_size & (out.page_size - 1)) != 0) {
      throw RuntimeError(fmt::format(
          "page size {} (dim 1 of the k and v pools) is not supported; it must be a power of two "
          "from 1 to 256",
          out.page_size));
    }
    out.qkv = validate_qkv(q, pool_view(k, batch), pool_view(v, batch));
    check_index_tensor(cache.page_table, "page_table", "[B, max_pages]", 2, q);
    if (cache.page_table.shape[0] != batch) {
      throw RuntimeError(fmt::format("page_table has shape {}; expected [B = {}, max_pages]",
                                     shape_str(cache.page_table.shape), batch));
    }
    out.max_pages = cache.page_table.shape[1];
    if (out.max_pages < 1) throw RuntimeError("page_table has no columns (max_pages = 0)");
    const int64_t capacity = out.max_pages * out.page_size;
    if (capacity > INT_MAX) {
      throw RuntimeError(fmt::format(
          "the page table holds {} pages of {} keys = {} keys per sequence; at most 2^31 - 1",
          out.max_pages, out.page_size, capacity));
    }
    out.qkv.seqlen_kv = capacity;
    if (!given(cache.seq_lens)) {
      throw RuntimeError(
          "a paged KV cache needs seq_lens ([B] int32): the length of each sequence");
    }
  }
  if (given(cache.seq_lens)) {
    check_index_tensor(cache.seq_lens, "seq_lens", "[B]", 1, q);
    if (cache.seq_lens.shape[0] != batch) {
      throw RuntimeError(fmt::format("seq_lens has shape {}; expected [B] = [{}]",
                                     shape_str(cache.seq_lens.shape), batch));
    }
  }
  if (out.fp8) {
    check_scale(cache.k_scale, "k_scale", out.qkv.heads_kv, q);
    check_scale(cache.v_scale, "v_scale", out.qkv.heads_kv, q);
    // validate_qkv judged the alignment with 2-byte elements: judge the pools again in bytes.
    const bool q_fast = out.qkv.fast_path;
    const std::string q_blocker = out.qkv.fast_path_blocker;
    out.qkv.fast_path = true;
    out.qkv.fast_path_blocker.clear();
    check_fp8_alignment(k_in, "k", out.qkv);
    check_fp8_alignment(v_in, "v", out.qkv);
    if (!q_fast && out.qkv.fast_path) {  // q's (or out's) own reason stands
      out.qkv.fast_path = false;
      out.qkv.fast_path_blocker = q_blocker;
    }
  }
  return out;
}

}  // namespace flexjit

namespace flexjit::runtime {

std::string kv_cache_length_error(int64_t b, int len, const KvCacheShape& shape) {
  if (len < 0) return fmt::format("seq_lens[{}] = {} is negative", b, len);
  return shape.paged ? fmt::format(
                           "seq_lens[{}] = {} is beyond the page table's capacity of {} "
                           "keys (max_pages {} x page_size {})",
                           b, len, shape.qkv.seqlen_kv, shape.max_pages, shape.page_size)
                     : fmt::format("seq_lens[{}] = {} is beyond the {} keys of k and v", b, len,
                                   shape.qkv.seqlen_kv);
}

std::string kv_cache_page_error(int64_t b, int64_t p, int entry, int len,
                                const KvCacheShape& shape) {
  return fmt::format(
      "page_table[{}][{}] = {} is not a page of the pool (0 .. {}); sequence {} reads it "
      "(seq_lens[{}] = {})",
      b, p, entry, shape.num_pages - 1, b, b, len);
}

void check_kv_cache_entries(const std::vector<int>& seq_lens, const std::vector<int>& table,
                            int64_t table_stride, const KvCacheShape& shape) {
  const int64_t capacity = shape.qkv.seqlen_kv;
  for (size_t b = 0; b < seq_lens.size(); ++b) {
    const int len = seq_lens[b];
    if (len < 0 || len > capacity) throw RuntimeError(kv_cache_length_error(b, len, shape));
    if (!shape.paged) continue;
    const int64_t pages = (len + shape.page_size - 1) / shape.page_size;
    for (int64_t p = 0; p < pages; ++p) {
      const int e = table[static_cast<size_t>(b * table_stride + p)];
      if (e < 0 || e >= shape.num_pages)
        throw RuntimeError(kv_cache_page_error(b, p, e, len, shape));
    }
  }
}

}  // namespace flexjit::runtime
