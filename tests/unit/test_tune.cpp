// The autotuner's CPU side ([tune]): pruning and its reasons, keys and shape buckets, the tuning
// file (round trip, corruption, trust), modes, the output comparison, manifests and the thread
// pool. tests/gpu/test_tune.cpp runs the search itself.
#include <flexjit/error.h>

#include "kernels/Registry.h"
#include "kernels/forward/Forward.h"
#include "plan/Plan.h"
#include "support/CacheTest.h"
#include "tune/Manifest.h"
#include "tune/Prune.h"
#include "tune/StepTuner.h"
#include "tune/ThreadPool.h"
#include "tune/TuningKey.h"
#include "tune/TuningStore.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <set>
#include <thread>

using namespace flexjit;
using namespace flexjit::test;
using kernels::Params;

namespace {

const kernels::Variant& sm80() {
  return kernels::Registry::global().get(kernels::Family::Forward, "sm80_mma");
}

kernels::KernelDesc fwd_problem(const char* arch = "sm_90a", int d = 128) {
  kernels::KernelDesc p =
      kernels::forward_problem(cuda::Arch::parse(arch), DType::BF16, d, d, 1, false, true);
  p.variant = "sm80_mma";
  return p;
}

bool has_reason(const tune::CandidateSet& s, const std::string& needle) {
  for (const auto& p : s.pruned) {
    if (p.reason.find(needle) != std::string::npos) return true;
  }
  return false;
}

tune::TuningRecord sample_record() {
  tune::TuningRecord r;
  r.key = tune::make_key({"NVIDIA H100 80GB HBM3", 9, 0, 132}, fwd_problem(), 0x1234abcdULL,
                         kernels::InputFacts{true, "", 128, 128, 4096, 4096, {}});
  r.config = {{"block_m", 128}, {"block_n", 128}, {"num_stages", 2}, {"num_warps", 8}};
  r.time_ms = 0.5;
  r.default_config = {{"block_m", 128}, {"block_n", 64}, {"num_stages", 2}, {"num_warps", 4}};
  r.default_ms = 0.6;
  r.candidates = {{r.default_config, 0.6, "ok"},
                  {r.config, 0.5, "ok"},
                  {{{"block_m", 64}, {"block_n", 32}, {"num_stages", 1}, {"num_warps", 4}},
                   -1,
                   "compile failed: x"}};
  r.pruned = {{{{"block_m", 64}}, "the caller fixed block_m = 128"}};
  r.tuned_at = "2026-11-23T12:00:00Z";
  return r;
}

void write_text(const fs::path& p, const std::string& text, mode_t mode = 0600) {
  std::ofstream(p) << text;
  ::chmod(p.c_str(), mode);
}

}  // namespace

TEST_CASE("pruning keeps the default first and says why each config is dropped", "[tune]") {
  const auto p = fwd_problem();
  SECTION("a block mask of 64 prunes tiles of 128") {
    kernels::InputFacts f;
    f.mask_q_block = f.mask_kv_block = 64;
    const tune::CandidateSet s = tune::prune_configs(sm80(), p, f);
    REQUIRE(!s.candidates.empty());
    CHECK(s.candidates.front() == s.default_config);
    CHECK(s.default_config.at("block_m") == 64);  // resolve_config shrank it to divide 64
    for (const Params& c : s.candidates) {
      CHECK(c.at("block_m") <= 64);
      CHECK(c.at("block_n") <= 64);
    }
    CHECK(has_reason(s, "block_m = 128 does not divide the block mask's sparse block of 64"));
    CHECK(has_reason(s, "block_n = 128 does not divide the block mask's sparse block of 64"));
  }
  SECTION("a value the caller fixed prunes the others") {
    const tune::CandidateSet s = tune::prune_configs(sm80(), p, {}, Params{{"block_n", 32}});
    for (const Params& c : s.candidates)
      CHECK(c.at("block_n") == 32);
    CHECK(has_reason(s, "the caller fixed block_n = 32"));
  }
  SECTION("the device's shared memory limit") {
    const tune::CandidateSet s = tune::prune_configs(sm80(), p, {}, {}, 64 * 1024);
    CHECK(has_reason(s, "bytes of shared memory; the device allows 65536 per block"));
    for (size_t i = 1; i < s.candidates.size(); ++i) {
      kernels::KernelDesc d = p;
      d.config = s.candidates[i];
      CHECK(sm80().smem_bytes(d) <= 64u * 1024);
    }
  }
  SECTION("every candidate validates, none repeats") {
    const tune::CandidateSet s = tune::prune_configs(sm80(), p, {});
    std::set<std::string> seen;
    for (const Params& c : s.candidates) {
      kernels::KernelDesc d = p;
      d.config = c;
      CHECK_NOTHROW(sm80().validate(d));
      CHECK(seen.insert(c.str()).second);
    }
    CHECK(s.candidates.size() > 4);
  }
}

