#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>

#include "plexus/moe/scenario.hpp"
#include "plexus/moe/simulator.hpp"

namespace plexus::moe {
namespace {

const std::string kData = PLEXUS_MOE_DATA_DIR;

Scenario Load(const std::string& name) {
  absl::StatusOr<Scenario> s = LoadScenario(kData + "/" + name);
  REQUIRE(s.ok());
  return *s;
}

const char* kTiny = R"({"nodes": 4, "slots_per_node": 2, "min_replicas": 2,
  "layer_loads": [[1, 1, 3, 5]],
  "training": {"samples_per_step": 8, "tokens_per_sample": 16, "seconds_per_token": 0.001,
               "fixed_step_s": 1, "checkpoint_every_steps": 10, "checkpoint_s": 2,
               "restart_s": 30, "reconfigure_s": 3, "expert_state_bytes": 0, "ep_size": 2,
               "scale_up_wait_s": 0, "max_nodes": 4}})";

TEST_CASE("Bundled scenarios parse and are skewed as documented", "[moe][scenario]") {
  for (const char* name : {"gpt-s.json", "gpt-m.json", "gpt-l.json"}) {
    const Scenario s = Load(name);
    CHECK(s.layer_loads.size() == 12);
    CHECK(s.nodes == 10);
    CHECK(s.slots_per_node == 6);
    CHECK(s.min_replicas == 2);
    double max_top2 = 0;
    for (auto loads : s.layer_loads) {
      std::sort(loads.rbegin(), loads.rend());
      double sum = 0;
      for (double l : loads) sum += l;
      max_top2 = std::max(max_top2, (loads[0] + loads[1]) / sum);
    }
    CHECK(max_top2 == Approx(0.87).margin(0.005));
  }
  CHECK(Load("gpt-s.json").num_experts() == 8);
  CHECK(Load("gpt-m.json").num_experts() == 12);
  CHECK(Load("gpt-l.json").num_experts() == 16);
}

