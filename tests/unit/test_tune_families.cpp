// Tuning the backward and decoding families without a GPU ([tune]): their config spaces, what
// the tuner compares and zeroes for each step, the split count as a launch parameter of one
// decode_split kernel, and manifests with backward and decode workloads.
// tests/gpu/test_tune_families.cpp runs the searches.
#include <flexjit/error.h>

#include "Pipeline.h"
#include "jit/Nvrtc.h"
#include "kernels/Family.h"
#include "kernels/Registry.h"
#include "kernels/backward/Backward.h"
#include "kernels/decode/Decode.h"
#include "kernels/decode/DecodeSplit.h"
#include "runtime/Decode.h"
#include "support/CacheTest.h"
#include "support/CliPath.h"
#include "tune/Manifest.h"
#include "tune/Prune.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <optional>
#include <set>

using namespace flexjit;
using namespace flexjit::test;
using kernels::Family;
using kernels::KernelDesc;
using kernels::Params;

namespace {

const kernels::Registry& reg() {
  return kernels::Registry::global();
}

TensorRef fake_cuda(DType dtype, std::vector<int64_t> shape, uintptr_t addr = 0x100000) {
  return TensorRef::contiguous(reinterpret_cast<void*>(addr), dtype, std::move(shape),
                               TensorRef::Device::CUDA, 0);
}

// The decode inputs of the anchors' decode shape (B=8 Hq=32 Hkv=8 Sq=1 Skv=8192 D=128).
kernels::DecodeInputs decode_inputs() {
  kernels::DecodeInputs in;
  in.q = fake_cuda(DType::BF16, {8, 32, 1, 128});
  in.k = fake_cuda(DType::BF16, {8, 8, 8192, 128});
  in.v = in.k;
  in.out = in.q;
  in.batch = 8, in.heads_q = 32, in.heads_kv = 8, in.seqlen_q = 1, in.seqlen_kv = 8192;
  in.head_dim_qk = in.head_dim_v = 128;
  in.sm_count = 132;
  in.mod_params.assign(1, 0);
  return in;
}

std::string manifest_error(const std::string& text) {
  try {
    const tune::Manifest m = tune::parse_manifest(text, "deploy.json", ".");
    tune::plan_warmup(m, {"sm_80"}, false);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

std::vector<tune::WarmKernel> of_family(const tune::WarmPlan& p, Family f) {
  std::vector<tune::WarmKernel> out;
  for (const tune::WarmKernel& k : p.kernels) {
    if (k.desc.family == f) out.push_back(k);
  }
  return out;
}

}  // namespace

TEST_CASE("the backward and decode config spaces are non-empty and every config validates",
          "[tune]") {
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90a"}) {
    for (DType dt : {DType::BF16, DType::F16}) {
      for (int d : {64, 128, 256}) {
        INFO(arch << " " << to_string(dt) << " d=" << d);
        const cuda::Arch a = cuda::Arch::parse(arch);
        std::vector<KernelDesc> problems = {
            kernels::backward_problem(Family::BackwardDkDv, a, dt, d, d, 1, true),
            kernels::backward_problem(Family::BackwardDq, a, dt, d, d, 1, true),
            kernels::decode_split_problem(a, dt, d, d, 4, kernels::decode_rows(4, 1), 0, false),
            kernels::decode_split_problem(a, dt, d, d, 8, kernels::decode_rows(8, 4), 16, true),
            kernels::decode_combine_problem(a, dt, d)};
        for (const KernelDesc& problem : problems) {
          const kernels::Variant& v = *reg().select(problem, {}).variant;
          KernelDesc keyed = problem;
          keyed.variant = std::string(v.name());
          INFO(keyed.str());
          const std::vector<Params> space = v.config_space(keyed);
          CHECK(space.size() >= 2);  // something to choose from
          for (const Params& c : space) {
            KernelDesc full = keyed;
            full.config = c;
            v.specialize(full, {});
            INFO(c.str());
            CHECK_NOTHROW(v.validate(full));
          }
          // The tuner's candidates for an unmasked call at 4096: the default first, then more.
          kernels::InputFacts facts;
          facts.seqlen_q = problem.family == Family::DecodeSplit ? 1 : 4096;
          facts.seqlen_kv = 4096;
          const tune::CandidateSet set = tune::prune_configs(v, keyed, facts);
          REQUIRE(!set.candidates.empty());
          CHECK(set.candidates[0] == set.default_config);
          CHECK(set.candidates.size() >= 2);
        }
      }
    }
  }
  // dK/dV: both dQ strategies are in the space (the plan fixes one while tuning the tiles).
  const KernelDesc dkdv = kernels::backward_problem(
      Family::BackwardDkDv, cuda::Arch::parse("sm_90a"), DType::BF16, 128, 128, 1, false);
  std::set<int64_t> atomic;
  for (const Params& c : reg().get(Family::BackwardDkDv, "sm80_mma").config_space(dkdv))
    atomic.insert(c.at("dq_atomic"));
  CHECK(atomic == std::set<int64_t>{0, 1});
  // The row kernels have one config: nothing to tune.
  for (const char* name : {"sm80"}) {
    CHECK(reg().get(Family::BackwardPreprocess, name).config_space({}).size() == 1);
  }
}

TEST_CASE("what the tuner compares and zeroes for each backward and decode step", "[tune]") {
  kernels::BackwardInputs b;
  b.dq = fake_cuda(DType::BF16, {1, 2, 64, 64}, 0x1000);
  b.dk = fake_cuda(DType::BF16, {1, 2, 64, 64}, 0x2000);
  b.dv = fake_cuda(DType::BF16, {1, 2, 64, 64}, 0x3000);
  b.buffer_grads = {fake_cuda(DType::F32, {2}, 0x4000)};
  using Out = kernels::TuningOutputs<kernels::BackwardInputs>;
  auto data = [](const std::vector<TensorRef>& v) {
    std::vector<uintptr_t> out;
    for (const TensorRef& t : v)
      out.push_back(reinterpret_cast<uintptr_t>(t.data));
    return out;
  };
  CHECK(data(Out::of(b, Family::BackwardDkDv)) == std::vector<uintptr_t>{0x2000, 0x3000, 0x4000});
  CHECK(data(Out::accumulated(b, Family::BackwardDkDv)) == std::vector<uintptr_t>{0x4000});
  CHECK(data(Out::of(b, Family::BackwardDq)) == std::vector<uintptr_t>{0x1000});
  CHECK(Out::accumulated(b, Family::BackwardDq).empty());
  CHECK(Out::of(b, Family::BackwardPreprocess).empty());

  kernels::DecodeInputs in = decode_inputs();
  in.lse = fake_cuda(DType::F32, {8, 32, 1}, 0x5000);
  using DecOut = kernels::TuningOutputs<kernels::DecodeInputs>;
  for (Family f : {Family::DecodeSplit, Family::DecodeCombine}) {
    CHECK(data(DecOut::of(in, f)) == std::vector<uintptr_t>{0x100000, 0x5000});
    CHECK(DecOut::accumulated(in, f).empty());
  }
}

TEST_CASE("decode_split: the split count is a launch parameter of one kernel", "[tune][decode]") {
  const kernels::DecodeInputs in = decode_inputs();
  const auto& split = kernels::variant_as<kernels::DecodeSplitVariant>(
      reg(), reg().complete(kernels::decode_split_problem(cuda::Arch::parse("sm_90a"), DType::BF16,
                                                          128, 128, 4, 16, 0, false),
                            kernels::decode_facts(in)));
  auto with_splits = [&](int n) {
    KernelDesc d =
        reg().complete(kernels::decode_split_problem(cuda::Arch::parse("sm_90a"), DType::BF16, 128,
                                                     128, 4, 16, 0, false),
                       kernels::decode_facts(in), {{"num_splits", n}});
    return d;
  };
  // The workspace and the grid follow the description's num_splits, whatever in.num_splits says
  // (every tuning candidate runs with its own count).
  for (int n : {1, 8, 64}) {
    const KernelDesc d = with_splits(n);
    CHECK(split.workspace_bytes(d, in) == kernels::decode_workspace_bytes(in, n));
    auto* ws = reinterpret_cast<void*>(uintptr_t{0x7f0000000000});
    CHECK(split.launches(d, in, ws).at(0).grid.x == static_cast<unsigned>(n));
  }
  // 0: the heuristic.
  const KernelDesc heuristic = with_splits(0);
  CHECK(split.launches(heuristic, in, nullptr).at(0).grid.x ==
        static_cast<unsigned>(kernels::resolve_num_splits(heuristic, in)));
  // One source (so one compile, one cache entry) for every count.
  const Mods mods = standard_mods("alibi");
  const cuda::GeneratedSource a = emit_source(mods, with_splits(1));
  const cuda::GeneratedSource b = emit_source(mods, with_splits(32));
  CHECK(a.source_key == b.source_key);
  CHECK_THAT(a.source, Catch::Contains("num_splits=0"));
  CHECK_THAT(a.source, Catch::Contains("any num_splits"));
  // The split counts of the config space reach the heuristic's maximum.
  std::set<int64_t> counts;
  for (const Params& c : split.config_space(with_splits(0)))
    counts.insert(c.at("num_splits"));
  CHECK(counts.count(0) == 1);
  CHECK(counts.count(kernels::kMaxDecodeSplits) == 1);
}

TEST_CASE("manifests: decode page sizes and their errors", "[tune]") {
  const std::string shape = R"("shapes": [{"heads": 8, "seqlen_q": 1, "seqlen_kv": 1000}])";
  CHECK(manifest_error(R"([{"kind": "decode", "mods": "noop", "page_size": 16, )" + shape + "}]")
            .empty());
  CHECK_THAT(
      manifest_error(R"([{"kind": "forward", "mods": "noop", "page_size": 16, )" + shape + "}]"),
      Catch::StartsWith("deploy.json: workload 0: 'page_size' applies to decode workloads") &&
          Catch::Contains("this one is a forward workload"));
  CHECK_THAT(
      manifest_error(R"([{"kind": "decode", "mods": "noop", "page_size": 24, )" + shape + "}]"),
      Catch::Contains("workload 0: page_size 24 must be 0 (contiguous K / V) or a power of two "
                      "from 1 to 256"));
  CHECK_THAT(
      manifest_error(R"([{"kind": "decode", "mods": "noop", "page_size": "16", )" + shape + "}]"),
      Catch::Contains("page_size \"16\" must be"));
  // Decoding runs bf16 and f16 only: said before anything is compiled, naming the family.
  CHECK_THAT(
      manifest_error(R"([{"name": "d", "kind": "decode", "mods": "noop", "dtypes": ["f32"], )" +
                     shape + "}]"),
      Catch::StartsWith("deploy.json: workload 0 ('d'): decode_split f32 d=128/128 gqa=1 "
                        "for sm_80:") &&
          Catch::Contains("bf16 or f16"));
  // The backward's head dims, likewise.
  CHECK_THAT(manifest_error(R"([{"kind": "backward", "mods": "noop", "head_dims": [100], )" +
                            shape + "}]"),
             Catch::Contains("workload 0: backward_preprocess bf16 d=100/100 gqa=1 for sm_80:") &&
                 Catch::Contains("head_dim_qk = 100"));
}

TEST_CASE("manifests: backward workloads warm the plan's kernels as the runtime completes them",
          "[tune]") {
  const tune::Manifest m = tune::parse_manifest(
      R"([{"kind": "backward", "mods": "alibi_causal", "head_dims": [128],
           "shapes": [{"batch": 2, "heads": 4, "seqlen": 4096},
                      {"batch": 2, "heads": 4, "seqlen": 1000}]}])",
      "deploy.json", ".");
  const tune::WarmPlan plan = tune::plan_warmup(m, {"sm_90a"}, false);
  CHECK(plan.notes.empty());
  CHECK(of_family(plan, Family::BackwardPreprocess).size() == 1);  // no per-shape flags
  CHECK(of_family(plan, Family::BlockMask).size() == 1);
  // dK/dV as the runtime completes it for each shape: divisible at 4096, not at 1000. Its default
  // on sm_90a adds dQ itself (dq_atomic = 1), so the plans' dQ step is the convert of its
  // accumulator layout (one kernel for both shapes), not a second pass.
  const cuda::Arch sm90 = cuda::Arch::parse("sm_90a");
  {
    const std::vector<tune::WarmKernel> ks = of_family(plan, Family::BackwardDkDv);
    REQUIRE(ks.size() == 2);
    std::set<std::string> warmed;
    for (const tune::WarmKernel& k : ks)
      warmed.insert(k.desc.str());
    for (int64_t s : {4096, 1000}) {
      kernels::InputFacts facts;
      facts.seqlen_q = facts.seqlen_kv = s;
      facts.mask_q_block = facts.mask_kv_block = 128;
      const KernelDesc d = reg().complete(
          kernels::backward_problem(Family::BackwardDkDv, sm90, DType::BF16, 128, 128, 1, true),
          facts);
      CHECK(warmed.count(d.str()) == 1);
      CHECK(d.flags.at("divisible") == (s == 4096 ? 1 : 0));
      CHECK(d.config.at("dq_atomic") == 1);
    }
  }
  const std::vector<tune::WarmKernel> dq90 = of_family(plan, Family::BackwardDq);
  REQUIRE(dq90.size() == 1);
  CHECK(dq90[0].desc.variant == "atomic_convert");
  CHECK(dq90[0].desc.config.at("dq_layout") == 1);
  // On sm_80 (the mma.sync variants, whose dK/dV config space has dQ by atomics):
  const tune::WarmPlan plan80 = tune::plan_warmup(m, {"sm_80"}, false);
  for (const tune::WarmKernel& k : of_family(plan80, Family::BackwardDq))
    CHECK(k.desc.variant == "sm80_mma");
  const tune::WarmPlan all = tune::plan_warmup(m, {"sm_80"}, true);
  bool convert = false, atomic_dkdv = false;
  for (const tune::WarmKernel& k : all.kernels) {
    convert = convert || k.desc.variant == "atomic_convert";
    atomic_dkdv = atomic_dkdv || (k.desc.family == Family::BackwardDkDv &&
                                  k.desc.config.get("dq_atomic").value_or(0) == 1);
  }
  CHECK(atomic_dkdv);
  CHECK(convert);
  CHECK(all.kernels.size() > 3 * plan80.kernels.size());
  // Every config of the sm_90a variants: more kernels than the defaults, with the second pass
  // (the dK/dV candidates without dQ) and the convert of sm90a_wgmma's layout.
  const tune::WarmPlan all90 = tune::plan_warmup(m, {"sm_90a"}, true);
  CHECK(all90.kernels.size() > plan.kernels.size());
  bool pass90 = false;
  for (const tune::WarmKernel& k : all90.kernels) {
    if (k.desc.variant == "atomic_convert") CHECK(k.desc.config.at("dq_layout") == 1);
    pass90 = pass90 || (k.desc.family == Family::BackwardDq && k.desc.variant == "sm90a_wgmma");
  }
  CHECK(pass90);
}

