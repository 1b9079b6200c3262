#include "kernels/KernelDesc.h"

#include <flexjit/error.h>

#include <fmt/format.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>

namespace flexjit::kernels {

namespace {

// Every field of KernelDesc, in order. A field added to KernelDesc without being added to
// str() / parse() / to_json() / from_json() (and here) fails this assertion: see the header.
struct KernelDescFields {
  Family family;
  std::string variant;
  cuda::Arch arch;
  DType dtype;
  int head_dim_qk, head_dim_v, gqa_ratio;
  Params flags, config;
};
static_assert(sizeof(KernelDesc) == sizeof(KernelDescFields),
              "KernelDesc gained a field: serialize it in str(), parse(), to_json() and "
              "from_json(), then add it to KernelDescFields");

bool valid_name(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

[[noreturn]] void bad(std::string_view text, const std::string& what) {
  throw UnsupportedError(fmt::format("cannot read kernel description '{}': {}", text, what));
}

std::optional<int64_t> parse_int(std::string_view s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::vector<std::string_view> split_spaces(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ')
      ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ')
      ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

}  // namespace

// ---- Params ------------------------------------------------------------------------------------

Params::Params(std::initializer_list<std::pair<std::string, int64_t>> items) {
  for (const auto& [name, value] : items)
    set(name, value);
}

void Params::set(const std::string& name, int64_t value) {
  FJ_ASSERT(valid_name(name), "parameter names are [a-z0-9_]+: '" + name + "'");
  auto it = std::lower_bound(items_.begin(), items_.end(), name,
                             [](const auto& item, const std::string& n) { return item.first < n; });
  if (it != items_.end() && it->first == name) {
    it->second = value;
  } else {
    items_.insert(it, {name, value});
  }
}

std::optional<int64_t> Params::get(std::string_view name) const {
  for (const auto& [n, v] : items_) {
    if (n == name) return v;
  }
  return std::nullopt;
}

int64_t Params::at(std::string_view name) const {
  auto v = get(name);
  FJ_ASSERT(v.has_value(), fmt::format("kernel parameter '{}' is not set ({})", name, str()));
  return *v;
}

std::string Params::str() const {
  std::string s;
  for (const auto& [n, v] : items_) {
    if (!s.empty()) s += ' ';
    s += fmt::format("{}={}", n, v);
  }
  return s;
}

// ---- KernelDesc --------------------------------------------------------------------------------

std::string KernelDesc::family_variant() const {
  return fmt::format("{}/{}", to_string(family), variant.empty() ? "?" : variant);
}

std::string KernelDesc::str() const {
  std::string s = fmt::format("{} {} {} d={}/{} gqa={}", family_variant(), arch.str(),
                              to_string(dtype), head_dim_qk, head_dim_v, gqa_ratio);
  if (!flags.empty()) {
    s += ' ';
    s += flags.str();
  }
  s += " |";
  if (!config.empty()) {
    s += ' ';
    s += config.str();
  }
  return s;
}

KernelDesc KernelDesc::parse(std::string_view text) {
  const std::vector<std::string_view> tokens = split_spaces(text);
  if (tokens.size() < 6) bad(text, "expected 'family/variant arch dtype d=QK/V gqa=N ... | ...'");
  KernelDesc d;
  const std::string_view fv = tokens[0];
  const size_t slash = fv.find('/');
  if (slash == std::string_view::npos) bad(text, "the first token is not family/variant");
  auto family = parse_family(fv.substr(0, slash));
  if (!family) bad(text, fmt::format("unknown kernel family '{}'", fv.substr(0, slash)));
  d.family = *family;
  const std::string_view variant = fv.substr(slash + 1);
  if (variant != "?") {
    if (!valid_name(variant)) bad(text, fmt::format("bad variant name '{}'", variant));
    d.variant = std::string(variant);
  }
  d.arch = cuda::Arch::parse(std::string(tokens[1]));
  auto dtype = parse_dtype(tokens[2]);
  if (!dtype) bad(text, fmt::format("unknown dtype '{}'", tokens[2]));
  d.dtype = *dtype;
  {
    const std::string_view dims = tokens[3];
    const size_t s2 = dims.find('/');
    if (dims.substr(0, 2) != "d=" || s2 == std::string_view::npos) {
      bad(text, fmt::format("expected d=QK/V, not '{}'", dims));
    }
    auto qk = parse_int(dims.substr(2, s2 - 2));
    auto v = parse_int(dims.substr(s2 + 1));
    if (!qk || !v) bad(text, fmt::format("expected d=QK/V, not '{}'", dims));
    d.head_dim_qk = static_cast<int>(*qk);
    d.head_dim_v = static_cast<int>(*v);
  }
  {
    auto g = tokens[4].substr(0, 4) == "gqa=" ? parse_int(tokens[4].substr(4)) : std::nullopt;
    if (!g) bad(text, fmt::format("expected gqa=N, not '{}'", tokens[4]));
    d.gqa_ratio = static_cast<int>(*g);
  }
  bool in_config = false;
  for (size_t i = 5; i < tokens.size(); ++i) {
    if (tokens[i] == "|") {
      if (in_config) bad(text, "two '|'");
      in_config = true;
      continue;
    }
    const size_t eq = tokens[i].find('=');
    const std::string_view name = tokens[i].substr(0, eq);
    auto value = eq == std::string_view::npos ? std::nullopt : parse_int(tokens[i].substr(eq + 1));
    if (!valid_name(name) || !value)
      bad(text, fmt::format("expected name=integer, not '{}'", tokens[i]));
    Params& p = in_config ? d.config : d.flags;
    if (p.has(name)) bad(text, fmt::format("'{}' given twice", name));
    p.set(std::string(name), *value);
  }
  if (!in_config) bad(text, "no '|' before the config");
  return d;
}

nlohmann::json KernelDesc::to_json() const {
  auto params = [](const Params& p) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [n, v] : p.items())
      j[n] = v;
    return j;
  };
  return {{"family", std::string(to_string(family))},
          {"variant", variant},
          {"arch", arch.str()},
          {"dtype", std::string(to_string(dtype))},
          {"head_dim_qk", head_dim_qk},
          {"head_dim_v", head_dim_v},
          {"gqa_ratio", gqa_ratio},
          {"flags", params(flags)},
          {"config", params(config)}};
}

KernelDesc KernelDesc::from_json(const nlohmann::json& j) {
  auto fail = [&](const std::string& what) -> KernelDesc {
    throw UnsupportedError(fmt::format("cannot read kernel description {}: {}", j.dump(), what));
  };
  if (!j.is_object()) return fail("not a JSON object");
  for (const char* key : {"family", "variant", "arch", "dtype", "head_dim_qk", "head_dim_v",
                          "gqa_ratio", "flags", "config"}) {
    if (!j.contains(key)) return fail(fmt::format("no \"{}\"", key));
  }
  if (j.size() != 9) return fail("unknown keys (expected exactly the nine fields)");
  try {
    KernelDesc d;
    auto family = parse_family(j.at("family").get<std::string>());
    if (!family) return fail("unknown family");
    d.family = *family;
    d.variant = j.at("variant").get<std::string>();
    if (!d.variant.empty() && !valid_name(d.variant)) return fail("bad variant name");
    d.arch = cuda::Arch::parse(j.at("arch").get<std::string>());
    auto dtype = parse_dtype(j.at("dtype").get<std::string>());
    if (!dtype) return fail("unknown dtype");
    d.dtype = *dtype;
    d.head_dim_qk = j.at("head_dim_qk").get<int>();
    d.head_dim_v = j.at("head_dim_v").get<int>();
    d.gqa_ratio = j.at("gqa_ratio").get<int>();
    for (auto [key, target] : {std::pair{"flags", &d.flags}, std::pair{"config", &d.config}}) {
      const nlohmann::json& p = j.at(key);
      if (!p.is_object()) return fail(fmt::format("\"{}\" is not an object", key));
      for (const auto& [n, v] : p.items()) {
        if (!valid_name(n) || !v.is_number_integer()) {
          return fail(fmt::format("\"{}\".\"{}\" is not a name with an integer", key, n));
        }
        target->set(n, v.get<int64_t>());
      }
    }
    return d;
  } catch (const nlohmann::json::exception& e) {
    return fail(e.what());
  }
}

uint64_t KernelDesc::hash() const {
  const std::string s = str();
  return XXH64(s.data(), s.size(), 0);
}

}  // namespace flexjit::kernels
