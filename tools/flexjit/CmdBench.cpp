// flexjit bench --compile: cold NVRTC compile, disk-cache hit and memory-cache hit of forward
// kernels, each through the whole pipeline (codegen included).
#include <flexjit/error.h>
#include "Pipeline.h"
#include "flexjit/Commands.h"
#include "flexjit/Options.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <random>

namespace flexjit::cli {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

template <typename F>
double time_ms(F&& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct CompileBenchRow {
  std::string mods;
  double cold_ms, disk_hit_ms, memory_hit_us;
};

}  // namespace

void register_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench",
      "Benchmarks\n\nExamples:\n"
      "  flexjit bench --compile --arch sm_90a\n"
      "  flexjit bench --compile --arch sm_80 --compile-mods causal,alibi_causal --json");
  static KernelOptions opts;
  static bool compile = false;
  static bool json = false;
  static std::string mods_list = "noop,causal,alibi_causal,softcap_causal,document_causal";
  static int repeats = 200;
  add_kernel_options(*cmd, opts);
  cmd->add_flag("--compile", compile,
                "Time cold NVRTC compile, disk-cache hit and memory-cache hit of forward kernels");
  cmd->add_option("--compile-mods", mods_list, "Comma-separated mods to time")
      ->capture_default_str();
  cmd->add_option("--repeats", repeats, "Repeats for the hit timings (median)")
      ->capture_default_str();
  cmd->add_flag("--json", json, "Print JSON");
  cmd->callback([] {
    if (!compile) {
      throw Error("choose a benchmark: --compile (the attention benchmark needs the GPU runtime)");
    }
    cuda::ForwardSpec spec = make_spec(opts);
    // A private cache directory, so that "cold" really is cold and nothing of the user's
    // cache is touched.
    std::mt19937_64 rng(std::random_device{}());
    auto dir = std::filesystem::temp_directory_path() / fmt::format("flexjit-bench-{:016x}", rng());
    jit::CacheSettings settings = jit::CacheSettings::from_env();
    settings.enabled = true;
    settings.dir = dir;
    settings.dump_dir.clear();
    std::vector<CompileBenchRow> rows;
    std::string spec_list = mods_list + ",";
    for (size_t pos = 0, next; (next = spec_list.find(',', pos)) != std::string::npos;
         pos = next + 1) {
      std::string name = spec_list.substr(pos, next - pos);
      if (name.empty()) continue;
      Mods mods = resolve_mods(name);
      CompileBenchRow row{name, 0, 0, 0};
      {
        KernelBuilder cold(settings);
        row.cold_ms = time_ms([&] { cold.build_forward(mods, spec); });
        std::vector<double> mem;
        for (int i = 0; i < repeats; ++i) {
          mem.push_back(1e3 * time_ms([&] { cold.build_forward(mods, spec); }));
        }
        row.memory_hit_us = median(mem);
      }
      std::vector<double> disk;
      for (int i = 0; i < std::max(5, repeats / 10); ++i) {
        KernelBuilder warm(settings);  // empty memory: served from disk
        disk.push_back(time_ms([&] {
          auto k = warm.build_forward(mods, spec);
          if (k.compiled.outcome != jit::CacheOutcome::DiskHit) {
            throw InternalError("bench: expected a disk-cache hit");
          }
        }));
      }
      row.disk_hit_ms = median(disk);
      rows.push_back(row);
    }
    std::filesystem::remove_all(dir);
    if (json) {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& r : rows) {
        j.push_back({{"mods", r.mods},
                     {"spec", spec.str()},
                     {"cold_ms", r.cold_ms},
                     {"disk_hit_ms", r.disk_hit_ms},
                     {"memory_hit_us", r.memory_hit_us}});
      }
      std::cout << j.dump(2) << "\n";
      return;
    }
    fmt::print("forward kernel build time, {} (targets: cold <= 1000 ms, disk hit <= 5 ms, "
               "memory hit <= 20 us)\n",
               spec.str());
    fmt::print("{:<22} {:>12} {:>14} {:>16}\n", "mods", "cold (ms)", "disk hit (ms)",
               "memory hit (us)");
    for (const auto& r : rows) {
      fmt::print("{:<22} {:>12.1f} {:>14.3f} {:>16.2f}\n", r.mods, r.cold_ms, r.disk_hit_ms,
                 r.memory_hit_us);
    }
  });
}

}  // namespace flexjit::cli
