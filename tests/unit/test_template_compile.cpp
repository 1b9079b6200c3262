// Compiles the forward kernel template through NVRTC exactly as the codegen assembles it
// (abi + prelude + FjConfig + mods + mma_sm80 + attention_sm80 + forward_common + forward_sm80, one
// header-free string), with hand-written stand-ins for the generated parts
// (tests/templates/mods_*.cuh). No GPU needed.
#include <flexjit/error.h>
#include <nvrtc.h>

#include "kernels/forward/Sm80Mma.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string read_source(const std::string& rel) {
  std::ifstream in(std::string(FLEXJIT_SOURCE_DIR) + "/" + rel, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct TestConfig {
  std::string mods = "mods_causal.cuh";
  std::string element = "fj_bf16";
  int block_m = 128, block_n = 64, num_warps = 4, num_stages = 2;
  int dim_qk = 128, dim_v = 128, gqa = 1;  // the tile dims
  int real_qk = 0, real_v = 0;             // the head dims computed in them; 0: the tile's
  bool divisible = false, full_blocks = true, score_mod = false, mask_mod = true;
  std::string arch = "sm_80";
};

std::string config_source(const TestConfig& c) {
  auto b = [](bool v) { return v ? "true" : "false"; };
  std::ostringstream s;
  s << "struct FjConfig {\n"
    << "  static constexpr int kBlockM = " << c.block_m << ", kBlockN = " << c.block_n
    << ", kNumWarps = " << c.num_warps << ", kNumStages = " << c.num_stages << ";\n"
    << "  static constexpr int kHeadDimQK = " << c.dim_qk << ", kHeadDimV = " << c.dim_v
    << ", kGqaRatio = " << c.gqa << ";\n"
    << "  static constexpr int kRealDimQK = " << (c.real_qk > 0 ? c.real_qk : c.dim_qk)
    << ", kRealDimV = " << (c.real_v > 0 ? c.real_v : c.dim_v) << ";\n"
    << "  static constexpr bool kIsDivisible = " << b(c.divisible)
    << ", kHasFullBlocks = " << b(c.full_blocks) << ";\n"
    << "  static constexpr bool kHasScoreMod = " << b(c.score_mod)
    << ", kHasMaskMod = " << b(c.mask_mod) << ";\n"
    << "  using Element = " << c.element << ";\n};\n";
  return s.str();
}

// The translation unit in the order the codegen emits it.
std::string compose(const TestConfig& c) {
  return "// flexjit template compile test\n" + read_source("templates/flexjit_abi.h") +
         read_source("templates/prelude.cuh") + config_source(c) +
         read_source("tests/templates/" + c.mods) + read_source("templates/mma_sm80.cuh") +
         read_source("templates/attention_sm80.cuh") + read_source("templates/forward_common.cuh") +
         read_source("templates/forward_sm80.cuh");
}

struct CompileResult {
  bool ok = false;
  std::string log;
  size_t cubin_bytes = 0;
  double seconds = 0;
};

CompileResult compile(const TestConfig& c) {
  const std::string src = compose(c);
  CompileResult r;
  const auto t0 = std::chrono::steady_clock::now();
  nvrtcProgram prog;
  REQUIRE(nvrtcCreateProgram(&prog, src.c_str(), "flexjit_forward.cu", 0, nullptr, nullptr) ==
          NVRTC_SUCCESS);
  const std::string arch_opt = "--gpu-architecture=" + c.arch;
  std::vector<const char*> opts = {arch_opt.c_str(), "-std=c++17"};
  const nvrtcResult res = nvrtcCompileProgram(prog, static_cast<int>(opts.size()), opts.data());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  if (log_size > 1) {
    r.log.resize(log_size);
    nvrtcGetProgramLog(prog, r.log.data());
    r.log.resize(log_size - 1);  // drop the terminating NUL
  }
  r.ok = res == NVRTC_SUCCESS;
  if (r.ok) nvrtcGetCUBINSize(prog, &r.cubin_bytes);
  nvrtcDestroyProgram(&prog);
  return r;
}

std::string describe(const TestConfig& c) {
  std::ostringstream s;
  s << c.mods << " " << c.element << " d=" << c.dim_qk << "/" << c.dim_v << " (real "
    << (c.real_qk > 0 ? c.real_qk : c.dim_qk) << "/" << (c.real_v > 0 ? c.real_v : c.dim_v) << ") "
    << c.block_m << "x" << c.block_n << " w" << c.num_warps << " s" << c.num_stages
    << " gqa=" << c.gqa << " div=" << c.divisible << " " << c.arch;
  return s.str();
}

void require_compiles(const TestConfig& c) {
  const CompileResult r = compile(c);
  INFO(describe(c) << "\nNVRTC log:\n" << r.log);
  REQUIRE(r.ok);
  CHECK(r.cubin_bytes > 0);
}

// The documented default block configuration per head dim (docs/kernels/forward_sm80.md).
TestConfig default_config(int d) {
  TestConfig c;
  c.dim_qk = c.dim_v = d;
  if (d == 64) {
    c.block_m = 128, c.block_n = 64, c.num_warps = 4;
  } else if (d == 128) {
    c.block_m = 128, c.block_n = 128, c.num_warps = 8;
  } else {
    c.block_m = 64, c.block_n = 64, c.num_warps = 4;
  }
  return c;
}

}  // namespace