// A variant whose config space holds configs its validate() refuses: pruning works from the
// Variant interface alone, whatever the family.
TEST_CASE("pruning a config space through validate() of any variant", "[tune]") {
  struct Loose : kernels::ForwardVariant {
    std::string_view name() const override { return "loose"; }
    std::string_view summary() const override { return "test"; }
    std::optional<std::string> unsupported(const kernels::KernelDesc&,
                                           const kernels::InputFacts&) const override {
      return std::nullopt;
    }
    void validate(const kernels::KernelDesc& d) const override {
      if (d.config.at("tile") > 64) throw UnsupportedError("tile must be at most 64 here");
    }
    Params default_config(const kernels::KernelDesc&) const override { return {{"tile", 32}}; }
    std::vector<Params> config_space(const kernels::KernelDesc&) const override {
      return {{{"tile", 16}}, {{"tile", 32}}, {{"tile", 128}}, {{"tile", 16}}};
    }
    std::vector<kernels::TemplateText> templates() const override { return {}; }
    std::vector<std::string> entry_points() const override { return {"k"}; }
    cuda::GeneratedSource generate(const Mods&, const kernels::KernelDesc&) const override {
      return {};
    }
    unsigned smem_bytes(const kernels::KernelDesc&) const override { return 0; }
    std::vector<kernels::Launch> launches(const kernels::KernelDesc&, const kernels::ForwardInputs&,
                                          void*) const override {
      return {};
    }
  } loose;
  const tune::CandidateSet s = tune::prune_configs(loose, fwd_problem(), {});
  REQUIRE(s.candidates.size() == 2);
  CHECK(s.candidates[0] == Params{{"tile", 32}});
  CHECK(s.candidates[1] == Params{{"tile", 16}});
  REQUIRE(s.pruned.size() == 2);
  CHECK(s.pruned[0].reason == "tile must be at most 64 here");
  CHECK(s.pruned[1].reason == "repeats an earlier candidate");
}

