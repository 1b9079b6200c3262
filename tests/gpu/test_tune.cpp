// Autotuning on the GPU ([gpu][tune]): a search stores a winner that a cached call then uses
// without timing, the tuned output matches the default's, and a candidate that computes a
// wrong result is rejected. Small shapes and config spaces bounded by the caller's fixed
// values keep the whole file to a few seconds of compiles on a 16-core machine.
#include <flexjit/attention.h>
#include <flexjit/block_mask.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>

#include "gpu/GpuTestUtil.h"
#include "kernels/Registry.h"
#include "kernels/forward/Sm80Mma.h"
#include "runtime/ForwardPlan.h"
#include "support/CacheTest.h"
#include "tune/StepTuner.h"
#include "tune/TuningStore.h"

#include <catch2/catch.hpp>

#include <mutex>

using namespace flexjit;
using namespace flexjit::test;
using kernels::Params;

namespace {

struct Inputs {
  DeviceTensor q, k, v;
};

Inputs make_inputs(Context& ctx, std::mt19937_64& rng, int s, int d) {
  Inputs in;
  in.q = upload(ctx, random_tensor(rng, DType::BF16, {1, 2, s, d}));
  in.k = upload(ctx, random_tensor(rng, DType::BF16, {1, 2, s, d}));
  in.v = upload(ctx, random_tensor(rng, DType::BF16, {1, 2, s, d}));
  return in;
}

// forward/sm80_mma with a config space of two: its default, and one config whose launches pass
// twice the softmax scale (a config that computes wrong, as a tile bug would).
class WrongConfigProbe : public kernels::ForwardSm80Mma {
 public:
  static Params bad() {
    return {{"block_m", 64}, {"block_n", 64}, {"num_stages", 2}, {"num_warps", 4}};
  }
  std::string_view name() const override { return "tune_probe"; }
  bool auto_select() const override { return false; }
  std::vector<Params> config_space(const kernels::KernelDesc& p) const override {
    return {default_config(p), bad()};
  }
  std::vector<kernels::Launch> launches(const kernels::KernelDesc& desc,
                                        const kernels::ForwardInputs& in, void* ws) const override {
    if (!(desc.config == bad())) return ForwardSm80Mma::launches(desc, in, ws);
    kernels::ForwardInputs wrong = in;
    wrong.scale = 2.0f / std::sqrt(static_cast<float>(desc.head_dim_qk));
    return ForwardSm80Mma::launches(desc, wrong, ws);
  }
};

std::vector<tune::TuningRecord> records_in(const fs::path& dir) {
  return tune::TuningStore::for_cache_dir(dir).records();
}

}  // namespace

TEST_CASE("search stores a winner; a cached call uses it without timing", "[gpu][tune]") {
  FJ_REQUIRE_GPU_OR_SKIP(shared);
  (void)shared;
  TempDir dir;
  Context ctx(cache_in(dir.path()));
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const Inputs in = make_inputs(ctx, rng, 384, 64);

  AttentionOptions o;
  o.mods = standard_mods("causal");
  o.config.num_warps = 4;  // fixed by the caller: the tuner varies block_m and block_n only
  o.config.num_stages = 2;
  o.autotune = AutotuneMode::Off;
  const AttentionResult base = flex_attention(ctx, in.q, in.k, in.v, o);

  ScopedEnv print("FLEXJIT_PRINT_AUTOTUNING", "1");
  const uint64_t searches = tune::search_count();
  o.autotune = AutotuneMode::Search;
  const AttentionResult tuned = flex_attention(ctx, in.q, in.k, in.v, o);
  ctx.synchronize();
  CHECK(tune::search_count() == searches + 1);

  const std::vector<tune::TuningRecord> recs = records_in(dir.path());
  REQUIRE(recs.size() == 1);
  const tune::TuningRecord& r = recs[0];
  CHECK(r.key.device.name == ctx.device_name());
  CHECK(r.key.bucket == "q512 kv512 masknone");
  CHECK(r.config.at("num_warps") == 4);
  CHECK(r.config.at("num_stages") == 2);
  CHECK(r.candidates.size() >= 3);
  int timed = 0;
  for (const tune::CandidateTiming& c : r.candidates) {
    INFO(c.config.str() << ": " << c.status);
    CHECK(c.config.at("num_warps") == 4);
    if (c.status == "ok") {
      CHECK(c.median_ms > 0);
      CHECK(c.median_ms >= r.time_ms);  // the winner is the fastest
      ++timed;
    }
  }
  CHECK(timed >= 2);
  CHECK(fs::exists(dir.path() / "tuning.json"));

  // The winner computes what the defaults compute.
  const ErrorStats e = compare(download(tuned.out), download(base.out));
  INFO(e.str());
  CHECK(e.rel < tolerance(DType::BF16));
  CHECK(e.nonfinite == 0);

  // Cached (and search again): the stored winner, no timing.
  o.autotune = AutotuneMode::Cached;
  const std::string plan = runtime::describe_forward_plan(ctx, in.q, in.k, in.v, o);
  CHECK_THAT(plan, Catch::Contains("| " + r.config.str()));
  const AttentionResult cached = flex_attention(ctx, in.q, in.k, in.v, o);
  o.autotune = AutotuneMode::Search;
  flex_attention(ctx, in.q, in.k, in.v, o);
  ctx.synchronize();
  CHECK(tune::search_count() == searches + 1);
  CHECK(compare(download(cached.out), download(tuned.out)).max_abs == 0);

  // The caller's explicit config still wins over the tuned one.
  o.config.block_m = r.config.at("block_m") == 64 ? 128 : 64;
  CHECK_THAT(runtime::describe_forward_plan(ctx, in.q, in.k, in.v, o),
             Catch::Contains("block_m=" + std::to_string(o.config.block_m)));
}