TEST_CASE("the family records say which later step a step changes and what a mask_mod needs",
          "[tune][family]") {
  const kernels::Families& families = kernels::Families::global();
  const kernels::FamilyInfo& dkdv = families.get(Family::BackwardDkDv);
  REQUIRE(dkdv.changes_later);
  const cuda::Arch sm90 = cuda::Arch::parse("sm_90a"), sm80 = cuda::Arch::parse("sm_80");
  // sm90a_wgmma adds dQ by bulk reductions (its default): the dQ step converts its layout.
  const KernelDesc d90 = reg().complete(
      kernels::backward_problem(Family::BackwardDkDv, sm90, DType::BF16, 128, 128, 1, false), {});
  const std::optional<kernels::StepChange> c90 = dkdv.changes_later(d90);
  REQUIRE(c90.has_value());
  CHECK(c90->family == Family::BackwardDq);
  CHECK(c90->variant == "atomic_convert");
  CHECK(c90->overrides == Params{{"dq_layout", kernels::dq_accum_layout(d90)}});
  CHECK(c90->overrides.at("dq_layout") == 1);
  // The change completes as the runtime's dQ step does.
  CHECK(reg()
            .complete(kernels::backward_problem(Family::BackwardDq, sm90, DType::BF16, 128, 128, 1,
                                                false),
                      {}, c90->overrides, c90->variant)
            .config.str() == "dq_layout=1 num_warps=4");
  // sm80_mma: a second pass by default (no change), the convert of layout 0 with dq_atomic = 1.
  const KernelDesc problem80 =
      kernels::backward_problem(Family::BackwardDkDv, sm80, DType::BF16, 64, 64, 1, false);
  CHECK_FALSE(dkdv.changes_later(reg().complete(problem80, {})).has_value());
  const auto c80 = dkdv.changes_later(reg().complete(problem80, {}, {{"dq_atomic", 1}}));
  REQUIRE(c80.has_value());
  CHECK(c80->overrides.at("dq_layout") == 0);
  // No other built-in family changes a later step; the block mask alone is built for a mask_mod.
  for (const kernels::FamilyInfo* f : families.all()) {
    INFO(f->name);
    if (f->family != Family::BackwardDkDv) CHECK_FALSE(f->changes_later);
    CHECK(f->for_mask_mod == (f->family == Family::BlockMask));
  }
}

