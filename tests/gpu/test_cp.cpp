// Context parallelism over NCCL on the GPUs of one machine (flex_attention_cp,
// docs/context_parallel.md), in one process: ncclCommInitAll over N visible devices, one host
// thread per rank, each with its own Context. Every rank's out and lse are compared with
// single-GPU flexjit on the gathered tensors and with the CPU backend's f32 attention on the
// same (bf16-rounded) values, on fresh random inputs. Skips with fewer than 2 GPUs; N = 4 runs
// where 4 are visible. NCCL: libnccl.so.2 as cp/NcclLibrary.h finds it (FLEXJIT_NCCL_LIBRARY).
//
// "[.][cp_bench]" (hidden, and outside the [gpu] suite: run it by its tag) times the forward at B =
// 1, H = 16 (GQA 4:1), d 128, causal, bf16 on 1 GPU and on N for both strategies; the length is
// $FLEXJIT_CP_BENCH_SEQLEN (default 131072).
#include <flexjit/backward.h>
#include <flexjit/context_parallel.h>
#include <flexjit/cpu.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "cp/NcclLibrary.h"
#include "cp/Sharding.h"
#include "device/CudaDriver.h"
#include "device/Device.h"
#include "gpu/GpuTestUtil.h"

#include <catch2/catch.hpp>

#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

using namespace flexjit;
using test::HostTensor;

namespace {

int visible_gpus() {
  std::string why;
  if (!runtime::cuda_available(&why)) return 0;
  return runtime::Driver::get().device_count();
}

// Skips the test case (with the reason) unless `n` GPUs are visible and NCCL loads.
#define FJ_REQUIRE_GPUS_OR_SKIP(n)                                                         \
  do {                                                                                     \
    const int fj_gpus_ = visible_gpus();                                                   \
    if (fj_gpus_ < (n)) {                                                                  \
      WARN("skipped: context parallelism over " << (n) << " GPUs needs " << (n)            \
                                                << " visible, found " << fj_gpus_);        \
      return;                                                                              \
    }                                                                                      \
    std::string fj_nccl_reason_;                                                           \
    if (!nccl_available(&fj_nccl_reason_)) FAIL("NCCL did not load: " << fj_nccl_reason_); \
  } while (0)

// N communicators, one per device 0..N-1 (ncclCommInitAll), destroyed at the end.
struct Comms {
  std::vector<cp::NcclComm> comms;
  explicit Comms(int n) : comms(static_cast<size_t>(n), nullptr) {
    // NVLink multicast stays off (it can take a shared host's GPUs out of service); a value the
    // environment already sets wins.
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    std::vector<int> devs;
    for (int i = 0; i < n; ++i)
      devs.push_back(i);
    FJ_NCCL(ncclCommInitAll, "the test's communicators", comms.data(), n, devs.data());
  }
  ~Comms() {
    for (cp::NcclComm c : comms)
      cp::Nccl::get().ncclCommDestroy_(c);
  }
};

// One Context per device, made once for the process.
Context& context_of(int device) {
  static std::vector<std::unique_ptr<Context>> ctxs(64);
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto& c = ctxs[static_cast<size_t>(device)];
  if (!c) {
    ContextOptions o;
    o.device = device;
    c = std::make_unique<Context>(o);
  }
  return *c;
}

// Rank r's shard of a whole-sequence host tensor [B, H, S, D].
HostTensor shard_of(const HostTensor& t, const cp::Sharding& sh, int rank) {
  HostTensor out;
  out.dtype = t.dtype;
  const int64_t B = t.shape[0], H = t.shape[1], S = t.shape[2], D = t.shape[3];
  out.shape = {B, H, sh.local_length(), D};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < sh.local_length(); ++i) {
        const int64_t g = sh.global_position(rank, i);
        const float* row = t.values.data() + ((b * H + h) * S + g) * D;
        out.values.insert(out.values.end(), row, row + D);
      }
  return out;
}

