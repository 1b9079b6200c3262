// What a context-parallel timeline's spans say (summarize_cp_timeline) and the Chrome trace they
// become (cp_timeline_chrome_trace), no GPU: the recording itself is tested on GPUs
// (tests/gpu/test_cp.cpp, "a CpTimeline records ...").
#include <flexjit/context_parallel.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

using namespace flexjit;
using Lane = CpTimelineSpan::Lane;

TEST_CASE("summarize_cp_timeline: compute busy time, comm time and the comm not hidden by compute",
          "[cp]") {
  // compute: [0, 10) and [10, 20) back to back, then [40, 50); comm: [5, 15) hidden behind the
  // compute, [18, 30) half exposed, [25, 28) inside that one (counted once), [45, 60) partly.
  const std::vector<CpTimelineSpan> spans = {
      {Lane::Compute, "step 0 attention", 0, 10},
      {Lane::Comm, "step 0 send / recv K / V", 5, 15},
      {Lane::Compute, "merge", 10, 20},
      {Lane::Comm, "step 1 send / recv K / V", 18, 30},
      {Lane::Comm, "all-reduce", 25, 28},
      {Lane::Compute, "step 1 attention", 40, 50},
      {Lane::Comm, "step 1 send / recv dK / dV", 45, 60},
  };
  const CpTimelineSummary s = summarize_cp_timeline(spans);
  CHECK(s.wall_us == 60);
  CHECK(s.compute_us == 30);
  CHECK(s.comm_us == 10 + 12 + 15);
  // Exposed: [20, 30) of the second and [50, 60) of the last.
  CHECK(s.comm_exposed_us == 20);
  CHECK(s.compute_spans == 3);
  CHECK(s.comm_spans == 4);

  const CpTimelineSummary empty = summarize_cp_timeline({});
  CHECK(empty.wall_us == 0);
  CHECK(empty.comm_exposed_us == 0);
}

TEST_CASE("cp_timeline_chrome_trace: one process per rank, compute and comm threads", "[cp]") {
  const std::vector<std::vector<CpTimelineSpan>> ranks = {
      {{Lane::Compute, "step 0 attention q [0, 8) x kv [0, 8) (partial)", 1.5, 4.0},
       {Lane::Comm, "step 0 send / recv K / V", 2.0, 3.0}},
      {{Lane::Compute, "finalize \"quoted\"", 0.0, 2.0}},
  };
  const nlohmann::json trace = nlohmann::json::parse(cp_timeline_chrome_trace(ranks));
  REQUIRE(trace.contains("traceEvents"));
  int spans = 0, process_names = 0;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") {
      ++process_names;
      CHECK(e["args"]["name"] == "rank " + std::to_string(e["pid"].get<int>()));
    }
    if (e["ph"] != "X") continue;
    ++spans;
    const int pid = e["pid"].get<int>();
    if (e["name"] == "step 0 send / recv K / V") {
      CHECK(pid == 0);
      CHECK(e["tid"] == 1);
      CHECK(e["cat"] == "comm");
      CHECK(e["ts"].get<double>() == 2.0);
      CHECK(e["dur"].get<double>() == 1.0);
    } else if (e["name"] == "finalize \"quoted\"") {
      CHECK(pid == 1);
      CHECK(e["tid"] == 0);
      CHECK(e["dur"].get<double>() == 2.0);
    } else {
      CHECK(e["name"] == "step 0 attention q [0, 8) x kv [0, 8) (partial)");
      CHECK(e["ts"].get<double>() == 1.5);
    }
  }
  CHECK(spans == 3);
  CHECK(process_names == 2);
}