TEST_CASE("forward template compiles through NVRTC for every arch, dtype and head dim",
          "[template]") {
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90a"})
    for (const char* element : {"fj_bf16", "fj_f16"})
      for (int d : {64, 128, 256}) {
        TestConfig c = default_config(d);
        c.arch = arch;
        c.element = element;
        require_compiles(c);
      }
}

TEST_CASE("forward template compiles with every stand-in mod and shape variant", "[template]") {
  std::vector<TestConfig> cases;
  auto add = [&](auto edit) {
    TestConfig c = default_config(128);
    edit(c);
    cases.push_back(c);
  };
  add([](TestConfig& c) { c.mods = "mods_noop.cuh", c.mask_mod = false, c.divisible = true; });
  add([](TestConfig& c) { c.mods = "mods_alibi.cuh", c.score_mod = true, c.mask_mod = false; });
  add([](TestConfig& c) { c.mods = "mods_softcap_window.cuh", c.score_mod = true; });
  add([](TestConfig& c) { c.mods = "mods_buffers.cuh", c.score_mod = true, c.element = "fj_f16"; });
  add([](TestConfig& c) { c.gqa = 4, c.full_blocks = false; });
  add([](TestConfig& c) { c.dim_v = 64, c.block_n = 64, c.num_warps = 4; });
  add([](TestConfig& c) { c.dim_qk = 64, c.num_stages = 1; });
  add([](TestConfig& c) {
    c.dim_qk = c.dim_v = 64, c.block_m = 64, c.block_n = 64, c.num_warps = 4, c.num_stages = 3;
  });
  add([](TestConfig& c) {
    c.dim_qk = 256, c.block_m = 64, c.block_n = 64, c.num_warps = 4, c.divisible = true;
  });
  for (const TestConfig& c : cases)
    require_compiles(c);
}

TEST_CASE("forward template rejects unsupported configurations with a clear message",
          "[template][errors]") {
  TestConfig f64 = default_config(128);
  f64.element = "double";
  CompileResult r = compile(f64);
  CHECK_FALSE(r.ok);
  CHECK_THAT(r.log, Catch::Contains("Element must be fj_bf16, fj_f16 or float"));

  TestConfig rows = default_config(128);
  rows.block_m = 64;  // 8 rows per warp with 8 warps
  r = compile(rows);
  CHECK_FALSE(r.ok);
  CHECK_THAT(r.log, Catch::Contains("kBlockM / kNumWarps must be 16 or 32"));

  TestConfig dim = default_config(128);
  dim.dim_qk = 192;
  r = compile(dim);
  CHECK_FALSE(r.ok);
  CHECK_THAT(r.log, Catch::Contains("tile dims must be"));

  TestConfig real = default_config(128);
  real.real_qk = 100;  // not a multiple of 8
  r = compile(real);
  CHECK_FALSE(r.ok);
  CHECK_THAT(r.log, Catch::Contains("a head dim is a multiple of 8 no larger than its tile dim"));
}

TestConfig tf32_config(int d, const std::string& arch);  // below

TEST_CASE("forward template compiles head dims below the tile dims", "[template][head_dims]") {
  // Real dims inside each tile, qk = v and qk != v, bf16 / f16 and f32 (16-byte chunks of 4).
  struct Dims {
    int tile_qk, tile_v, real_qk, real_v;
  };
  for (Dims d : {Dims{64, 64, 32, 32}, Dims{128, 128, 80, 80}, Dims{128, 128, 72, 72},
                 Dims{256, 128, 192, 128}, Dims{128, 64, 96, 64}, Dims{256, 256, 160, 160}}) {
    TestConfig c = default_config(std::max(d.tile_qk, d.tile_v));
    c.dim_qk = d.tile_qk, c.dim_v = d.tile_v, c.real_qk = d.real_qk, c.real_v = d.real_v;
    require_compiles(c);
    c.element = "fj_f16", c.arch = "sm_90a";
    c.mods = "mods_alibi.cuh", c.score_mod = true, c.mask_mod = false;
    require_compiles(c);
    if (d.tile_qk <= 128 && d.tile_v <= 128) {
      TestConfig f = tf32_config(std::max(d.tile_qk, d.tile_v), "sm_80");
      f.dim_qk = d.tile_qk, f.dim_v = d.tile_v, f.real_qk = d.real_qk, f.real_v = d.real_v;
      require_compiles(f);
    }
  }
}