// Runs fn(rank) on one thread per rank; fails (and ends the process, as NCCL ranks waiting for
// a dead peer never return) when a rank is not done within `seconds`.
void on_every_rank(int n, const std::function<void(int)>& fn, int seconds = 600) {
  std::vector<std::future<std::string>> done;
  for (int r = 0; r < n; ++r) {
    done.push_back(std::async(std::launch::async, [&fn, r]() -> std::string {
      try {
        fn(r);
      } catch (const std::exception& e) {
        return e.what();
      }
      return {};
    }));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::vector<std::string> errors;
  for (int r = 0; r < n; ++r) {
    if (done[static_cast<size_t>(r)].wait_until(deadline) != std::future_status::ready) {
      std::fprintf(stderr,
                   "context parallelism test: rank %d did not finish in %d s (a hang in "
                   "NCCL?); exiting\n",
                   r, seconds);
      std::fflush(stderr);
      std::_Exit(3);
    }
    errors.push_back(done[static_cast<size_t>(r)].get());
  }
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(errors[static_cast<size_t>(r)] == "");
  }
}

struct Case {
  std::string mods;
  int64_t B = 1, Hq = 8, Hkv = 2, S = 0, D = 128;
};

// Host bindings of the standard mods used here, at global positions.
struct Bindings {
  std::vector<float> slopes, bias;
  std::vector<int32_t> doc_id;
  std::vector<std::pair<std::string, double>> params;

  explicit Bindings(const Case& c) {
    for (int64_t h = 0; h < c.Hq; ++h)
      slopes.push_back(std::exp2(-8.0f * float(h + 1) / float(c.Hq)));
    int32_t doc = 0;
    for (int64_t i = 0; i < c.S; ++i) {
      if (i == c.S / 3 || i == c.S / 2 + 5 || i == c.S - 100) ++doc;
      doc_id.push_back(doc);
    }
    if (c.mods == "sliding_window") params = {{"window", double(c.S / 5)}};
    // relative_bias: bias[q_idx - kv_idx + offset] over R = 2 S entries.
    std::mt19937 rng(17);
    std::normal_distribution<float> n01(0.0f, 0.5f);
    for (int64_t i = 0; i < 2 * c.S; ++i)
      bias.push_back(n01(rng));
    if (c.mods.rfind("relative_bias", 0) == 0) params = {{"offset", double(c.S)}};
  }
  // Device copies on ctx (kept in `keep`) or host views (ctx null).
  ModBindings bind(const Mods& mods, Context* ctx, std::vector<DeviceTensor>& keep) {
    ModBindings b;
    b.params = params;
    for (const Buffer& buf : mods.buffers) {
      TensorRef host;
      if (buf.name() == "slopes") {
        host =
            TensorRef::contiguous(slopes.data(), DType::F32, {static_cast<int64_t>(slopes.size())});
      } else if (buf.name() == "bias") {
        host = TensorRef::contiguous(bias.data(), DType::F32, {static_cast<int64_t>(bias.size())});
      } else if (buf.name() == "doc_id") {
        host =
            TensorRef::contiguous(doc_id.data(), DType::I32, {static_cast<int64_t>(doc_id.size())});
      } else {
        FAIL("no binding for buffer " << buf.name());
      }
      if (ctx == nullptr) {
        b.buffers.emplace_back(buf.name(), host);
      } else {
        keep.push_back(DeviceTensor::from_host(*ctx, host.dtype, host.shape, host.data));
        b.buffers.emplace_back(buf.name(), keep.back().ref());
      }
    }
    return b;
  }
};

double max_lse_diff(const std::vector<float>& got, const std::vector<float>& want) {
  double m = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (got[i] != want[i]) return INFINITY;
      continue;
    }
    m = std::max(m, std::abs(double(got[i]) - want[i]));
  }
  return m;
}

}  // namespace

