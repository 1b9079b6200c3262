// Captured buffers of every DSL dtype (f32, f16, bf16, i32, bool) and rank (1 to 4), contiguous
// and as strided views of a larger allocation, with runtime params of every type (f32, i32,
// bool) bound to non-default values: the forward on the GPU against the CPU fp64 reference
// (skips with "skipped: no GPU (...)" without one), the CUDA source of their loads (NVRTC, no GPU
// needed), and the precise errors of bad bindings.
#include <flexjit/attention.h>
#include <flexjit/error.h>

#include "Pipeline.h"
#include "binding/ModArgs.h"
#include "binding/ModParamLayout.h"
#include "codegen/cuda/ModCodegen.h"
#include "device/ModuleCache.h"
#include "gpu/GpuTestUtil.h"
#include "support/KernelDescs.h"
#include "support/ReferenceAttention.h"
#include "support/ReferenceKernel.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

using namespace flexjit;
using namespace flexjit::test;

namespace {

constexpr int kB = 2, kH = 3, kSq = 70, kSkv = 90, kD = 64;
constexpr int kS = std::max(kSq, kSkv);  // extent of the doc-id buffer

const DType kBufferDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::I32, DType::Bool};

// A captured buffer: the host copy of its whole allocation and the view the mods read. A
// strided view leaves elements of the allocation unread; they hold a poison value (NaN, a huge
// integer) so that a load that ignores the strides gives a visibly wrong result.
struct BoundBuffer {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;    // of the view
  std::vector<int64_t> strides;  // of the view, in elements
  int64_t offset = 0;            // of the view's first element in the allocation, in elements
  std::vector<char> storage;     // the whole allocation
};

