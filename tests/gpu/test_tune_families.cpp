// Tuning the backward and decoding plans on the GPU ([gpu][tune]): a search stores the winners of
// the dK/dV and dQ steps (the buffer gradients, added with atomics, start from zero for every
// candidate run: none is rejected for a wrong sum) and of the decode split and combine steps
// (split counts compared through the combine); the tuned results equal the defaults'; a second
// call does not search; a warmed manifest's backward and decode calls compile nothing. Caller-
// fixed values bound the config spaces so the file stays at a few seconds of compiles on a
// 16-core machine.
#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>

#include "Pipeline.h"
#include "device/Device.h"
#include "device/Timer.h"
#include "gpu/GpuTestUtil.h"
#include "jit/Nvrtc.h"
#include "runtime/BackwardPlan.h"
#include "runtime/ForwardPlan.h"
#include "support/CacheTest.h"
#include "tune/Manifest.h"
#include "tune/StepTuner.h"
#include "tune/TuningStore.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <tuple>

using namespace flexjit;
using namespace flexjit::test;

namespace {

std::vector<tune::TuningRecord> records_in(const fs::path& dir) {
  return tune::TuningStore::for_cache_dir(dir).records();
}

const tune::TuningRecord* record_of(const std::vector<tune::TuningRecord>& recs,
                                    const std::string& kernel_prefix) {
  for (const tune::TuningRecord& r : recs) {
    if (r.key.kernel.rfind(kernel_prefix, 0) == 0) return &r;
  }
  return nullptr;
}

// Every candidate ran and matched the default (a wrong sum would read "wrong output ...").
void check_all_ok(const tune::TuningRecord& r) {
  INFO(r.key.str());
  CHECK(r.candidates.size() >= 2);
  for (const tune::CandidateTiming& c : r.candidates) {
    INFO(c.config.str() << ": " << c.status);
    CHECK(c.status == "ok");
    CHECK(c.median_ms > 0);
    CHECK(c.median_ms >= r.time_ms);  // the winner is the fastest
  }
}

DeviceTensor slopes_tensor(Context& ctx, int heads) {
  std::vector<float> s(static_cast<size_t>(heads));
  for (int h = 0; h < heads; ++h)
    s[static_cast<size_t>(h)] = std::exp2(-8.0f * static_cast<float>(h + 1) / heads);
  return DeviceTensor::from_host(ctx, DType::F32, {heads}, s.data());
}

struct BackwardCase {
  DeviceTensor q, k, v, dout, slopes;
  DeviceBlockMask mask;
  AttentionOptions o;
  AttentionResult fwd;
};

// alibi_causal (a float buffer: its gradient is added with atomics) with its block mask, B=1
// H=2 S=256 D=64 bf16; the forward's out and lse untuned.
void make_backward_case(Context& ctx, std::mt19937_64& rng, BackwardCase& c) {
  const int S = 256, D = 64, H = 2;
  c.q = upload(ctx, random_tensor(rng, DType::BF16, {1, H, S, D}));
  c.k = upload(ctx, random_tensor(rng, DType::BF16, {1, H, S, D}));
  c.v = upload(ctx, random_tensor(rng, DType::BF16, {1, H, S, D}));
  c.dout = upload(ctx, random_tensor(rng, DType::BF16, {1, H, S, D}));
  c.slopes = slopes_tensor(ctx, H);
  c.o.mods = standard_mods("alibi_causal");
  c.o.bindings.buffers = {{"slopes", c.slopes.ref()}};
  c.mask = create_block_mask(ctx, c.o.mods, 1, 1, S, S, 128, c.o.bindings);
  c.o.block_mask = &c.mask;
  c.o.return_lse = true;
  c.o.autotune = AutotuneMode::Off;
  c.fwd = flex_attention(ctx, c.q, c.k, c.v, c.o);
}

void check_same_gradients(const BackwardResult& tuned, const BackwardResult& base) {
  for (auto [t, b, what] :
       {std::tuple{&tuned.dq, &base.dq, "dq"}, std::tuple{&tuned.dk, &base.dk, "dk"},
        std::tuple{&tuned.dv, &base.dv, "dv"}}) {
    const ErrorStats e = compare(download(*t), download(*b));
    INFO(what << ": " << e.str());
    CHECK(e.rel < tolerance(DType::BF16));
    CHECK(e.nonfinite == 0);
  }
  REQUIRE(tuned.buffer_grads.size() == 1);
  REQUIRE(base.buffer_grads.size() == 1);
  // Not a sum of the candidates' runs: the tuned call's slopes gradient is the default's.
  const ErrorStats e =
      compare(download(tuned.buffer_grads[0].second), download(base.buffer_grads[0].second));
  INFO("slopes gradient: " << e.str());
  CHECK(e.rel < 1e-3);
}

}  // namespace

