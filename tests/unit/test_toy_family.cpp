// A kernel family added from this file alone ([family]): its id, its record (kernels/Family.h),
// one variant with a trivial template, and the registration lines. What proves "a family in one
// place": the kernel API (emit_kernel, compile_kernel, kernel_families, kernel_variants), the
// descriptions' text form, the public config's conversion and a tuning manifest's warm-up plan
// (what `flexjit tune --dry-run` lists) all take it without an edit anywhere else.
#include <flexjit/error.h>
#include <flexjit/kernel.h>

#include "kernels/Family.h"
#include "kernels/Registry.h"
#include "kernels/Variant.h"
#include "tune/Manifest.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <mutex>

using namespace flexjit;

namespace {

// The toy family: fills `n` floats with the config's fill_value.
constexpr kernels::Family kToyFill = kernels::external_family(0);

struct ToyFillInputs {
  float* out = nullptr;
  int64_t n = 0;
};

constexpr std::string_view kToyTemplate = R"(
extern "C" __global__ void flexjit_toy_fill(float* out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    out[i] = (float)FjToyConfig::kFillValue;
  }
}
)";

// The variant, of family F (kToyFill; a test also tries an id nobody registered).
template <kernels::Family F>
class ToyFill : public kernels::FamilyVariant<F, ToyFillInputs> {
 public:
  std::string_view name() const override { return "grid_stride"; }
  std::string_view summary() const override { return "a grid-stride loop, one float per thread"; }

  std::optional<std::string> unsupported(const kernels::KernelDesc& p,
                                         const kernels::InputFacts&) const override {
    if (p.dtype != DType::F32) {
      return fmt::format("toy_fill writes f32, not {}", to_string(p.dtype));
    }
    return std::nullopt;
  }
  void validate(const kernels::KernelDesc& d) const override {
    if (auto r = unsupported(d, {})) throw UnsupportedError(*r);
    kernels::require_keys(d, {"fill_value", "num_warps"});
    const int64_t warps = d.config.at("num_warps");
    if (warps != 1 && warps != 2 && warps != 4) {
      throw UnsupportedError(
          fmt::format("toy_fill/grid_stride takes num_warps 1, 2 or 4, not {}", warps));
    }
  }
  kernels::Params default_config(const kernels::KernelDesc&) const override {
    return {{"fill_value", 1}, {"num_warps", 4}};
  }
  std::vector<kernels::Params> config_space(const kernels::KernelDesc&) const override {
    return {{{"fill_value", 1}, {"num_warps", 1}},
            {{"fill_value", 1}, {"num_warps", 2}},
            {{"fill_value", 1}, {"num_warps", 4}}};
  }
  std::vector<kernels::TemplateText> templates() const override {
    std::vector<kernels::TemplateText> t = kernels::common_templates();
    t.push_back({"toy_fill.cuh", kToyTemplate});
    return t;
  }
  std::vector<std::string> entry_points() const override { return {"flexjit_toy_fill"}; }
  cuda::GeneratedSource generate(const Mods& mods, const kernels::KernelDesc& d) const override {
    validate(d);
    mods.check();
    const std::string config = fmt::format(
        "struct FjToyConfig {{\n  static constexpr int kFillValue = {}, kNumWarps = {};\n}};\n",
        d.config.at("fill_value"), d.config.at("num_warps"));
    return kernels::assemble_variant_source(*this, d, mods, config,
                                            "toy kernel `flexjit_toy_fill`");
  }
  unsigned smem_bytes(const kernels::KernelDesc&) const override { return 0; }
  std::vector<kernels::Launch> launches(const kernels::KernelDesc& d, const ToyFillInputs& in,
                                        void*) const override {
    kernels::Launch l;
    l.entry_point = "flexjit_toy_fill";
    l.grid = {static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(in.n / 128, 1024))), 1,
              1};
    l.block = {static_cast<unsigned>(32 * d.config.at("num_warps")), 1, 1};
    l.args.add(in.out);
    l.args.add(static_cast<long long>(in.n));
    std::vector<kernels::Launch> out;
    out.push_back(std::move(l));
    return out;
  }
};
using ToyFillGridStride = ToyFill<kToyFill>;

kernels::FamilyInfo toy_fill_family() {
  kernels::FamilyInfo f;
  f.family = kToyFill;
  f.name = "toy_fill";
  f.summary = "n floats set to a constant (a test family)";
  f.kind = "toy";
  f.config_keys = {kernels::num_warps_key(), {"fill_value", "the value written", 0, 1000}};
  f.problem = [](const KernelQuery& q, const cuda::Arch& arch) {
    kernels::KernelDesc d;
    d.family = kToyFill;
    d.arch = arch;
    d.dtype = q.dtype;
    d.head_dim_qk = d.head_dim_v = q.head_dim_qk;
    return d;
  };
  return f;
}

// The registration: one line for the family, one per variant.
void register_toy_family() {
  static std::once_flag once;
  std::call_once(once, [] {
    kernels::Families::global().add(toy_fill_family());
    kernels::Registry::global().add(std::make_unique<ToyFillGridStride>());
  });
}

KernelQuery toy_query() {
  KernelQuery q;
  q.family = "toy_fill";
  q.arch = "sm_80";
  q.dtype = DType::F32;
  q.head_dim_qk = 64;
  return q;
}

}  // namespace

