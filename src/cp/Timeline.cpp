// summarize_cp_timeline and cp_timeline_chrome_trace (include/flexjit/context_parallel.h): what a
// CpTimeline's spans say, computed on the host; the recording is in
// src/runtime/ContextParallelTimeline.cpp. tests/unit/test_cp_timeline.cpp checks both.
#include <flexjit/context_parallel.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace flexjit {

namespace {

using Interval = std::pair<double, double>;

// The union of the intervals, as disjoint intervals in order.
std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (i.second <= i.first) continue;
    if (!out.empty() && i.first <= out.back().second) {
      out.back().second = std::max(out.back().second, i.second);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

double length(const std::vector<Interval>& v) {
  double t = 0;
  for (const Interval& i : v)
    t += i.second - i.first;
  return t;
}

// The length of the intersection of two unions of disjoint ordered intervals.
double overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double t = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].first, b[j].first);
    const double hi = std::min(a[i].second, b[j].second);
    if (hi > lo) t += hi - lo;
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return t;
}

}  // namespace

CpTimelineSummary summarize_cp_timeline(const std::vector<CpTimelineSpan>& spans) {
  CpTimelineSummary s;
  if (spans.empty()) return s;
  std::vector<Interval> compute, comm;
  double first = spans.front().start_us, last = spans.front().end_us;
  for (const CpTimelineSpan& x : spans) {
    first = std::min(first, x.start_us);
    last = std::max(last, x.end_us);
    if (x.lane == CpTimelineSpan::Lane::Compute) {
      compute.emplace_back(x.start_us, x.end_us);
      ++s.compute_spans;
    } else {
      comm.emplace_back(x.start_us, x.end_us);
      ++s.comm_spans;
    }
  }
  const std::vector<Interval> c = merged(std::move(compute)), m = merged(std::move(comm));
  s.wall_us = last - first;
  s.compute_us = length(c);
  s.comm_us = length(m);
  s.comm_exposed_us = s.comm_us - overlap(c, m);
  return s;
}

std::string cp_timeline_chrome_trace(const std::vector<std::vector<CpTimelineSpan>>& ranks) {
  using nlohmann::json;
  json events = json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const int pid = static_cast<int>(r);
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"args", {{"name", "rank " + std::to_string(r)}}}});
    events.push_back({{"name", "process_sort_index"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"args", {{"sort_index", pid}}}});
    for (const auto& [tid, name] : {std::pair{0, "compute"}, std::pair{1, "comm (NCCL)"}}) {
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", pid},
                        {"tid", tid},
                        {"args", {{"name", name}}}});
    }
    for (const CpTimelineSpan& x : ranks[r]) {
      const bool comm = x.lane == CpTimelineSpan::Lane::Comm;
      events.push_back({{"name", x.name},
                        {"cat", comm ? "comm" : "compute"},
                        {"ph", "X"},
                        {"pid", pid},
                        {"tid", comm ? 1 : 0},
                        {"ts", x.start_us},
                        {"dur", std::max(0.0, x.end_us - x.start_us)}});
    }
  }
  return json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump() + "\n";
}

}  // namespace flexjit
