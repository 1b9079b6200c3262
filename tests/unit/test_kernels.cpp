// The kernel layer: descriptions (text / JSON round trips, hashing), the variant registry and
// selection, the builder's bounded memo, plans and launch arguments, and the CLI's view of them.
#include <flexjit/error.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "kernels/Registry.h"
#include "kernels/block_mask/BlockMaskBuild.h"
#include "kernels/forward/ForwardArgs.h"
#include "kernels/forward/Sm80Mma.h"
#include "plan/Plan.h"
#include "support/CliPath.h"
#include "support/KernelDescs.h"
#include "util/Log.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

// A description with every field away from its default.
KernelDesc all_fields() {
  KernelDesc d;
  d.family = Family::BackwardDkDv;
  d.variant = "sm90a_wgmma";
  d.arch = cuda::Arch::parse("sm_90a");
  d.dtype = DType::F16;
  d.head_dim_qk = 192;
  d.head_dim_v = 64;
  d.gqa_ratio = 7;
  d.flags = {{"divisible", 1}, {"full_blocks", 0}, {"deterministic", 1}};
  d.config = {{"block_m", 64}, {"block_n", 128}, {"num_warps", 8}, {"num_stages", 3}};
  return d;
}

// A stand-in forward variant that serves only sm_90a (as the Hopper variant will).
class OnlyHopper : public ForwardSm80Mma {
 public:
  std::string_view name() const override { return "only_hopper"; }
  int priority() const override { return 100; }
  std::optional<std::string> unsupported(const KernelDesc& p, const InputFacts& f) const override {
    if (!p.arch.accelerated) return "needs sm_90a; the target is " + p.arch.str();
    return ForwardSm80Mma::unsupported(p, f);
  }
};

// A stand-in for a variant written but not yet verified on its GPU.
class ExperimentalHopper : public OnlyHopper {
 public:
  std::string_view name() const override { return "experimental_hopper"; }
  bool experimental() const override { return true; }
};

KernelDesc forward_problem_for(const char* arch) {
  return forward_problem(cuda::Arch::parse(arch), DType::BF16, 128, 128, 1, false, true);
}

}  // namespace

TEST_CASE("KernelDesc: text and JSON round trips keep every field", "[kernels][desc]") {
  const KernelDesc d = all_fields();
  CHECK(d.str() ==
        "backward_dkdv/sm90a_wgmma sm_90a f16 d=192/64 gqa=7 deterministic=1 divisible=1 "
        "full_blocks=0 | block_m=64 block_n=128 num_stages=3 num_warps=8");
  CHECK(KernelDesc::parse(d.str()) == d);
  CHECK(KernelDesc::from_json(d.to_json()) == d);
  CHECK(KernelDesc::from_json(nlohmann::json::parse(d.to_json().dump())) == d);
  CHECK(d.to_json().at("config").at("num_warps") == 8);
  // Every family and a description without variant or config.
  for (Family f : all_families()) {
    KernelDesc e;
    e.family = f;
    CHECK(parse_family(to_string(f)) == f);
    CHECK(KernelDesc::parse(e.str()) == e);
    CHECK(KernelDesc::from_json(e.to_json()) == e);
  }
}

TEST_CASE("KernelDesc: the hash follows the text, and any field changes it", "[kernels][desc]") {
  const KernelDesc d = all_fields();
  CHECK(d.hash() == KernelDesc::parse(d.str()).hash());
  std::vector<KernelDesc> changed(10, d);
  changed[0].family = Family::BackwardDq;
  changed[1].variant = "other";
  changed[2].arch = cuda::Arch::parse("sm_90");
  changed[3].dtype = DType::BF16;
  changed[4].head_dim_qk = 128;
  changed[5].head_dim_v = 128;
  changed[6].gqa_ratio = 1;
  changed[7].flags.set("divisible", 0);
  changed[8].config.set("num_stages", 2);
  changed[9].config.set("swizzle", 1);
  for (const KernelDesc& c : changed) {
    INFO(c.str());
    CHECK(c.hash() != d.hash());
    CHECK_FALSE(c == d);
  }
}