TEST_CASE("Scenario errors are clear", "[moe][scenario]") {
  auto code = [](const std::string& text) { return ParseScenario(text).status().code(); };
  CHECK(code("{") == absl::StatusCode::kInvalidArgument);
  CHECK(code("[]") == absl::StatusCode::kInvalidArgument);
  CHECK(code(R"({"slots_per_node": 2, "layer_loads": [[1]]})") ==
        absl::StatusCode::kInvalidArgument);
  CHECK(code(R"({"nodes": 0, "slots_per_node": 2, "layer_loads": [[1]]})") ==
        absl::StatusCode::kInvalidArgument);
  CHECK(code(R"({"nodes": 2, "slots_per_node": 2, "layer_loads": [[1, 2], [1]]})") ==
        absl::StatusCode::kInvalidArgument);
  CHECK(code(R"({"nodes": 2, "slots_per_node": 2, "layer_loads": [[1, -2]]})") ==
        absl::StatusCode::kInvalidArgument);
  CHECK(code(R"({"nodes": 1, "slots_per_node": 1, "layer_loads": [[1, 2]]})") ==
        absl::StatusCode::kInvalidArgument);
  CHECK(code(R"({"nodes": 2, "slots_per_node": 2, "layer_loads": [[1, 2, 3]],
                 "training": {"ep_size": 2}})") == absl::StatusCode::kInvalidArgument);
  CHECK(code(R"({"nodes": 2, "slots_per_node": 2, "layer_loads": [[1, 2]],
                 "training": {"restart_s": "slow"}})") == absl::StatusCode::kInvalidArgument);
  CHECK(LoadScenario("/nonexistent/x.json").status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("The bundled P3 spot trace parses", "[moe][scenario]") {
  absl::StatusOr<Schedule> trace = LoadSchedule(kData + "/bamboo/p3-trace.csv");
  REQUIRE(trace.ok());
  CHECK(trace->events.size() == 344);
  CHECK(trace->events.front().add);
  CHECK(trace->end_s == Approx(40920.0));
}

TEST_CASE("Trace and schedule errors are clear", "[moe][scenario]") {
  CHECK(ParseSpotTrace("").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseSpotTrace("0,add\n").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseSpotTrace("x,add,a\n").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseSpotTrace("0,join,a\n").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseSpotTrace("0,remove,a\n").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseSpotTrace("5,add,a\n1,add,b\n").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseSchedule(R"({"steps": [{"time_s": 0, "nodes": -1}]})").status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ParseSchedule(R"({"name": "x"})").status().code() == absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Schedule> steps =
      ParseSchedule(R"({"steps": [{"time_s": 0, "nodes": 4}, {"time_s": 10, "nodes": 2}],
                        "end_s": 20})");
  REQUIRE(steps.ok());
  CHECK(steps->events.size() == 6);
  CHECK(steps->end_s == 20);
  absl::StatusOr<Schedule> periodic = LoadSchedule(kData + "/fail-every-5min.json");
  REQUIRE(periodic.ok());
  int removes = 0;
  for (const NodeEvent& e : periodic->events) removes += e.add ? 0 : 1;
  CHECK(removes == 47);  // every 300 s in 14400 s, strictly before the end
}

// StepTime is the library's own figure: this checks that the event loop turns it into steps
// (blocks of 10 steps and a 2 s checkpoint), not that the step time itself is right.
TEST_CASE("Without failures every system trains at its step time", "[moe][simulator]") {
  absl::StatusOr<Scenario> s = ParseScenario(kTiny);
  REQUIRE(s.ok());
  absl::StatusOr<Schedule> steady =
      ParseSchedule(R"({"steps": [{"time_s": 0, "nodes": 4}], "end_s": 1000})");
  REQUIRE(steady.ok());
  for (SystemKind kind : {SystemKind::kLazarus, SystemKind::kCheckpointRestart}) {
    absl::StatusOr<double> step = StepTime(*s, kind, 4);
    REQUIRE(step.ok());
    absl::StatusOr<SimulationResult> r = Simulate(*s, *steady, kind);
    REQUIRE(r.ok());
    // Each block of 10 steps costs 10 steps plus one 2 s checkpoint.
    const double block = 10 * *step + 2;
    const int64_t expected_steps =
        static_cast<int64_t>(1000 / block) * 10 +
        std::min<int64_t>(10, static_cast<int64_t>(std::fmod(1000, block) / *step));
    CHECK(r->steps == expected_steps);
    CHECK(r->samples == Approx(8.0 * r->steps));
    CHECK(r->restarts == 0);
    CHECK(r->lost_samples == 0);
  }
  // Lazarus balances the skewed load over replicas; EP puts the hot expert on one node.
  CHECK(*StepTime(*s, SystemKind::kLazarus, 4) < *StepTime(*s, SystemKind::kCheckpointRestart, 4));
  CHECK(StepTime(*s, SystemKind::kCheckpointRestart, 1).status().code() ==
        absl::StatusCode::kUnavailable);
}

TEST_CASE("Lazarus reconfigures where checkpoint-restart restarts", "[moe][simulator]") {
  absl::StatusOr<Scenario> s = ParseScenario(kTiny);
  REQUIRE(s.ok());
  absl::StatusOr<Schedule> one_failure = ParseSchedule(
      R"({"events": [{"time_s": 0, "op": "add", "node": "a"},
                     {"time_s": 0, "op": "add", "node": "b"},
                     {"time_s": 0, "op": "add", "node": "c"},
                     {"time_s": 0, "op": "add", "node": "d"},
                     {"time_s": 95, "op": "remove", "node": "c"}], "end_s": 400})");
  REQUIRE(one_failure.ok());
  absl::StatusOr<SimulationResult> lazarus = Simulate(*s, *one_failure, SystemKind::kLazarus);
  absl::StatusOr<SimulationResult> ckpt =
      Simulate(*s, *one_failure, SystemKind::kCheckpointRestart);
  absl::StatusOr<SimulationResult> epr = Simulate(*s, *one_failure, SystemKind::kEpReconfigure);
  REQUIRE(lazarus.ok());
  REQUIRE(ckpt.ok());
  REQUIRE(epr.ok());
  CHECK(lazarus->failures == 1);
  CHECK(lazarus->restarts == 0);
  CHECK(lazarus->reconfigurations == 1);
  CHECK(lazarus->lost_samples == 0);
  CHECK(ckpt->restarts == 1);
  CHECK(ckpt->lost_samples > 0);
  // With 4 nodes and EP size 2 there are two EP groups: the intact one keeps every expert.
  CHECK(epr->restarts == 0);
  CHECK(epr->reconfigurations == 1);
  CHECK(lazarus->samples > ckpt->samples);
  CHECK(epr->samples > ckpt->samples);
  // The timeline is sampled every 60 s and never exceeds the final count by more than lost work.
  REQUIRE(lazarus->timeline.size() == 7);
  CHECK(lazarus->timeline.back().time_s == 360);
  for (const SimulationResult* r : {&*lazarus, &*ckpt, &*epr}) {
    double previous_time = -1;
    for (const TimelinePoint& p : r->timeline) {
      INFO("t = " << p.time_s);
      CHECK(p.time_s > previous_time);
      CHECK(p.samples <= r->samples + r->lost_samples);
      previous_time = p.time_s;
    }
  }
}

