// Every standard mod through the whole pipeline (typecheck, simplify, cse, codegen, NVRTC) for
// bf16/fp16 x head dims 64/128 x sm_80/sm_90a: what users get from `flexjit compile`.
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "support/KernelDescs.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>

using namespace flexjit;

TEST_CASE("every standard mod compiles for bf16/fp16 x d64/d128 x sm_80/sm_90a",
          "[pipeline][nvrtc]") {
  struct Job {
    std::string mods;
    DType dtype;
    int d;
    std::string arch;
  };
  std::vector<Job> jobs;
  for (const auto& name : standard_mod_names()) {
    for (DType dt : {DType::BF16, DType::F16}) {
      for (int d : {64, 128}) {
        for (const char* arch : {"sm_80", "sm_90a"})
          jobs.push_back({name, dt, d, arch});
      }
    }
  }
  jit::CacheSettings settings;
  settings.enabled = false;  // every job is a real NVRTC compile
  KernelBuilder builder(settings);
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<int> registers(jobs.size(), -1), spills(jobs.size(), -1);
  auto worker = [&] {
    for (size_t i; (i = next++) < jobs.size();) {
      const Job& j = jobs[i];
      try {
        BuiltKernel k =
            builder.build(standard_mods(j.mods), test::forward_desc(j.arch, j.dtype, j.d, j.d));
        registers[i] = k.compiled.kernel->usage.registers;
        spills[i] = k.compiled.kernel->usage.spill_store_bytes;
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back(j.mods + " " + j.arch + ": " + e.what());
      }
    }
  };
  std::vector<std::thread> pool;
  unsigned n = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  for (unsigned t = 0; t < n; ++t)
    pool.emplace_back(worker);
  for (auto& t : pool)
    t.join();
  for (const auto& f : failures)
    FAIL_CHECK(f);
  CHECK(failures.empty());
  for (size_t i = 0; i < jobs.size(); ++i) {
    INFO(jobs[i].mods << " " << to_string(jobs[i].dtype) << " d=" << jobs[i].d << " "
                      << jobs[i].arch);
    CHECK(registers[i] > 0);
    CHECK(registers[i] <= 255);
  }
}
