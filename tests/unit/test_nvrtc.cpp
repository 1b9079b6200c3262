// NVRTC compilation and resource usage ([jit]).
#include "jit/KernelCompiler.h"
#include "jit/Nvrtc.h"
#include "jit/ResourceUsage.h"

#include <flexjit/error.h>

#include <catch2/catch.hpp>

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

using namespace flexjit;
using namespace flexjit::jit;

namespace {

// A realistic forward attention kernel (sm80 mma.sync path, block-sparse iteration, online
// softmax, score_mod / mask_mod slots): the compile-time and resource-usage fixture.
const char* kForwardKernel = R"CUDA(
// A realistic flash-attention style forward kernel (sm80 mma.sync path) used to measure
// NVRTC compile time and to check resource usage against nvcc.
typedef long long fj_i64;
typedef unsigned short fj_bf16_bits;

struct FjBlockMaskArgs {
  const int* kv_num_blocks;
  const int* kv_indices;
  const int* full_kv_num_blocks;
  const int* full_kv_indices;
  fj_i64 num_stride_b, num_stride_h;
  fj_i64 idx_stride_b, idx_stride_h, idx_stride_m;
  int q_block_size;
  int kv_block_size;
};

struct FjFwdArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  fj_i64 q_stride_b, q_stride_h, q_stride_s;
  fj_i64 k_stride_b, k_stride_h, k_stride_s;
  fj_i64 v_stride_b, v_stride_h, v_stride_s;
  fj_i64 o_stride_b, o_stride_h, o_stride_s;
  fj_i64 lse_stride_b, lse_stride_h;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_kv;
  float scale;
  struct FjBlockMaskArgs mask;
};

struct FjModParams {
  const float* slopes;
  float cap;
  int window;
};

namespace fj {

constexpr int kBlockM = 64;
constexpr int kBlockN = 64;
constexpr int kHeadDim = 128;
constexpr int kNumWarps = 4;
constexpr int kNumThreads = kNumWarps * 32;
constexpr int kStages = 2;
constexpr bool kIsDivisible = false;
constexpr int kGqaRatio = 1;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -1.0f / 0.0f;

// ---- bf16 helpers (no cuda_bf16.h: NVRTC compiles with no headers) ----------------------------
__device__ __forceinline__ float bf16_to_float(fj_bf16_bits x) {
  return __uint_as_float(static_cast<unsigned>(x) << 16);
}
__device__ __forceinline__ fj_bf16_bits float_to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  unsigned rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<fj_bf16_bits>((u + rounding) >> 16);
}
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- the mods (the slots codegen fills) ---------------------------------------------------------
__device__ __forceinline__ float score_mod(float score, int b, int h, int q_idx, int kv_idx,
                                           const FjModParams& p) {
  float s = score + p.slopes[h] * static_cast<float>(kv_idx - q_idx);
  float t = s / p.cap;
  return p.cap * tanhf(t);
}
__device__ __forceinline__ bool mask_mod(int b, int h, int q_idx, int kv_idx,
                                         const FjModParams& p) {
  return q_idx >= kv_idx && q_idx - kv_idx <= p.window;
}

