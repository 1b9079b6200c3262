// Companion kernels (kernels::Variant::companions): the sm_90a forward's 192-row tiles with a
// mask_mod name the union schedule's kernel (forward_schedule/block_per_tile), which
// KernelBuilder builds beside the forward in a module of its own, once for every mods; the
// forward's own module no longer holds it ([pipeline][companion]).
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "jit/Nvrtc.h"
#include "kernels/Registry.h"
#include "kernels/forward/Sm90Wgmma.h"
#include "kernels/forward_companions/Fp8Transpose.h"
#include "kernels/forward_companions/UnionSchedule.h"
#include "support/CacheTest.h"
#include "support/KernelDescs.h"

#include <catch2/catch.hpp>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

KernelDesc forward_192() {
  return test::forward_desc("sm_90a", DType::BF16, 128, 128, 1, "sm90a_wgmma", {{"block_m", 192}});
}

}  // namespace

TEST_CASE("the 192-row sm_90a forward with a mask_mod names the union schedule as its companion",
          "[pipeline][companion]") {
  const Variant& v = Registry::global().get(Family::Forward, "sm90a_wgmma");
  const KernelDesc d = forward_192();
  REQUIRE(d.config.at("block_m") == 192);
  const std::vector<KernelDesc> c = v.companions(d, standard_mods("causal"));
  REQUIRE(c.size() == 1);
  CHECK(c[0] == union_schedule_desc(cuda::Arch::parse("sm_90a")));
  CHECK(c[0].str() == KernelDesc::parse(c[0].str()).str());
  // The same companion whatever the mods and the dtype; none without a mask_mod or at 128 rows.
  CHECK(v.companions(d, standard_mods("document_causal")) == c);
  CHECK(v.companions(d, standard_mods("noop")).empty());
  CHECK(v.companions(test::forward_desc("sm_90a", DType::BF16, 128, 128, 1, "sm90a_wgmma",
                                        {{"block_m", 128}}),
                     standard_mods("causal"))
            .empty());
  // The companion's source holds its entry point and no mods; the forward's does not hold it.
  const Variant& s = Registry::global().get(Family::ForwardSchedule, "block_per_tile");
  CHECK(s.entry_points() == std::vector<std::string>{"flexjit_forward_union_schedule"});
  CHECK_THAT(s.generate(Mods{}, c[0]).source,
             Catch::Contains("flexjit_forward_union_schedule(const FjUnionScheduleArgs a)"));
  CHECK_THAT(emit_source(standard_mods("causal"), d).source,
             !Catch::Contains("flexjit_forward_union_schedule(const"));
  // The family takes no config.
  KernelDesc bad = c[0];
  bad.config.set("num_warps", 4);
  CHECK_THROWS_AS(s.validate(bad), UnsupportedError);
}

TEST_CASE("the e4m3 forward names its V^T pre-pass first, then the union schedule",
          "[pipeline][companion][fp8]") {
  const Variant& v = Registry::global().get(Family::Forward, "sm90a_wgmma");
  const cuda::Arch arch = cuda::Arch::parse("sm_90a");
  for (int bm : {128, 192}) {
    const KernelDesc d =
        test::forward_desc("sm_90a", DType::E4M3, 128, 96, 1, "sm90a_wgmma", {{"block_m", bm}});
    INFO(d.str());
    // In this order whatever the mods: launches() numbers them without the mods.
    const std::vector<KernelDesc> none = v.companions(d, standard_mods("noop"));
    REQUIRE(none.size() == 1);
    CHECK(none[0] == fp8_vt_desc(arch, 96));
    const std::vector<KernelDesc> masked = v.companions(d, standard_mods("causal"));
    REQUIRE(masked.size() == (bm == 192 ? 2u : 1u));
    CHECK(masked[0] == fp8_vt_desc(arch, 96));
    if (bm == 192) CHECK(masked[1] == union_schedule_desc(arch));
    CHECK_THAT(emit_source(standard_mods("causal"), d).source,
               !Catch::Contains("flexjit_forward_fp8_vt(const FjFp8VtArgs a)"));
  }
  // The pre-pass's source: v's real head dim, no mods; refusals name the value.
  const Variant& t = Registry::global().get(Family::ForwardFp8Vt, "block_per_64_keys");
  CHECK_THAT(t.generate(Mods{}, fp8_vt_desc(arch, 96)).source,
             Catch::Contains("static constexpr int kRealDimV = 96;") &&
                 Catch::Contains("flexjit_forward_fp8_vt(const FjFp8VtArgs a)"));
  KernelDesc odd = fp8_vt_desc(arch, 40);
  CHECK_THROWS_WITH(t.validate(odd), Catch::Contains("multiple of 16 up to 256, not 40"));
  KernelDesc bf16 = fp8_vt_desc(arch, 128);
  bf16.dtype = DType::BF16;
  CHECK_THROWS_WITH(t.validate(bf16), Catch::Contains("transposes e4m3 v, not bf16"));
}

TEST_CASE("a companion is built beside its kernel, once for every mods",
          "[pipeline][companion][nvrtc]") {
  test::TempDir dir;
  KernelBuilder builder(test::settings_in(dir.path()));
  builder.set_compile_threads(2);
  const KernelDesc d = forward_192();
  const uint64_t compiles = jit::nvrtc_compile_count();
  const BuiltKernel causal = builder.build(standard_mods("causal"), d);
  CHECK(jit::nvrtc_compile_count() == compiles + 2);  // the forward and its companion
  REQUIRE(causal.companions.size() == 1);
  const BuiltKernel& schedule = causal.companions[0];
  CHECK(schedule.desc.family == Family::ForwardSchedule);
  CHECK(schedule.compiled.kernel->kernel_name == "flexjit_forward_union_schedule");
  CHECK(schedule.compiled.kernel->key != causal.compiled.kernel->key);
  CHECK(builder.totals().kernels == 2);

  // Other mods: their forward is compiled, the companion comes from the memo.
  const BuiltKernel doc = builder.build(standard_mods("document_causal"), d);
  CHECK(jit::nvrtc_compile_count() == compiles + 3);
  REQUIRE(doc.companions.size() == 1);
  CHECK(doc.companions[0].compiled.kernel == schedule.compiled.kernel);
  // The forward again: one memo hit with its companion.
  const BuiltKernel again = builder.build(standard_mods("causal"), d);
  CHECK(again.compiled.outcome == jit::CacheOutcome::MemoryHit);
  REQUIRE(again.companions.size() == 1);
  CHECK(again.companions[0].compiled.kernel == schedule.compiled.kernel);

  // One thread: the same companion (the disk cache's), built after the kernel.
  KernelBuilder serial(test::settings_in(dir.path()));
  serial.set_compile_threads(1);
  const BuiltKernel s = serial.build(standard_mods("causal"), d);
  REQUIRE(s.companions.size() == 1);
  CHECK(s.companions[0].compiled.kernel->key == schedule.compiled.kernel->key);
  CHECK(s.companions[0].compiled.kernel->cubin == schedule.compiled.kernel->cubin);
}
