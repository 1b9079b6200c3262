#include "gpu/GpuTestUtil.h"

#include <flexjit/error.h>

#include "ir/Evaluate.h"
#include "kernels/Registry.h"
#include "runtime/Device.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace flexjit::test {

Context* gpu_context(std::string* reason) {
  if (!runtime::cuda_available(reason)) return nullptr;
  static std::unique_ptr<Context> ctx = std::make_unique<Context>();
  return ctx.get();
}

ContextOptions cache_in(const std::filesystem::path& dir) {
  ContextOptions o;
  o.cache_dir = dir.string();
  return o;
}

uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

std::vector<char> HostTensor::bytes() const {
  std::vector<char> b(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::F32) {
      std::memcpy(b.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t bits = dtype == DType::BF16 ? ir::float_to_bf16_bits(values[i])
                                                 : ir::float_to_f16_bits(values[i]);
      std::memcpy(b.data() + 2 * i, &bits, 2);
    }
  }
  return b;
}

namespace {
float round_to(DType d, float v) {
  if (d == DType::BF16) return ir::bf16_bits_to_float(ir::float_to_bf16_bits(v));
  if (d == DType::F16) return ir::f16_bits_to_float(ir::float_to_f16_bits(v));
  return v;
}
}  // namespace

HostTensor random_tensor(std::mt19937_64& rng, DType dtype, std::vector<int64_t> shape,
                         float stddev) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : t.shape)
    n *= d;
  std::normal_distribution<float> dist(0.0f, stddev);
  t.values.resize(static_cast<size_t>(n));
  for (float& x : t.values)
    x = round_to(dtype, dist(rng));
  return t;
}

DeviceTensor upload(Context& ctx, const HostTensor& t) {
  const std::vector<char> b = t.bytes();
  return DeviceTensor::from_host(ctx, t.dtype, t.shape, b.data());
}

DeviceTensor upload_f32(Context& ctx, const HostTensor& t) {
  return DeviceTensor::from_host(ctx, DType::F32, t.shape, t.values.data());
}

std::vector<float> download(const DeviceTensor& t) {
  const int64_t n = t.ref().numel();
  std::vector<float> out(static_cast<size_t>(n));
  if (n == 0) return out;
  if (t.ref().dtype == DType::F32) {
    t.copy_to_host(out.data());
    return out;
  }
  FJ_ASSERT(t.ref().dtype == DType::BF16 || t.ref().dtype == DType::F16, "download of a non-float");
  const std::vector<uint16_t> bits = t.to_host<uint16_t>();
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = t.ref().dtype == DType::BF16 ? ir::bf16_bits_to_float(bits[i])
                                          : ir::f16_bits_to_float(bits[i]);
  }
  return out;
}

std::string ErrorStats::str() const {
  return fmt::format(
      "rel {:.3e}, max |err| {:.3e} at {}, {} non-finite, |ref| {:.3e}, |out| {:.3e}", rel, max_abs,
      max_index, nonfinite, ref_norm, out_norm);
}

template <typename R>
ErrorStats compare(const std::vector<float>& out, const std::vector<R>& ref) {
  ErrorStats s;
  FJ_ASSERT(out.size() == ref.size(), "compare of different sizes");
  double num = 0, den = 0, on = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double r = static_cast<double>(ref[i]), o = out[i];
    if (!std::isfinite(r)) continue;
    if (!std::isfinite(o)) {
      ++s.nonfinite;
      continue;
    }
    const double e = std::abs(o - r);
    num += e * e;
    den += r * r;
    on += o * o;
    if (e > s.max_abs) {
      s.max_abs = e;
      s.max_index = static_cast<int64_t>(i);
    }
  }
  s.ref_norm = std::sqrt(den);
  s.out_norm = std::sqrt(on);
  s.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return s;
}

template ErrorStats compare<float>(const std::vector<float>&, const std::vector<float>&);
template ErrorStats compare<double>(const std::vector<float>&, const std::vector<double>&);

// The error rule: bf16 1e-2, fp16 3e-3, fp32 inputs (tf32 tensor cores) 1e-3.
double tolerance(DType dtype) {
  if (dtype == DType::F32) return 1e-3;
  return dtype == DType::F16 ? 3e-3 : 1e-2;
}

std::vector<std::string> forward_families(Context& ctx) {
  if (ctx.arch() != "sm_90a") return {"auto"};
  // Were the sm_90a family experimental again, it would be tested only where it is enabled
  // (FLEXJIT_ENABLE_VARIANTS), so that the default suite does not depend on an unverified kernel.
  const kernels::Registry& reg = kernels::Registry::global();
  const kernels::Variant* v = reg.find(kernels::Family::Forward, "sm90a_wgmma");
  const std::vector<std::string> enabled = reg.enabled();
  const bool on =
      v != nullptr && (!v->experimental() || std::find(enabled.begin(), enabled.end(),
                                                       "forward/sm90a_wgmma") != enabled.end());
  if (!on) return {"auto"};
  return {"sm90a_wgmma", "sm80_mma"};
}

ForwardFamilyScope::ForwardFamilyScope(const std::string& family)
    : saved_excluded_(kernels::Registry::global().excluded()),
      saved_enabled_(kernels::Registry::global().enabled()) {
  kernels::Registry& reg = kernels::Registry::global();
  if (family == "sm80_mma") {
    std::vector<std::string> excluded = saved_excluded_;
    excluded.push_back("forward/sm90a_wgmma");
    reg.set_excluded(excluded);
  } else if (family == "sm90a_wgmma") {
    std::vector<std::string> enabled = saved_enabled_;
    enabled.push_back("forward/sm90a_wgmma");
    reg.set_enabled(enabled);
  }
}

ForwardFamilyScope::~ForwardFamilyScope() {
  kernels::Registry::global().set_excluded(saved_excluded_);
  kernels::Registry::global().set_enabled(saved_enabled_);
}

}  // namespace flexjit::test