// Lays out `values` (the view's elements in row-major order, as T: float, uint16_t bits,
// int32_t, uint8_t) contiguously, or strided: every other element (stride 2 in dim 0), dims in
// reverse order (column-major), each dim padded by 1 + d elements, starting one element in.
template <typename T>
BoundBuffer place(std::string name, DType dtype, std::vector<int64_t> shape,
                  const std::vector<T>& values, bool strided, T poison) {
  FJ_ASSERT(static_cast<int>(sizeof(T)) == dtype_size(dtype), "element size");
  BoundBuffer bb;
  bb.name = std::move(name);
  bb.dtype = dtype;
  bb.shape = std::move(shape);
  const int rank = static_cast<int>(bb.shape.size());
  bb.strides.assign(rank, 1);
  int64_t elems = 0;
  if (strided) {
    bb.offset = 1;
    int64_t st = 2;
    for (int d = 0; d < rank; ++d) {
      bb.strides[d] = st;
      st *= bb.shape[d] + 1 + d;
    }
    elems = st + 2;
  } else {
    for (int d = rank - 2; d >= 0; --d)
      bb.strides[d] = bb.strides[d + 1] * bb.shape[d + 1];
    elems = static_cast<int64_t>(values.size());
  }
  std::vector<T> all(static_cast<size_t>(elems), poison);
  std::vector<int64_t> idx(rank, 0);
  for (size_t linear = 0; linear < values.size(); ++linear) {
    int64_t off = bb.offset;
    for (int d = 0; d < rank; ++d)
      off += idx[d] * bb.strides[d];
    FJ_ASSERT(off >= 0 && off < elems, "strided view outside its allocation");
    all[static_cast<size_t>(off)] = values[linear];
    for (int d = rank - 1; d >= 0; --d) {  // row-major increment
      if (++idx[d] < bb.shape[d]) break;
      idx[d] = 0;
    }
  }
  bb.storage.resize(all.size() * sizeof(T));
  std::memcpy(bb.storage.data(), all.data(), bb.storage.size());
  return bb;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

// The declared dims and bound shape of the buffer under test for each rank, and the index
// expressions the mods use: every one is in range for all (b, h, q_idx, kv_idx) of the problem
// (floor modulo keeps the results non-negative for any `shift`).
struct RankSpec {
  std::vector<std::string> dims;
  std::vector<int64_t> shape;
};

RankSpec rank_spec(int rank) {
  switch (rank) {
    case 1:
      return {{"11"}, {11}};
    case 2:
      return {{"H", "13"}, {kH, 13}};
    case 3:
      return {{"B", "7", "5"}, {kB, 7, 5}};
    default:
      return {{"H", "7", "5", "B"}, {kH, 7, 5, kB}};
  }
}

std::vector<Expr> rank_indices(int rank, Expr b, Expr h, Expr q, Expr kv, Expr shift) {
  switch (rank) {
    case 1:
      return {(q * 3 + kv + shift) % 11};
    case 2:
      return {h, (kv - q + shift) % 13};
    case 3:
      return {b, (q + shift) % 7, kv % 5};
    default:
      return {h, q % 7, (kv + shift) % 5, b};
  }
}

struct BufferCase {
  std::string label;
  Mods mods;
  std::vector<BoundBuffer> buffers;
  std::vector<std::pair<std::string, double>> params;
};

// The runtime params every case declares (defaults 1.0, 0, false; bound to other values).
struct CaseParams {
  Param alpha{"alpha", ScalarType::F32, 1.0};
  Param shift{"shift", ScalarType::I32, 0.0};
  Param flip{"flip", ScalarType::Bool, 0.0};
};

// The mods for a buffer of `dtype` and `rank`:
//  f32 / f16 / bf16: score * alpha ± buf[...] (sign by `flip`), masked where buf[...] <= -0.8
//    off the diagonal;
//  i32: score * alpha ± 0.125 · float(ids[...]) + table[ids[...] % 17] (ids as values and as
//    indices), masked to the same document (doc[q_idx] == doc[kv_idx], i32 doc ids);
//  bool: score * alpha ± 0.5 by keep[...] (where), masked where keep[...] == flip off the
//    diagonal.
// The diagonal (q_idx == kv_idx) stays visible so that no row is fully masked.
Mods make_mods(DType dtype, int rank, const CaseParams& p) {
  const RankSpec rs = rank_spec(rank);
  const Expr alpha = p.alpha, shift = p.shift, flip = p.flip;
  switch (dtype) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: {
      const Buffer buf(fmt::format("{}_r{}", to_string(dtype), rank), dtype, rs.dims);
      return Mods::from(
          [&](Expr s, Expr b, Expr h, Expr q, Expr kv) {
            const Expr v = buf(rank_indices(rank, b, h, q, kv, shift));
            return s * alpha + where(flip, -v, v);
          },
          [&](Expr b, Expr h, Expr q, Expr kv) {
            return buf(rank_indices(rank, b, h, q, kv, shift)) > Expr(-0.8f) || q == kv;
          });
    }
    case DType::I32: {
      const Buffer ids(fmt::format("ids_r{}", rank), DType::I32, rs.dims);
      const Buffer table("table", DType::F32, {"17"});
      const Buffer doc("doc", DType::I32, {"S"});
      return Mods::from(
          [&](Expr s, Expr b, Expr h, Expr q, Expr kv) {
            const Expr i = ids(rank_indices(rank, b, h, q, kv, shift));
            return s * alpha + Expr(0.125f) * to_float(where(flip, -i, i)) + table(i % 17);
          },
          [&](Expr, Expr, Expr q, Expr kv) { return doc(q) == doc(kv); });
    }
    case DType::Bool: {
      const Buffer keep(fmt::format("keep_r{}", rank), DType::Bool, rs.dims);
      return Mods::from(
          [&](Expr s, Expr b, Expr h, Expr q, Expr kv) {
            return s * alpha +
                   where(keep(rank_indices(rank, b, h, q, kv, shift)), Expr(0.5f), Expr(-0.5f));
          },
          [&](Expr b, Expr h, Expr q, Expr kv) {
            return keep(rank_indices(rank, b, h, q, kv, shift)) != flip || q == kv;
          });
    }
    case DType::E4M3:
      break;  // captured buffers take no e4m3
  }
  FJ_ASSERT(false, "bad DType");
}

