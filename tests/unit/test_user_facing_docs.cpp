// What the docs and help promise matches the tool (issue 34, "Docs that disagree with the
// tool"): flexjit.h ("everything a user includes") declares kernel.h's API, `run --help`
// names every dtype `run` takes, and `flexjit kernels` marks experimental variants as the
// README's FLEXJIT_ENABLE_VARIANTS row says.
#include <flexjit/flexjit.h>  // alone: kernel_variants() must be declared through it

#include "support/CliPath.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

TEST_CASE("flexjit.h includes the kernel API; run --help names f32", "[cli][docs]") {
  const std::vector<flexjit::KernelVariantInfo> variants = flexjit::kernel_variants();
  CHECK_FALSE(variants.empty());

  std::string help;
  CHECK(flexjit::test::run_cli("run --help", &help) == 0);
  CHECK_THAT(help, Catch::Contains("or float32"));

  std::string kernels;
  REQUIRE(flexjit::test::run_cli("kernels", &kernels) == 0);
  for (const flexjit::KernelVariantInfo& v : variants) {
    if (v.experimental) {
      INFO(v.family << "/" << v.name);
      CHECK_THAT(kernels, Catch::Contains("(experimental: FLEXJIT_ENABLE_VARIANTS)"));
    }
  }
}