TEST_CASE("shape buckets and tuning keys", "[tune]") {
  CHECK(tune::length_bucket(1) == 16);
  CHECK(tune::length_bucket(16) == 16);
  CHECK(tune::length_bucket(1000) == 1024);
  CHECK(tune::length_bucket(1024) == 1024);
  CHECK(tune::length_bucket(1025) == 2048);
  CHECK(tune::length_bucket(-1) == -1);
  kernels::InputFacts f;
  CHECK(tune::shape_bucket(f) == "qany kvany masknone");
  f.seqlen_q = 3000;
  f.seqlen_kv = 4096;
  f.mask_q_block = f.mask_kv_block = 128;
  CHECK(tune::shape_bucket(f) == "q4096 kv4096 mask128x128");

  const tune::DeviceIdentity h100{"NVIDIA H100 80GB HBM3", 9, 0, 132};
  kernels::KernelDesc p = fwd_problem();
  const tune::TuningKey k = tune::make_key(h100, p, 0xabcULL, f);
  CHECK(k.kernel ==
        "forward/sm80_mma sm_90a bf16 d=128/128 gqa=1 divisible=0 fast_math=1 full_blocks=1");
  CHECK(k.mods_hash == "0000000000000abc");
  // The config never reaches the key; the shape only through its bucket.
  p.config = {{"block_m", 64}};
  kernels::InputFacts f2 = f;
  f2.seqlen_q = 2049;
  CHECK(tune::make_key(h100, p, 0xabcULL, f2) == k);
  f2.seqlen_q = 4097;
  CHECK(!(tune::make_key(h100, p, 0xabcULL, f2) == k));
  CHECK(!(tune::make_key({"NVIDIA A100", 8, 0, 108}, p, 0xabcULL, f) == k));
  CHECK(!(tune::make_key(h100, p, 0xabdULL, f) == k));
  // A search under values the caller fixed is stored apart.
  const tune::TuningKey fixed = tune::make_key(h100, p, 0xabcULL, f, Params{{"num_warps", 4}});
  CHECK(!(fixed == k));
  CHECK_THAT(fixed.str(), Catch::EndsWith("|fixed num_warps=4"));
  CHECK_THAT(k.str(), Catch::EndsWith("|q4096 kv4096 mask128x128|fixed none"));
  // The mods' structure, not their parameter values or names.
  Mods a = standard_mods("softcap_causal"), b = standard_mods("softcap_causal");
  b.name = "other";
  CHECK(a.hash() == b.hash());
  CHECK(a.hash() != standard_mods("causal").hash());
}

TEST_CASE("tuning records round-trip through JSON", "[tune]") {
  const tune::TuningRecord r = sample_record();
  const tune::TuningRecord back = tune::record_from_json(tune::record_to_json(r));
  CHECK(back.key == r.key);
  CHECK(back.config == r.config);
  CHECK(back.time_ms == r.time_ms);
  CHECK(back.default_config == r.default_config);
  REQUIRE(back.candidates.size() == 3);
  CHECK(back.candidates[2].median_ms == -1);
  CHECK(back.candidates[2].status == "compile failed: x");
  CHECK(back.pruned == r.pruned);
  CHECK(back.tuned_at == r.tuned_at);
  const auto file = tune::parse_tuning_file(tune::tuning_file_text({r, r}));
  CHECK(file.size() == 2);
}