TEST_CASE(
    "flex_attention_cp over NCCL matches single-GPU flexjit and the CPU on the gathered "
    "tensors",
    "[gpu][cp]") {
  const int n = GENERATE(2, 4);
  FJ_REQUIRE_GPUS_OR_SKIP(n);
  const std::string mods_name =
      GENERATE(as<std::string>{}, "causal", "document", "sliding_window", "alibi");
  const uint64_t seed = test::fresh_seed();
  Case c;
  c.mods = mods_name;
  c.S = 256 * 2 * n;  // zigzag chunks of 256
  INFO(mods_name << ", N = " << n << ", S = " << c.S << ", seed " << seed);
  std::mt19937_64 rng(seed);
  const HostTensor q = test::random_tensor(rng, DType::BF16, {c.B, c.Hq, c.S, c.D});
  const HostTensor k = test::random_tensor(rng, DType::BF16, {c.B, c.Hkv, c.S, c.D});
  const HostTensor v = test::random_tensor(rng, DType::BF16, {c.B, c.Hkv, c.S, c.D});
  const Mods mods = standard_mods(mods_name);
  Bindings bind(c);

  // The references on the gathered tensors: the CPU backend in f32 on the same bf16 values, and
  // single-GPU flexjit (device 0).
  std::vector<DeviceTensor> keep0;
  AttentionOptions cpu_opts;
  cpu_opts.mods = mods;
  cpu_opts.bindings = bind.bind(mods, nullptr, keep0);
  std::vector<float> qv = q.values, kv = k.values, vv = v.values;
  const CpuAttentionResult ref =
      flex_attention_cpu(TensorRef::contiguous(qv.data(), DType::F32, q.shape),
                         TensorRef::contiguous(kv.data(), DType::F32, k.shape),
                         TensorRef::contiguous(vv.data(), DType::F32, v.shape), cpu_opts);
  Context& ctx0 = context_of(0);
  AttentionOptions one_opts;
  one_opts.mods = mods;
  one_opts.bindings = bind.bind(mods, &ctx0, keep0);
  one_opts.return_lse = true;
  DeviceBlockMask one_mask;
  if (mods.mask_mod.defined()) {
    one_mask = create_block_mask(ctx0, mods, 1, 1, static_cast<int>(c.S), static_cast<int>(c.S),
                                 128, one_opts.bindings);
    one_opts.block_mask = &one_mask;
  }
  const DeviceTensor dq = test::upload(ctx0, q), dk = test::upload(ctx0, k),
                     dv = test::upload(ctx0, v);
  const AttentionResult one = flex_attention(ctx0, dq, dk, dv, one_opts);
  ctx0.synchronize();
  const std::vector<float> one_out = test::download(one.out);
  const std::vector<float> one_lse = one.lse.to_host<float>();
  {
    const test::ErrorStats e = test::compare(one_out, ref.out);
    INFO("single GPU vs CPU: " << e.str());
    REQUIRE(e.rel <= test::tolerance(DType::BF16));
  }

  for (CpStrategy strategy : {CpStrategy::Ring, CpStrategy::AllGather}) {
    const CpLayout layout = mods_name == "document" ? CpLayout::Contiguous : CpLayout::Zigzag;
    INFO(to_string(strategy) << ", " << to_string(layout));
    const cp::Sharding sh(layout, c.S, n);
    Comms comms(n);
    std::vector<std::vector<float>> outs(static_cast<size_t>(n)), lses(static_cast<size_t>(n));
    on_every_rank(n, [&](int r) {
      Context& ctx = context_of(r);
      std::vector<DeviceTensor> keep;
      const DeviceTensor lq = test::upload(ctx, shard_of(q, sh, r));
      const DeviceTensor lk = test::upload(ctx, shard_of(k, sh, r));
      const DeviceTensor lv = test::upload(ctx, shard_of(v, sh, r));
      AttentionOptions o;
      o.mods = mods;
      o.bindings = bind.bind(mods, &ctx, keep);
      o.return_lse = true;
      const NcclCommunicator comm = NcclCommunicator::wrap(comms.comms[static_cast<size_t>(r)]);
      const AttentionResult res = flex_attention_cp(ctx, comm, lq, lk, lv, o, {strategy, layout});
      ctx.synchronize();
      outs[static_cast<size_t>(r)] = test::download(res.out);
      lses[static_cast<size_t>(r)] = res.lse.to_host<float>();
    });
    // Each rank's rows against the references' rows at the same global positions.
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      const auto& out = outs[static_cast<size_t>(r)];
      const auto& lse = lses[static_cast<size_t>(r)];
      REQUIRE(out.size() == static_cast<size_t>(c.B * c.Hq * sh.local_length() * c.D));
      std::vector<float> want_one, want_one_lse, want_ref_lse;
      std::vector<float> want_ref;
      for (int64_t h = 0; h < c.Hq; ++h) {
        for (int64_t i = 0; i < sh.local_length(); ++i) {
          const int64_t g = sh.global_position(r, i);
          const size_t at = static_cast<size_t>((h * c.S + g) * c.D);
          want_one.insert(want_one.end(), one_out.begin() + at, one_out.begin() + at + c.D);
          want_ref.insert(want_ref.end(), ref.out.begin() + at, ref.out.begin() + at + c.D);
          want_one_lse.push_back(one_lse[static_cast<size_t>(h * c.S + g)]);
          want_ref_lse.push_back(ref.lse[static_cast<size_t>(h * c.S + g)]);
        }
      }
      const test::ErrorStats vs_cpu = test::compare(out, want_ref);
      const test::ErrorStats vs_one = test::compare(out, want_one);
      INFO("vs CPU f32: " << vs_cpu.str() << "; vs single GPU: " << vs_one.str());
      CHECK(vs_cpu.rel <= test::tolerance(DType::BF16));
      CHECK(vs_one.rel <= test::tolerance(DType::BF16));
      CHECK(vs_cpu.nonfinite == 0);
      CHECK(max_lse_diff(lse, want_ref_lse) <= 1e-2);
      CHECK(max_lse_diff(lse, want_one_lse) <= 1e-2);
    }
  }
}