// ---- async copies, ldmatrix, mma ------------------------------------------------------------
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool pred) {
  int src_size = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(src_size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const unsigned (&a)[4],
                                               const unsigned (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- shared memory layout: swizzled rows of kHeadDim bf16 ------------------------------------
// A row is kHeadDim * 2 bytes = 16 chunks of 16 B; chunk c of row r lives at c ^ (r & 7) so
// that ldmatrix reads of 8 rows hit 8 different banks.
__device__ __forceinline__ int swizzle(int row, int chunk) { return row * (kHeadDim / 8) + (chunk ^ (row & 7)); }

struct SmemTile {
  fj_bf16_bits* base;
  __device__ __forceinline__ fj_bf16_bits* chunk_ptr(int row, int chunk) const {
    return base + swizzle(row, chunk) * 8;
  }
};

template <int kRows>
__device__ __forceinline__ void load_tile_async(SmemTile dst, const fj_bf16_bits* src,
                                                fj_i64 row_stride, int row0, int num_rows) {
  constexpr int kChunksPerRow = kHeadDim / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
#pragma unroll
  for (int i = threadIdx.x; i < kChunks; i += kNumThreads) {
    int r = i / kChunksPerRow;
    int c = i % kChunksPerRow;
    bool pred = kIsDivisible || (row0 + r < num_rows);
    int safe_row = pred ? row0 + r : 0;
    const fj_bf16_bits* g = src + static_cast<fj_i64>(safe_row) * row_stride + c * 8;
    cp_async_16(dst.chunk_ptr(r, c), g, pred);
  }
}

// ---- block-mask iteration ---------------------------------------------------------------------
struct KvBlockList {
  const int* indices;
  int count;
};

__device__ __forceinline__ KvBlockList kv_blocks(const FjBlockMaskArgs& m, int b, int h, int qb,
                                                 bool full, int num_kv_tiles) {
  KvBlockList list;
  const int* nums = full ? m.full_kv_num_blocks : m.kv_num_blocks;
  const int* idx = full ? m.full_kv_indices : m.kv_indices;
  if (nums == nullptr) {
    list.indices = nullptr;
    list.count = full ? 0 : num_kv_tiles;
    return list;
  }
  int sparse_qb = qb * kBlockM / m.q_block_size;
  fj_i64 off_n = b * m.num_stride_b + h * m.num_stride_h + sparse_qb;
  fj_i64 off_i = b * m.idx_stride_b + h * m.idx_stride_h + sparse_qb * m.idx_stride_m;
  list.indices = idx + off_i;
  list.count = nums[off_n] * (m.kv_block_size / kBlockN);
  return list;
}

__device__ __forceinline__ int kv_tile_of(const KvBlockList& l, const FjBlockMaskArgs& m, int i) {
  if (l.indices == nullptr) return i;
  int per = m.kv_block_size / kBlockN;
  return l.indices[i / per] * per + i % per;
}

// ---- the per-warp state -------------------------------------------------------------------------
struct WarpState {
  float acc[kHeadDim / 8][4];  // 16 rows x kHeadDim, mma C-fragment layout
  float row_max[2];
  float row_sum[2];
};

__device__ __forceinline__ void init_state(WarpState& st) {
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) st.acc[n][i] = 0.f;
  st.row_max[0] = st.row_max[1] = kNegInf;
  st.row_sum[0] = st.row_sum[1] = 0.f;
}

// S = Q K^T for this warp's 16 rows and kBlockN keys.
__device__ __forceinline__ void compute_scores(float (&s)[kBlockN / 8][4], const unsigned (&qf)[kHeadDim / 16][4],
                                               SmemTile k_tile, int lane) {
#pragma unroll
  for (int n = 0; n < kBlockN / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) s[n][i] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) {
      unsigned bf[2];
      int row = n * 8 + (lane & 7);
      int chunk = kk * 2 + ((lane >> 3) & 1);
      ldmatrix_x2(bf, k_tile.chunk_ptr(row, chunk));
      mma_bf16_16816(s[n], qf[kk], bf);
    }
  }
}

