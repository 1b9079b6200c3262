// flexjit cache ls | stats | clear | prune
#include <flexjit/error.h>
#include "flexjit/Commands.h"
#include "jit/KernelCompiler.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <iostream>

namespace flexjit::cli {

namespace {

jit::DiskCache& disk_cache(jit::KernelCompiler& c) {
  jit::DiskCache* d = c.disk();
  if (d == nullptr) throw Error("the disk cache is disabled (FLEXJIT_DISABLE_CACHE is set)");
  return *d;
}

std::string human_bytes(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(b) / (1ull << 10));
  return fmt::format("{} B", b);
}

// Parses "500M", "2G", "4096" into bytes.
uint64_t parse_size(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    throw Error(fmt::format("cannot read size '{}': use e.g. 4096, 500M or 2G", s));
  }
  std::string unit = s.substr(pos);
  double mult = 1;
  if (unit == "K" || unit == "k" || unit == "KiB")
    mult = 1024.0;
  else if (unit == "M" || unit == "MiB")
    mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (!unit.empty())
    throw Error(fmt::format("unknown size unit '{}' in '{}'", unit, s));
  if (v < 0) throw Error(fmt::format("size must not be negative: '{}'", s));
  return static_cast<uint64_t>(v * mult);
}

}  // namespace

void register_cache(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "cache",
      "Inspect and manage the on-disk kernel cache ($FLEXJIT_CACHE_DIR, else "
      "$XDG_CACHE_HOME/flexjit, else ~/.cache/flexjit)\n\nExamples:\n"
      "  flexjit cache ls\n  flexjit cache stats --json\n  flexjit cache prune --max-size 500M\n"
      "  flexjit cache clear");
  cmd->require_subcommand(1);
  static bool json = false;
  static std::string max_size;

  auto* ls = cmd->add_subcommand("ls", "List entries, most recently used first");
  ls->add_flag("--json", json, "Print JSON");
  ls->callback([] {
    jit::KernelCompiler c;
    auto entries = disk_cache(c).list();
    std::sort(entries.begin(), entries.end(),
              [](const auto& a, const auto& b) { return a.last_used > b.last_used; });
    nlohmann::json j = nlohmann::json::array();
    for (const auto& e : entries) {
      auto t = std::chrono::file_clock::to_sys(e.last_used);
      if (json) {
        j.push_back({{"key", e.key},
                     {"arch", e.arch},
                     {"kernel", e.kernel_name},
                     {"label", e.label},
                     {"bytes", e.size_bytes},
                     {"last_used", fmt::format("{:%FT%T}", t)}});
      } else {
        fmt::print("{}  {:<7} {:>10}  {:%F %T}  {}\n", e.key.substr(0, 16), e.arch,
                   human_bytes(e.size_bytes), std::chrono::floor<std::chrono::seconds>(t), e.label);
      }
    }
    if (json) std::cout << j.dump(2) << "\n";
  });

  auto* stats = cmd->add_subcommand("stats", "Entry count, size and limit");
  stats->add_flag("--json", json, "Print JSON");
  stats->callback([] {
    jit::KernelCompiler c;
    auto s = disk_cache(c).stats();
    if (json) {
      std::cout << nlohmann::json{{"dir", s.dir.string()},
                                  {"entries", s.entries},
                                  {"bytes", s.bytes},
                                  {"max_bytes", s.max_bytes}}
                       .dump(2)
                << "\n";
      return;
    }
    fmt::print("dir       {}\nentries   {}\nsize      {}\nlimit     {}\n", s.dir.string(),
               s.entries, human_bytes(s.bytes), human_bytes(s.max_bytes));
  });

  auto* clear = cmd->add_subcommand("clear", "Remove every entry");
  clear->callback([] {
    jit::KernelCompiler c;
    auto before = disk_cache(c).stats();
    disk_cache(c).clear();
    fmt::print("removed {} entries ({})\n", before.entries, human_bytes(before.bytes));
  });

  auto* prune = cmd->add_subcommand("prune", "Evict least recently used entries to a size");
  prune->add_option("--max-size", max_size, "Target size, e.g. 500M (default: the cache limit)");
  prune->callback([] {
    jit::KernelCompiler c;
    auto& d = disk_cache(c);
    uint64_t target = max_size.empty() ? d.stats().max_bytes : parse_size(max_size);
    uint64_t freed = d.prune(target);
    fmt::print("freed {}; {} in {} entries remain\n", human_bytes(freed),
               human_bytes(d.stats().bytes), d.stats().entries);
  });
}

}  // namespace flexjit::cli