TEST_CASE("KernelDesc: malformed text and JSON are precise errors", "[kernels][desc][errors]") {
  const std::string good = all_fields().str();
  auto fails = [](const std::string& text, const std::string& what) {
    INFO(text);
    CHECK_THROWS_AS(KernelDesc::parse(text), UnsupportedError);
    CHECK_THROWS_WITH(KernelDesc::parse(text), Catch::Contains(what));
  };
  fails("forward", "expected 'family/variant");
  fails("fwd/x sm_80 bf16 d=64/64 gqa=1 |", "unknown kernel family 'fwd'");
  fails("forward/x sm_75 bf16 d=64/64 gqa=1 |", "sm_75");
  fails("forward/x sm_80 f64 d=64/64 gqa=1 |", "unknown dtype 'f64'");
  fails("forward/x sm_80 bf16 d=64 gqa=1 |", "expected d=QK/V");
  fails("forward/x sm_80 bf16 d=64/64 gqa=one |", "expected gqa=N");
  fails("forward/x sm_80 bf16 d=64/64 gqa=1 divisible", "expected name=integer");
  fails("forward/x sm_80 bf16 d=64/64 gqa=1 a=1 a=2 |", "'a' given twice");
  fails("forward/x sm_80 bf16 d=64/64 gqa=1 a=1", "no '|'");
  fails("forward/X! sm_80 bf16 d=64/64 gqa=1 |", "bad variant name");
  nlohmann::json j = all_fields().to_json();
  j.erase("gqa_ratio");
  CHECK_THROWS_WITH(KernelDesc::from_json(j), Catch::Contains("no \"gqa_ratio\""));
  j = all_fields().to_json();
  j["config"]["block_m"] = "big";
  CHECK_THROWS_WITH(KernelDesc::from_json(j), Catch::Contains("block_m"));
  j = all_fields().to_json();
  j["extra"] = 1;
  CHECK_THROWS_WITH(KernelDesc::from_json(j), Catch::Contains("unknown keys"));
}