// Random contents for the buffers of make_mods(dtype, rank), the buffer under test strided or
// not (the helper buffers `table` and `doc` are always contiguous).
std::vector<BoundBuffer> make_buffers(DType dtype, int rank, bool strided, std::mt19937_64& rng) {
  const RankSpec rs = rank_spec(rank);
  const size_t n = static_cast<size_t>(numel(rs.shape));
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  std::vector<BoundBuffer> out;
  switch (dtype) {
    case DType::F32: {
      std::vector<float> v(n);
      for (float& x : v)
        x = u(rng);
      v[1] = -1.25f;  // some positions are masked whatever the draw
      out.push_back(place(fmt::format("f32_r{}", rank), dtype, rs.shape, v, strided,
                          std::numeric_limits<float>::quiet_NaN()));
      break;
    }
    case DType::F16:
    case DType::BF16: {
      // Given as bits: the reference widens exactly what the GPU loads.
      const bool f16 = dtype == DType::F16;
      std::vector<uint16_t> v(n);
      for (uint16_t& x : v)
        x = f16 ? ir::float_to_f16_bits(u(rng)) : ir::float_to_bf16_bits(u(rng));
      if (n >= 3) {  // values whose bits are easy to get wrong: 1, -2, the smallest subnormal
        v[0] = f16 ? 0x3C00 : 0x3F80;
        v[1] = f16 ? 0xC000 : 0xC000;
        v[2] = 0x0001;
      }
      const uint16_t nan = f16 ? 0x7E00 : 0x7FC0;
      out.push_back(
          place(fmt::format("{}_r{}", to_string(dtype), rank), dtype, rs.shape, v, strided, nan));
      break;
    }
    case DType::I32: {
      std::uniform_int_distribution<int32_t> ui(-40, 40);
      std::vector<int32_t> v(n);
      for (int32_t& x : v)
        x = ui(rng);
      out.push_back(
          place(fmt::format("ids_r{}", rank), dtype, rs.shape, v, strided, int32_t{1000003}));
      std::vector<float> table(17);
      for (float& x : table)
        x = u(rng);
      out.push_back(place("table", DType::F32, {17}, table, false, 0.0f));
      std::vector<int32_t> doc(kS);
      int d = 0;
      for (int i = 0; i < kS; ++i) {
        if (i > 0 && (rng() % 12 == 0 || i == kS / 2)) ++d;  // at least two documents
        doc[i] = d;
      }
      out.push_back(place("doc", DType::I32, {kS}, doc, false, 0));
      break;
    }
    case DType::Bool: {
      std::vector<uint8_t> v(n);
      for (uint8_t& x : v)
        x = rng() % 5 < 3 ? 1 : 0;
      v[0] = 1, v[1] = 0;  // both outcomes occur whatever the draw
      out.push_back(place(fmt::format("keep_r{}", rank), dtype, rs.shape, v, strided, uint8_t{1}));
      break;
    }
    case DType::E4M3:
      FJ_ASSERT(false, "captured buffers take no e4m3");
  }
  return out;
}

struct RunResult {
  ErrorStats out_err;
  double lse_max_err = 0;
  int64_t lse_mismatched_inf = 0;
  int64_t ref_masked_rows = 0;
};