template <bool kApplyMask>
__device__ __forceinline__ void apply_mods(float (&s)[kBlockN / 8][4], const FjFwdArgs& a,
                                           const FjModParams& p, int b, int h, int q_row0,
                                           int kv0, int lane) {
#pragma unroll
  for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int q_idx = q_row0 + (lane >> 2) + (i >= 2 ? 8 : 0);
      int kv_idx = kv0 + n * 8 + (lane & 3) * 2 + (i & 1);
      float v = s[n][i] * a.scale;
      v = score_mod(v, b, h, q_idx, kv_idx, p);
      bool keep = true;
      if (kApplyMask) keep = mask_mod(b, h, q_idx, kv_idx, p);
      if (!kIsDivisible) keep = keep && kv_idx < a.seqlen_kv && q_idx < a.seqlen_q;
      s[n][i] = keep ? v * kLog2e : kNegInf;
    }
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// Online softmax in the log2 domain; rescales the accumulator and turns s into probabilities.
__device__ __forceinline__ void online_softmax(WarpState& st, float (&s)[kBlockN / 8][4]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float m = st.row_max[half];
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) m = fmaxf(m, fmaxf(s[n][half * 2], s[n][half * 2 + 1]));
    m = quad_max(m);
    // A fully masked row so far keeps max -inf; use 0 as the reference so exp2 gives 0, not NaN.
    float ref = m == kNegInf ? 0.f : m;
    float correction = fast_exp2(st.row_max[half] - ref);
    st.row_max[half] = m;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) {
      s[n][half * 2] = fast_exp2(s[n][half * 2] - ref);
      s[n][half * 2 + 1] = fast_exp2(s[n][half * 2 + 1] - ref);
      sum += s[n][half * 2] + s[n][half * 2 + 1];
    }
    st.row_sum[half] = st.row_sum[half] * correction + sum;
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d) {
      st.acc[d][half * 2] *= correction;
      st.acc[d][half * 2 + 1] *= correction;
    }
  }
}

// acc += P V for this warp's rows.
__device__ __forceinline__ void accumulate_pv(WarpState& st, const float (&p)[kBlockN / 8][4],
                                              SmemTile v_tile, int lane) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    unsigned af[4];
    af[0] = pack_bf16x2(p[2 * kk][0], p[2 * kk][1]);
    af[1] = pack_bf16x2(p[2 * kk][2], p[2 * kk][3]);
    af[2] = pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    af[3] = pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d) {
      unsigned bf[2];
      int row = kk * 16 + (lane & 15);
      ldmatrix_x2_trans(bf, v_tile.chunk_ptr(row, d));
      mma_bf16_16816(st.acc[d], af, bf);
    }
  }
}

__device__ __forceinline__ void load_q_fragments(unsigned (&qf)[kHeadDim / 16][4], SmemTile q_tile,
                                                 int warp, int lane) {
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    int row = warp * 16 + (lane & 15);
    int chunk = kk * 2 + (lane >> 4);
    ldmatrix_x4(qf[kk], q_tile.chunk_ptr(row, chunk));
  }
}

__device__ __forceinline__ void store_output(const WarpState& st, const FjFwdArgs& a, int b, int h,
                                             int q_row0, int lane) {
  fj_bf16_bits* out = static_cast<fj_bf16_bits*>(a.out) + b * a.o_stride_b + h * a.o_stride_h;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    int q = q_row0 + (lane >> 2) + half * 8;
    if (!kIsDivisible && q >= a.seqlen_q) continue;
    float inv = st.row_sum[half] > 0.f ? 1.f / st.row_sum[half] : 0.f;
    fj_bf16_bits* row = out + static_cast<fj_i64>(q) * a.o_stride_s;
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d) {
      int col = d * 8 + (lane & 3) * 2;
      unsigned packed = pack_bf16x2(st.acc[d][half * 2] * inv, st.acc[d][half * 2 + 1] * inv);
      *reinterpret_cast<unsigned*>(row + col) = packed;
    }
    if (a.lse != nullptr && (lane & 3) == 0) {
      float lse = st.row_sum[half] > 0.f ? (st.row_max[half] + log2f(st.row_sum[half])) / kLog2e
                                         : kNegInf;
      a.lse[b * a.lse_stride_b + h * a.lse_stride_h + q] = lse;
    }
  }
}

