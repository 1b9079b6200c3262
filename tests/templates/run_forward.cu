// GPU check and benchmark of one composed forward kernel (see build_run.sh). Not part of the
// Catch2 suite: it needs a GPU. The reference is a naive fp32 kernel calling the same mods, so
// this checks the tiling, fragments, pipeline, softmax, block-sparse iteration and edges.
//   run_forward B H HKV SQ SKV BLOCKMASK(0|1) BSHD(0|1) PARAM [bench_iters]
#include <cuda_fp16.h>
#include <type_traits>
#include FJ_KERNEL_TU
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "harness_mods.h"

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

using E = FjConfig::Element;
static constexpr bool kBf16 = sizeof(E) == 2 && std::is_same<E, fj_bf16>::value;

static unsigned short to16(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  if (kBf16) return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  return __half_as_ushort(__float2half_rn(f));
}
__host__ __device__ inline float from16(unsigned short h) {
  if (kBf16) {
#ifdef __CUDA_ARCH__
    return __int_as_float((int)((unsigned)h << 16));
#else
    unsigned u = (unsigned)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
  }
  return __half2float(__ushort_as_half(h));
}

// One thread per (b, h, q row); fp32 throughout; same strides as the kernel.
__global__ void reference(FjFwdArgs a, FjModParams mods, float* out, float* lse) {
  int q = blockIdx.x * blockDim.x + threadIdx.x;
  int h = blockIdx.y, b = blockIdx.z;
  if (q >= a.seqlen_q) return;
  int hk = h / FjConfig::kGqaRatio;
  const unsigned short* Q = (const unsigned short*)a.q + b * a.q_stride_b + h * a.q_stride_h +
                            (long long)q * a.q_stride_s;
  const unsigned short* K = (const unsigned short*)a.k + b * a.k_stride_b + hk * a.k_stride_h;
  const unsigned short* V = (const unsigned short*)a.v + b * a.v_stride_b + hk * a.v_stride_h;
  float mx = -INFINITY;
  for (int kv = 0; kv < a.seqlen_kv; ++kv) {
    float s = 0;
    for (int d = 0; d < FjConfig::kHeadDimQK; ++d)
      s += from16(Q[d]) * from16(K[(long long)kv * a.k_stride_s + d]);
    s *= a.scale;
    if (FjConfig::kHasScoreMod) s = fj_score_mod(mods, s, b, h, q, kv);
    if (FjConfig::kHasMaskMod && !fj_mask_mod(mods, b, h, q, kv)) s = -INFINITY;
    mx = fmaxf(mx, s);
  }
  float acc[FjConfig::kHeadDimV];
  for (int d = 0; d < FjConfig::kHeadDimV; ++d)
    acc[d] = 0;
  float sum = 0;
  for (int kv = 0; kv < a.seqlen_kv && mx != -INFINITY; ++kv) {
    float s = 0;
    for (int d = 0; d < FjConfig::kHeadDimQK; ++d)
      s += from16(Q[d]) * from16(K[(long long)kv * a.k_stride_s + d]);
    s *= a.scale;
    if (FjConfig::kHasScoreMod) s = fj_score_mod(mods, s, b, h, q, kv);
    if (FjConfig::kHasMaskMod && !fj_mask_mod(mods, b, h, q, kv)) s = -INFINITY;
    float p = expf(s - mx);
    sum += p;
    for (int d = 0; d < FjConfig::kHeadDimV; ++d)
      acc[d] += p * from16(V[(long long)kv * a.v_stride_s + d]);
  }
  long long row = ((long long)(b * a.heads_q + h) * a.seqlen_q + q);
  for (int d = 0; d < FjConfig::kHeadDimV; ++d)
    out[row * FjConfig::kHeadDimV + d] = sum > 0 ? acc[d] / sum : 0.f;
  lse[row] = sum > 0 ? mx + logf(sum) : -INFINITY;
}

// counts[(bh * nqb + qb) * nkb + kb] = number of in-range (q, kv) of the block where mask_mod
// holds, and totals[...] the number of in-range pairs.
__global__ void count_mask(FjModParams mods, int H, int Sq, int Skv, int qbs, int kbs, int nqb,
                           int nkb, int* counts, int* totals) {
  int kb = blockIdx.x, qb = blockIdx.y, bh = blockIdx.z;
  int b = bh / H, h = bh % H;
  int c = 0, t = 0;
  for (int i = threadIdx.x; i < qbs * kbs; i += blockDim.x) {
    int q = qb * qbs + i / kbs, kv = kb * kbs + i % kbs;
    if (q >= Sq || kv >= Skv) continue;
    ++t;
    c += (!FjConfig::kHasMaskMod || fj_mask_mod(mods, b, h, q, kv)) ? 1 : 0;
  }
  atomicAdd(&counts[(bh * nqb + qb) * nkb + kb], c);
  atomicAdd(&totals[(bh * nqb + qb) * nkb + kb], t);
}