TEST_CASE("backward: search tunes dK/dV and dQ; gradients and buffer gradients match",
          "[gpu][tune][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(shared);
  (void)shared;
  // The mma.sync variants (the sm_90a default is sm90a_wgmma): their config space has the
  // num_stages = 1 and dQ-by-atomics configs these searches fix.
  test::BackwardFamilyScope family_scope("sm80_mma");
  ScopedEnv env_off("FLEXJIT_AUTOTUNE", "off");  // create_block_mask: not tuned here
  TempDir dir;
  Context ctx(cache_in(dir.path()));
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  BackwardCase c;
  make_backward_case(ctx, rng, c);
  AttentionOptions o = c.o;
  o.config.num_stages = 1;  // fixed by the caller: the tuner varies the tiles and warps
  const BackwardResult base =
      flex_attention_backward(ctx, c.q, c.k, c.v, c.fwd.out, c.fwd.lse, c.dout, o);

  ScopedEnv print("FLEXJIT_PRINT_AUTOTUNING", "1");
  const uint64_t searches = tune::search_count();
  o.autotune = AutotuneMode::Search;
  const BackwardResult tuned =
      flex_attention_backward(ctx, c.q, c.k, c.v, c.fwd.out, c.fwd.lse, c.dout, o);
  ctx.synchronize();
  CHECK(tune::search_count() == searches + 2);  // dK/dV and dQ; the preprocess has one config

  const std::vector<tune::TuningRecord> recs = records_in(dir.path());
  CHECK(recs.size() == 2);
  const tune::TuningRecord* dkdv = record_of(recs, "backward_dkdv/sm80_mma");
  const tune::TuningRecord* dq = record_of(recs, "backward_dq/sm80_mma");
  REQUIRE(dkdv != nullptr);
  REQUIRE(dq != nullptr);
  CHECK(dkdv->key.bucket == "q256 kv256 mask128x128");
  CHECK(dkdv->key.fixed == "dq_atomic=0 num_stages=1");  // the plan's dQ strategy, the caller's
  CHECK(dq->key.fixed == "num_stages=1");
  check_all_ok(*dkdv);
  check_all_ok(*dq);
  CHECK(dkdv->config.at("num_stages") == 1);
  CHECK(dkdv->config.at("dq_atomic") == 0);
  check_same_gradients(tuned, base);

  // Again (search and cached): the stored winners, no timing, the same gradients.
  const BackwardResult again =
      flex_attention_backward(ctx, c.q, c.k, c.v, c.fwd.out, c.fwd.lse, c.dout, o);
  o.autotune = AutotuneMode::Cached;
  const BackwardResult cached =
      flex_attention_backward(ctx, c.q, c.k, c.v, c.fwd.out, c.fwd.lse, c.dout, o);
  ctx.synchronize();
  CHECK(tune::search_count() == searches + 2);
  CHECK(compare(download(cached.dq), download(tuned.dq)).max_abs == 0);
  CHECK(compare(download(again.dk), download(tuned.dk)).max_abs == 0);
  check_same_gradients(again, base);
}