TEST_CASE("Registry: built-in variants and selection by arch, with reasons",
          "[kernels][registry]") {
  const Registry& global = Registry::global();
  REQUIRE(global.find(Family::Forward, "sm80_mma") != nullptr);
  REQUIRE(global.find(Family::BlockMask, "warp_per_tile") != nullptr);
  CHECK(global.find(Family::Forward, "nope") == nullptr);

  Registry r;
  register_builtin_variants(r);
  r.add(std::make_unique<OnlyHopper>());
  CHECK_THROWS_WITH(r.add(std::make_unique<OnlyHopper>()),
                    Catch::Contains("forward/only_hopper is already registered"));
  // Higher priority first.
  REQUIRE(r.variants(Family::Forward).size() == 3);  // + sm90a_wgmma and sm80_mma
  CHECK(r.variants(Family::Forward)[0]->name() == "only_hopper");

  Selection on_hopper = r.select(forward_problem_for("sm_90a"), {});
  CHECK(on_hopper.variant->name() == "only_hopper");
  CHECK(on_hopper.skipped.empty());
  Selection on_ampere = r.select(forward_problem_for("sm_80"), {});
  CHECK(on_ampere.variant->name() == "sm80_mma");
  REQUIRE(on_ampere.skipped.size() == 2);
  CHECK(on_ampere.skipped[0] == "forward/only_hopper: needs sm_90a; the target is sm_80");
  CHECK(on_ampere.skipped[1] == "forward/sm90a_wgmma: wgmma and setmaxnreg need sm_90a, not sm_80");
  CHECK_THAT(on_ampere.str(),
             Catch::Contains("forward/sm80_mma (passed over: forward/only_hopper"));

  // Inputs a variant cannot take: every reason is in the error.
  InputFacts misaligned;
  misaligned.aligned16 = false;
  misaligned.alignment_blocker = "stride of q in dim 2 is 6 bytes";
  CHECK_THROWS_WITH(r.select(forward_problem_for("sm_90a"), misaligned),
                    Catch::Contains("no forward kernel variant supports") &&
                        Catch::Contains("forward/only_hopper: the forward kernel needs 16-byte") &&
                        Catch::Contains("forward/sm80_mma: the forward kernel needs 16-byte") &&
                        Catch::Contains("forward/sm90a_wgmma: TMA needs 16-byte") &&
                        Catch::Contains("6 bytes"));
  // Named variants: unknown, unsupported, and taken even at lower priority.
  CHECK_THROWS_WITH(r.select(forward_problem_for("sm_80"), {}, "wgmma"),
                    Catch::Contains("no forward kernel variant 'wgmma'") &&
                        Catch::Contains("only_hopper, sm90a_wgmma, sm80_mma"));
  CHECK_THROWS_WITH(r.select(forward_problem_for("sm_80"), {}, "only_hopper"),
                    Catch::Contains("forward/only_hopper cannot run this call: needs sm_90a"));
  Selection forced = r.select(forward_problem_for("sm_90a"), {}, "sm80_mma");
  CHECK(forced.forced);
  CHECK(forced.variant->name() == "sm80_mma");
  // Excluded variants are passed over by automatic selection (with the reason), still taken
  // when named; an unknown name is refused with the list.
  r.set_excluded({"forward/only_hopper", "forward/sm90a_wgmma"});
  Selection excluded = r.select(forward_problem_for("sm_90a"), {});
  CHECK(excluded.variant->name() == "sm80_mma");
  CHECK_THAT(excluded.str(),
             Catch::Contains("forward/only_hopper: excluded (FLEXJIT_EXCLUDE_VARIANTS)"));
  CHECK(r.select(forward_problem_for("sm_90a"), {}, "sm90a_wgmma").variant->name() ==
        "sm90a_wgmma");
  CHECK_THROWS_WITH(r.set_excluded({"forward/sm100"}),
                    Catch::Contains("no such variant") && Catch::Contains("forward/sm80_mma"));
  CHECK(r.excluded().size() == 2);
  // A config override that only a lower-priority variant has (num_warps: sm80_mma's, not
  // sm90a_wgmma's) selects that variant, with the reason.
  r.set_excluded({"forward/only_hopper"});
  Selection warps = r.select(forward_problem_for("sm_90a"), {}, {}, Params{{"num_warps", 4}});
  CHECK(warps.variant->name() == "sm80_mma");
  CHECK_THAT(warps.str(), Catch::Contains("forward/sm90a_wgmma: has no config parameter "
                                          "'num_warps' (its parameters: block_m, block_n"));
  CHECK(r.complete(forward_problem_for("sm_90a"), {}, Params{{"num_warps", 4}}).variant ==
        "sm80_mma");
  CHECK(r.complete(forward_problem_for("sm_90a"), {}, Params{{"block_n", 64}}).variant ==
        "sm90a_wgmma");
  // An experimental variant is passed over unless enabled.
  r.set_excluded({"forward/only_hopper"});
  CHECK(r.select(forward_problem_for("sm_90a"), {}).variant->name() == "sm90a_wgmma");
  r.add(std::make_unique<ExperimentalHopper>());
  Selection not_enabled = r.select(forward_problem_for("sm_90a"), {});
  CHECK(not_enabled.variant->name() == "sm90a_wgmma");
  CHECK_THAT(not_enabled.str(),
             Catch::Contains("forward/experimental_hopper: experimental") &&
                 Catch::Contains("FLEXJIT_ENABLE_VARIANTS=forward/experimental_hopper"));
  r.set_enabled({"forward/experimental_hopper"});
  CHECK(r.select(forward_problem_for("sm_90a"), {}).variant->name() == "experimental_hopper");
  CHECK_THROWS_WITH(r.set_enabled({"forward/sm91"}), Catch::Contains("FLEXJIT_ENABLE_VARIANTS"));
  r.set_enabled({});
  r.set_excluded({});
  // A family without variants (in a registry that has none of it).
  Registry empty;
  KernelDesc dq = forward_problem_for("sm_80");
  dq.family = Family::BackwardDq;
  CHECK_THROWS_WITH(empty.select(dq, {}), Catch::Contains("none is registered"));
}

TEST_CASE("Registry::complete resolves, specializes and validates the config",
          "[kernels][registry]") {
  Selection sel;
  KernelDesc problem = forward_problem_for("sm_80");
  InputFacts facts;
  facts.seqlen_q = 4096;
  facts.seqlen_kv = 4096;
  const KernelDesc d = Registry::global().complete(problem, facts, {}, {}, &sel);
  CHECK(d.str() ==
        "forward/sm80_mma sm_80 bf16 d=128/128 gqa=1 divisible=1 fast_math=1 full_blocks=1 | "
        "block_m=128 block_n=64 num_stages=2 num_warps=4");
  CHECK(sel.variant->name() == "sm80_mma");
  CHECK_THROWS_WITH(Registry::global().complete(problem, facts, {{"num_stages", 7}}),
                    Catch::Contains("num_stages = 7"));
  // The log says what was chosen.
  setenv("FLEXJIT_LOG", "kernels", 1);
  logging::reload();
  CHECK(logging::enabled("kernels"));
  unsetenv("FLEXJIT_LOG");
  logging::reload();
}