TEST_CASE("a candidate config whose output differs from the default's is rejected", "[gpu][tune]") {
  FJ_REQUIRE_GPU_OR_SKIP(shared);
  (void)shared;
  static std::once_flag once;
  std::call_once(once,
                 [] { kernels::Registry::global().add(std::make_unique<WrongConfigProbe>()); });
  TempDir dir;
  Context ctx(cache_in(dir.path()));
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const Inputs in = make_inputs(ctx, rng, 256, 64);

  AttentionOptions o;
  o.mods = standard_mods("noop");
  o.variant = "tune_probe";
  o.return_lse = true;
  o.autotune = AutotuneMode::Search;
  const AttentionResult tuned = flex_attention(ctx, in.q, in.k, in.v, o);
  o.autotune = AutotuneMode::Off;
  const AttentionResult base = flex_attention(ctx, in.q, in.k, in.v, o);
  ctx.synchronize();

  const std::vector<tune::TuningRecord> recs = records_in(dir.path());
  REQUIRE(recs.size() == 1);
  const tune::TuningRecord& r = recs[0];
  REQUIRE(r.candidates.size() == 2);
  CHECK(r.candidates[0].config == r.default_config);
  CHECK(r.candidates[1].config == WrongConfigProbe::bad());
  CHECK_THAT(r.candidates[1].status, Catch::StartsWith("wrong output"));
  CHECK(r.candidates[1].median_ms < 0);
  CHECK(r.config == r.default_config);
  CHECK(compare(download(tuned.out), download(base.out)).max_abs == 0);
}

TEST_CASE("create_block_mask is tuned under FLEXJIT_AUTOTUNE=search, arrays unchanged",
          "[gpu][tune]") {
  FJ_REQUIRE_GPU_OR_SKIP(shared);
  (void)shared;
  TempDir dir;
  Context ctx(cache_in(dir.path()));
  // sliding_window leaves tiles undecided on the host, so the classify kernel (tuned) runs.
  const Mods mods = standard_mods("sliding_window");
  const BlockMask base = [&] {
    ScopedEnv off("FLEXJIT_AUTOTUNE", "off");
    return create_block_mask(ctx, mods, 1, 2, 1024, 1024, 128).to_host();
  }();
  ScopedEnv search("FLEXJIT_AUTOTUNE", "search");
  const BlockMask tuned = create_block_mask(ctx, mods, 1, 2, 1024, 1024, 128).to_host();
  const std::vector<tune::TuningRecord> recs = records_in(dir.path());
  REQUIRE(recs.size() == 1);
  CHECK_THAT(recs[0].key.kernel, Catch::StartsWith("block_mask/warp_per_tile"));
  CHECK(recs[0].key.bucket == "q1024 kv1024 masknone");
  CHECK(recs[0].candidates.size() == 3);  // num_warps 4, 8, 16
  for (const tune::CandidateTiming& c : recs[0].candidates) {
    INFO(c.config.str() << ": " << c.status);
    CHECK(c.status == "ok");
  }
  CHECK(tuned.kv_num_blocks == base.kv_num_blocks);
  CHECK(tuned.kv_indices == base.kv_indices);
  CHECK(tuned.full_kv_num_blocks == base.full_kv_num_blocks);
  CHECK(tuned.q_num_blocks == base.q_num_blocks);
  CHECK(tuned.q_indices == base.q_indices);
}