TEST_CASE("backward: with dQ by atomics, the dK/dV search keeps the strategy",
          "[gpu][tune][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(shared);
  (void)shared;
  // The mma.sync variants (the sm_90a default is sm90a_wgmma): their config space has the
  // num_stages = 1 and dQ-by-atomics configs these searches fix.
  test::BackwardFamilyScope family_scope("sm80_mma");
  ScopedEnv env_off("FLEXJIT_AUTOTUNE", "off");  // create_block_mask: not tuned here
  TempDir dir;
  Context ctx(cache_in(dir.path()));
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  BackwardCase c;
  make_backward_case(ctx, rng, c);
  AttentionOptions o = c.o;
  o.config.num_stages = 1;
  BackwardOptions atomic;
  atomic.dq_mode = BackwardOptions::DqMode::Atomic;
  const BackwardResult base =
      flex_attention_backward(ctx, c.q, c.k, c.v, c.fwd.out, c.fwd.lse, c.dout, o, atomic);
  const uint64_t searches = tune::search_count();
  o.autotune = AutotuneMode::Search;
  const BackwardResult tuned =
      flex_attention_backward(ctx, c.q, c.k, c.v, c.fwd.out, c.fwd.lse, c.dout, o, atomic);
  ctx.synchronize();
  CHECK(tune::search_count() == searches + 1);  // the dQ convert has one config
  const std::vector<tune::TuningRecord> recs = records_in(dir.path());
  REQUIRE(recs.size() == 1);
  CHECK_THAT(recs[0].key.kernel, Catch::StartsWith("backward_dkdv/sm80_mma"));
  CHECK(recs[0].key.fixed == "dq_atomic=1 num_stages=1");
  for (const tune::CandidateTiming& t : recs[0].candidates) {
    INFO(t.config.str() << ": " << t.status);
    CHECK(t.config.at("dq_atomic") == 1);
    CHECK(t.status == "ok");
  }
  check_same_gradients(tuned, base);
}

TEST_CASE("backward: search and a second pass keep the arch's default dK/dV and dQ variants",
          "[gpu][tune][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(shared);
  // No family scope: the variants the registry picks for this GPU. The tuned plan once carried
  // the dQ strategy as dq_atomic = 0 into the dK/dV overrides, a key sm90a_wgmma does not have,
  // so the search and the plan ran sm80_mma's dK/dV on sm_90a, 27-73 % slower (docs/tuning.md
  // "Measured"); so did BackwardOptions::DqMode::SecondPass.
  const bool hopper = shared->arch() == "sm_90a";
  const std::string want = hopper ? "sm90a_wgmma" : "sm80_mma";
  ScopedEnv env_off("FLEXJIT_AUTOTUNE", "off");  // create_block_mask: not tuned here
  TempDir dir;
  Context ctx(cache_in(dir.path()));
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  BackwardCase c;
  make_backward_case(ctx, rng, c);
  AttentionOptions o = c.o;
  const BackwardResult base =
      flex_attention_backward(ctx, c.q, c.k, c.v, c.fwd.out, c.fwd.lse, c.dout, o);

  const uint64_t searches = tune::search_count();
  o.autotune = AutotuneMode::Search;
  const BackwardResult tuned =
      flex_attention_backward(ctx, c.q, c.k, c.v, c.fwd.out, c.fwd.lse, c.dout, o);
  ctx.synchronize();
  // sm90a_wgmma's dK/dV adds dQ itself (dq_atomic = 1 by default): the plan's dQ step is the
  // convert, which has one config, so only dK/dV is searched there; sm80_mma: dK/dV and dQ.
  const uint64_t searched = hopper ? 1 : 2;
  CHECK(tune::search_count() == searches + searched);
  const std::vector<tune::TuningRecord> recs = records_in(dir.path());
  CHECK(recs.size() == searched);
  const tune::TuningRecord* dkdv = record_of(recs, "backward_dkdv/" + want);
  REQUIRE(dkdv != nullptr);
  check_all_ok(*dkdv);
  // The plan's dQ strategy is fixed for the search, where the variant has the choice.
  if (hopper) CHECK(dkdv->key.fixed == "dq_atomic=1");
  check_same_gradients(tuned, base);
  // The plan the next call runs (what `flexjit bench --backward --autotune` prints): the winners.
  const std::string plan = runtime::describe_backward_plan(ctx, c.q, c.k, c.v, o);
  INFO(plan);
  CHECK_THAT(plan, Catch::Contains("backward_dkdv/" + want) && Catch::Contains(dkdv->config.str()));
  if (hopper) {
    CHECK_THAT(plan, Catch::Contains("backward_dq/atomic_convert"));
  } else {
    const tune::TuningRecord* dq = record_of(recs, "backward_dq/" + want);
    REQUIRE(dq != nullptr);
    check_all_ok(*dq);
    CHECK_THAT(plan, Catch::Contains("backward_dq/" + want) && Catch::Contains(dq->config.str()));
  }

  // A second pass asked for: the arch's variants still (sm90a_wgmma's dK/dV without dQ and its
  // dQ kernel), from the cache mode's defaults where nothing was searched for them.
  BackwardOptions pass;
  pass.dq_mode = BackwardOptions::DqMode::SecondPass;
  o.autotune = AutotuneMode::Cached;
  const std::string pass_plan = runtime::describe_backward_plan(ctx, c.q, c.k, c.v, o, pass);
  INFO(pass_plan);
  CHECK_THAT(pass_plan,
             Catch::Contains("backward_dkdv/" + want) && Catch::Contains("backward_dq/" + want));
  const BackwardResult second =
      flex_attention_backward(ctx, c.q, c.k, c.v, c.fwd.out, c.fwd.lse, c.dout, o, pass);
  ctx.synchronize();
  CHECK(tune::search_count() == searches + searched);  // cached mode: no new search
  check_same_gradients(second, base);
}