TEST_CASE("KernelBuilder: the memo is bounded and keyed by mods and description",
          "[kernels][builder][nvrtc]") {
  jit::CacheSettings off;
  off.enabled = false;
  KernelBuilder builder(off, 2);
  const Mods causal = standard_mods("causal"), window = standard_mods("sliding_window");
  const KernelDesc b128 = test::block_mask_desc("sm_80", 128);
  const KernelDesc b64 = test::block_mask_desc("sm_80", 64);
  CHECK(builder.build(causal, b128).compiled.outcome == jit::CacheOutcome::Compiled);
  CHECK(builder.build(causal, b128).compiled.outcome == jit::CacheOutcome::MemoryHit);
  CHECK(builder.build(causal, b64).compiled.outcome == jit::CacheOutcome::Compiled);
  CHECK(builder.build(window, b64).compiled.outcome == jit::CacheOutcome::Compiled);
  CHECK(builder.memo_size() == 2);
  // causal at 128 was least recently used: evicted, compiled again (no other cache here).
  CHECK(builder.build(causal, b128).compiled.outcome == jit::CacheOutcome::Compiled);
  CHECK(builder.build(window, b64).compiled.outcome == jit::CacheOutcome::MemoryHit);
  CHECK(builder.memo_size() == 2);
  // A description of another variant's name is an error naming the family's variants.
  KernelDesc bad = b128;
  bad.variant = "nope";
  CHECK_THROWS_WITH(
      builder.build(causal, bad),
      Catch::Contains("no block_mask kernel variant 'nope'") && Catch::Contains("warp_per_tile"));
}

TEST_CASE("Plan: workspace slices are aligned and in step order", "[kernels][plan]") {
  runtime::Plan plan;
  for (size_t bytes : {size_t{100}, size_t{0}, size_t{4096}, size_t{1}}) {
    runtime::PlanStep s;
    s.desc = test::block_mask_desc("sm_80", 128);
    s.workspace_bytes = bytes;
    plan.add(std::move(s));
  }
  REQUIRE(plan.steps.size() == 4);
  CHECK(plan.steps[0].workspace_offset == 0);
  CHECK(plan.steps[1].workspace_offset == 256);
  CHECK(plan.steps[2].workspace_offset == 256);
  CHECK(plan.steps[3].workspace_offset == 256 + 4096);
  CHECK(plan.workspace_bytes == 256 + 4096 + 256);
  CHECK_THAT(plan.str(), Catch::Contains("block_mask/warp_per_tile sm_80"));
}

TEST_CASE("KernelArgs copies each argument and points at the copies", "[kernels][plan]") {
  KernelArgs a;
  struct Big {
    int64_t x[5];
    int y;
  } big{{1, 2, 3, 4, 5}, 6};
  const float f = 2.5f;
  a.add(big);
  a.add(f);
  a.add_bytes(nullptr, 0);
  big.y = 7;  // later changes do not reach the copy
  void** p = a.pointers();
  REQUIRE(a.size() == 3);
  Big got{};
  std::memcpy(&got, p[0], sizeof got);
  CHECK(got.x[4] == 5);
  CHECK(got.y == 6);
  CHECK(*static_cast<const float*>(p[1]) == 2.5f);
  CHECK(p[2] != nullptr);
}

TEST_CASE("block_mask_args gives broadcast strides of zero", "[kernels][blockmask]") {
  BlockMask m = block_mask_from_predicate([](int, int, int q, int kv) { return q >= kv; }, 1, 4,
                                          512, 1024, 128, 128);
  int dummy[4] = {};
  const FjBlockMaskArgs args = block_mask_args(m, dummy, dummy + 1, dummy + 2, dummy + 3);
  CHECK(args.kv_indices == dummy + 1);
  CHECK(args.num_stride_b == 0);
  CHECK(args.num_stride_h == 4);
  CHECK(args.idx_stride_b == 0);
  CHECK(args.idx_stride_h == 4 * 8);
  CHECK(args.idx_stride_m == 8);
  CHECK(args.q_block_size == 128);
  CHECK(args.kv_block_size == 128);
}