template <class T>
static T* upload(const std::vector<T>& v) {
  T* p;
  CK(cudaMalloc(&p, v.size() * sizeof(T) + 16));
  CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

int main(int argc, char** argv) {
  if (argc < 9) {
    std::printf("usage: %s B H HKV SQ SKV BLOCKMASK BSHD PARAM [bench_iters]\n", argv[0]);
    return 1;
  }
  const int B = atoi(argv[1]), H = atoi(argv[2]), HKV = atoi(argv[3]), SQ = atoi(argv[4]),
            SKV = atoi(argv[5]);
  const int use_bm = atoi(argv[6]), bshd = atoi(argv[7]);
  const float param = atof(argv[8]);
  const int iters = argc > 9 ? atoi(argv[9]) : 0;
  constexpr int DQ = FjConfig::kHeadDimQK, DV = FjConfig::kHeadDimV;
  if (H / HKV != FjConfig::kGqaRatio) {
    std::printf("H/HKV != kGqaRatio\n");
    return 1;
  }
  srand(1234);
  auto rnd = [] { return (float)rand() / RAND_MAX * 2.f - 1.f; };
  std::vector<unsigned short> hq((size_t)B * H * SQ * DQ), hk((size_t)B * HKV * SKV * DQ),
      hv((size_t)B * HKV * SKV * DV);
  for (auto& x : hq)
    x = to16(rnd() * 2.f);
  for (auto& x : hk)
    x = to16(rnd() * 2.f);
  for (auto& x : hv)
    x = to16(rnd());
  FjFwdArgs a{};
  a.q = upload(hq);
  a.k = upload(hk);
  a.v = upload(hv);
  void* out;
  CK(cudaMalloc(&out, (size_t)B * H * SQ * DV * 2));
  CK(cudaMemset(out, 0xff, (size_t)B * H * SQ * DV * 2));  // NaN pattern: unwritten rows show
  float* lse;
  CK(cudaMalloc(&lse, (size_t)B * H * SQ * 4));
  a.lse = lse;
  a.out = out;
  if (bshd) {  // q and out as [B, S, H, D]: strides the kernel must honour
    a.q_stride_b = (long long)SQ * H * DQ;
    a.q_stride_h = DQ;
    a.q_stride_s = (long long)H * DQ;
    a.o_stride_b = (long long)SQ * H * DV;
    a.o_stride_h = DV;
    a.o_stride_s = (long long)H * DV;
  } else {
    a.q_stride_b = (long long)H * SQ * DQ;
    a.q_stride_h = (long long)SQ * DQ;
    a.q_stride_s = DQ;
    a.o_stride_b = (long long)H * SQ * DV;
    a.o_stride_h = (long long)SQ * DV;
    a.o_stride_s = DV;
  }
  a.k_stride_b = (long long)HKV * SKV * DQ;
  a.k_stride_h = (long long)SKV * DQ;
  a.k_stride_s = DQ;
  a.v_stride_b = (long long)HKV * SKV * DV;
  a.v_stride_h = (long long)SKV * DV;
  a.v_stride_s = DV;
  a.lse_stride_b = (long long)H * SQ;
  a.lse_stride_h = SQ;
  a.batch = B;
  a.heads_q = H;
  a.heads_kv = HKV;
  a.seqlen_q = SQ;
  a.seqlen_kv = SKV;
  a.scale = 1.0f / std::sqrt((float)DQ);

  FjModParams mods{};
  std::vector<float> slopes(H);
  for (int i = 0; i < H; ++i)
    slopes[i] = std::pow(2.f, -8.f * (i + 1) / H);
  fj_test_set_mods(mods, upload(slopes), param);

  long long computed_pairs = (long long)SQ * SKV;  // for TFLOP/s
  if (use_bm) {
    const int qbs = 128, kbs = 128, nqb = (SQ + qbs - 1) / qbs, nkb = (SKV + kbs - 1) / kbs;
    int *dc, *dt;
    size_t n = (size_t)B * H * nqb * nkb;
    CK(cudaMalloc(&dc, n * 4));
    CK(cudaMalloc(&dt, n * 4));
    CK(cudaMemset(dc, 0, n * 4));
    CK(cudaMemset(dt, 0, n * 4));
    count_mask<<<dim3(nkb, nqb, B * H), 256>>>(mods, H, SQ, SKV, qbs, kbs, nqb, nkb, dc, dt);
    CK(cudaGetLastError());
    std::vector<int> c(n), t(n);
    CK(cudaMemcpy(c.data(), dc, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(t.data(), dt, n * 4, cudaMemcpyDeviceToHost));
    std::vector<int> num((size_t)B * H * nqb), idx((size_t)B * H * nqb * nkb), fnum(num.size()),
        fidx(idx.size());
    computed_pairs = 0;
    for (int bh = 0; bh < B * H; ++bh)
      for (int qb = 0; qb < nqb; ++qb) {
        int np = 0, nf = 0;
        size_t r = (size_t)bh * nqb + qb;
        // Reverse order for the partial list: the kernel must not depend on index order.
        for (int kb = nkb - 1; kb >= 0; --kb) {
          // Without full-block support every visited tile is partial (mask_mod applied).
          int cc = c[r * nkb + kb],
              tt = FjConfig::kHasFullBlocks && c[r * nkb + kb] == t[r * nkb + kb];
          if (cc == 0) continue;
          if (tt)
            fidx[r * nkb + nf++] = kb;
          else
            idx[r * nkb + np++] = kb;
          computed_pairs += (long long)qbs * kbs;
        }
        num[r] = np;
        fnum[r] = nf;
      }
    computed_pairs /= (long long)B * H;
    a.mask.kv_num_blocks = upload(num);
    a.mask.kv_indices = upload(idx);
    a.mask.full_kv_num_blocks = FjConfig::kHasFullBlocks ? upload(fnum) : nullptr;
    a.mask.full_kv_indices = FjConfig::kHasFullBlocks ? upload(fidx) : nullptr;
    a.mask.num_stride_b = (long long)H * nqb;
    a.mask.num_stride_h = nqb;
    a.mask.idx_stride_b = (long long)H * nqb * nkb;
    a.mask.idx_stride_h = (long long)nqb * nkb;
    a.mask.idx_stride_m = nkb;
    a.mask.q_block_size = qbs;
    a.mask.kv_block_size = kbs;
  }

  const int smem =
      fj_forward_smem_bytes(FjConfig::kBlockM, FjConfig::kBlockN, DQ, DV, 2, FjConfig::kNumStages);
  CK(cudaFuncSetAttribute(flexjit_forward, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  dim3 grid((SQ + FjConfig::kBlockM - 1) / FjConfig::kBlockM, H, B);
  flexjit_forward<<<grid, FjConfig::kNumWarps * 32, smem>>>(a, mods);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  float *rout, *rlse;
  CK(cudaMalloc(&rout, (size_t)B * H * SQ * DV * 4));
  CK(cudaMalloc(&rlse, (size_t)B * H * SQ * 4));
  reference<<<dim3((SQ + 127) / 128, H, B), 128>>>(a, mods, rout, rlse);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<unsigned short> ho((size_t)B * H * SQ * DV);
  std::vector<float> hro(ho.size()), hl((size_t)B * H * SQ), hrl(hl.size());
  CK(cudaMemcpy(ho.data(), out, ho.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hro.data(), rout, hro.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hl.data(), lse, hl.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hrl.data(), rlse, hrl.size() * 4, cudaMemcpyDeviceToHost));
  double max_err = 0, max_lse_err = 0;
  long long bad = 0, masked_rows = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int q = 0; q < SQ; ++q) {
        size_t row = ((size_t)b * H + h) * SQ + q;
        const unsigned short* o = (const unsigned short*)ho.data() + b * a.o_stride_b +
                                  h * a.o_stride_h + (size_t)q * a.o_stride_s;
        for (int d = 0; d < DV; ++d) {
          float x = from16(o[d]), r = hro[row * DV + d];
          double e = std::fabs((double)x - r);
          if (!(e <= 2e-2 + 2e-2 * std::fabs(r))) ++bad;
          if (e > max_err || x != x) max_err = x != x ? INFINITY : e;
        }
        if (std::isinf(hrl[row])) {
          ++masked_rows;
          if (!(std::isinf(hl[row]) && hl[row] < 0)) ++bad;
        } else {
          double e = std::fabs((double)hl[row] - hrl[row]);
          if (!(e <= 1e-3 + 1e-4 * std::fabs(hrl[row]))) ++bad;
          if (!(e <= max_lse_err)) max_lse_err = e;
        }
      }
  std::printf(
      "%s %s d=%d/%d %dx%d w%d s%d | B=%d H=%d/%d Sq=%d Skv=%d bm=%d bshd=%d param=%g | "
      "max_err=%.3g lse_err=%.3g masked_rows=%lld bad=%lld %s\n",
      FJ_MODS_NAME, kBf16 ? "bf16" : "f16", DQ, DV, FjConfig::kBlockM, FjConfig::kBlockN,
      FjConfig::kNumWarps, FjConfig::kNumStages, B, H, HKV, SQ, SKV, use_bm, bshd, param, max_err,
      max_lse_err, masked_rows, bad, bad ? "FAIL" : "ok");
  if (iters > 0) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; ++i)
      flexjit_forward<<<grid, FjConfig::kNumWarps * 32, smem>>>(a, mods);
    CK(cudaEventRecord(e0));
    for (int i = 0; i < iters; ++i)
      flexjit_forward<<<grid, FjConfig::kNumWarps * 32, smem>>>(a, mods);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ms /= iters;
    double flops = 2.0 * B * H * (double)computed_pairs * (DQ + DV);
    std::printf("  bench: %.3f ms, %.1f TFLOP/s (over computed blocks: %lld pairs/head)\n", ms,
                flops / ms / 1e9, computed_pairs);
  }
  return bad ? 1 : 0;
}