TEST_CASE("decode: search tunes the split (with its split count) and the combine",
          "[gpu][tune][decode]") {
  FJ_REQUIRE_GPU_OR_SKIP(shared);
  (void)shared;
  ScopedEnv env_off("FLEXJIT_AUTOTUNE", "off");  // create_block_mask: not tuned here
  TempDir dir;
  Context ctx(cache_in(dir.path()));
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  // The anchors' decode layout, smaller: B=2 Hq=8 Hkv=2 (GQA 4) Sq=1 Skv=1024 D=128.
  const DeviceTensor q = upload(ctx, random_tensor(rng, DType::BF16, {2, 8, 1, 128}));
  const DeviceTensor k = upload(ctx, random_tensor(rng, DType::BF16, {2, 2, 1024, 128}));
  const DeviceTensor v = upload(ctx, random_tensor(rng, DType::BF16, {2, 2, 1024, 128}));
  const DeviceTensor slopes = slopes_tensor(ctx, 8);
  AttentionOptions o;
  o.mods = standard_mods("alibi");
  o.bindings.buffers = {{"slopes", slopes.ref()}};
  o.return_lse = true;
  o.config.num_warps = 4;  // fixed: the tuner varies block_n and the split count
  o.config.num_stages = 2;
  o.autotune = AutotuneMode::Off;
  REQUIRE_THAT(runtime::describe_forward_plan(ctx, q, k, v, o),
               Catch::StartsWith("decode_split/sm80_mma"));
  const AttentionResult base = flex_attention(ctx, q, k, v, o);

  ScopedEnv print("FLEXJIT_PRINT_AUTOTUNING", "1");
  const uint64_t searches = tune::search_count();
  o.autotune = AutotuneMode::Search;
  const AttentionResult tuned = flex_attention(ctx, q, k, v, o);
  ctx.synchronize();
  CHECK(tune::search_count() == searches + 2);

  const std::vector<tune::TuningRecord> recs = records_in(dir.path());
  CHECK(recs.size() == 2);
  const tune::TuningRecord* split = record_of(recs, "decode_split/sm80_mma");
  const tune::TuningRecord* combine = record_of(recs, "decode_combine/warp_batched");
  REQUIRE(split != nullptr);
  REQUIRE(combine != nullptr);
  CHECK(split->key.bucket == "q16 kv1024 masknone ctas4");  // B x Hkv x 1 row group
  check_all_ok(*split);
  check_all_ok(*combine);
  CHECK(combine->candidates.size() == 4);
  std::set<int64_t> counts;
  for (const tune::CandidateTiming& t : split->candidates)
    counts.insert(t.config.at("num_splits"));
  CHECK(counts.size() >= 5);  // split counts compared (through the combine) and timed

  const ErrorStats e = compare(download(tuned.out), download(base.out));
  INFO(e.str());
  CHECK(e.rel < tolerance(DType::BF16));
  CHECK(e.nonfinite == 0);
  CHECK(compare(download(tuned.lse), download(base.lse)).rel < 1e-4);

  // The plan (and its workspace) of a cached call is the winner's; no second search.
  o.autotune = AutotuneMode::Cached;
  const std::string plan = runtime::describe_forward_plan(ctx, q, k, v, o);
  CHECK_THAT(plan, Catch::Contains(split->config.str()));
  CHECK_THAT(plan, Catch::Contains(combine->config.str()));
  const int64_t splits = split->config.at("num_splits");
  if (splits > 0) {
    const size_t bytes = static_cast<size_t>(2 * 8 * 1 * splits * 129 * 4);
    CHECK(flex_attention_workspace_bytes(ctx, q, k, v, o) == (bytes + 255) / 256 * 256);
  }
  o.autotune = AutotuneMode::Search;
  const AttentionResult again = flex_attention(ctx, q, k, v, o);
  ctx.synchronize();
  CHECK(tune::search_count() == searches + 2);
  CHECK(compare(download(again.out), download(tuned.out)).max_abs == 0);
}

