// `flexjit run --dout`: the backward from the command line on .npy files, on the CPU backend
// (and on the GPU when there is one), against the library's CPU backward on the same inputs.
#include <flexjit/mods.h>

#include "cpu/BackwardKernel.h"
#include "cpu/ForwardKernel.h"
#include "gpu/GpuTestUtil.h"
#include "support/CliPath.h"
#include "util/Npy.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <random>

using namespace flexjit;
namespace fs = std::filesystem;

namespace {

struct Files {
  fs::path dir;
  npy::Array q, k, v, dout, slopes;
  explicit Files(uint64_t seed) {
    dir = fs::temp_directory_path() / ("flexjit-cli-bwd-" + std::to_string(seed));
    fs::create_directories(dir);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n;
    auto make = [&](std::vector<int64_t> shape) {
      npy::Array a = npy::make_array(DType::F32, shape);
      for (int64_t i = 0; i < a.numel(); ++i)
        a.as<float>()[i] = n(rng);
      return a;
    };
    q = make({1, 4, 45, 64});
    k = make({1, 2, 70, 64});
    v = make({1, 2, 70, 64});
    dout = make({1, 4, 45, 64});
    slopes = npy::make_array(DType::F32, {4});
    for (int h = 0; h < 4; ++h)
      slopes.as<float>()[h] = 1.0f / static_cast<float>(2 << h);
    npy::write((dir / "q.npy").string(), q);
    npy::write((dir / "k.npy").string(), k);
    npy::write((dir / "v.npy").string(), v);
    npy::write((dir / "do.npy").string(), dout);
    npy::write((dir / "slopes.npy").string(), slopes);
  }
  ~Files() { fs::remove_all(dir); }
  std::string inputs() const {
    const std::string d = dir.string() + "/";
    return "--mods alibi_causal --q " + d + "q.npy --k " + d + "k.npy --v " + d + "v.npy " +
           "--buffer slopes=" + d + "slopes.npy --repeat 0";
  }
  std::string path(const char* name) const { return (dir / name).string(); }
};

// max |a - ref| / max |ref| for an f32 array.
double max_rel(const npy::Array& a, const std::vector<float>& ref) {
  REQUIRE(a.dtype == DType::F32);
  REQUIRE(static_cast<size_t>(a.numel()) == ref.size());
  double err = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a.as<float>()[i]) - ref[i]));
    scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
  }
  return err / scale;
}

// The library's fp32 CPU backward of the files' problem (the reference for the CLI's outputs).
cpu::CpuGradients<float> library_backward(const Files& f) {
  const Mods mods = standard_mods("alibi_causal");
  ModBindings b;
  b.buffers = {{"slopes", f.slopes.view()}};
  std::vector<float> out(static_cast<size_t>(f.dout.numel())), lse(4 * 45);
  cpu::cpu_attention_forward(mods, b, f.q.view(), f.k.view(), f.v.view(), out.data(), lse.data());
  return cpu::cpu_attention_backward(mods, b, f.q.view(), f.k.view(), f.v.view(), out.data(),
                                     lse.data(), f.dout.view());
}

}  // namespace

TEST_CASE("flexjit run --dout: the CPU backward to .npy files", "[cli][backward]") {
  Files f(std::random_device{}());
  std::string out;
  REQUIRE(test::run_cli("run --device cpu " + f.inputs() + " --dout " + f.path("do.npy") +
                            " --dq " + f.path("dq.npy") + " --dk " + f.path("dk.npy") + " --dv " +
                            f.path("dv.npy") + " --dbuffer slopes=" + f.path("ds.npy"),
                        &out) == 0);
  CHECK_THAT(out, Catch::Contains("backward on cpu") && Catch::Contains("dslopes: checksum"));
  const cpu::CpuGradients<float> ref = library_backward(f);
  CHECK(max_rel(npy::read(f.path("dq.npy")), ref.dq) < 1e-5);
  CHECK(max_rel(npy::read(f.path("dk.npy")), ref.dk) < 1e-5);
  CHECK(max_rel(npy::read(f.path("dv.npy")), ref.dv) < 1e-5);
  CHECK(max_rel(npy::read(f.path("ds.npy")), ref.buffers.at("slopes")) < 1e-4);
}

