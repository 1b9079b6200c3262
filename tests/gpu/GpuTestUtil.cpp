#include "gpu/GpuTestUtil.h"

#include <flexjit/error.h>

#include "device/Device.h"
#include "ir/Evaluate.h"
#include "kernels/Registry.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

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

LseStats compare_lse(const std::vector<float>& lse, const std::vector<double>& ref) {
  FJ_ASSERT(lse.size() == ref.size(), "compare_lse of different sizes");
  LseStats s;
  for (size_t i = 0; i < ref.size(); ++i) {
    const bool ref_inf = std::isinf(ref[i]) && ref[i] < 0;
    const bool out_inf = std::isinf(lse[i]) && lse[i] < 0;
    if (ref_inf != out_inf || std::isnan(lse[i])) {
      ++s.mismatched_inf;
    } else if (!ref_inf && std::isfinite(ref[i])) {
      s.max_err = std::max(s.max_err, std::abs(lse[i] - ref[i]) / std::max(1.0, std::abs(ref[i])));
    }
  }
  return s;
}

// The error rule: bf16 1e-2, fp16 3e-3, fp32 inputs (tf32 tensor cores) 1e-3.
std::string step_line(const std::string& plan, const std::string& family) {
  size_t at = 0;
  while (at < plan.size()) {
    size_t end = plan.find('\n', at);
    if (end == std::string::npos) end = plan.size();
    const std::string line = plan.substr(at, end - at);
    if (line.find(family + "/") != std::string::npos) return line;
    at = end + 1;
  }
  return "(no " + family + " step in: " + plan + ")";
}

double tolerance(DType dtype) {
  if (dtype == DType::F32) return 1e-3;
  return dtype == DType::F16 ? 3e-3 : 1e-2;
}

namespace {

const std::vector<std::string> kForwardSm90 = {"forward/sm90a_wgmma"};
const std::vector<std::string> kBackwardSm90 = {"backward_dkdv/sm90a_wgmma",
                                                "backward_dq/sm90a_wgmma"};

// {"sm90a_wgmma", "sm80_mma"} on sm_90a where one of `names` is registered and selectable (not
// experimental, or enabled); otherwise {"auto"}.
std::vector<std::string> families_of(Context& ctx, const std::vector<std::string>& names) {
  if (ctx.arch() != "sm_90a") return {"auto"};
  const kernels::Registry& reg = kernels::Registry::global();
  const std::vector<std::string> enabled = reg.enabled();
  for (const kernels::Variant* v : reg.all()) {
    const std::string name = fmt::format("{}/{}", kernels::to_string(v->family()), v->name());
    if (std::find(names.begin(), names.end(), name) == names.end()) continue;
    if (!v->experimental() || std::find(enabled.begin(), enabled.end(), name) != enabled.end())
      return {"sm90a_wgmma", "sm80_mma"};
  }
  return {"auto"};
}

}  // namespace

std::vector<std::string> forward_families(Context& ctx) {
  return families_of(ctx, kForwardSm90);
}

std::vector<std::string> backward_families(Context& ctx) {
  return families_of(ctx, kBackwardSm90);
}

bool sm90a_wgmma_selectable(Context& ctx) {
  const std::vector<std::string> families = forward_families(ctx);
  if (std::find(families.begin(), families.end(), "sm90a_wgmma") != families.end()) return true;
  WARN("skipped: the sm90a_wgmma variants are not selectable here (" << ctx.arch() << ")");
  return false;
}

FamilyScope::FamilyScope(const std::string& family, const std::vector<std::string>& sm90_variants)
    : saved_excluded_(kernels::Registry::global().excluded()),
      saved_enabled_(kernels::Registry::global().enabled()) {
  kernels::Registry& reg = kernels::Registry::global();
  if (family == "sm80_mma") {
    std::vector<std::string> excluded = saved_excluded_;
    excluded.insert(excluded.end(), sm90_variants.begin(), sm90_variants.end());
    reg.set_excluded(excluded);
  } else if (family == "sm90a_wgmma") {
    std::vector<std::string> enabled = saved_enabled_;
    enabled.insert(enabled.end(), sm90_variants.begin(), sm90_variants.end());
    reg.set_enabled(enabled);
  }
}

FamilyScope::~FamilyScope() {
  kernels::Registry::global().set_excluded(saved_excluded_);
  kernels::Registry::global().set_enabled(saved_enabled_);
}

ForwardFamilyScope::ForwardFamilyScope(const std::string& family)
    : FamilyScope(family, kForwardSm90) {}

BackwardFamilyScope::BackwardFamilyScope(const std::string& family)
    : FamilyScope(family, kBackwardSm90) {}

}  // namespace flexjit::test