TEST_CASE("manifests: decode workloads warm one split kernel per tile config", "[tune]") {
  const tune::Manifest m = tune::parse_manifest(
      R"([{"kind": "decode", "mods": "alibi", "gqa_ratios": [4], "page_size": 16,
           "shapes": [{"batch": 8, "heads": 32, "seqlen_q": 1, "seqlen_kv": 8000},
                      {"batch": 8, "heads": 32, "seqlen_q": 4, "seqlen_kv": 8192}]}])",
      "deploy.json", ".");
  const tune::WarmPlan plan = tune::plan_warmup(m, {"sm_80"}, false);
  CHECK(plan.notes.empty());
  const std::vector<tune::WarmKernel> splits = of_family(plan, Family::DecodeSplit);
  // 4 q heads per kv head x 1 token and x 4 tokens: 16 packed rows both (one kernel).
  REQUIRE(splits.size() == 1);
  CHECK(splits[0].desc.flags.at("rows") == 16);
  CHECK(splits[0].desc.flags.at("page_size") == 16);
  CHECK(splits[0].desc.config.at("num_splits") == 0);
  CHECK(of_family(plan, Family::DecodeCombine).size() == 1);
  CHECK(of_family(plan, Family::BlockMask).empty());  // alibi has no mask_mod
  // As the runtime completes it for the call (its problem and input facts).
  kernels::DecodeInputs in = decode_inputs();
  in.heads_q = 32, in.heads_kv = 8, in.page_size = 16, in.seqlen_kv = 8000;
  const KernelDesc runtime_split =
      reg().complete(kernels::decode_split_problem(cuda::Arch::parse("sm_80"), DType::BF16, 128,
                                                   128, 4, 16, 16, false),
                     kernels::decode_facts(in));
  CHECK(runtime_split.str() == splits[0].desc.str());
  // Every config: the tile configs once each (their split counts share a kernel).
  const tune::WarmPlan all = tune::plan_warmup(m, {"sm_80"}, true);
  std::set<std::string> seen;
  size_t n = 0;
  for (const tune::WarmKernel& k : of_family(all, Family::DecodeSplit)) {
    CHECK(k.desc.config.at("num_splits") == 0);
    seen.insert(k.desc.str());
    ++n;
  }
  CHECK(n == seen.size());
  CHECK(n >= 4);
  CHECK(of_family(all, Family::DecodeCombine).size() == 4);  // num_warps 1, 2, 4, 8
}