TEST_CASE("a corrupt or stale tuning file is refused with the reason", "[tune]") {
  const std::string good = tune::tuning_file_text({sample_record()});
  auto refused = [](const std::string& text) {
    try {
      tune::parse_tuning_file(text);
    } catch (const UnsupportedError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refused(good).empty());
  CHECK_THAT(refused(good.substr(0, good.size() / 2)), Catch::Contains("not valid JSON"));
  CHECK_THAT(refused("{\"records\": []}"), Catch::Contains("not a flexjit tuning file"));
  nlohmann::json j = nlohmann::json::parse(good);
  j["version"] = 99;
  CHECK_THAT(refused(j.dump()), Catch::Contains("format version 99"));
  j = nlohmann::json::parse(good);
  j["flexjit"] = "0.0.1-old";
  CHECK_THAT(refused(j.dump()), Catch::Contains("written by flexjit 0.0.1-old"));
  j = nlohmann::json::parse(good);
  j["records"][0]["bucket"] = "q64 kv64 masknone";  // edited: the key no longer matches
  CHECK_THAT(refused(j.dump()), Catch::Contains("record 0: its 'key' does not match"));
  j = nlohmann::json::parse(good);
  j["records"][0]["config"]["block_m"] = "big";
  CHECK_THAT(refused(j.dump()), Catch::Contains("'config.block_m' is not an integer"));
  CHECK_THAT(refused(R"({"format": 7, "version": "x"})"), Catch::Contains("not a flexjit"));
  j = nlohmann::json::parse(good);
  j["version"] = "one";
  CHECK_THAT(refused(j.dump()), Catch::Contains("format version -1"));
  j = nlohmann::json::parse(good);
  j["records"][0]["candidates"] = 5;
  CHECK(!refused(j.dump()).empty());
  j = nlohmann::json::parse(good);
  j["records"][0].erase("time_ms");
  CHECK_THAT(refused(j.dump()), Catch::Contains("missing 'time_ms'"));
}

TEST_CASE("the tuning store persists privately and ignores files it cannot trust", "[tune]") {
  TempDir dir;
  const fs::path file = dir.path() / "tuning.json";
  const tune::TuningRecord r = sample_record();
  {
    tune::TuningStore s(file);
    CHECK(!s.find(r.key));
    s.put(r);
    CHECK(s.find(r.key));
  }
  struct stat st {};
  REQUIRE(::stat(file.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  {
    tune::TuningStore s(file);  // a new process, in effect
    auto got = s.find(r.key);
    REQUIRE(got);
    CHECK(got->config == r.config);
    CHECK(s.problem().empty());
    // A second record keeps the first.
    tune::TuningRecord r2 = r;
    r2.key.bucket = "q1024 kv1024 masknone";
    s.put(r2);
    CHECK(tune::TuningStore(file).records().size() == 2);
  }
  SECTION("corrupt: ignored with a warning, replaced by the next store") {
    write_text(file, "{\"format\": \"flexjit-tuning\", \"version\": 1, \"records\": [");
    tune::TuningStore s(file);
    CHECK(!s.find(r.key));
    CHECK_THAT(s.problem(), Catch::Contains("is ignored: it is not valid JSON"));
    s.put(r);
    CHECK(tune::TuningStore(file).find(r.key));
    CHECK(tune::TuningStore(file).problem().empty());
  }
  SECTION("writable by others: not trusted") {
    ::chmod(file.c_str(), 0666);
    tune::TuningStore s(file);
    CHECK(!s.find(r.key));
    CHECK_THAT(s.problem(), Catch::Contains("is ignored"));
  }
  SECTION("a symlink: not followed") {
    const fs::path other = dir.path() / "other.json";
    fs::rename(file, other);
    fs::create_symlink(other, file);
    tune::TuningStore s(file);
    CHECK(!s.find(r.key));
    CHECK_THAT(s.problem(), Catch::Contains("is ignored"));
  }
}

TEST_CASE("autotune modes from the options and FLEXJIT_AUTOTUNE", "[tune]") {
  CHECK(tune::resolve_mode(AutotuneMode::Search) == tune::Mode::Search);
  CHECK(tune::resolve_mode(AutotuneMode::Off) == tune::Mode::Off);
  {
    ScopedEnv e("FLEXJIT_AUTOTUNE", nullptr);
    CHECK(tune::resolve_mode(AutotuneMode::FromEnv) == tune::Mode::Off);
  }
  {
    ScopedEnv e("FLEXJIT_AUTOTUNE", "Cached");
    CHECK(tune::resolve_mode(AutotuneMode::FromEnv) == tune::Mode::Cached);
    CHECK(tune::resolve_mode(AutotuneMode::Off) == tune::Mode::Off);  // the option wins
  }
  {
    ScopedEnv e("FLEXJIT_AUTOTUNE", "max-autotune");
    CHECK(tune::resolve_mode(AutotuneMode::FromEnv) == tune::Mode::Off);
  }
  CHECK(runtime::below(Params{{"block_m", 64}}, Params{{"block_m", 128}, {"block_n", 32}}) ==
        Params{{"block_m", 64}, {"block_n", 32}});
}

TEST_CASE("a candidate's output is compared with the dtype's tolerance", "[tune]") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(tune::compare_outputs(DType::BF16, {1.0, -2.0, 0.0}, {1.01, -2.02, 0.01}).empty());
  CHECK_THAT(tune::compare_outputs(DType::BF16, {1.0, 0.5}, {1.0, 0.75}),
             Catch::Contains("element 1: 0.75 vs 0.5"));
  CHECK(!tune::compare_outputs(DType::F16, {1.0}, {1.01}).empty());
  CHECK(
      tune::compare_outputs(DType::F32, {-inf, 3.0}, {-inf, 3.001}).empty());  // LSE of empty rows
  CHECK(!tune::compare_outputs(DType::F32, {-inf}, {0.0}).empty());
  CHECK(!tune::compare_outputs(DType::F32, {1.0}, {nan}).empty());
  CHECK(!tune::compare_outputs(DType::F32, {1.0, 2.0}, {1.0}).empty());
  CHECK(!tune::compare_outputs(DType::I32, {1000.0}, {1001.0}).empty());  // block indices: exact
}

TEST_CASE("the thread pool runs every task, in parallel, and keeps failures apart", "[tune]") {
  tune::ThreadPool pool(4);
  CHECK(pool.size() == 4);
  std::atomic<int> sum{0}, running{0}, peak{0};
  tune::parallel_for(pool, 64, [&](size_t i) {
    const int now = ++running;
    int p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    sum += static_cast<int>(i);
    --running;
  });
  CHECK(sum == 64 * 63 / 2);
  CHECK(peak > 1);
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH(tune::parallel_for(pool, 8,
                                       [&](size_t i) {
                                         ++ran;
                                         if (i == 3) throw Error("task 3 failed");
                                       }),
                    "task 3 failed");
  CHECK(ran == 8);  // one failure stops no other task
  auto f = pool.submit([] {});
  f.get();
}

namespace {

std::string manifest_error(const std::string& text) {
  try {
    const tune::Manifest m = tune::parse_manifest(text, "deploy.json", ".");
    tune::plan_warmup(m, {"sm_80"}, false);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("bad manifests fail with the file, the entry's index and the problem", "[tune]") {
  const std::string ok = R"({"mods": "causal", "shapes": [{"heads": 4, "seqlen": 512}]})";
  CHECK(manifest_error("[" + ok + "]").empty());
  CHECK_THAT(manifest_error("[" + ok + ","), Catch::StartsWith("deploy.json: not valid JSON"));
  CHECK_THAT(
      manifest_error("[" + ok + R"(, {"mods": "casual", "shapes": [{"heads": 4, "seqlen": 8}]}])"),
      Catch::StartsWith("deploy.json: workload 1: unknown mod 'casual'; the standard mods "
                        "are: alibi"));
  CHECK_THAT(
      manifest_error(
          R"([{"name": "x", "mods": "causal", "dtypes": ["f64"], "shapes": [{"heads": 4, "seqlen": 8}]}])"),
      Catch::StartsWith("deploy.json: workload 0 ('x'): dtype \"f64\" is not one of bf16, "
                        "f16, f32"));
  CHECK_THAT(
      manifest_error(
          R"([{"mods": "causal", "head_dims": [100], "shapes": [{"heads": 4, "seqlen": 8}]}])"),
      Catch::StartsWith("deploy.json: workload 0: forward bf16 d=100/100 gqa=1 for sm_80:") &&
          Catch::Contains("head_dim_qk = 100; supported: multiples of 8 from 8 to 256"));
  CHECK_THAT(
      manifest_error(
          R"([{"mods": "causal", "head_dims": [-1], "shapes": [{"heads": 4, "seqlen": 8}]}])"),
      Catch::Contains("workload 0: head dim -1 is out of range"));
  CHECK_THAT(
      manifest_error(
          R"([{"mods": "causal", "gqa_ratios": [3], "shapes": [{"heads": 4, "seqlen": 8}]}])"),
      Catch::Contains("workload 0: heads 4 is not a multiple of gqa ratio 3"));
  CHECK_THAT(manifest_error(R"([{"mods": "causal", "shape": []}])"),
             Catch::Contains("workload 0: unknown field 'shape'"));
  CHECK_THAT(
      manifest_error(
          R"([{"mods": "causal", "mods_text": "x", "shapes": [{"heads": 4, "seqlen": 8}]}])"),
      Catch::Contains("workload 0: give the mods as exactly one of"));
  CHECK_THAT(
      manifest_error(
          R"([{"mods_text": "score_mod = score +", "shapes": [{"heads": 4, "seqlen": 8}]}])"),
      Catch::StartsWith("deploy.json: workload 0: mods:"));
  CHECK_THAT(
      manifest_error(
          R"([{"mods": "causal", "kind": "training", "shapes": [{"heads": 4, "seqlen": 8}]}])"),
      Catch::Contains("kind 'training' is not one of forward, backward, decode"));
  CHECK_THAT(
      manifest_error(
          R"([{"mods": "causal", "archs": ["sm_70"], "shapes": [{"heads": 4, "seqlen": 8}]}])"),
      Catch::Contains("workload 0: ") && Catch::Contains("sm_70"));
  CHECK_THAT(manifest_error(R"([{"mods": "causal", "shapes": [{"heads": 0, "seqlen": 8}]}])"),
             Catch::Contains("shape field 'heads' is 0"));
  CHECK_THAT(
      manifest_error(R"([{"mods": "causal", "kind": 3, "shapes": [{"heads": 4, "seqlen": 8}]}])"),
      Catch::Contains("workload 0: 'kind' must be one of"));
  CHECK_THAT(
      manifest_error(
          R"([{"mods": "causal", "block_size": "x", "shapes": [{"heads": 4, "seqlen": 8}]}])"),
      Catch::Contains("workload 0: block_size \"x\""));
  CHECK_THAT(manifest_error("[]"), Catch::Contains("deploy.json: the workload list is empty"));
  CHECK_THAT(manifest_error(R"({"workload": []})"),
             Catch::Contains("unknown top-level field 'workload'"));
}

TEST_CASE("the example manifest covers the standard mods and the backward and decode families",
          "[tune]") {
  const tune::Manifest m =
      tune::load_manifest(fs::path(FLEXJIT_SOURCE_DIR) / "examples/tune/standard_manifest.json");
  std::set<std::string> mods;
  for (const tune::Workload& w : m.workloads)
    mods.insert(w.mods_spec);
  for (const std::string& name : standard_mod_names())
    CHECK(mods.count(name) == 1);
  const tune::WarmPlan plan = tune::plan_warmup(m, {}, false);
  for (const tune::WarmKernel& k : plan.kernels)
    CHECK(k.desc.arch.str() == "sm_90a");
  // Every family the manifest names has variants now: its backward and decode entries give
  // kernels of those families, and nothing is left unregistered.
  bool backward = false, decode = false;
  for (const tune::WarmKernel& k : plan.kernels) {
    backward = backward || k.desc.family == kernels::Family::BackwardDkDv;
    decode = decode || k.desc.family == kernels::Family::DecodeSplit;
  }
  CHECK(backward);
  CHECK(decode);
  CHECK(plan.notes.empty());
  // Block-mask kernels are shared by mods with the same mask_mod: causal, alibi_causal and
  // softcap_causal need one.
  int causal_masks = 0;
  for (const tune::WarmKernel& k : plan.kernels) {
    if (k.desc.family == kernels::Family::BlockMask &&
        (k.mods.name == "causal" || k.mods.name == "alibi_causal" ||
         k.mods.name == "softcap_causal"))
      ++causal_masks;
  }
  CHECK(causal_masks == 1);
  // --all-configs adds the pruned candidates; --arch overrides the manifest's archs.
  const tune::WarmPlan all = tune::plan_warmup(m, {"sm_80", "sm_89"}, true);
  CHECK(all.kernels.size() > 2 * plan.kernels.size());
  for (const tune::WarmKernel& k : all.kernels)
    CHECK((k.desc.arch.str() == "sm_80" || k.desc.arch.str() == "sm_89"));
}

TEST_CASE("Registry::resolve completes a selected problem as complete() does", "[tune][plan]") {
  const kernels::Registry& reg = kernels::Registry::global();
  kernels::InputFacts facts;
  facts.seqlen_q = facts.seqlen_kv = 1000;  // not a multiple of any tile: divisible stays 0
  for (const char* arch : {"sm_80", "sm_90a"}) {
    kernels::KernelDesc problem = fwd_problem(arch, 64);
    problem.variant.clear();
    for (const std::string_view forced : {std::string_view{}, std::string_view{"sm80_mma"}}) {
      const Params caller{{"num_warps", 4}};
      kernels::Selection chosen;
      const kernels::KernelDesc completed = reg.complete(problem, facts, caller, forced, &chosen);
      const kernels::Selection sel = reg.select(problem, facts, forced, caller);
      CHECK(sel.variant == chosen.variant);
      CHECK(reg.resolve(sel, problem, facts, caller).str() == completed.str());
    }
    // A key the chosen variant does not have is refused, naming it.
    const kernels::Selection sel = reg.select(problem, facts, "sm80_mma");
    CHECK_THROWS_WITH(reg.resolve(sel, problem, facts, {{"q_tiles", 2}}),
                      Catch::Contains("forward/sm80_mma has no config parameter 'q_tiles'"));
  }
}

TEST_CASE("a plan step's description is completed once, by the tuner when one is active",
          "[tune][plan]") {
  const kernels::Registry& reg = kernels::Registry::global();
  kernels::KernelDesc problem = fwd_problem("sm_80", 64);
  problem.variant.clear();
  kernels::InputFacts facts;
  facts.seqlen_q = facts.seqlen_kv = 512;
  const Mods mods = standard_mods("causal");
  const kernels::ForwardInputs inputs;  // sm80_mma needs no workspace; nothing is launched
  const Params caller{{"num_warps", 4}};

  SECTION("untuned: the registry's complete() of the caller's overrides") {
    kernels::Selection sel;
    const kernels::KernelDesc direct = reg.complete(problem, facts, caller, {}, &sel);
    const runtime::PlanStep step =
        runtime::plan_step<kernels::ForwardVariant>(problem, inputs, facts, mods, caller);
    CHECK(step.desc.str() == direct.str());
    CHECK(step.selection.str() == sel.str());
    // A StepTuning that is off completes it the same way.
    const tune::StepTuning off{};
    const runtime::CompletedStep done = off.complete(problem, facts, mods, caller, {}, {});
    CHECK(done.desc.str() == direct.str());
    CHECK(done.selection.str() == sel.str());
  }

  SECTION("tuned: the tuner's completion is the step's, not completed again") {
    // A config of sm80_mma's space other than its default, with the caller's num_warps.
    kernels::KernelDesc keyed = problem;
    keyed.variant = "sm80_mma";
    Params winner;
    for (const Params& c : sm80().config_space(keyed)) {
      if (c != sm80().default_config(keyed) && c.at("num_warps") == 4) winner = c;
    }
    REQUIRE_FALSE(winner.items().empty());
    // Completes as tune::complete_step does with a stored winner: the variant selected by the
    // caller's overrides, the winner's config resolved below them, once.
    struct StoredWinner final : runtime::Tuner {
      Params config;
      mutable int calls = 0;
      mutable bool io_bound = false;
      bool active() const override { return true; }
      runtime::CompletedStep complete(const kernels::KernelDesc& p, const kernels::InputFacts& f,
                                      const Mods&, const Params& c, std::string_view forced,
                                      const runtime::StepIo& io) const override {
        ++calls;
        io_bound = io.launches != nullptr && io.workspace_bytes != nullptr;
        const kernels::Registry& r = kernels::Registry::global();
        runtime::CompletedStep s;
        s.selection = r.select(p, f, forced, c);
        s.desc = r.resolve(s.selection, p, f, runtime::below(c, config));
        return s;
      }
    } tuner;
    tuner.config = winner;
    const runtime::PlanStep step = runtime::plan_step<kernels::ForwardVariant>(
        problem, inputs, facts, mods, caller, {}, tuner);
    CHECK(tuner.calls == 1);
    CHECK(tuner.io_bound);
    // Exactly what one complete() of the winner below the caller's values gives; a second
    // completion from the caller's overrides alone would have the defaults.
    kernels::Selection sel;
    const kernels::KernelDesc direct =
        reg.complete(problem, facts, runtime::below(caller, winner), {}, &sel);
    CHECK(step.desc.str() == direct.str());
    CHECK(step.desc.str() != reg.complete(problem, facts, caller).str());
    CHECK(step.selection.variant == sel.variant);
    CHECK(step.selection.str() == sel.str());
  }
}
