// The simulator: feasible plans sustain their rate, over-committed plans show it, traffic adds up.
#include <catch2/catch.hpp>
#include <string>

#include "plexus/placement/optimizer.hpp"
#include "plexus/placement/simulator.hpp"
#include "test_support.hpp"

namespace plexus::placement {
namespace {

TEST_CASE("the JellyBean plan of the real VQA input sustains 40 req/s", "[placement]") {
  auto problem = LoadProblem(testing::DataFile("jellybean-vqa/vqa-medium-release.json"));
  REQUIRE(problem.ok());
  auto plan = Optimize(*problem, Strategy::kJellyBean);
  REQUIRE(plan.ok());
  SimulationOptions options;
  options.duration_s = 40;
  auto report = Simulate(*problem, *plan, options);
  REQUIRE(report.ok());
  CHECK(report->sustained);
  CHECK(report->throughput_ratio == Approx(1).epsilon(0.02));
  REQUIRE(report->sinks.size() == 1);
  CHECK(report->sinks[0].target_rate == Approx(40));
  // The bytes actually carried cost what the plan's network cost says.
  CHECK(report->network_cost_per_hour == Approx(plan->network_cost).epsilon(0.03));
  CHECK(report->compute_cost_per_hour == Approx(plan->compute_cost));
  CHECK(report->latency_p50_ms > 0);
  CHECK(report->latency_p99_ms >= report->latency_p50_ms);
  for (const WorkerReport& w : report->workers) {
    CHECK(w.utilisation < 1.0);
    // Throughput is planned at p75, so measured busy time stays at or below the plan.
    CHECK(w.utilisation <= w.planned_utilisation * 1.05);
  }
}

TEST_CASE("an over-committed plan shows it", "[placement]") {
  auto problem = LoadProblem(testing::DataFile("jellybean-vqa/vqa-medium-release.json"));
  REQUIRE(problem.ok());
  auto plan = Optimize(*problem, Strategy::kCloudGpu);  // 250% of one GPU
  REQUIRE(plan.ok());
  REQUIRE_FALSE(plan->capacity_ok);
  SimulationOptions options;
  options.duration_s = 30;
  auto report = Simulate(*problem, *plan, options);
  REQUIRE(report.ok());
  CHECK_FALSE(report->sustained);
  CHECK(report->throughput_ratio < 0.6);
  REQUIRE(report->workers.size() == 1);
  CHECK(report->workers[0].utilisation > 0.97);
  CHECK(report->workers[0].planned_utilisation > 2);
  CHECK(report->workers[0].queue_at_end > 100);
}

TEST_CASE("bytes per tier pair follow the rate and the message sizes", "[placement]") {
  auto problem = ParseProblem(testing::TinyProblem().dump());
  REQUIRE(problem.ok());
  // Everything on the cloud: the camera's 1000 KB frames all cross edge -> cloud.
  Plan plan;
  plan.variant = {-1, 0, 0};
  plan.workers = {{}, {{problem->FindWorker("c"), 1.0}}, {{problem->FindWorker("t"), 1.0}}};
  SimulationOptions options;
  options.duration_s = 20;
  options.warmup_s = 2;
  auto report = Simulate(*problem, plan, options);
  REQUIRE(report.ok());
  const double frames = 8 * 18;  // constant arrivals at 8 req/s over the measured 18 s
  CHECK(report->bytes_per_tier_pair.at("edge->cloud") == Approx(frames * 1e6).epsilon(0.01));
  CHECK(report->bytes_per_tier_pair.at("cloud->cloud") == Approx(frames * 1e3).epsilon(0.01));
  CHECK(report->sustained);
}

TEST_CASE("the simulator rejects bad options and invalid plans", "[placement]") {
  auto problem = ParseProblem(testing::TinyProblem().dump());
  REQUIRE(problem.ok());
  auto plan = Optimize(*problem, Strategy::kJellyBean);
  REQUIRE(plan.ok());
  SimulationOptions options;
  options.warmup_s = 100;
  CHECK_FALSE(Simulate(*problem, *plan, options).ok());
  options = {};
  options.max_events = 10;
  auto limited = Simulate(*problem, *plan, options);
  REQUIRE_FALSE(limited.ok());
  CHECK_THAT(std::string(limited.status().message()), Catch::Contains("max_events"));
  Plan broken = *plan;
  broken.workers[1].clear();
  CHECK_FALSE(Simulate(*problem, broken, {}).ok());
}

}  // namespace
}  // namespace plexus::placement