// fp32 inputs on tf32 tensor cores, in forward/sm80_mma's default configurations
// (src/kernels/forward/Sm80Mma.cpp; d=256 has none on sm_86/89: 99 KiB of shared memory is too
// little for fp32 tiles).
TestConfig tf32_config(int d, const std::string& arch) {
  TestConfig c;
  c.element = "float";
  c.arch = arch;
  c.dim_qk = c.dim_v = d;
  const bool small_smem = arch == "sm_86" || arch == "sm_89";
  if (d == 64) {
    c.block_m = 128, c.block_n = 64, c.num_warps = 4, c.num_stages = 2;
  } else if (d == 128) {
    c.block_m = 64, c.block_n = 64, c.num_warps = 4, c.num_stages = small_smem ? 1 : 2;
  } else {
    c.block_m = 64, c.block_n = 32, c.num_warps = 4, c.num_stages = arch == "sm_90a" ? 2 : 1;
  }
  return c;
}

TEST_CASE("forward template compiles fp32 (tf32) for every arch, head dim and mod",
          "[template][tf32]") {
  for (const char* arch : {"sm_80", "sm_86", "sm_90a"}) {
    for (int d : {64, 128, 256}) {
      if (d == 256 && std::string(arch) == "sm_86") continue;
      TestConfig c = tf32_config(d, arch);
      require_compiles(c);  // causal mask_mod
      c.mods = "mods_alibi.cuh", c.score_mod = true, c.mask_mod = false;
      require_compiles(c);
    }
  }
  std::vector<TestConfig> cases;
  auto add = [&](auto edit) {
    TestConfig c = tf32_config(128, "sm_80");
    edit(c);
    cases.push_back(c);
  };
  add([](TestConfig& c) { c.mods = "mods_noop.cuh", c.mask_mod = false, c.divisible = true; });
  add([](TestConfig& c) { c.mods = "mods_softcap_window.cuh", c.score_mod = true; });
  add([](TestConfig& c) { c.mods = "mods_buffers.cuh", c.score_mod = true, c.arch = "sm_90a"; });
  add([](TestConfig& c) { c.gqa = 2, c.full_blocks = false; });
  add([](TestConfig& c) { c.dim_v = 64; });
  add([](TestConfig& c) { c.dim_qk = 64, c.num_stages = 3; });
  add([](TestConfig& c) { c.block_m = 128, c.num_stages = 1; });  // 32 rows per warp
  add([](TestConfig& c) {
    c.dim_qk = c.dim_v = 64, c.block_m = 128, c.block_n = 128, c.num_warps = 8;
  });
  for (const TestConfig& c : cases)
    require_compiles(c);
}

TEST_CASE("fp32 default configs fit shared memory on every arch, or say why not",
          "[template][tf32]") {
  using namespace flexjit;
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"}) {
    for (int d : {64, 128, 256}) {
      const kernels::ForwardSm80Mma variant;
      kernels::KernelDesc spec =
          kernels::forward_problem(cuda::Arch::parse(arch), DType::F32, d, d, 1, false, true);
      spec.variant = "sm80_mma";
      spec.config = variant.default_config(spec);
      INFO(spec.str());
      if (d == 256 && (spec.arch.cc() == 86 || spec.arch.cc() == 89)) {
        CHECK_THROWS_WITH(
            variant.validate(spec),
            Catch::Contains("shared memory") && Catch::Contains("convert q, k, v to bf16 or f16"));
      } else {
        CHECK_NOTHROW(variant.validate(spec));
      }
    }
  }
}

TEST_CASE("one forward kernel compiles cold through NVRTC in well under a second",
          "[template][perf]") {
  TestConfig c = default_config(128);
  c.arch = "sm_90a";
  const CompileResult r = compile(c);
  REQUIRE(r.ok);
  // Reported, and bounded generously: the machine running the tests may be loaded.
  WARN("NVRTC cold compile of " << describe(c) << ": " << r.seconds << " s");
  CHECK(r.seconds < 5.0);
}
