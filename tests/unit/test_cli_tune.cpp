// `flexjit tune` and `flexjit cache stats` ([cli][tune]): manifests checked before any work, the
// warm-up resumable, and a warmed cache directory relocatable (no NVRTC compile after a copy).
#include "Pipeline.h"
#include "jit/Nvrtc.h"
#include "kernels/Registry.h"
#include "kernels/block_mask/BlockMaskBuild.h"
#include "kernels/forward/Forward.h"
#include "support/CacheTest.h"
#include "support/CliPath.h"
#include "tune/Manifest.h"
#include "tune/TuningStore.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <string>

using namespace flexjit;
using namespace flexjit::test;

namespace {

struct Result {
  int code;
  std::string output;
};

Result cli(const std::string& prefix, const std::string& args) {
  Result r;
  r.code = run_cli(args, &r.output, prefix);
  return r;
}

std::string env_for(const fs::path& cache) {
  return "FLEXJIT_CACHE_DIR='" + cache.string() + "' timeout 300";
}

size_t entry_files(const fs::path& dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".fjc") ++n;
  }
  return n;
}

// The JSON document at the end of the output (stderr lines may come first).
nlohmann::json json_of(const std::string& out) {
  return nlohmann::json::parse(out.substr(out.find('{')));
}

constexpr const char* kSmall =
    R"([{"name": "small-causal", "mods": "causal", "head_dims": [64],
         "shapes": [{"batch": 1, "heads": 2, "seqlen": 256}], "archs": ["sm_80"]}])";

}  // namespace

TEST_CASE("flexjit tune --help names the options and an example", "[cli][tune]") {
  const Result r = cli("", "tune --help");
  CHECK(r.code == 0);
  for (const char* s : {"--manifest", "--arch", "--jobs", "--all-configs", "--json", "--dry-run",
                        "standard_manifest.json"})
    CHECK_THAT(r.output, Catch::Contains(s));
}

TEST_CASE("flexjit tune refuses a bad manifest before any work", "[cli][tune]") {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  const fs::path m = dir.path() / "bad.json";
  std::ofstream(m) << R"([{"mods": "causal", "shapes": [{"heads": 2, "seqlen": 64}]},
                          {"mods": "no_such_mod", "shapes": [{"heads": 2, "seqlen": 64}]}])";
  Result r = cli(env_for(cache), "tune --arch sm_80 --manifest '" + m.string() + "'");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains(m.string() + ": workload 1: unknown mod 'no_such_mod'"));
  CHECK(entry_files(cache) == 0);  // workload 0 was not compiled either
  r = cli(env_for(cache), "tune --arch sm_75 --manifest '" + m.string() + "'");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("sm_75"));
  r = cli(env_for(cache), "tune --manifest '" + (dir.path() / "missing.json").string() + "'");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("missing.json: cannot read the manifest"));
}

TEST_CASE("flexjit tune --dry-run lists the kernels of a manifest", "[cli][tune]") {
  const std::string manifest =
      std::string(FLEXJIT_SOURCE_DIR) + "/examples/tune/standard_manifest.json";
  TempDir dir;
  const Result r = cli(env_for(dir.path() / "c"),
                       "tune --dry-run --json --arch sm_80,sm_90a --manifest '" + manifest + "'");
  REQUIRE(r.code == 0);
  const nlohmann::json j = json_of(r.output);
  const tune::WarmPlan plan =
      tune::plan_warmup(tune::load_manifest(manifest), {"sm_80", "sm_90a"}, false);
  CHECK(j["kernels"].size() == plan.kernels.size());
  CHECK(entry_files(dir.path() / "c") == 0);
  if (kernels::Registry::global().variants(kernels::Family::DecodeSplit).empty()) {
    CHECK_THAT(r.output, Catch::Contains("no variant registered for family decode_split"));
  }
}