TEST_CASE("a warmed manifest's forward, backward and decode calls compile nothing", "[gpu][tune]") {
  FJ_REQUIRE_GPU_OR_SKIP(shared);
  TempDir dir;
  const std::string text = R"([
    {"kind": "forward", "mods": "alibi_causal", "head_dims": [64],
     "shapes": [{"batch": 1, "heads": 2, "seqlen": 256}]},
    {"kind": "backward", "mods": "alibi_causal", "head_dims": [64],
     "shapes": [{"batch": 1, "heads": 2, "seqlen": 256}]},
    {"kind": "decode", "mods": "alibi", "gqa_ratios": [4],
     "shapes": [{"batch": 2, "heads": 8, "seqlen_q": 1, "seqlen_kv": 1024}]}])";
  const tune::WarmPlan plan =
      tune::plan_warmup(tune::parse_manifest(text, "m.json", "."), {shared->arch()}, false);
  {
    ScopedEnv env("FLEXJIT_CACHE_DIR", dir.path().c_str());
    KernelBuilder builder;
    for (const tune::WarmKernel& k : plan.kernels)
      builder.build(k.mods, k.desc);
  }
  Context ctx(cache_in(dir.path()));
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  ScopedEnv off("FLEXJIT_AUTOTUNE", "off");
  const uint64_t before = jit::nvrtc_compile_count();
  BackwardCase c;
  make_backward_case(ctx, rng, c);  // the block mask and the forward
  const BackwardResult g =
      flex_attention_backward(ctx, c.q, c.k, c.v, c.fwd.out, c.fwd.lse, c.dout, c.o);
  const DeviceTensor q = upload(ctx, random_tensor(rng, DType::BF16, {2, 8, 1, 128}));
  const DeviceTensor k = upload(ctx, random_tensor(rng, DType::BF16, {2, 2, 1024, 128}));
  const DeviceTensor slopes = slopes_tensor(ctx, 8);
  AttentionOptions o;
  o.mods = standard_mods("alibi");
  o.bindings.buffers = {{"slopes", slopes.ref()}};
  const AttentionResult d = flex_attention(ctx, q, k, k, o);
  ctx.synchronize();
  CHECK(jit::nvrtc_compile_count() == before);
  (void)g;
  (void)d;
}

TEST_CASE("timer: before_each runs before every run, outside the timed region",
          "[gpu][tune][timer]") {
  FJ_REQUIRE_GPU_OR_SKIP(shared);
  (void)shared;
  runtime::Device& dev = runtime::Device::get(0);
  runtime::DeviceTimer timer(dev);
  runtime::DeviceTimer other(dev);  // its flush is the untimed work
  int before = 0, runs = 0;
  runtime::TimingOptions o;
  o.flush_l2 = false;
  o.fixed_repeats = 5;
  o.before_each = [&] {
    ++before;
    other.flush_l2();  // a memset of 2 x L2 (at least 64 MiB) enqueued before the start event
  };
  const runtime::Timing t = timer.time([&] { ++runs; }, o);
  CHECK(runs == 6);  // one warm-up run and the repeats
  CHECK(before == runs);
  // The flush alone takes tens of microseconds at least; the timed region holds nothing.
  const runtime::Timing flush = timer.time([&] { other.flush_l2(); }, o);
  INFO("empty " << t.median_ms << " ms, flush " << flush.median_ms << " ms");
  CHECK(t.median_ms < 0.5 * flush.median_ms);
}