template <bool kApplyMask>
__device__ __forceinline__ void process_blocks(WarpState& st, const KvBlockList& list,
                                               const unsigned (&qf)[kHeadDim / 16][4],
                                               SmemTile (&k_tiles)[kStages], SmemTile (&v_tiles)[kStages],
                                               const FjFwdArgs& a, const FjModParams& p,
                                               const fj_bf16_bits* k_base, const fj_bf16_bits* v_base,
                                               int b, int h, int q_row0, int lane) {
  if (list.count == 0) return;
  int first = kv_tile_of(list, a.mask, 0);
  load_tile_async<kBlockN>(k_tiles[0], k_base, a.k_stride_s, first * kBlockN, a.seqlen_kv);
  load_tile_async<kBlockN>(v_tiles[0], v_base, a.v_stride_s, first * kBlockN, a.seqlen_kv);
  cp_async_commit();
  for (int i = 0; i < list.count; ++i) {
    int stage = i % kStages;
    int tile = kv_tile_of(list, a.mask, i);
    if (i + 1 < list.count) {
      int next = kv_tile_of(list, a.mask, i + 1);
      int ns = (i + 1) % kStages;
      load_tile_async<kBlockN>(k_tiles[ns], k_base, a.k_stride_s, next * kBlockN, a.seqlen_kv);
      load_tile_async<kBlockN>(v_tiles[ns], v_base, a.v_stride_s, next * kBlockN, a.seqlen_kv);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    float s[kBlockN / 8][4];
    compute_scores(s, qf, k_tiles[stage], lane);
    apply_mods<kApplyMask>(s, a, p, b, h, q_row0, tile * kBlockN, lane);
    online_softmax(st, s);
    accumulate_pv(st, s, v_tiles[stage], lane);
    __syncthreads();
  }
}

}  // namespace fj

extern "C" __global__ void __launch_bounds__(fj::kNumThreads)
flexjit_forward(const FjFwdArgs a, const FjModParams p) {
  using namespace fj;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  fj_bf16_bits* smem = reinterpret_cast<fj_bf16_bits*>(smem_raw);
  SmemTile q_tile{smem};
  SmemTile k_tiles[kStages];
  SmemTile v_tiles[kStages];
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    k_tiles[s].base = smem + kBlockM * kHeadDim + s * kBlockN * kHeadDim;
    v_tiles[s].base = smem + kBlockM * kHeadDim + (kStages + s) * kBlockN * kHeadDim;
  }
  const int qb = blockIdx.x;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int hkv = h / kGqaRatio;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int q_row0 = qb * kBlockM + warp * 16;

  const fj_bf16_bits* q_base = static_cast<const fj_bf16_bits*>(a.q) + b * a.q_stride_b + h * a.q_stride_h;
  const fj_bf16_bits* k_base = static_cast<const fj_bf16_bits*>(a.k) + b * a.k_stride_b + hkv * a.k_stride_h;
  const fj_bf16_bits* v_base = static_cast<const fj_bf16_bits*>(a.v) + b * a.v_stride_b + hkv * a.v_stride_h;

  load_tile_async<kBlockM>(q_tile, q_base, a.q_stride_s, qb * kBlockM, a.seqlen_q);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  unsigned qf[kHeadDim / 16][4];
  load_q_fragments(qf, q_tile, warp, lane);

  WarpState st;
  init_state(st);
  const int num_kv_tiles = (a.seqlen_kv + kBlockN - 1) / kBlockN;
  KvBlockList partial = kv_blocks(a.mask, b, h, qb, false, num_kv_tiles);
  process_blocks<true>(st, partial, qf, k_tiles, v_tiles, a, p, k_base, v_base, b, h, q_row0, lane);
  KvBlockList full = kv_blocks(a.mask, b, h, qb, true, num_kv_tiles);
  process_blocks<false>(st, full, qf, k_tiles, v_tiles, a, p, k_base, v_base, b, h, q_row0, lane);
  store_output(st, a, b, h, q_row0, lane);
}

// A second, small kernel with static shared memory (resource-usage fixture).
extern "C" __global__ void flexjit_smem_probe(float* out) {
  __shared__ float buf[1024];
  buf[threadIdx.x] = threadIdx.x * 2.f;
  __syncthreads();
  out[threadIdx.x] = buf[(threadIdx.x + 1) % 1024];
}
)CUDA";