// One forward on the GPU (poisoned out / lse) against the CPU fp64 reference.
RunResult run_case(Context& ctx, const BufferCase& c, DType in_dtype, std::mt19937_64& rng) {
  AttentionShape s;
  s.batch = kB, s.heads_q = kH, s.heads_kv = kH, s.seqlen_q = kSq, s.seqlen_kv = kSkv;
  s.head_dim_qk = s.head_dim_v = kD;
  const HostTensor q = random_tensor(rng, in_dtype, {kB, kH, kSq, kD});
  const HostTensor k = random_tensor(rng, in_dtype, {kB, kH, kSkv, kD});
  const HostTensor v = random_tensor(rng, in_dtype, {kB, kH, kSkv, kD});
  const DeviceTensor dq = upload(ctx, q), dk = upload(ctx, k), dv = upload(ctx, v);

  std::vector<DeviceTensor> keep;
  AttentionOptions o;
  o.mods = c.mods;
  ir::EvalEnv env;
  for (const BoundBuffer& bb : c.buffers) {
    const int64_t elems = static_cast<int64_t>(bb.storage.size()) / dtype_size(bb.dtype);
    keep.push_back(DeviceTensor::from_host(ctx, bb.dtype, {elems}, bb.storage.data()));
    TensorRef view = keep.back().ref();
    view.data = static_cast<char*>(view.data) + bb.offset * dtype_size(bb.dtype);
    view.shape = bb.shape;
    view.strides = bb.strides;
    o.bindings.buffers.emplace_back(bb.name, view);
    env.buffers[bb.name] = ir::BufferView{bb.storage.data() + bb.offset * dtype_size(bb.dtype),
                                          bb.dtype, bb.shape, bb.strides};
  }
  o.bindings.params = c.params;
  for (const auto& [name, value] : c.params)
    env.params[name] = value;

  DeviceTensor out = DeviceTensor::empty(ctx, in_dtype, {kB, kH, kSq, kD});
  DeviceTensor lse = DeviceTensor::empty(ctx, DType::F32, {kB, kH, kSq});
  out.fill_bytes(0xFF);  // NaN: an element the kernel does not write fails
  lse.fill_bytes(0xFF);
  flex_attention_into(ctx, dq, dk, dv, out, &lse.ref(), o);
  ctx.synchronize();

  const ReferenceResult ref = reference_attention(c.mods, s, q.values, k.values, v.values,
                                                  1.0f / std::sqrt(static_cast<float>(kD)), env);
  RunResult r;
  r.out_err = compare(download(out), ref.out);
  const std::vector<float> got_lse = download(lse);
  const LseStats lse_err = compare_lse(got_lse, ref.lse);
  r.lse_max_err = lse_err.max_err;
  r.lse_mismatched_inf = lse_err.mismatched_inf;
  r.ref_masked_rows = std::count_if(ref.lse.begin(), ref.lse.end(),
                                    [](double x) { return std::isinf(x) && x < 0; });
  return r;
}

std::vector<std::pair<std::string, double>> param_values(bool strided) {
  // Non-default values for every type; the strided run takes others (flip given explicitly).
  if (!strided) return {{"alpha", 0.625}, {"shift", -5}, {"flip", 1}};
  return {{"alpha", 1.5}, {"shift", 4}, {"flip", 0}};
}

}  // namespace

TEST_CASE("forward: captured buffers of every dtype and rank 1-4, contiguous and strided",
          "[gpu][forward][buffers]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::forward_families(*ctx)));
  test::ForwardFamilyScope family_scope(family);
  INFO("forward family: " << family);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const CaseParams params;
  int n = 0;
  for (DType dtype : kBufferDTypes) {
    for (int rank = 1; rank <= 4; ++rank, ++n) {
      const DType in_dtype = n % 2 == 0 ? DType::BF16 : DType::F16;
      size_t modules_after_first = 0;
      for (bool strided : {false, true}) {
        BufferCase c;
        c.mods = make_mods(dtype, rank, params);
        c.buffers = make_buffers(dtype, rank, strided, rng);
        c.params = param_values(strided);
        const BoundBuffer& under_test = c.buffers.front();
        c.label = fmt::format("{} rank {} {} (strides [{}]) in {}", to_string(dtype), rank,
                              strided ? "strided view" : "contiguous",
                              fmt::join(under_test.strides, ", "), to_string(in_dtype));
        const RunResult r = run_case(*ctx, c, in_dtype, rng);
        const std::string summary = fmt::format(
            "{}: out {}; lse max rel err {:.3e}, {} -inf mismatches, {} rows fully "
            "masked (seed {})",
            c.label, r.out_err.str(), r.lse_max_err, r.lse_mismatched_inf, r.ref_masked_rows, seed);
        INFO(summary);
        INFO("mods:\n" << c.mods.to_text());
        CHECK(r.out_err.nonfinite == 0);
        CHECK(r.out_err.rel <= tolerance(in_dtype));
        CHECK(r.lse_mismatched_inf == 0);
        CHECK(r.lse_max_err <= 1e-2);
        CHECK(r.ref_masked_rows == 0);  // the diagonal is always visible
        std::printf("  %s\n", summary.c_str());
        // Strides and param values are kernel arguments: the strided run reuses the module.
        if (!strided) {
          modules_after_first = runtime::ModuleCache::global().num_modules();
        } else {
          CHECK(runtime::ModuleCache::global().num_modules() == modules_after_first);
        }
      }
    }
  }
}