TEST_CASE("emit_kernel / kernel_variants: the public view of the kernel layer", "[kernels][api]") {
  KernelQuery q;
  q.arch = "sm_80";
  q.head_dim_qk = 64;
  const KernelSource src = emit_kernel(standard_mods("alibi_causal"), q);
  CHECK(src.kernel_name == "flexjit_forward");
  CHECK_THAT(src.description, Catch::StartsWith("forward/sm80_mma sm_80 bf16 d=64/64"));
  CHECK(KernelDesc::from_json(nlohmann::json::parse(src.description_json)).str() ==
        src.description);
  CHECK(src.selection ==
        "forward/sm80_mma (passed over: forward/sm90a_wgmma: wgmma and setmaxnreg need sm_90a, "
        "not sm_80)");
  CHECK(src.dynamic_smem_bytes == 2 * (128 * 64 + 2 * 64 * 128));
  CHECK_THAT(src.source, Catch::Contains("// spec: " + src.description));

  q.family = "block_mask";
  q.block_size = 64;
  const KernelSource bm = emit_kernel(standard_mods("sliding_window"), q);
  CHECK(bm.kernel_name == "flexjit_block_mask_classify");
  CHECK_THAT(bm.source, Catch::Contains("kQBlock = 64, kKvBlock = 64, kNumWarps = 8"));

  q.family = "decoder";
  CHECK_THROWS_WITH(
      emit_kernel(standard_mods("causal"), q),
      Catch::Contains("unknown kernel family 'decoder'") && Catch::Contains("forward, block_mask"));
  q.family = "backward_dq";
  const KernelSource dqk = emit_kernel(standard_mods("alibi_causal"), q);
  CHECK(dqk.kernel_name == "flexjit_bwd_dq");
  CHECK_THAT(dqk.description, Catch::StartsWith("backward_dq/sm80_mma "));
  CHECK_THAT(dqk.source,
             Catch::Contains("fj_dscore") && Catch::Contains("fj_grad_add(gp.grad_slopes"));
  q.family = "forward";
  q.variant = "nope";
  CHECK_THROWS_WITH(emit_kernel(standard_mods("causal"), q),
                    Catch::Contains("the forward variants are: sm90a_wgmma, sm80_mma"));

  bool forward = false, block_mask = false;
  for (const KernelVariantInfo& v : kernel_variants()) {
    if (v.family == "forward" && v.name == "sm80_mma") {
      forward = true;
      CHECK(v.templates == std::vector<std::string>{"flexjit_abi.h", "prelude.cuh", "mma_sm80.cuh",
                                                    "attention_sm80.cuh", "forward_common.cuh",
                                                    "forward_sm80.cuh"});
    }
    block_mask |= v.family == "block_mask" && v.name == "warp_per_tile";
  }
  CHECK(forward);
  CHECK(block_mask);
}

TEST_CASE("flexjit kernels, --kernel and --variant on the command line", "[kernels][cli]") {
  std::string out;
  REQUIRE(test::run_cli("kernels", &out) == 0);
  CHECK_THAT(out, Catch::Contains("forward/sm80_mma") &&
                      Catch::Contains("block_mask/warp_per_tile") &&
                      Catch::Contains("templates: flexjit_abi.h, prelude.cuh, mma_sm80.cuh"));
  REQUIRE(test::run_cli("kernels --json", &out) == 0);
  CHECK(nlohmann::json::parse(out).size() >= 2);
  REQUIRE(test::run_cli("emit --kernel block_mask --mask-mod causal --block-size 64 --arch sm_90a",
                        &out) == 0);
  CHECK_THAT(out, Catch::Contains("flexjit_block_mask_index") &&
                      Catch::Contains("// spec: block_mask/warp_per_tile sm_90a"));
  CHECK(test::run_cli("emit --variant wgmma --arch sm_90a", &out) == 1);
  CHECK_THAT(out,
             Catch::Contains("no forward kernel variant 'wgmma'") && Catch::Contains("sm80_mma"));
  CHECK(test::run_cli("emit --kernel decode --arch sm_90a", &out) == 1);
  CHECK_THAT(out, Catch::Contains("unknown kernel family 'decode'"));
  CHECK(test::run_cli("emit --arch sm_80 --stages 9", &out) == 1);
  CHECK_THAT(out, Catch::Contains("num_stages = 9"));
  // An explicit 0 is not "the default": it is refused, naming the flag.
  CHECK(test::run_cli("emit --arch sm_80 --warps 0", &out) == 1);
  CHECK_THAT(out, Catch::Contains("--warps"));
}