const char* kSmallKernel = R"CUDA(
extern "C" __global__ void scale(float* x, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}
)CUDA";

// setmaxnreg exists only with the sm_90a arch-specific feature set.
const char* kHopperOnlyKernel = R"CUDA(
extern "C" __global__ void __launch_bounds__(256) hopper_only(float* x) {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  x[threadIdx.x] += 1.f;
}
)CUDA";

CompileRequest request(const char* source, const char* kernel, const char* arch) {
  return CompileRequest{source, kernel, arch, {}, std::string("test ") + kernel};
}

// Runs nvcc -Xptxas -v on `source` and returns its ptxas log, or "" when nvcc is not installed.
std::string nvcc_ptxas_log(const std::string& source, const std::string& arch) {
  if (std::system("command -v nvcc > /dev/null 2>&1") != 0) return {};
  auto dir =
      std::filesystem::temp_directory_path() / ("flexjit-nvcc-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "k.cu") << source;
  std::string cmd = "nvcc -arch=" + arch + " -cubin -Xptxas -v -o " + (dir / "k.cubin").string() +
                    " " + (dir / "k.cu").string() + " 2>&1";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    std::array<char, 4096> buf;
    while (size_t n = fread(buf.data(), 1, buf.size(), p))
      out.append(buf.data(), n);
    pclose(p);
  }
  std::filesystem::remove_all(dir);
  return out;
}

bool is_elf(const std::vector<char>& b) {
  return b.size() > 4 && b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F';
}

}  // namespace

TEST_CASE("NVRTC compiles a kernel to a cubin for the requested arch", "[jit]") {
  CHECK(nvrtc_version() == "13.0");
  for (const char* arch : {"sm_80", "sm_90a"}) {
    INFO(arch);
    CompiledKernel k = nvrtc_compile(request(kSmallKernel, "scale", arch));
    REQUIRE(is_elf(k.cubin));
    CHECK(cubin_sm_version(k.cubin) == (std::string(arch) == "sm_80" ? 80 : 90));
    CHECK(k.kernel_name == "scale");
    CHECK(k.arch == arch);
    CHECK(k.usage.registers > 0);
    CHECK(k.compile_ms > 0);
  }
}

TEST_CASE("sm_90a enables arch-specific instructions that sm_90 rejects", "[jit]") {
  CompiledKernel k = nvrtc_compile(request(kHopperOnlyKernel, "hopper_only", "sm_90a"));
  REQUIRE(cubin_sm_version(k.cubin) == 90);
  CHECK(k.usage.max_threads_per_block == 256);
  CHECK_THROWS_AS(nvrtc_compile(request(kHopperOnlyKernel, "hopper_only", "sm_90")), JitError);
}

TEST_CASE("a compile error names the kernel and shows the offending source line", "[jit]") {
  std::string source =
      "extern \"C\" __global__ void broken(float* x) {\n"  // 1
      "  int i = threadIdx.x;\n"                           // 2
      "  x[i] = undefined_name * 2.f;\n"                   // 3
      "}\n";
  CompileRequest req{source, "broken", "sm_80", {"-DFOO=1"}, "forward alibi bf16 d128"};
  try {
    nvrtc_compile(req);
    FAIL("expected a JitError");
  } catch (const JitError& e) {
    std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("forward alibi bf16 d128"));
    CHECK_THAT(msg, Catch::Contains("sm_80"));
    CHECK_THAT(msg, Catch::Contains("-DFOO=1"));
    CHECK_THAT(msg, Catch::Contains("identifier \"undefined_name\" is undefined"));
    CHECK_THAT(msg, Catch::Contains(">    3 |   x[i] = undefined_name * 2.f;"));
    CHECK_THAT(msg, Catch::Contains("     2 |   int i = threadIdx.x;"));
  }
}

