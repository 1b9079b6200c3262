// flexjit cache ls | stats | clear | prune
#include <flexjit/error.h>
#include "flexjit/Commands.h"
#include "jit/CacheSettings.h"
#include "jit/DiskCache.h"
#include "tune/TuningStore.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <iostream>
#include <map>

namespace flexjit::cli {

namespace {

// The disk cache as the compiler would use it, without the compiler's warning: here an untrusted
// directory is the error.
jit::DiskCache open_disk_cache() {
  jit::CacheSettings s = jit::CacheSettings::from_env();
  if (!s.enabled) throw Error("the disk cache is disabled (FLEXJIT_DISABLE_CACHE is set)");
  jit::DiskCache d(s.dir, s.max_disk_bytes);
  if (!d.trusted()) throw Error(d.problem());
  return d;
}

// Labels come from cache files: printable ASCII passes, every other byte is shown as \xNN so that
// no escape sequence reaches the terminal.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c >= 0x20 && c < 0x7f)
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

std::string human_bytes(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(b) / (1ull << 10));
  return fmt::format("{} B", b);
}

// Parses "500M", "2G", "4096" into bytes: finite, not negative, at most 2^63 bytes.
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
  double bytes = v * mult;
  // !(x >= 0) also catches NaN; 2^63 keeps the conversion to uint64_t defined.
  if (!std::isfinite(bytes) || !(bytes >= 0) || bytes > 9.223372036854775808e18) {
    throw Error(fmt::format(
        "size '{}' is not a finite, non-negative size of at most 8 EiB: use e.g. 4096, 500M or 2G",
        s));
  }
  return static_cast<uint64_t>(bytes);
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
    auto entries = open_disk_cache().list();
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
        fmt::print("{}  {:<7} {:>10}  {:%F %T}  {}\n", e.key.substr(0, 16), printable(e.arch),
                   human_bytes(e.size_bytes), std::chrono::floor<std::chrono::seconds>(t),
                   printable(e.label));
      }
    }
    if (json) std::cout << j.dump(2) << "\n";
  });

  auto* stats = cmd->add_subcommand(
      "stats", "Entry count, size and limit; entries per arch and family; the tuning table");
  stats->add_flag("--json", json, "Print JSON");
  stats->callback([] {
    jit::DiskCache d = open_disk_cache();
    auto s = d.stats();
    // Entries per arch and kernel family (the family is the label's first word: "forward/...").
    std::map<std::string, std::map<std::string, uint64_t>> per;
    for (const auto& e : d.list()) {
      const size_t slash = e.label.find('/');
      const std::string family = slash == std::string::npos ? "other" : e.label.substr(0, slash);
      ++per[printable(e.arch)][printable(family)];
    }
    auto& store = tune::TuningStore::for_cache_dir(s.dir);
    const auto records = store.records();
    if (json) {
      nlohmann::json tuning = nlohmann::json::array();
      for (const auto& r : records)
        tuning.push_back(tune::record_to_json(r));
      std::cout << nlohmann::json{{"dir", s.dir.string()},
                                  {"entries", s.entries},
                                  {"bytes", s.bytes},
                                  {"max_bytes", s.max_bytes},
                                  {"by_arch_family", per},
                                  {"tuning_file", store.file().string()},
                                  {"tuning_problem", store.problem()},
                                  {"tuning", tuning}}
                       .dump(2)
                << "\n";
      return;
    }
    fmt::print("dir       {}\nentries   {}\nsize      {}\nlimit     {}\n", s.dir.string(),
               s.entries, human_bytes(s.bytes), human_bytes(s.max_bytes));
    for (const auto& [arch, families] : per) {
      for (const auto& [family, n] : families)
        fmt::print("  {:<8} {:<22} {}\n", arch, family, n);
    }
    fmt::print("tuning    {} ({} tuned workloads)\n", store.file().string(), records.size());
    if (!store.problem().empty()) fmt::print("          {}\n", store.problem());
    for (const auto& r : records) {
      fmt::print("  {} [{}{}] mods {} on {}: {} {:.4f} ms (default {} {:.4f} ms)\n",
                 printable(r.key.kernel), printable(r.key.bucket),
                 r.key.fixed.empty() ? "" : ", fixed " + printable(r.key.fixed),
                 printable(r.key.mods_hash.substr(0, 8)), printable(r.key.device.name),
                 r.config.str(), r.time_ms, r.default_config.str(), r.default_ms);
    }
  });

  auto* clear = cmd->add_subcommand("clear", "Remove every entry");
  clear->callback([] {
    jit::DiskCache d = open_disk_cache();
    auto before = d.stats();
    uint64_t removed = d.clear();
    fmt::print("removed {} entries ({})\n", removed, human_bytes(before.bytes));
  });

  auto* prune = cmd->add_subcommand("prune", "Evict least recently used entries to a size");
  prune->add_option("--max-size", max_size, "Target size, e.g. 500M (default: the cache limit)");
  prune->callback([] {
    jit::DiskCache d = open_disk_cache();
    uint64_t target = max_size.empty() ? d.stats().max_bytes : parse_size(max_size);
    uint64_t freed = d.prune(target);
    fmt::print("freed {}; {} in {} entries remain\n", human_bytes(freed),
               human_bytes(d.stats().bytes), d.stats().entries);
  });
}

}  // namespace flexjit::cli