TEST_CASE("forward: the buffers of a case change the answer", "[gpu][forward][buffers]") {
  // Guards the test above against a reference and kernel that both ignore the buffers: with
  // every buffer contents replaced, the output moves far beyond the tolerance.
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::forward_families(*ctx)));
  test::ForwardFamilyScope family_scope(family);
  INFO("forward family: " << family);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const CaseParams params;
  for (DType dtype : kBufferDTypes) {
    INFO(to_string(dtype));
    BufferCase c;
    c.mods = make_mods(dtype, 3, params);
    c.params = param_values(false);
    std::mt19937_64 rng(seed), buf_rng_a(seed + 1), buf_rng_b(seed + 2);
    c.buffers = make_buffers(dtype, 3, false, buf_rng_a);
    AttentionOptions o;
    o.mods = c.mods;
    std::vector<DeviceTensor> keep_a, keep_b;
    auto bind = [&](const std::vector<BoundBuffer>& bufs, std::vector<DeviceTensor>& keep) {
      ModBindings mb;
      for (const BoundBuffer& bb : bufs) {
        const int64_t elems = static_cast<int64_t>(bb.storage.size()) / dtype_size(bb.dtype);
        keep.push_back(DeviceTensor::from_host(*ctx, bb.dtype, {elems}, bb.storage.data()));
        TensorRef view = keep.back().ref();
        view.shape = bb.shape;
        view.strides = bb.strides;
        mb.buffers.emplace_back(bb.name, view);
      }
      mb.params = c.params;
      return mb;
    };
    const HostTensor q = random_tensor(rng, DType::BF16, {kB, kH, kSq, kD});
    const HostTensor k = random_tensor(rng, DType::BF16, {kB, kH, kSkv, kD});
    const DeviceTensor dq = upload(*ctx, q), dk = upload(*ctx, k);
    o.bindings = bind(c.buffers, keep_a);
    AttentionResult a = flex_attention(*ctx, dq, dk, dk, o);
    o.bindings = bind(make_buffers(dtype, 3, false, buf_rng_b), keep_b);
    AttentionResult b = flex_attention(*ctx, dq, dk, dk, o);
    ctx->synchronize();
    const ErrorStats diff = compare(download(a.out), download(b.out));
    INFO("other buffer contents vs first: " << diff.str());
    CHECK(diff.rel > 10 * tolerance(DType::BF16));
  }
}