TEST_CASE("a misspelt kernel name is a JitError, not a missing symbol at launch", "[jit]") {
  CHECK_THROWS_AS(nvrtc_compile(request(kSmallKernel, "scael", "sm_80")), JitError);
}

TEST_CASE("ptxas log parsing picks the requested entry function", "[jit]") {
  const char* log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'other' for 'sm_80'\n"
      "ptxas info    : Function properties for other\n"
      "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
      "ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem, 360 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function 'mine' for 'sm_80'\n"
      "ptxas info    : Function properties for mine\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 12 registers, used 0 barriers, 360 bytes cmem[0]\n";
  ResourceUsage u = usage_from_ptxas_log(log, "mine");
  CHECK(u.registers == 12);
  CHECK(u.static_shared_bytes == 0);
  CHECK(u.stack_frame_bytes == 0);
  CHECK(u.spill_store_bytes == 0);
  ResourceUsage o = usage_from_ptxas_log(log, "other");
  CHECK(o.registers == 40);
  CHECK(o.static_shared_bytes == 4096);
  CHECK(o.spill_store_bytes == 4);
  CHECK(o.str() == "40 registers, 8 B spills, 8 B stack, 4096 B static smem");
  CHECK(usage_from_ptxas_log(log, "absent").registers == -1);
  CHECK(u.wgmma_serialized.empty());
}

TEST_CASE("ptxas's serialized-wgmma remark is read for the function it names", "[jit]") {
  // CUDA 13.0's wording (the sm_90a dK/dV kernel of 2026-11-28 without `divisible`).
  const char* log =
      "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are "
      "serialized due to insufficient register resources for the function 'flexjit_bwd_dkdv'\n"
      "ptxas info    : Compiling entry function 'flexjit_bwd_dkdv' for 'sm_90a'\n"
      "ptxas info    : Function properties for flexjit_bwd_dkdv\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers, 360 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function 'flexjit_forward' for 'sm_90a'\n"
      "ptxas info    : Used 168 registers, used 1 barriers, 360 bytes cmem[0]\n";
  const ResourceUsage u = usage_from_ptxas_log(log, "flexjit_bwd_dkdv");
  CHECK(u.wgmma_serialized == "C7512: insufficient register resources");
  CHECK(u.registers == 168);
  CHECK(u.str() ==
        "168 registers, 0 B spills, 0 B stack, 0 B static smem, wgmma serialized (C7512: "
        "insufficient register resources)");
  CHECK(usage_from_ptxas_log(log, "flexjit_forward").wgmma_serialized.empty());
  // A remark without a function name belongs to the function being compiled.
  const char* unnamed =
      "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
      "ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are "
      "serialized due to program dependence on compiler-inserted WG.AR in divergent path\n";
  CHECK(usage_from_ptxas_log(unnamed, "k").wgmma_serialized ==
        "C7520: program dependence on compiler-inserted WG.AR in divergent path");
}

TEST_CASE("resource usage of a static shared memory kernel matches nvcc", "[jit]") {
  CompiledKernel k = nvrtc_compile(request(kForwardKernel, "flexjit_smem_probe", "sm_80"));
  CHECK(k.usage.static_shared_bytes >= 4096);
  CHECK(k.usage.spill_store_bytes == 0);
  CHECK(k.usage.registers == usage_from_cubin(k.cubin, "flexjit_smem_probe").registers);
  std::string nvcc_log = nvcc_ptxas_log(kForwardKernel, "sm_80");
  if (nvcc_log.empty()) {
    WARN("skipped: nvcc not found, no cross-check against nvcc -Xptxas -v");
    return;
  }
  ResourceUsage ref = usage_from_ptxas_log(nvcc_log, "flexjit_smem_probe");
  CHECK(k.usage.registers == ref.registers);
  CHECK(k.usage.static_shared_bytes == ref.static_shared_bytes);
  CHECK(k.usage.stack_frame_bytes == ref.stack_frame_bytes);
}