TEST_CASE("the example manifest warms backward and decode plans at their shapes", "[tune]") {
  const tune::Manifest m =
      tune::load_manifest(fs::path(FLEXJIT_SOURCE_DIR) / "examples/tune/standard_manifest.json");
  std::set<std::string> kinds;
  bool paged = false;
  for (const tune::Workload& w : m.workloads) {
    kinds.insert(w.kind);
    paged = paged || w.page_size > 0;
  }
  CHECK(kinds == std::set<std::string>{"backward", "decode", "forward"});
  CHECK(paged);
  const tune::WarmPlan plan = tune::plan_warmup(m, {}, false);
  CHECK(plan.notes.empty());
  CHECK(of_family(plan, Family::BackwardDkDv).size() >= 3);
  CHECK(of_family(plan, Family::DecodeSplit).size() >= 2);  // contiguous and paged
  for (const tune::WarmKernel& k : of_family(plan, Family::BackwardDkDv))
    CHECK(k.desc.flags.at("divisible") == 1);  // 4096 divides by every tile
}

TEST_CASE("flexjit tune warms backward and decode kernels that the runtime then finds",
          "[cli][tune][nvrtc]") {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  const fs::path m = dir.path() / "m.json";
  std::ofstream(m) << R"([
    {"name": "bwd", "kind": "backward", "mods": "alibi_causal", "head_dims": [64],
     "shapes": [{"batch": 1, "heads": 2, "seqlen": 256}], "archs": ["sm_80"]},
    {"name": "dec", "kind": "decode", "mods": "alibi", "gqa_ratios": [4], "page_size": 16,
     "shapes": [{"batch": 2, "heads": 8, "seqlen_q": 1, "seqlen_kv": 1000}],
     "archs": ["sm_80"]}])";
  const std::string env = "FLEXJIT_CACHE_DIR='" + cache.string() + "' timeout 300";
  std::string out;
  REQUIRE(run_cli("tune --jobs 2 --manifest '" + m.string() + "'", &out, env) == 0);
  INFO(out);
  // preprocess, dK/dV, dQ, the block mask; the decode split and combine.
  CHECK_THAT(out, Catch::Contains("6 kernels: 6 compiled, 0 already cached, 0 failed"));
  REQUIRE(run_cli("tune --manifest '" + m.string() + "'", &out, env) == 0);
  CHECK_THAT(out, Catch::Contains("6 kernels: 0 compiled, 6 already cached"));

  // The kernels the runtime completes for these calls come from the disk cache, a tuned split
  // count included (one split kernel serves them all).
  ScopedEnv cache_env("FLEXJIT_CACHE_DIR", cache.c_str());
  KernelBuilder builder;
  const cuda::Arch sm80 = cuda::Arch::parse("sm_80");
  kernels::InputFacts bwd;
  bwd.seqlen_q = bwd.seqlen_kv = 256;
  bwd.mask_q_block = bwd.mask_kv_block = 128;
  kernels::DecodeInputs in = decode_inputs();
  in.batch = 2, in.heads_q = 8, in.heads_kv = 2, in.page_size = 16, in.seqlen_kv = 1008;
  const uint64_t before = jit::nvrtc_compile_count();
  for (Family f : {Family::BackwardPreprocess, Family::BackwardDkDv, Family::BackwardDq}) {
    const KernelDesc d =
        reg().complete(kernels::backward_problem(f, sm80, DType::BF16, 64, 64, 1, true), bwd);
    CHECK(builder.build(standard_mods("alibi_causal"), d).compiled.outcome ==
          jit::CacheOutcome::DiskHit);
  }
  const KernelDesc split =
      reg().complete(kernels::decode_split_problem(sm80, DType::BF16, 128, 128, 4, 16, 16, false),
                     kernels::decode_facts(in), {{"num_splits", 16}});
  CHECK(builder.build(standard_mods("alibi"), split).compiled.outcome ==
        jit::CacheOutcome::DiskHit);
  CHECK(jit::nvrtc_compile_count() == before);
}

