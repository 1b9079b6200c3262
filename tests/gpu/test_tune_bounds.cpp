// `flexjit tune` on a GPU sizes its random inputs with checked arithmetic (issue 34): a manifest
// shape whose tensors overflow is that item's "failed: ..." with the shape, never a wrapped
// allocation. (Shapes past 2^31 - 1 are refused by the manifest itself: test_cli.cpp.)
#include "gpu/GpuTestUtil.h"
#include "support/CacheTest.h"
#include "support/CliPath.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <string>

using namespace flexjit;

TEST_CASE("tune: a workload shape whose inputs overflow fails alone, naming the shape",
          "[gpu][tune][errors]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  test::TempDir dir;
  const std::string arch = ctx->arch();
  const std::string manifest = (dir.path() / "huge.json").string();
  std::ofstream(manifest) << R"({"archs": [")" << arch << R"("], "workloads": [)"
                          << R"({"name": "huge", "mods": "causal", "head_dims": [64], )"
                          << R"("shapes": [{"batch": 2147483647, "heads": 2147483647, )"
                          << R"("seqlen": 2147483647}]}]})";
  std::string output;
  const int code = test::run_cli("tune --json --manifest '" + manifest + "'", &output,
                                 "FLEXJIT_CACHE_DIR='" + (dir.path() / "cache").string() + "'");
  INFO(output);
  CHECK(code == 0);  // the kernels compiled; the timing item failed and says why
  CHECK_THAT(output, Catch::Contains("failed: an input tensor of shape [2147483647, 2147483647, "
                                     "2147483647, 64] has a negative extent or more than 2^63 "
                                     "bytes"));
}