TEST_CASE(
    "flex_attention_cp_backward matches single-GPU flexjit's backward, buffer gradients included",
    "[gpu][cp][backward]") {
  const int n = GENERATE(2, 4);
  const CpStrategy strategy = GENERATE(CpStrategy::AllGather, CpStrategy::Ring);
  FJ_REQUIRE_GPUS_OR_SKIP(n);
  const std::string mods_name = GENERATE(as<std::string>{}, "causal", "document", "sliding_window",
                                         "alibi", "relative_bias_causal");
  const uint64_t seed = test::fresh_seed();
  Case c;
  c.mods = mods_name;
  c.S = 256 * 2 * n;
  INFO(mods_name << ", N = " << n << ", S = " << c.S << ", " << to_string(strategy) << ", seed "
                 << seed);
  std::mt19937_64 rng(seed);
  const HostTensor q = test::random_tensor(rng, DType::BF16, {c.B, c.Hq, c.S, c.D});
  const HostTensor k = test::random_tensor(rng, DType::BF16, {c.B, c.Hkv, c.S, c.D});
  const HostTensor v = test::random_tensor(rng, DType::BF16, {c.B, c.Hkv, c.S, c.D});
  const HostTensor dout = test::random_tensor(rng, DType::BF16, {c.B, c.Hq, c.S, c.D});
  const Mods mods = standard_mods(mods_name);
  Bindings bind(c);

  // Single-GPU flexjit on the gathered tensors (device 0): forward, then backward.
  Context& ctx0 = context_of(0);
  std::vector<DeviceTensor> keep0;
  AttentionOptions one_opts;
  one_opts.mods = mods;
  one_opts.bindings = bind.bind(mods, &ctx0, keep0);
  one_opts.return_lse = true;
  const DeviceTensor dq0 = test::upload(ctx0, q), dk0 = test::upload(ctx0, k),
                     dv0 = test::upload(ctx0, v), ddo0 = test::upload(ctx0, dout);
  const AttentionResult fwd = flex_attention(ctx0, dq0, dk0, dv0, one_opts);
  const BackwardResult one =
      flex_attention_backward(ctx0, dq0, dk0, dv0, fwd.out, fwd.lse, ddo0, one_opts);
  ctx0.synchronize();
  const std::vector<float> one_dq = test::download(one.dq), one_dk = test::download(one.dk),
                           one_dv = test::download(one.dv);
  std::map<std::string, std::vector<float>> one_bufs;
  for (const auto& [name, t] : one.buffer_grads)
    one_bufs[name] = t.to_host<float>();

  const CpLayout layout = mods_name == "document" ? CpLayout::Contiguous : CpLayout::Zigzag;
  const cp::Sharding sh(layout, c.S, n);
  Comms comms(n);
  std::vector<std::vector<float>> dqs(static_cast<size_t>(n)), dks(static_cast<size_t>(n)),
      dvs(static_cast<size_t>(n));
  std::vector<std::map<std::string, std::vector<float>>> bufs(static_cast<size_t>(n));
  on_every_rank(n, [&](int r) {
    Context& ctx = context_of(r);
    std::vector<DeviceTensor> keep;
    const DeviceTensor lq = test::upload(ctx, shard_of(q, sh, r));
    const DeviceTensor lk = test::upload(ctx, shard_of(k, sh, r));
    const DeviceTensor lv = test::upload(ctx, shard_of(v, sh, r));
    const DeviceTensor ldo = test::upload(ctx, shard_of(dout, sh, r));
    AttentionOptions o;
    o.mods = mods;
    o.bindings = bind.bind(mods, &ctx, keep);
    o.return_lse = true;
    const NcclCommunicator comm = NcclCommunicator::wrap(comms.comms[static_cast<size_t>(r)]);
    const ContextParallelOptions cpo{strategy, layout};
    const AttentionResult f = flex_attention_cp(ctx, comm, lq, lk, lv, o, cpo);
    const BackwardResult b =
        flex_attention_cp_backward(ctx, comm, lq, lk, lv, f.out, f.lse, ldo, o, cpo);
    ctx.synchronize();
    const auto ri = static_cast<size_t>(r);
    dqs[ri] = test::download(b.dq);
    dks[ri] = test::download(b.dk);
    dvs[ri] = test::download(b.dv);
    for (const auto& [name, t] : b.buffer_grads)
      bufs[ri][name] = t.to_host<float>();
  });
  // The rows of a whole-sequence [B, H, S, D] tensor that rank r holds.
  auto rows_of_rank = [&](const std::vector<float>& all, int64_t H, int r) {
    std::vector<float> out;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < sh.local_length(); ++i) {
        const size_t at = static_cast<size_t>((h * c.S + sh.global_position(r, i)) * c.D);
        out.insert(out.end(), all.begin() + at, all.begin() + at + c.D);
      }
    return out;
  };
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const auto ri = static_cast<size_t>(r);
    for (const auto& [name, got, want] :
         {std::tuple{"dq", &dqs[ri], rows_of_rank(one_dq, c.Hq, r)},
          std::tuple{"dk", &dks[ri], rows_of_rank(one_dk, c.Hkv, r)},
          std::tuple{"dv", &dvs[ri], rows_of_rank(one_dv, c.Hkv, r)}}) {
      const test::ErrorStats e = test::compare(*got, want);
      INFO(name << " vs single GPU: " << e.str());
      CHECK(e.rel <= 2 * test::tolerance(DType::BF16));
      CHECK(e.nonfinite == 0);
    }
    REQUIRE(bufs[ri].size() == one_bufs.size());
    for (const auto& [name, want] : one_bufs) {
      const test::ErrorStats e = test::compare(bufs[ri].at(name), want);
      INFO("buffer " << name << " gradient vs single GPU: " << e.str());
      CHECK(e.rel <= 2 * test::tolerance(DType::BF16));
    }
  }
}