TEST_CASE("forward: bad buffer bindings are precise errors before any launch",
          "[gpu][forward][buffers]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  const std::string family = GENERATE_COPY(from_range(test::forward_families(*ctx)));
  test::ForwardFamilyScope family_scope(family);
  INFO("forward family: " << family);
  std::mt19937_64 rng(fresh_seed());
  const DeviceTensor q = upload(*ctx, random_tensor(rng, DType::BF16, {kB, kH, 64, kD}));
  const CaseParams params;
  AttentionOptions o;
  o.mods = make_mods(DType::Bool, 3, params);
  // keep_r3: bool[B, 7, 5]
  const DeviceTensor as_i32 = DeviceTensor::empty(*ctx, DType::I32, {kB, 7, 5});
  o.bindings.buffers = {{"keep_r3", as_i32.ref()}};
  CHECK_THROWS_WITH(flex_attention(*ctx, q, q, q, o),
                    Catch::Contains("buffer 'keep_r3' (declared bool[B, 7, 5]) is bound to a i32 "
                                    "tensor; expected bool"));
  const DeviceTensor rank2 = DeviceTensor::empty(*ctx, DType::Bool, {kB, 35});
  o.bindings.buffers = {{"keep_r3", rank2.ref()}};
  CHECK_THROWS_WITH(flex_attention(*ctx, q, q, q, o),
                    Catch::Contains("is bound to a tensor of 2 dims; expected 3"));
  const DeviceTensor wrong_extent = DeviceTensor::empty(*ctx, DType::Bool, {kB, 7, 6});
  o.bindings.buffers = {{"keep_r3", wrong_extent.ref()}};
  CHECK_THROWS_WITH(flex_attention(*ctx, q, q, q, o),
                    Catch::Contains("dim 2 has extent 6; the declaration says 5"));
  std::vector<uint8_t> host(static_cast<size_t>(kB) * 35, 1);
  o.bindings.buffers = {{"keep_r3", TensorRef::contiguous(host.data(), DType::Bool, {kB, 7, 5})}};
  CHECK_THROWS_WITH(flex_attention(*ctx, q, q, q, o),
                    Catch::Contains("is on cpu; the kernel runs on cuda:"));
  const DeviceTensor good = DeviceTensor::empty(*ctx, DType::Bool, {kB, 7, 5});
  o.bindings.buffers = {{"keep_r3", good.ref()}};
  o.bindings.params = {{"flip", 2}};
  CHECK_THROWS_WITH(flex_attention(*ctx, q, q, q, o),
                    Catch::Contains("param 'flip' is bool, but its value 2 is not 0 or 1"));
}

TEST_CASE("bad bindings of buffers of every dtype and rank are precise errors",
          "[buffers][modargs]") {
  alignas(16) static char fake[256];  // never dereferenced: the packer copies pointers only
  const CaseParams params;
  for (DType dtype : kBufferDTypes) {
    for (int rank = 1; rank <= 4; ++rank) {
      const Mods mods = make_mods(dtype, rank, params);
      const Buffer& buf = mods.buffers.front();
      INFO(buf.name());
      const RankSpec rs = rank_spec(rank);
      ModBindings good;
      for (const Buffer& b : mods.buffers) {
        const std::vector<int64_t> shape =
            b.name() == "table" ? std::vector<int64_t>{17}
                                : (b.name() == "doc" ? std::vector<int64_t>{kS} : rs.shape);
        good.buffers.emplace_back(
            b.name(), TensorRef::contiguous(fake, b.dtype(), shape, TensorRef::Device::CUDA, 0));
      }
      CHECK(runtime::pack_mod_params(mods, good, 0).size() * 8 ==
            static_cast<size_t>(cuda::layout_of(mods).size));
      auto fails_with = [&](const TensorRef& t, const std::string& text) {
        ModBindings mb = good;
        mb.buffers.front().second = t;
        INFO("expecting: " << text);
        CHECK_THROWS_WITH(runtime::pack_mod_params(mods, mb, 0), Catch::Contains(text));
      };
      const std::string what = fmt::format("buffer '{}' (declared {}[{}])", buf.name(),
                                           to_string(dtype), fmt::join(rs.dims, ", "));
      // Every other dtype, same shape.
      for (DType other : kBufferDTypes) {
        if (other == dtype) continue;
        fails_with(TensorRef::contiguous(fake, other, rs.shape, TensorRef::Device::CUDA, 0),
                   fmt::format("{} is bound to a {} tensor; expected {}", what, to_string(other),
                               to_string(dtype)));
      }
      // One dim more and one dim less.
      std::vector<int64_t> more = rs.shape;
      more.push_back(1);
      fails_with(
          TensorRef::contiguous(fake, dtype, more, TensorRef::Device::CUDA, 0),
          fmt::format("{} is bound to a tensor of {} dims; expected {}", what, rank + 1, rank));
      if (rank > 1) {
        std::vector<int64_t> less(rs.shape.begin(), rs.shape.end() - 1);
        fails_with(
            TensorRef::contiguous(fake, dtype, less, TensorRef::Device::CUDA, 0),
            fmt::format("{} is bound to a tensor of {} dims; expected {}", what, rank - 1, rank));
      }
      // A host tensor, and a tensor on another device.
      fails_with(TensorRef::contiguous(fake, dtype, rs.shape, TensorRef::Device::CPU, 0),
                 what + " is on cpu; the kernel runs on cuda:0");
      fails_with(TensorRef::contiguous(fake, dtype, rs.shape, TensorRef::Device::CUDA, 1),
                 what + " is on cuda:1; the kernel runs on cuda:0");
      // Null data with elements; strides that do not match the dims.
      fails_with(TensorRef::contiguous(nullptr, dtype, rs.shape, TensorRef::Device::CUDA, 0),
                 what + " has a null data pointer");
      TensorRef short_strides =
          TensorRef::contiguous(fake, dtype, rs.shape, TensorRef::Device::CUDA, 0);
      short_strides.strides.pop_back();
      fails_with(short_strides,
                 fmt::format("{}: the tensor has {} strides for {} dims", what, rank - 1, rank));
    }
  }
  // Param values of each type that the type cannot hold.
  const Mods mods = make_mods(DType::F32, 1, params);
  TensorRef buf = TensorRef::contiguous(fake, DType::F32, {11}, TensorRef::Device::CUDA, 0);
  auto param_fails = [&](std::vector<std::pair<std::string, double>> ps, const std::string& text) {
    INFO("expecting: " << text);
    CHECK_THROWS_WITH(runtime::pack_mod_params(mods, {{{"f32_r1", buf}}, std::move(ps)}, 0),
                      Catch::Contains(text));
  };
  param_fails({{"flip", 2}}, "param 'flip' is bool, but its value 2 is not 0 or 1");
  param_fails({{"flip", 0.5}}, "param 'flip' is bool, but its value 0.5 is not 0 or 1");
  param_fails({{"shift", 3e9}}, "param 'shift' is i32, but its value 3000000000 is not an integer");
  param_fails({{"shift", std::nan("")}}, "param 'shift' is i32");
  param_fails({{"alpha", 1}, {"alpha", 2}}, "param 'alpha' is given twice");
  CHECK_NOTHROW(runtime::pack_mod_params(
      mods, {{{"f32_r1", buf}}, {{"alpha", -0.5}, {"shift", -2147483648.0}, {"flip", 1}}}, 0));
}