TEST_CASE("resource usage of the forward attention kernel is plausible and matches nvcc", "[jit]") {
  CompiledKernel k = nvrtc_compile(request(kForwardKernel, "flexjit_forward", "sm_80"));
  INFO(k.log);
  // 16 rows x 128 head dim of fp32 accumulators per warp alone need 64 registers per thread.
  CHECK(k.usage.registers > 128);
  CHECK(k.usage.registers <= 255);
  CHECK(k.usage.max_threads_per_block == 128);  // __launch_bounds__(kNumThreads)
  CHECK(k.usage.static_shared_bytes == 0);      // all dynamic
  CHECK(k.usage.spill_store_bytes >= 0);
  // The cubin's own record agrees with the ptxas log.
  ResourceUsage elf = usage_from_cubin(k.cubin, "flexjit_forward");
  CHECK(elf.registers == k.usage.registers);
  CHECK(elf.stack_frame_bytes == k.usage.stack_frame_bytes);
  std::string nvcc_log = nvcc_ptxas_log(kForwardKernel, "sm_80");
  if (nvcc_log.empty()) {
    WARN("skipped: nvcc not found, no cross-check against nvcc -Xptxas -v");
    return;
  }
  ResourceUsage ref = usage_from_ptxas_log(nvcc_log, "flexjit_forward");
  INFO("nvcc: " << ref.str() << "; nvrtc: " << k.usage.str());
  // nvcc's front end passes NVVM slightly different flags; allocation may differ by a few.
  CHECK(std::abs(k.usage.registers - ref.registers) <= 8);
  CHECK(k.usage.spill_store_bytes == ref.spill_store_bytes);
  CHECK(k.usage.static_shared_bytes == ref.static_shared_bytes);
}

TEST_CASE("usage_from_cubin rejects bytes that are not a CUDA ELF", "[jit]") {
  std::vector<char> junk(100, 'x');
  CHECK(usage_from_cubin(junk, "k").registers == -1);
  CHECK(cubin_sm_version(junk) == -1);
  CHECK(cubin_sm_version({}) == -1);
}

// Timing figures for the report: cold compile, disk hit, memory hit. Hidden: run with
// ./flexjit-tests "[.timing]".
TEST_CASE("compile, disk hit and memory hit timings", "[.timing]") {
  auto dir =
      std::filesystem::temp_directory_path() / ("flexjit-timing-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  CacheSettings s;
  s.dir = dir;
  CompileRequest req = request(kForwardKernel, "flexjit_forward", "sm_90a");
  // Pad the source to ~50 KB, as generated sources with comment headers and templates are.
  std::string pad = "// " + std::string(96, '=') + "\n";
  while (req.source.size() < 50 * 1024)
    req.source += pad;
  {
    KernelCompiler c(s);
    CompileResult cold = c.compile(req);
    REQUIRE(cold.outcome == CacheOutcome::Compiled);
    WARN("cold compile (" << req.source.size() / 1024 << " KB source, " << cold.kernel->usage.str()
                          << "): " << cold.elapsed_ms << " ms");
    auto t0 = std::chrono::steady_clock::now();
    constexpr int kReps = 2000;
    for (int i = 0; i < kReps; ++i)
      REQUIRE(c.compile(req).outcome == CacheOutcome::MemoryHit);
    double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        kReps;
    WARN("memory hit: " << us << " us");
    auto k0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kReps; ++i)
      (void)cache_key(req);
    double key_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - k0).count() /
        kReps;
    WARN("cache_key alone: " << key_us << " us");
    CHECK(us < 1000);
  }
  double disk_ms = 1e9;
  for (int i = 0; i < 20; ++i) {
    KernelCompiler c(s);
    CompileResult r = c.compile(req);
    REQUIRE(r.outcome == CacheOutcome::DiskHit);
    disk_ms = std::min(disk_ms, r.elapsed_ms);
  }
  WARN("disk hit (best of 20): " << disk_ms << " ms");
  CHECK(disk_ms < 50);
  std::filesystem::remove_all(dir);
}