TEST_CASE("flexjit tune warms a cache that is resumable and relocatable", "[cli][tune][nvrtc]") {
  TempDir dir;
  const fs::path a = dir.path() / "A", b = dir.path() / "B";
  const fs::path m = dir.path() / "m.json";
  std::ofstream(m) << kSmall;

  Result r = cli(env_for(a), "tune --jobs 2 --json --manifest '" + m.string() + "'");
  REQUIRE(r.code == 0);
  nlohmann::json j = json_of(r.output);
  CHECK(j["kernels"] == 2);  // the forward kernel and the block-mask kernel
  CHECK(j["compiled"] == 2);
  CHECK(j["failed"] == 0);
  CHECK(entry_files(a) == 2);

  // Started again: nothing left to do.
  r = cli(env_for(a), "tune --json --manifest '" + m.string() + "'");
  REQUIRE(r.code == 0);
  j = json_of(r.output);
  CHECK(j["compiled"] == 0);
  CHECK(j["cached"] == 2);

  // Plain lines without a terminal.
  r = cli(env_for(a), "tune --manifest '" + m.string() + "'");
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("[1/2 ") && Catch::Contains("2 kernels: 0 compiled, 2 "
                                                                   "already cached, 0 failed"));

  // cache stats: per arch and family, and the tuning table.
  tune::TuningStore(a / "tuning.json").put([] {
    tune::TuningRecord rec;
    rec.key.device = {"NVIDIA H100 80GB HBM3", 9, 0, 132};
    rec.key.kernel = "forward/sm80_mma sm_90a bf16 d=64/64 gqa=1 divisible=0 full_blocks=1";
    rec.key.mods_hash = "00000000deadbeef";
    rec.key.head_dim_qk = rec.key.head_dim_v = 64;
    rec.key.bucket = "q256 kv256 mask128x128";
    rec.config = {{"block_m", 64}};
    rec.default_config = {{"block_m", 128}};
    return rec;
  }());
  r = cli(env_for(a), "cache stats");
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("sm_80    forward                1"));
  CHECK_THAT(r.output, Catch::Contains("sm_80    block_mask             1"));
  CHECK_THAT(r.output, Catch::Contains("(1 tuned workloads)"));
  CHECK_THAT(r.output,
             Catch::Contains("[q256 kv256 mask128x128]") && Catch::Contains("block_m=64"));
  r = cli(env_for(a), "cache stats --json");
  CHECK(json_of(r.output)["by_arch_family"]["sm_80"]["forward"] == 1);
  CHECK(json_of(r.output)["tuning"].size() == 1);

  // Relocated: copy A to B, remove A, and build what flex_attention would build for the
  // workload from B: no NVRTC compile.
  fs::copy(a, b, fs::copy_options::recursive);
  fs::remove_all(a);
  ScopedEnv env("FLEXJIT_CACHE_DIR", b.c_str());
  KernelBuilder builder;
  const Mods mods = standard_mods("causal");
  kernels::InputFacts facts;
  facts.seqlen_q = facts.seqlen_kv = 256;
  facts.mask_q_block = facts.mask_kv_block = 128;
  const cuda::Arch sm80 = cuda::Arch::parse("sm_80");
  const kernels::KernelDesc fwd = kernels::Registry::global().complete(
      kernels::forward_problem(sm80, DType::BF16, 64, 64, 1, false, true), facts);
  const kernels::KernelDesc bm =
      kernels::Registry::global().complete(kernels::block_mask_problem(sm80, 128, 128), {});
  const uint64_t before = jit::nvrtc_compile_count();
  CHECK(builder.build(mods, fwd).compiled.outcome == jit::CacheOutcome::DiskHit);
  CHECK(builder.build(mods, bm).compiled.outcome == jit::CacheOutcome::DiskHit);
  CHECK(jit::nvrtc_compile_count() == before);
  CHECK(tune::TuningStore(b / "tuning.json").records().size() == 1);
}