TEST_CASE("loads of every buffer dtype and rank lower to strided 64-bit addressing and compile",
          "[buffers][codegen][nvrtc]") {
  const CaseParams params;
  test::register_reference_variant();
  jit::CacheSettings settings;
  settings.enabled = false;  // every compile is a real NVRTC compile
  KernelBuilder builder(settings);
  for (DType dtype : kBufferDTypes) {
    for (int rank = 1; rank <= 4; ++rank) {
      const Mods mods = lower_mods(make_mods(dtype, rank, params));
      const Buffer& buf = mods.buffers.front();
      INFO(buf.name());
      const std::string text = cuda::generate_mod_functions(mods);
      INFO(text);
      const std::string ptr = cuda::buffer_ptr_member(buf.name());
      const std::string stride = cuda::buffer_stride_member(buf.name());
      CHECK_THAT(text, Catch::Contains(fmt::format("fj_ld_{}(mp.{}, ", to_string(dtype), ptr)));
      CHECK_THAT(text, Catch::Contains(fmt::format("fj_i64 {}[{}];", stride, rank)));
      for (int d = 0; d < rank; ++d)
        CHECK_THAT(text, Catch::Contains(fmt::format(" * mp.{}[{}]", stride, d)));
      CHECK_THAT(text, Catch::Contains("param_alpha"));
      CHECK_THAT(text, Catch::Contains("param_shift"));
      CHECK_THAT(text, Catch::Contains("(mp.param_flip != 0)"));
      const BuiltKernel r =
          builder.build(mods, test::forward_desc("sm_80", DType::BF16, kD, kD, 1, "reference"));
      REQUIRE(r.compiled.kernel);
      CHECK(!r.compiled.kernel->cubin.empty());
    }
  }
  // One forward kernel loading from all five dtypes at rank 4.
  const Buffer f32("all_f32", DType::F32, {"H", "7", "5", "B"}),
      f16("all_f16", DType::F16, {"H", "7", "5", "B"}),
      bf16("all_bf16", DType::BF16, {"H", "7", "5", "B"}),
      i32("all_i32", DType::I32, {"H", "7", "5", "B"}),
      keep("all_bool", DType::Bool, {"H", "7", "5", "B"});
  const Mods all = Mods::from(
      [&](Expr s, Expr b, Expr h, Expr q, Expr kv) {
        const std::vector<Expr> i = rank_indices(4, b, h, q, kv, params.shift);
        return s * Expr(params.alpha) + f32(i) + f16(i) + bf16(i) + to_float(i32(i));
      },
      [&](Expr b, Expr h, Expr q, Expr kv) {
        return keep(rank_indices(4, b, h, q, kv, params.shift)) != Expr(params.flip);
      });
  const BuiltKernel k = builder.build(all, test::forward_desc("sm_80", DType::F16, kD, kD));
  REQUIRE(k.compiled.kernel);
  CHECK(!k.compiled.kernel->cubin.empty());
  for (const char* ld : {"fj_ld_f32(", "fj_ld_f16(", "fj_ld_bf16(", "fj_ld_i32(", "fj_ld_bool("})
    CHECK_THAT(k.source->source, Catch::Contains(ld));
}

