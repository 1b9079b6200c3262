// Helpers for the GPU tests: a shared Context, skipping without a GPU, random inputs rounded
// to their dtype, poisoned outputs and error statistics against a reference.
#pragma once

#include <flexjit/context.h>
#include <flexjit/device_tensor.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace flexjit::test {

// The process-wide test context, or null when there is no GPU (then *reason says why).
Context* gpu_context(std::string* reason);

// Returns from the test case with "skipped: no GPU (...)" when there is no GPU.
#define FJ_REQUIRE_GPU_OR_SKIP(ctx_var)                                         \
  std::string fj_skip_reason_;                                                  \
  ::flexjit::Context* ctx_var = ::flexjit::test::gpu_context(&fj_skip_reason_); \
  if (ctx_var == nullptr) {                                                     \
    WARN("skipped: no GPU (" << fj_skip_reason_ << ")");                        \
    return;                                                                     \
  }

// A fresh seed per run (std::random_device); print it on failure with INFO / CAPTURE.
uint64_t fresh_seed();

// Values of a tensor as f32, already rounded to `dtype` (so the reference sees exactly what the
// GPU reads), and the raw element bytes for upload.
struct HostTensor {
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  std::vector<float> values;
  std::vector<char> bytes() const;
};

HostTensor random_tensor(std::mt19937_64& rng, DType dtype, std::vector<int64_t> shape,
                         float stddev = 1.0f);
DeviceTensor upload(Context& ctx, const HostTensor& t);
// The same values as an f32 device tensor (input of the fp32 GPU reference).
DeviceTensor upload_f32(Context& ctx, const HostTensor& t);
// All elements of a device tensor as float (f16 / bf16 converted).
std::vector<float> download(const DeviceTensor& t);

// How far `out` is from `ref`: ‖out − ref‖ / ‖ref‖ over finite reference elements, the worst
// element, and the number of positions where out is NaN / Inf but ref is finite.
struct ErrorStats {
  double rel = 0, max_abs = 0;
  int64_t max_index = -1;
  int64_t nonfinite = 0;
  double ref_norm = 0, out_norm = 0;
  std::string str() const;
};
template <typename R>
ErrorStats compare(const std::vector<float>& out, const std::vector<R>& ref);

// How far an LSE is from the reference's: the rows where one is -inf and the other not (or the
// kernel's is NaN), and the worst |lse - ref| / max(1, |ref|) over the other finite rows.
struct LseStats {
  double max_err = 0;
  int64_t mismatched_inf = 0;
};
LseStats compare_lse(const std::vector<float>& lse, const std::vector<double>& ref);

// Options of a Context whose kernel and tuning caches live in `dir` (a test::TempDir's path).
ContextOptions cache_in(const std::filesystem::path& dir);

// The line of a plan's text (runtime::describe_*_plan) whose step is of `family` ("forward",
// "backward_dkdv", ...), or a line saying there is none.
std::string step_line(const std::string& plan, const std::string& family);

// The tolerance on ErrorStats::rel for a dtype: 1e-2 bf16, 3e-3 f16.
double tolerance(DType dtype);

// The kernel families the GPU suite runs against on this device: on sm_90a, "sm90a_wgmma" (the
// sm_90a variants selected where they apply, sm80_mma elsewhere) and "sm80_mma" (the sm_90a
// variants excluded); otherwise "auto" (flexjit's own selection). An experimental sm_90a variant
// is tested only where FLEXJIT_ENABLE_VARIANTS lists it, so that the default suite does not
// depend on an unverified kernel. Tests parametrize over them:
//   const std::string family = GENERATE_COPY(from_range(test::forward_families(*ctx)));
//   test::ForwardFamilyScope scope(family);
// forward: forward/sm90a_wgmma; backward: backward_dkdv/sm90a_wgmma and backward_dq/sm90a_wgmma
// (either enabled runs the "sm90a_wgmma" family, whose scope enables both).
std::vector<std::string> forward_families(Context& ctx);
std::vector<std::string> backward_families(Context& ctx);
// Whether the sm90a_wgmma family is among forward_families(ctx), where the tests of the sm_90a
// kernels' own configs run; otherwise a warning says they are skipped and names the arch.
bool sm90a_wgmma_selectable(Context& ctx);

// Steers automatic selection for one family of a test (see above) and restores it.
class FamilyScope {
 public:
  // `sm90_variants`: the family/variant names the "sm90a_wgmma" family enables and the
  // "sm80_mma" family excludes.
  FamilyScope(const std::string& family, const std::vector<std::string>& sm90_variants);
  ~FamilyScope();
  FamilyScope(const FamilyScope&) = delete;
  FamilyScope& operator=(const FamilyScope&) = delete;

 private:
  std::vector<std::string> saved_excluded_, saved_enabled_;
};
class ForwardFamilyScope : public FamilyScope {
 public:
  explicit ForwardFamilyScope(const std::string& family);
};
class BackwardFamilyScope : public FamilyScope {
 public:
  explicit BackwardFamilyScope(const std::string& family);
};

}  // namespace flexjit::test
