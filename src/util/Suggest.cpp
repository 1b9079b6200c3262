#include "util/Suggest.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace flexjit {

namespace {

// Optimal string alignment distance (a transposition counts as one edit), capped at cap + 1.
int edit_distance(std::string_view a, std::string_view b, int cap) {
  if (a.size() > 64 || b.size() > 64) return cap + 1;
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1));
  for (size_t i = 0; i <= n; ++i)
    d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j)
    d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return std::min(d[n][m], cap + 1);
}

std::string lower(std::string_view s, bool drop_separators) {
  std::string out;
  for (char c : s) {
    if (drop_separators && (c == '_' || c == '-')) continue;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

std::optional<std::string> closest(std::string_view name,
                                   const std::vector<std::string>& candidates, bool loose) {
  const std::string key = lower(name, loose);
  const std::string* best = nullptr;
  int best_d = std::max<int>(1, static_cast<int>(key.size()) / 3);
  for (const std::string& c : candidates) {
    const int d = edit_distance(key, lower(c, loose), best_d);
    if (d >= static_cast<int>(key.size())) continue;  // replacing every letter is no suggestion
    if (d <= best_d && (best == nullptr || d < best_d)) {
      best = &c;
      best_d = d;
    }
  }
  if (best == nullptr && !key.empty()) {
    for (const std::string& c : candidates) {
      const std::string lc = lower(c, loose);
      if (lc.size() > key.size() && lc.compare(0, key.size(), key) == 0 &&
          (best == nullptr || c.size() < best->size())) {
        best = &c;
      }
    }
  }
  if (best == nullptr) return std::nullopt;
  return *best;
}

}  // namespace

std::optional<std::string> closest_match(std::string_view name,
                                         const std::vector<std::string>& candidates) {
  if (auto m = closest(name, candidates, /*loose=*/false)) return m;
  return closest(name, candidates, /*loose=*/true);
}

std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates) {
  const std::optional<std::string> m = closest_match(name, candidates);
  return m ? fmt::format(" (did you mean '{}'?)", *m) : std::string();
}

}  // namespace flexjit
