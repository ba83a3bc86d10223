// The seed's two workloads as transfers for the CXL simulator: LLM inference (weight loads and
// ring all-reduces) and YCSB A/B/C/F (Zipf keys, write-invalidate fan-out), scaled down.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "plexus/netmodel/cxl_workloads.hpp"

namespace cxl = plexus::netmodel::cxl;

namespace {
const cxl::Fabric& K4() {
  static const cxl::Fabric f = cxl::Fabric::FatTree(4).value();
  return f;
}
}  // namespace

TEST_CASE("cxl workloads: LLM inference phases, sizes and dependencies", "[netmodel][cxl]") {
  cxl::LlmSpec spec;
  spec.runs = 2;
  spec.scale = 1 << 20;  // a 6.3 KB all-reduce share, 7.7 KB stripes, 2.9 us compute gaps
  auto w = cxl::LlmInference(K4(), spec);
  REQUIRE(w.ok());
  // Per run: 2 x (8 x 8 striped reads + 14 ring steps x 8 accelerators).
  REQUIRE(w->run_end == std::vector<int>{352, 704});
  const auto& t = w->transfers;
  CHECK(t[0].op == cxl::Op::kRead);
  CHECK(cxl::FormatFanId(t[0].src) == "0:0:2");  // accelerators at x:y:2
  CHECK(cxl::FormatFanId(t[0].dst) == "0:0:3");  // expanders at x:y:3
  CHECK(t[0].bytes == std::llround(8.125e9 / 8 / spec.scale));
  CHECK(t[0].after.empty());
  const cxl::Transfer& first_step = t[64];
  CHECK(first_step.op == cxl::Op::kUio);
  CHECK(cxl::FormatFanId(first_step.dst) == "0:1:2");  // the next accelerator on the ring
  CHECK(first_step.bytes == std::llround(810.0 * (8 << 20) / 8 / spec.scale));
  CHECK(first_step.after.size() == 64);  // the weight load is a barrier
  CHECK(first_step.gap_ns == Approx(3e6 / spec.scale));
  // Step 1 of accelerator 1 waits for its own step 0 and its predecessor's.
  CHECK(t[64 + 8 + 1].after == std::vector<int>{64 + 1, 64 + 0});
  CHECK(t[176].after.size() == 8);  // the second load waits for the last ring step

  auto r = cxl::Simulate(K4(), t, {});
  REQUIRE(r.ok());
  const auto times = cxl::LlmRunTimes(*w, *r);
  REQUIRE(times.size() == 2);
  // Run 1 has 3 compute gaps (its first load starts at once), run 2 has 4.
  CHECK(times[0] > 3 * spec.compute_gap_ns / spec.scale);
  CHECK(times[1] > 4 * spec.compute_gap_ns / spec.scale);
  CHECK(r->makespan_ns == Approx(times[0] + times[1]));
  CHECK_FALSE(cxl::LlmInference(cxl::Fabric::FatTree(2).value(), spec).ok());
}

TEST_CASE("cxl workloads: LLM phases that overlap start a gap apart, runs one after another",
          "[netmodel][cxl]") {
  cxl::LlmSpec spec;
  spec.runs = 2;
  spec.scale = 1 << 20;
  spec.overlap_phases = true;
  auto w = cxl::LlmInference(K4(), spec);
  REQUIRE(w.ok());
  REQUIRE(w->run_end == std::vector<int>{352, 704});
  const auto& t = w->transfers;
  const double gap = spec.compute_gap_ns / spec.scale;
  // Run 1: load, all-reduce, load, all-reduce at 0, 1, 2 and 3 gaps, none waiting for another.
  for (const auto& [first, k] :
       std::vector<std::pair<int, int>>{{0, 0}, {64, 1}, {176, 2}, {240, 3}}) {
    INFO("transfer " << first);
    CHECK(t[first].after.empty());
    CHECK(t[first].start_ns == Approx(k * gap));
  }
  // The ring's later steps still chain; run 2 waits for all of run 1, then its own gaps.
  CHECK(t[64 + 8 + 1].after == std::vector<int>{64 + 1, 64 + 0});
  CHECK(t[352].after.size() == 352);
  CHECK(t[352].gap_ns == Approx(gap));
  CHECK(t[352 + 64].gap_ns == Approx(2 * gap));
  auto r = cxl::Simulate(K4(), t, {});
  REQUIRE(r.ok());
  // Overlapping phases finish sooner than the same phases one after another.
  spec.overlap_phases = false;
  auto serial = cxl::LlmInference(K4(), spec);
  REQUIRE(serial.ok());
  auto rs = cxl::Simulate(K4(), serial->transfers, {});
  REQUIRE(rs.ok());
  CHECK(r->makespan_ns < rs->makespan_ns);
}

TEST_CASE("cxl workloads: YCSB mixes, Zipf skew and invalidations", "[netmodel][cxl]") {
  std::map<cxl::Ycsb, double> write_share;
  for (auto y : {cxl::Ycsb::kA, cxl::Ycsb::kB, cxl::Ycsb::kC, cxl::Ycsb::kF}) {
    cxl::YcsbSpec spec;
    spec.workload = y;
    auto w = cxl::YcsbWorkloadFor(K4(), spec);
    REQUIRE(w.ok());
    REQUIRE(w->ops.size() == 4 * 2000u);
    int writes = 0;
    std::map<std::string, int> per_memory;
    for (const auto& op : w->ops) {
      writes += op.write;
      ++per_memory[cxl::FormatFanId(w->transfers[op.last].dst)];
    }
    write_share[y] = writes / 8000.0;
    CHECK(w->invalidations == 3 * writes);  // the other three CPUs
    // F's writes are read-modify-writes: one more transfer each.
    const size_t extra = y == cxl::Ycsb::kF ? writes : 0;
    CHECK(w->transfers.size() == 8000 + extra + 3u * writes);
    CHECK(w->device_rates.size() == 12);
    // Zipf: key 0's expander (the first that is not a CPU, 0:0:3) is the busiest.
    const auto busiest = std::max_element(per_memory.begin(), per_memory.end(),
                                          [](auto& a, auto& b) { return a.second < b.second; });
    CHECK(busiest->first == "0:0:3");
  }
  CHECK(write_share[cxl::Ycsb::kA] == Approx(0.5).margin(0.03));
  CHECK(write_share[cxl::Ycsb::kB] == Approx(0.05).margin(0.01));
  CHECK(write_share[cxl::Ycsb::kC] == 0);
  CHECK(write_share[cxl::Ycsb::kF] == Approx(0.5).margin(0.03));

  cxl::YcsbSpec small;
  small.ops_per_cpu = 200;
  auto w = cxl::YcsbWorkloadFor(K4(), small);
  REQUIRE(w.ok());
  cxl::SimOptions o;
  o.device_rates = w->device_rates;
  o.cc.enabled = true;
  auto r = cxl::Simulate(K4(), w->transfers, o);
  REQUIRE(r.ok());
  const auto latencies = cxl::YcsbLatencies(*w, *r);
  REQUIRE(latencies.size() == 800);
  // No operation beats an unloaded round trip through one switch (2 x 270 ns).
  CHECK(*std::min_element(latencies.begin(), latencies.end()) > 540);
  CHECK(absl::IsInvalidArgument(cxl::ParseYcsb("d").status()));
  CHECK(cxl::ParseYcsb("F").value() == cxl::Ycsb::kF);
}
