// The standard mods (dsl/*.fx, embedded at build time), loading mods files, and resolving what
// the CLI accepts as a mods spec.
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "util/Embedded.h"
#include "util/InputFiles.h"
#include "util/Suggest.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>

namespace flexjit {

namespace {

// name without ".fx" -> source text; built once from the embedded files.
const std::map<std::string, std::string>& standard_sources() {
  static const std::map<std::string, std::string> sources = [] {
    std::map<std::string, std::string> m;
    for (const auto& f : embedded::dsl()) {
      std::string name = f.name;
      if (name.size() > 3 && name.compare(name.size() - 3, 3, ".fx") == 0) {
        name.resize(name.size() - 3);
      }
      m.emplace(std::move(name), std::string(f.text()));
    }
    return m;
  }();
  return sources;
}

std::string strip_fx(const std::string& name) {
  if (name.size() > 3 && name.compare(name.size() - 3, 3, ".fx") == 0) {
    return name.substr(0, name.size() - 3);
  }
  return name;
}

std::string names_list() {
  std::string out;
  for (const auto& n : standard_mod_names())
    out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

Mods load_mods_file(const std::string& path) {
  // A regular file of at most 1 MiB: a FIFO, a device or a directory is refused before reading.
  return parse_mods(files::read_text_file(path, fmt::format("cannot read mods file '{}'", path),
                                          "a mods file", files::kMaxModsFileBytes),
                    path);
}

std::vector<std::string> standard_mod_names() {
  std::vector<std::string> out;
  for (const auto& [name, text] : standard_sources())
    out.push_back(name);
  return out;
}

const std::string& standard_mod_source(const std::string& name) {
  const auto& sources = standard_sources();
  auto it = sources.find(strip_fx(name));
  if (it == sources.end()) {
    throw Error(fmt::format("unknown standard mod '{}'{}; the standard mods are: {}", name,
                            did_you_mean(strip_fx(name), standard_mod_names()), names_list()));
  }
  return it->second;
}

Mods standard_mods(const std::string& name) {
  std::string base = strip_fx(name);
  const std::string& text = standard_mod_source(base);
  Mods m = parse_mods(text, "dsl/" + base + ".fx");
  m.name = base;
  return m;
}

Mods resolve_mods(const std::string& spec) {
  if (standard_sources().count(strip_fx(spec))) return standard_mods(spec);
  std::error_code ec;
  if (!spec.empty() && spec.find('\n') == std::string::npos &&
      std::filesystem::is_regular_file(spec, ec)) {
    return load_mods_file(spec);
  }
  if (spec.find('=') != std::string::npos) return parse_mods(spec, "<inline>");
  throw Error(
      fmt::format("'{}' is not a standard mod{}, an existing file, or inline mods text "
                  "(like 'mask_mod = q_idx >= kv_idx'); the standard mods are: {}",
                  spec, did_you_mean(strip_fx(spec), standard_mod_names()), names_list()));
}

}  // namespace flexjit