TEST_CASE("the buffer cases index in range and their strided views read the same elements",
          "[buffers]") {
  // What the GPU test relies on, checked without a GPU: every index the mods form is in range
  // for the whole problem (the interpreter throws otherwise), the strided placement puts each
  // element where its strides say (a poisoned slot would change a value), and the mods are not
  // trivial (both mask outcomes and several score offsets occur).
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const CaseParams params;
  for (DType dtype : kBufferDTypes) {
    for (int rank = 1; rank <= 4; ++rank) {
      INFO(to_string(dtype) << " rank " << rank);
      const Mods mods = make_mods(dtype, rank, params);
      std::mt19937_64 rng_a(seed), rng_b(seed);
      const std::vector<BoundBuffer> contiguous = make_buffers(dtype, rank, false, rng_a);
      const std::vector<BoundBuffer> strided = make_buffers(dtype, rank, true, rng_b);
      auto env_of = [&](const std::vector<BoundBuffer>& bufs) {
        ir::EvalEnv env;
        for (const BoundBuffer& bb : bufs) {
          env.buffers[bb.name] = ir::BufferView{
              bb.storage.data() + bb.offset * dtype_size(bb.dtype), bb.dtype, bb.shape, bb.strides};
        }
        for (const auto& [name, value] : param_values(false))
          env.params[name] = value;
        return env;
      };
      ir::EvalEnv a = env_of(contiguous), b = env_of(strided);
      int64_t kept = 0, points = 0, mismatches = 0;
      std::set<float> offsets;
      for (int bi = 0; bi < kB; ++bi) {
        for (int h = 0; h < kH; ++h) {
          for (int q = 0; q < kSq; ++q) {
            for (int kv = 0; kv < kSkv; ++kv) {
              for (ir::EvalEnv* e : {&a, &b}) {
                e->b = bi, e->h = h, e->q_idx = q, e->kv_idx = kv, e->score = 0.25f;
              }
              const ir::ModsValue va = ir::evaluate_mods(mods, a);
              const ir::ModsValue vb = ir::evaluate_mods(mods, b);
              mismatches += va.keep != vb.keep || !(va.score == vb.score);
              kept += va.keep;
              ++points;
              if (offsets.size() < 8) offsets.insert(va.score);
            }
          }
        }
      }
      CHECK(mismatches == 0);
      // Not trivially masked. The i32 case's mask is a random document mask (a new document
      // with probability 1/12 per position): its kept fraction is about 18% with a 1st
      // percentile near 9%, so the bound sits well below that (2%; the diagonal alone is 1.1%).
      CHECK(kept > points / 50);
      CHECK(kept < points);
      CHECK(offsets.size() >= (dtype == DType::Bool ? 2u : 3u));  // bool: score ± 0.5
    }
  }
}