TEST_CASE("NcclCommunicator::create from a unique id: each rank's thread joins, the ring runs",
          "[gpu][cp]") {
  FJ_REQUIRE_GPUS_OR_SKIP(2);
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  const int n = 2;
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Case c;
  c.mods = "causal";
  c.S = 1024;
  std::mt19937_64 rng(seed);
  const HostTensor q = test::random_tensor(rng, DType::BF16, {c.B, c.Hq, c.S, c.D});
  const HostTensor k = test::random_tensor(rng, DType::BF16, {c.B, c.Hkv, c.S, c.D});
  const HostTensor v = test::random_tensor(rng, DType::BF16, {c.B, c.Hkv, c.S, c.D});
  const Mods mods = standard_mods("causal");
  // The reference: the CPU backend on the gathered tensors.
  std::vector<float> qv = q.values, kv = k.values, vv = v.values;
  AttentionOptions cpu_opts;
  cpu_opts.mods = mods;
  const CpuAttentionResult ref =
      flex_attention_cpu(TensorRef::contiguous(qv.data(), DType::F32, q.shape),
                         TensorRef::contiguous(kv.data(), DType::F32, k.shape),
                         TensorRef::contiguous(vv.data(), DType::F32, v.shape), cpu_opts);
  const NcclUniqueId id = NcclCommunicator::unique_id();
  const cp::Sharding sh(CpLayout::Zigzag, c.S, n);
  std::vector<std::vector<float>> outs(static_cast<size_t>(n));
  std::vector<int> ranks(static_cast<size_t>(n), -1), sizes(static_cast<size_t>(n), -1);
  on_every_rank(n, [&](int r) {
    Context& ctx = context_of(r);
    const NcclCommunicator comm = NcclCommunicator::create(ctx, id, n, r);
    ranks[static_cast<size_t>(r)] = comm.rank();
    sizes[static_cast<size_t>(r)] = comm.size();
    const DeviceTensor lq = test::upload(ctx, shard_of(q, sh, r));
    const DeviceTensor lk = test::upload(ctx, shard_of(k, sh, r));
    const DeviceTensor lv = test::upload(ctx, shard_of(v, sh, r));
    AttentionOptions o;
    o.mods = mods;
    // Twice: the second call reuses the communicator's buffers and block masks.
    (void)flex_attention_cp(ctx, comm, lq, lk, lv, o, {CpStrategy::Ring, CpLayout::Zigzag});
    const AttentionResult res =
        flex_attention_cp(ctx, comm, lq, lk, lv, o, {CpStrategy::Ring, CpLayout::Zigzag});
    ctx.synchronize();
    outs[static_cast<size_t>(r)] = test::download(res.out);
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(ranks[static_cast<size_t>(r)] == r);
    CHECK(sizes[static_cast<size_t>(r)] == n);
    std::vector<float> want;
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < sh.local_length(); ++i) {
        const size_t at = static_cast<size_t>((h * c.S + sh.global_position(r, i)) * c.D);
        want.insert(want.end(), ref.out.begin() + at, ref.out.begin() + at + c.D);
      }
    const test::ErrorStats e = test::compare(outs[static_cast<size_t>(r)], want);
    INFO(e.str());
    CHECK(e.rel <= test::tolerance(DType::BF16));
  }
}

