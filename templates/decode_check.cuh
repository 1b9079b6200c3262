// flexjit split-KV decoding: the opt-in check of a paged KV cache (KvCache::check_pages), in the
// decode_combine module (no mods reach either). Two launches on the call's stream, before the
// decode kernels, then the host reads the result:
//   flexjit_decode_check_init(args): one thread sets *result to "no error" (all ones);
//   flexjit_decode_check_pages(args): one CTA per sequence b; a length outside [0, capacity] is
//     key b * (max_pages + 1), a page entry p (p < ceil(len / page_size)) outside [0, num_pages)
//     is key b * (max_pages + 1) + p + 1; *result is the smallest key (atom.min.u64): the first
//     bad entry in (sequence, length-then-pages) order, as the host formats it.
#ifndef FLEXJIT_DECODE_CHECK_CUH_
#define FLEXJIT_DECODE_CHECK_CUH_

FJ_DEVICE void fj_atomic_min_u64(unsigned long long* p, unsigned long long v) {
  asm volatile("red.global.min.u64 [%0], %1;\n" ::"l"(p), "l"(v) : "memory");
}

extern "C" __global__ void flexjit_decode_check_init(const FjDecodeCheckArgs args) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *args.result = ~0ull;
}

extern "C" __global__ void __launch_bounds__(128)
    flexjit_decode_check_pages(const FjDecodeCheckArgs args) {
  const int b = blockIdx.x;
  const unsigned long long base = (unsigned long long)b * (unsigned long long)(args.max_pages + 1);
  const int len = args.seq_lens[b];
  if (len < 0 || (fj_i64)len > args.capacity) {
    if (threadIdx.x == 0) fj_atomic_min_u64(args.result, base);
    return;
  }
  if (args.page_table == nullptr) return;
  const fj_i64 pages = ((fj_i64)len + args.page_size - 1) / args.page_size;
  const int* row = args.page_table + (fj_i64)b * args.page_table_stride_b;
  for (fj_i64 p = threadIdx.x; p < pages; p += blockDim.x) {
    const int e = row[p];
    if (e < 0 || (fj_i64)e >= args.num_pages) fj_atomic_min_u64(args.result, base + p + 1);
  }
}

#endif  // FLEXJIT_DECODE_CHECK_CUH_