TEST_CASE("Lazarus restarts when a failure takes every replica of an expert", "[moe][simulator]") {
  absl::StatusOr<Scenario> s = ParseScenario(kTiny);
  REQUIRE(s.ok());
  // MRO puts the two coldest experts (2 replicas each) on the first two nodes.
  absl::StatusOr<Schedule> two = ParseSchedule(
      R"({"events": [{"time_s": 0, "op": "add", "node": "a"},
                     {"time_s": 0, "op": "add", "node": "b"},
                     {"time_s": 0, "op": "add", "node": "c"},
                     {"time_s": 0, "op": "add", "node": "d"},
                     {"time_s": 95, "op": "remove", "node": "a"},
                     {"time_s": 95, "op": "remove", "node": "b"}], "end_s": 400})");
  REQUIRE(two.ok());
  absl::StatusOr<SimulationResult> r = Simulate(*s, *two, SystemKind::kLazarus);
  REQUIRE(r.ok());
  CHECK(r->restarts == 1);
  CHECK(r->lost_samples > 0);
}

TEST_CASE("Spot trace: Lazarus trains more than checkpoint-restart", "[moe][simulator]") {
  const Scenario s = Load("gpt-l.json");
  absl::StatusOr<Schedule> trace = LoadSchedule(kData + "/bamboo/p3-trace.csv");
  REQUIRE(trace.ok());
  absl::StatusOr<SimulationResult> lazarus = Simulate(s, *trace, SystemKind::kLazarus);
  absl::StatusOr<SimulationResult> ckpt = Simulate(s, *trace, SystemKind::kCheckpointRestart);
  REQUIRE(lazarus.ok());
  REQUIRE(ckpt.ok());
  CHECK(lazarus->mean_active_nodes <= 10.0 + 1e-9);
  CHECK(lazarus->failures > 0);
  CHECK(lazarus->samples > ckpt->samples);
}

TEST_CASE("Simulation rejects bad options", "[moe][simulator]") {
  absl::StatusOr<Scenario> s = ParseScenario(kTiny);
  REQUIRE(s.ok());
  CHECK(Simulate(*s, Schedule{}, SystemKind::kLazarus).status().code() ==
        absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Schedule> steady =
      ParseSchedule(R"({"steps": [{"time_s": 0, "nodes": 4}], "end_s": 100})");
  REQUIRE(steady.ok());
  SimulationOptions bad;
  bad.timeline_interval_s = 0;
  CHECK(Simulate(*s, *steady, SystemKind::kLazarus, bad).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ParseSystemKind("deepspeed").status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace plexus::moe