TEST_CASE("flexjit run --dout: bad backward flags fail before any work", "[cli][backward]") {
  Files f(std::random_device{}());
  std::string out;
  CHECK(test::run_cli("run --device cpu " + f.inputs() + " --dq " + f.path("dq.npy"), &out) == 1);
  CHECK_THAT(out, Catch::Contains("need --dout"));
  CHECK(test::run_cli("run --device cpu " + f.inputs() + " --dout " + f.path("do.npy") +
                          " --dbuffer bias=" + f.path("x.npy"),
                      &out) == 1);
  CHECK_THAT(out, Catch::Contains("--dbuffer bias: the mods 'alibi_causal' have no float buffer"));
  CHECK_FALSE(fs::exists(f.path("x.npy")));
  CHECK(test::run_cli("run --device cpu " + f.inputs() + " --deterministic", &out) == 1);
  CHECK_THAT(out, Catch::Contains("--deterministic need --dout"));
}

TEST_CASE("flexjit run --dout --deterministic: the CPU backward (always deterministic) accepts it",
          "[cli][backward][determ]") {
  Files f(std::random_device{}());
  std::string out;
  for (const char* name : {"ds1.npy", "ds2.npy"}) {
    REQUIRE(test::run_cli("run --device cpu " + f.inputs() + " --dout " + f.path("do.npy") +
                              " --deterministic --dbuffer slopes=" + f.path(name),
                          &out) == 0);
  }
  const npy::Array a = npy::read(f.path("ds1.npy")), b = npy::read(f.path("ds2.npy"));
  CHECK(a.bytes == b.bytes);
  CHECK(max_rel(a, library_backward(f).buffers.at("slopes")) < 1e-4);
}

TEST_CASE("flexjit run --dout --device cuda matches the CPU backward", "[gpu][cli][backward]") {
  FJ_REQUIRE_GPU_OR_SKIP(ctx);
  (void)ctx;
  Files f(std::random_device{}());
  std::string out;
  REQUIRE(test::run_cli("run --device cuda " + f.inputs() + " --dout " + f.path("do.npy") +
                            " --dq " + f.path("dq.npy") + " --dk " + f.path("dk.npy") + " --dv " +
                            f.path("dv.npy") + " --dbuffer slopes=" + f.path("ds.npy"),
                        &out) == 0);
  INFO(out);
  const cpu::CpuGradients<float> ref = library_backward(f);
  // f32 inputs run on tf32 tensor cores (S and dP split to fp32 accuracy).
  CHECK(max_rel(npy::read(f.path("dq.npy")), ref.dq) < 5e-3);
  CHECK(max_rel(npy::read(f.path("dk.npy")), ref.dk) < 5e-3);
  CHECK(max_rel(npy::read(f.path("dv.npy")), ref.dv) < 5e-3);
  CHECK(max_rel(npy::read(f.path("ds.npy")), ref.buffers.at("slopes")) < 5e-3);

  // --deterministic: twice, bitwise the same buffer gradient, as accurate.
  for (const char* name : {"dd1.npy", "dd2.npy"}) {
    REQUIRE(test::run_cli("run --device cuda " + f.inputs() + " --dout " + f.path("do.npy") +
                              " --deterministic --dbuffer slopes=" + f.path(name),
                          &out) == 0);
  }
  const npy::Array d1 = npy::read(f.path("dd1.npy")), d2 = npy::read(f.path("dd2.npy"));
  CHECK(d1.bytes == d2.bytes);
  CHECK(max_rel(d1, ref.buffers.at("slopes")) < 5e-3);
}