TEST_CASE("a toy family registered from one file is a family everywhere", "[family]") {
  register_toy_family();
  // Its name in the text form, and descriptions that read back.
  CHECK(kernels::to_string(kToyFill) == "toy_fill");
  CHECK(kernels::parse_family("toy_fill") == kToyFill);
  const auto fams = kernels::all_families();
  CHECK(std::find(fams.begin(), fams.end(), kToyFill) != fams.end());

  // The public listings.
  const std::vector<KernelFamilyInfo> families = kernel_families();
  const auto it = std::find_if(families.begin(), families.end(),
                               [](const KernelFamilyInfo& f) { return f.name == "toy_fill"; });
  REQUIRE(it != families.end());
  CHECK(it->kind == "toy");
  CHECK_FALSE(it->math);
  REQUIRE(it->config_keys.size() == 2);
  CHECK(it->config_keys[1].name == "fill_value");
  const std::vector<KernelVariantInfo> variants = kernel_variants();
  CHECK(std::any_of(variants.begin(), variants.end(), [](const KernelVariantInfo& v) {
    return v.family == "toy_fill" && v.name == "grid_stride";
  }));

  // emit_kernel: the query's problem, the config from BlockConfig's field and params.
  KernelQuery q = toy_query();
  q.config.num_warps = 2;
  q.config.params["fill_value"] = 7;
  q.config.params["q_tiles"] = 2;  // another family's key: left to it
  const KernelSource src = emit_kernel(standard_mods("noop"), q);
  CHECK(src.description ==
        "toy_fill/grid_stride sm_80 f32 d=64/64 gqa=1 | fill_value=7 num_warps=2");
  CHECK(kernels::KernelDesc::parse(src.description).str() == src.description);
  CHECK(src.kernel_name == "flexjit_toy_fill");
  CHECK_THAT(src.source, Catch::Contains("kFillValue = 7, kNumWarps = 2"));
  CHECK_THAT(src.source, Catch::Contains("extern \"C\" __global__ void flexjit_toy_fill"));
  // The defaults when the caller sets nothing.
  CHECK_THAT(emit_kernel(standard_mods("noop"), toy_query()).description,
             Catch::EndsWith("| fill_value=1 num_warps=4"));
}

TEST_CASE("the toy family's record checks a query's math mode and config keys", "[family]") {
  register_toy_family();
  KernelQuery q = toy_query();
  q.math = MathMode::Approx;
  CHECK_THROWS_WITH(emit_kernel(standard_mods("noop"), q),
                    Catch::Contains("math mode 'approx' does not apply to the toy_fill kernel") &&
                        Catch::Contains("it applies to forward, backward_dkdv, backward_dq and "
                                        "decode_split"));
  q = toy_query();
  q.config.params["fill_value"] = 5000;
  CHECK_THROWS_WITH(emit_kernel(standard_mods("noop"), q),
                    Catch::Contains("config key fill_value = 5000 is out of range for toy_fill "
                                    "kernels: 0 to 1000"));
  q = toy_query();
  q.config.params["fill_valeu"] = 3;
  CHECK_THROWS_WITH(emit_kernel(standard_mods("noop"), q),
                    Catch::Contains("unknown config key 'fill_valeu' (did you mean "
                                    "'fill_value'?)") &&
                        Catch::Contains("num_splits"));
  q = toy_query();
  q.dtype = DType::BF16;
  CHECK_THROWS_WITH(emit_kernel(standard_mods("noop"), q),
                    Catch::Contains("toy_fill writes f32, not bf16"));
  // A second family of the same name or id is refused.
  CHECK_THROWS_WITH(kernels::Families::global().add(toy_fill_family()),
                    Catch::Contains("toy_fill (id 128) is registered already"));
  // A variant of a family nobody registered is refused.
  CHECK_THROWS_WITH(
      kernels::Registry::global().add(std::make_unique<ToyFill<kernels::external_family(1)>>()),
      Catch::Contains("cannot register kernel variant 'grid_stride': its family (id 129) is not "
                      "registered"));
}

TEST_CASE("a manifest workload of the toy family's kind warms its kernels", "[family][tune]") {
  register_toy_family();
  const tune::Manifest m = tune::parse_manifest(
      R"([{"name": "fill", "kind": "toy", "mods": "noop", "dtypes": ["f32"], "head_dims": [64],
           "shapes": [{"batch": 1, "heads": 1, "seqlen": 256}], "archs": ["sm_80"]}])",
      "toy.json", ".");
  REQUIRE(m.workloads.size() == 1);
  CHECK(tune::families_of_kind("toy") == std::vector<kernels::Family>{kToyFill});

  const tune::WarmPlan defaults = tune::plan_warmup(m, {}, /*all_configs=*/false);
  REQUIRE(defaults.kernels.size() == 1);
  CHECK(defaults.kernels[0].desc.str() ==
        "toy_fill/grid_stride sm_80 f32 d=64/64 gqa=1 | fill_value=1 num_warps=4");
  // With --all-configs, every candidate of config_space.
  const tune::WarmPlan all = tune::plan_warmup(m, {}, /*all_configs=*/true);
  CHECK(all.kernels.size() == 3);

  // The kinds a manifest takes are the registered ones.
  CHECK_THROWS_WITH(
      tune::parse_manifest(R"([{"kind": "toys", "mods": "noop",
                                "shapes": [{"batch": 1, "heads": 1, "seqlen": 64}]}])",
                           "toy.json", "."),
      Catch::Contains("kind 'toys' is not one of forward, backward, decode, toy (did you mean "
                      "'toy'?)"));
}

TEST_CASE("the toy family's kernel compiles with NVRTC", "[family][nvrtc]") {
  register_toy_family();
  KernelQuery q = toy_query();
  q.config.params["fill_value"] = 3;
  const KernelBinary bin = compile_kernel(standard_mods("noop"), q);
  CHECK_FALSE(bin.cubin.empty());
  CHECK(bin.source.kernel_name == "flexjit_toy_fill");
}