TEST_CASE("the searches of the GPU tuning tests have a valid default and candidates to time",
          "[tune]") {
  // tests/gpu/test_tune_families.cpp: alibi_causal backward at B=1 H=2 S=256 D=64 with its
  // 128-block mask, num_stages fixed to 1 (dQ by a second pass, then by atomics); alibi decoding
  // at B=2 Hq=8 Hkv=2 Sq=1 Skv=1024 D=128 with num_warps 4 and num_stages 2 fixed.
  const cuda::Arch sm90 = cuda::Arch::parse("sm_90a");
  kernels::InputFacts bwd;
  bwd.seqlen_q = bwd.seqlen_kv = 256;
  bwd.mask_q_block = bwd.mask_kv_block = 128;
  // The backward searches run under the sm80_mma family scope (test::BackwardFamilyScope).
  auto candidates = [&](const KernelDesc& problem, const kernels::InputFacts& facts,
                        const Params& caller, const std::string& variant = {}) {
    // As StepTuner selects: a variant without a parameter the caller fixes is passed over.
    const kernels::Variant& v = *reg().select(problem, facts, variant, caller).variant;
    KernelDesc keyed = problem;
    keyed.variant = std::string(v.name());
    const tune::CandidateSet set = tune::prune_configs(v, keyed, facts, caller, 232448);
    // The default is valid (the untuned call runs it).
    KernelDesc d = reg().complete(problem, facts, caller, variant);
    CHECK_NOTHROW(v.validate(d));
    return set.candidates.size();
  };
  for (int atomic : {0, 1}) {
    INFO("dq_atomic " << atomic);
    const size_t dkdv = candidates(
        kernels::backward_problem(Family::BackwardDkDv, sm90, DType::BF16, 64, 64, 1, true), bwd,
        {{"dq_atomic", atomic}, {"num_stages", 1}}, "sm80_mma");
    CHECK(dkdv >= 2);
    WARN("backward_dkdv candidates (dq_atomic " << atomic << "): " << dkdv);
  }
  const size_t dq =
      candidates(kernels::backward_problem(Family::BackwardDq, sm90, DType::BF16, 64, 64, 1, true),
                 bwd, {{"num_stages", 1}}, "sm80_mma");
  CHECK(dq >= 2);
  kernels::DecodeInputs in = decode_inputs();
  in.batch = 2, in.heads_q = 8, in.heads_kv = 2, in.seqlen_kv = 1024;
  const size_t split =
      candidates(kernels::decode_split_problem(sm90, DType::BF16, 128, 128, 4, 16, 0, false),
                 kernels::decode_facts(in), {{"num_stages", 2}, {"num_warps", 4}});
  CHECK(split >= 10);  // two tile configs x the split counts
  WARN("backward_dq candidates: " << dq << ", decode_split candidates: " << split);
}