TEST_CASE("flex_attention_cp refuses a block mask, sinks and a mismatched device, naming them",
          "[gpu][cp]") {
  FJ_REQUIRE_GPUS_OR_SKIP(2);
  Comms comms(2);
  Context& ctx = context_of(0);
  const NcclCommunicator comm = NcclCommunicator::wrap(comms.comms[0]);
  CHECK(comm.size() == 2);
  CHECK(comm.rank() == 0);
  std::mt19937_64 rng(1);
  const DeviceTensor t = test::upload(ctx, test::random_tensor(rng, DType::BF16, {1, 2, 256, 64}));
  AttentionOptions o;
  o.mods = standard_mods("sinks");
  CHECK_THROWS_WITH(flex_attention_cp(ctx, comm, t, t, t, o),
                    Catch::Contains("does not support attention sinks yet"));
  o.mods = standard_mods("causal");
  // Rank 1's communicator with device 0's context.
  const NcclCommunicator other = NcclCommunicator::wrap(comms.comms[1]);
  CHECK_THROWS_WITH(flex_attention_cp(ctx, other, t, t, t, o),
                    Catch::Contains("rank 1 is on cuda:1, the context on cuda:0"));
}

TEST_CASE(
    "context parallelism forward: throughput on 1 GPU and on N (B=1 H=16 GQA 4:1 d128 "
    "causal bf16)",
    "[.][cp_bench]") {
  const int gpus = visible_gpus();
  FJ_REQUIRE_GPUS_OR_SKIP(2);
  const char* env = std::getenv("FLEXJIT_CP_BENCH_SEQLEN");
  const int64_t S = env ? std::atoll(env) : 131072;
  const int iters = 5;
  const int64_t B = 1, Hq = 16, Hkv = 4, D = 128;
  const Mods mods = standard_mods("causal");
  // Causal forward FLOPs: 4 B H S^2 D / 2.
  const double flops = 4.0 * B * Hq * double(S) * double(S) * D / 2.0;
  std::mt19937_64 rng(7);
  auto time_it = [&](const std::function<void()>& step, const std::function<void()>& sync) {
    step(), step();  // compile, caches, block masks
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i)
      step();
    sync();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  };
  // One GPU on the whole sequence.
  double one_seconds = 0;
  {
    Context& ctx = context_of(0);
    const DeviceTensor q = test::upload(ctx, test::random_tensor(rng, DType::BF16, {B, Hq, S, D}));
    const DeviceTensor k = test::upload(ctx, test::random_tensor(rng, DType::BF16, {B, Hkv, S, D}));
    const DeviceTensor v = test::upload(ctx, test::random_tensor(rng, DType::BF16, {B, Hkv, S, D}));
    const DeviceBlockMask bm =
        create_block_mask(ctx, mods, 1, 1, static_cast<int>(S), static_cast<int>(S));
    AttentionOptions o;
    o.mods = mods;
    o.block_mask = &bm;
    one_seconds =
        time_it([&] { (void)flex_attention(ctx, q, k, v, o); }, [&] { ctx.synchronize(); });
    std::printf("cp bench S=%lld: 1 GPU %.2f ms, %.1f TFLOP/s\n", static_cast<long long>(S),
                one_seconds * 1e3, flops / one_seconds / 1e12);
  }
  for (int n = 2; n <= gpus; n *= 2) {
    for (CpStrategy strategy : {CpStrategy::Ring, CpStrategy::AllGather}) {
      const cp::Sharding sh(CpLayout::Zigzag, S, n);
      Comms comms(n);
      std::barrier sync_point(n);
      std::vector<double> seconds(static_cast<size_t>(n));
      on_every_rank(n, [&](int r) {
        Context& ctx = context_of(r);
        std::mt19937_64 local(100 + r);
        const int64_t L = sh.local_length();
        const DeviceTensor q =
            test::upload(ctx, test::random_tensor(local, DType::BF16, {B, Hq, L, D}));
        const DeviceTensor k =
            test::upload(ctx, test::random_tensor(local, DType::BF16, {B, Hkv, L, D}));
        const DeviceTensor v =
            test::upload(ctx, test::random_tensor(local, DType::BF16, {B, Hkv, L, D}));
        const NcclCommunicator comm = NcclCommunicator::wrap(comms.comms[static_cast<size_t>(r)]);
        AttentionOptions o;
        o.mods = mods;
        seconds[static_cast<size_t>(r)] = time_it(
            [&] {
              (void)flex_attention_cp(ctx, comm, q, k, v, o, {strategy, CpLayout::Zigzag});
            },
            [&] {
              ctx.synchronize();
              sync_point.arrive_and_wait();
            });
      });
      double worst = 0;
      for (double s : seconds)
        worst = std::max(worst, s);
      std::printf("cp bench S=%lld: %d GPUs %-9s %.2f ms, %.1f TFLOP/s per GPU, %.2fx one GPU\n",
                  static_cast<long long>(S), n, std::string(to_string(strategy)).c_str(),
                  worst * 1e3, flops / worst / n / 1e12, one_seconds / worst);
    }
  }
  SUCCEED();
}
