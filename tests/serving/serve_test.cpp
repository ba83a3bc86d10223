// The serving runtime end to end over inproc rpc: exact delivery, joins, shares, overload,
// refusals, a real operator, fan-out, and the VQA and AI City workflows against the simulator.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "plexus/base/admin.hpp"
#include "plexus/placement/optimizer.hpp"
#include "plexus/placement/simulator.hpp"
#include "plexus/serving/serve.hpp"

namespace plexus::serving {
namespace {

using nlohmann::json;
using placement::Plan;
using placement::Problem;

// A workflow from its operators, edges and workers: every non-source operator has one variant
// "v" whose latency on the "gpu" type is `ms` (p50 = p75 = p90: fixed service times) and on the
// "cpu" type twice that; the last operator listed is the ML sink.
json Workflow(const std::vector<std::string>& sources, const std::vector<std::string>& ops,
              const std::vector<std::pair<std::string, std::string>>& edges, const json& workers,
              double rate, double ms, const std::string& join = "") {
  json operators = json::array();
  for (const auto& s : sources) operators.push_back({{"name", s}, {"kind", "source"}});
  json profiles = json::array();
  for (const auto& op : ops) {
    json o = {{"name", op}, {"kind", op == ops.back() ? "ml" : "relational"}};
    if (op == ops.back()) o["variants"] = {"v"};
    if (op == join) o["combine"] = "join";
    operators.push_back(o);
    profiles.push_back(
        {{"operator", op}, {"worker_type", "gpu"}, {"p50", ms}, {"p75", ms}, {"p90", ms}});
    profiles.push_back({{"operator", op},
                        {"worker_type", "cpu"},
                        {"p50", 2 * ms},
                        {"p75", 2 * ms},
                        {"p90", 2 * ms}});
    if (op == ops.back())
      profiles.back()["variant"] = "v", profiles[profiles.size() - 2]["variant"] = "v";
  }
  json edge_list = json::array();
  for (const auto& [from, to] : edges) {
    edge_list.push_back({{"from", from}, {"to", to}, {"message_kb", {{{"kb", 2}}}}});
  }
  json source_list = json::array();
  for (const auto& s : sources) source_list.push_back({{"operator", s}, {"tier", "edge"}});
  json accuracy_inputs = json::array();
  return {{"name", "test"},
          {"workflow", {{"operators", operators}, {"edges", edge_list}}},
          {"accuracy_profiles",
           {{{"operator", ops.back()},
             {"variants", {{"v", {{{"in", json::array()}, {"out", 0.9}}}}}}}}},
          {"execution_profiles", profiles},
          {"infrastructure",
           {{"tiers", {{{"name", "edge"}}, {{"name", "cloud"}}}},
            {"worker_types",
             {{{"name", "cpu"}, {"price_per_hour", 1.0}},
              {{"name", "gpu"}, {"price_per_hour", 3.0}, {"gpu", true}}}},
            {"workers", workers},
            {"network",
             {{{"from", "edge"}, {"to", "cloud"}, {"price_per_gb", 0.1}, {"latency_ms", 5}}}},
            {"sources", source_list}}},
          {"objective", {{"accuracy_target", 0.5}, {"input_rate", rate}}}};
}

Problem MustParse(const json& input) {
  auto problem = placement::ParseProblem(input.dump());
  INFO((problem.ok() ? "" : std::string(problem.status().message())));
  REQUIRE(problem.ok());
  return *problem;
}

// plan: operator -> [(worker, share)]
Plan MustPlan(
    const Problem& problem,
    const std::vector<std::pair<std::string, std::vector<std::pair<std::string, double>>>>& ops) {
  json plan = {{"strategy", "test"}, {"operators", json::array()}};
  for (const auto& [op, workers] : ops) {
    json entry = {{"name", op}, {"workers", json::array()}};
    if (problem.operators[problem.FindOperator(op)].kind == placement::OperatorKind::kMl) {
      entry["variant"] = "v";
    }
    for (const auto& [w, share] : workers)
      entry["workers"].push_back({{"name", w}, {"share", share}});
    plan["operators"].push_back(entry);
  }
  auto parsed = placement::ParsePlan(problem, plan.dump());
  INFO((parsed.ok() ? "" : std::string(parsed.status().message())));
  REQUIRE(parsed.ok());
  return *parsed;
}

json Workers(const std::string& tier, const std::string& type, const std::string& name, int n) {
  return {{"name", name}, {"type", type}, {"tier", tier}, {"count", n}};
}

void RequireExact(const ServeReport& r) {
  INFO("injected " << r.injected << ", completed " << r.completed << ", dropped " << r.dropped
                   << ", duplicates " << r.duplicates << ", unfinished " << r.unfinished);
  REQUIRE(r.injected > 0);
  REQUIRE(r.dropped == 0);
  REQUIRE(r.duplicates == 0);
  REQUIRE(r.unfinished == 0);
  for (const SinkServeReport& s : r.sinks) REQUIRE(s.completed == s.expected);
}

// 20 plan seconds (the first 2 left out of the figures) at compression 10: 2 wall seconds.
ServeOptions TwentySeconds() {
  ServeOptions options;
  options.duration_s = 20;
  options.warmup_s = 2;
  options.compression = 10;
  return options;
}

// cam -> A -> B -> C at 40 requests/s, 2 ms per operator on a GPU: two edge CPUs and two cloud
// GPUs; the plan puts A on e-0, B on e-1, C on g-0.
Problem ChainProblem() {
  return MustParse(Workflow(
      {"cam"}, {"A", "B", "C"}, {{"cam", "A"}, {"A", "B"}, {"B", "C"}},
      json::array({Workers("edge", "cpu", "e", 2), Workers("cloud", "gpu", "g", 2)}), 40, 2));
}
Plan ChainPlan(const Problem& problem) {
  return MustPlan(problem, {{"A", {{"e-0", 1}}}, {"B", {{"e-1", 1}}}, {"C", {{"g-0", 1}}}});
}

TEST_CASE("a 3-operator chain delivers every request once, in order", "[serving]") {
  const Wire wire = GENERATE(Wire::kInproc, Wire::kTcp);
  const Problem problem = ChainProblem();
  const Plan plan = ChainPlan(problem);
  std::mutex mu;
  std::vector<uint64_t> order;
  ServeOptions options = TwentySeconds();
  options.wire = wire;
  options.operators["C"] = [&](const Request& request) -> absl::StatusOr<std::string> {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(request.id);
    return std::string();
  };
  auto report = Serve(problem, plan, options);
  REQUIRE(report.ok());
  std::printf("%s", ServeSummary(problem, *report).c_str());
  RequireExact(*report);
  CHECK(report->injected == 40 * 20);
  CHECK(report->sustained);
  REQUIRE(order.size() == static_cast<size_t>(report->injected));
  CHECK(std::is_sorted(order.begin(), order.end()));
  // Bytes: every message is 2 KB; edge -> cloud is only B -> C.
  CHECK(report->bytes_per_tier_pair.count("edge->cloud") == 1);
  CHECK(report->network_cost_per_hour > 0);
}

// cam -> A -> B -> C with rate_ratio `ab` on A -> B and `bc` on B -> C (a detector that finds
// objects, a filter that keeps some), C real: it records every (request, part) it sees.
struct FanOut {
  Problem problem;
  Plan plan;
};
FanOut FanOutProblem(double rate, double ab, double bc) {
  json input = Workflow(
      {"cam"}, {"A", "B", "C"}, {{"cam", "A"}, {"A", "B"}, {"B", "C"}},
      json::array({Workers("edge", "cpu", "e", 2), Workers("cloud", "gpu", "g", 3)}), rate, 1);
  input["workflow"]["edges"][1]["rate_ratio"] = ab;
  input["workflow"]["edges"][2]["rate_ratio"] = bc;
  FanOut f{MustParse(input), {}};
  f.plan = MustPlan(
      f.problem, {{"A", {{"e-0", 1}}}, {"B", {{"g-0", 0.5}, {"g-1", 0.5}}}, {"C", {{"g-2", 1}}}});
  return f;
}

TEST_CASE("edges with a rate_ratio fan a request out into messages, each served once",
          "[serving][fanout]") {
  const auto [ab, bc] = GENERATE(std::pair{3.0, 1.0}, std::pair{2.5, 0.4});
  const Wire wire = GENERATE(Wire::kInproc, Wire::kTcp);
  INFO("A -> B " << ab << ", B -> C " << bc << (wire == Wire::kTcp ? ", tcp" : ", inproc"));
  const FanOut f = FanOutProblem(20, ab, bc);
  std::mutex mu;
  std::map<uint64_t, std::vector<uint64_t>> parts;  // request -> the parts C saw
  ServeOptions options = TwentySeconds();
  options.wire = wire;
  options.operators["C"] = [&](const Request& r) -> absl::StatusOr<std::string> {
    std::lock_guard<std::mutex> lock(mu);
    parts[r.id].push_back(r.part);
    return std::string();
  };
  auto report = Serve(f.problem, f.plan, options);
  REQUIRE(report.ok());
  std::printf("%s", ServeSummary(f.problem, *report).c_str());
  RequireExact(*report);
  CHECK(report->sustained);
  // Request i becomes floor((i+1) r) - floor(i r) messages on an edge with ratio r; message k of
  // part p is part p * ceil(r) + k.
  const auto count = [](double r, uint64_t i) {
    return static_cast<uint64_t>(std::floor((i + 1) * r + 1e-9)) -
           static_cast<uint64_t>(std::floor(i * r + 1e-9));
  };
  const auto radix_bc = static_cast<uint64_t>(std::ceil(bc));
  uint64_t expected_total = 0;
  for (uint64_t id = 0; id < static_cast<uint64_t>(report->injected); ++id) {
    std::vector<uint64_t> want;
    for (uint64_t k = 0; k < count(ab, id); ++k) {
      for (uint64_t j = 0; j < count(bc, id); ++j) want.push_back(k * radix_bc + j);
    }
    std::vector<uint64_t> got = parts.count(id) != 0 ? parts[id] : std::vector<uint64_t>{};
    std::sort(got.begin(), got.end());
    INFO("request " << id);
    REQUIRE(got == want);
    expected_total += want.size();
  }
  CHECK(report->completed == static_cast<int64_t>(expected_total));
  REQUIRE(report->sinks.size() == 1);
  CHECK(report->sinks[0].target_rate == Approx(20 * ab * bc));
  CHECK(report->sinks[0].achieved_rate == Approx(20 * ab * bc).epsilon(0.05));
}

TEST_CASE("a killed worker below a fan-out: every message of every request served once",
          "[serving][fanout][failure]") {
  const FanOut f = FanOutProblem(20, 3, 1);
  ServeOptions options = TwentySeconds();
  options.failures = {{"g-1", 8}};
  auto report = Serve(f.problem, f.plan, options);
  REQUIRE(report.ok());
  std::printf("%s", ServeSummary(f.problem, *report).c_str());
  RequireExact(*report);
  CHECK(report->completed == 3 * report->injected);
  REQUIRE(report->failures.size() == 1);
  CHECK(report->failures[0].error.empty());
  CHECK(report->failures[0].retried > 0);
}

TEST_CASE("workers deployed on hosts (other processes' servers) serve exactly and re-plan",
          "[serving][hosts]") {
  // Hosts are what the other ranks of a multi-process run start; here three of them in this
  // process, over tcp, so that the driver deploys through their rpc service as it would there.
  std::vector<std::unique_ptr<Host>> hosts;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    auto host = Host::Start({});
    REQUIRE(host.ok());
    addresses.push_back((*host)->address());
    hosts.push_back(std::move(*host));
  }
  ServeOptions options = TwentySeconds();
  options.wire = Wire::kTcp;
  options.hosts = addresses;
  SECTION("a chain") {
    const Problem problem = ChainProblem();
    auto report = Serve(problem, ChainPlan(problem), options);
    REQUIRE(report.ok());
    RequireExact(*report);
    CHECK(report->injected == 40 * 20);
    CHECK(report->sustained);
  }
  SECTION("a fan-out, the same hosts for a second run") {
    const FanOut f = FanOutProblem(20, 3, 1);
    for (int run = 0; run < 2; ++run) {
      auto report = Serve(f.problem, f.plan, options);
      REQUIRE(report.ok());
      RequireExact(*report);
      CHECK(report->completed == 3 * report->injected);
    }
  }
  SECTION("refused over inproc, and with the driver's own operators") {
    const Problem problem = ChainProblem();
    ServeOptions inproc = options;
    inproc.wire = Wire::kInproc;
    auto refused = Serve(problem, ChainPlan(problem), inproc);
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(std::string(refused.status().message()), Catch::Contains("hosts"));
    ServeOptions with_fn = options;
    with_fn.operators["C"] = [](const Request&) { return std::string(); };
    auto refused_fn = Serve(problem, ChainPlan(problem), with_fn);
    REQUIRE_FALSE(refused_fn.ok());
    CHECK_THAT(std::string(refused_fn.status().message()), Catch::Contains("HostOptions"));
  }
  REQUIRE(ShutdownHosts(addresses).ok());
  for (auto& host : hosts) CHECK(host->Wait().ok());
}

TEST_CASE("a host whose driver falls silent gives up within its timeout", "[serving][hosts]") {
  HostOptions options;
  options.driver_timeout_s = 0.3;
  auto host = Host::Start(options);
  REQUIRE(host.ok());
  const auto start = std::chrono::steady_clock::now();
  const absl::Status waited = (*host)->Wait();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(absl::IsUnavailable(waited));
  CHECK_THAT(std::string(waited.message()), Catch::Contains("silent"));
  CHECK(seconds < 2);
}

TEST_CASE("a join of two branches of one source pairs every request once", "[serving]") {
  const Problem problem = MustParse(Workflow(
      {"cam"}, {"L", "R", "J"}, {{"cam", "L"}, {"cam", "R"}, {"L", "J"}, {"R", "J"}},
      json::array({Workers("edge", "cpu", "e", 3), Workers("cloud", "gpu", "g", 2)}), 40, 2, "J"));
  // L on two workers, R on one, the join on two: every relay must pick the same join worker.
  const Plan plan = MustPlan(problem, {{"L", {{"e-0", 0.5}, {"e-1", 0.5}}},
                                       {"R", {{"e-2", 1}}},
                                       {"J", {{"g-0", 0.7}, {"g-1", 0.3}}}});
  ServeOptions options = TwentySeconds();
  auto report = Serve(problem, plan, options);
  REQUIRE(report.ok());
  std::printf("%s", ServeSummary(problem, *report).c_str());
  RequireExact(*report);
  CHECK(report->sustained);
}

TEST_CASE("a join drops a request whose inputs never complete, once, with the reason",
          "[serving]") {
  const Problem problem = MustParse(Workflow(
      {"cam"}, {"L", "R", "J"}, {{"cam", "L"}, {"cam", "R"}, {"L", "J"}, {"R", "J"}},
      json::array({Workers("edge", "gpu", "e", 2), Workers("cloud", "gpu", "g", 1)}), 40, 1, "J"));
  const Plan plan =
      MustPlan(problem, {{"L", {{"e-0", 1}}}, {"R", {{"e-1", 1}}}, {"J", {{"g", 1}}}});
  ServeOptions options = TwentySeconds();
  options.join_timeout_s = 0.2;
  options.drain_timeout_s = 2;
  // R fails every tenth request: L's half of it waits at the join until the timeout.
  options.operators["R"] = [](const Request& r) -> absl::StatusOr<std::string> {
    if (r.id % 10 == 3) return absl::DataLossError("no audio");
    return std::string(r.inputs.at(0));
  };
  auto report = Serve(problem, plan, options);
  REQUIRE(report.ok());
  std::printf("%s", ServeSummary(problem, *report).c_str());
  const int64_t failing = report->injected / 10;
  CHECK(report->dropped == failing);
  CHECK(report->completed == report->injected - failing);
  CHECK(report->unfinished == 0);
  CHECK(report->duplicates == 0);
  CHECK(report->drops_by_reason["operator 'R' failed: no audio"] == failing);
  CHECK(report->drops_by_reason["join inputs incomplete within ServeOptions::join_timeout_s"] > 0);
}

TEST_CASE("a join of two sources pairs their k-th requests", "[serving]") {
  const Problem problem = MustParse(Workflow(
      {"img", "mic"}, {"F", "S", "J"}, {{"img", "F"}, {"mic", "S"}, {"F", "J"}, {"S", "J"}},
      json::array({Workers("edge", "gpu", "e", 2), Workers("cloud", "gpu", "g", 1)}), 30, 2, "J"));
  const Plan plan =
      MustPlan(problem, {{"F", {{"e-0", 1}}}, {"S", {{"e-1", 1}}}, {"J", {{"g", 1}}}});
  ServeOptions options;
  options.duration_s = 10;
  options.warmup_s = 1;
  options.compression = 10;
  options.poisson_arrivals = true;  // the sources inject different counts: the tail is no request
  auto report = Serve(problem, plan, options);
  REQUIRE(report.ok());
  std::printf("%s", ServeSummary(problem, *report).c_str());
  RequireExact(*report);
}

TEST_CASE("relays honour the plan's shares within 2% over 10,000 requests", "[serving]") {
  const Problem problem = MustParse(Workflow(
      {"cam"}, {"A", "B"}, {{"cam", "A"}, {"A", "B"}},
      json::array({Workers("edge", "gpu", "e", 3), Workers("cloud", "gpu", "g", 1)}), 1000, 0.001));
  const Plan plan =
      MustPlan(problem, {{"A", {{"e-0", 0.5}, {"e-1", 0.3}, {"e-2", 0.2}}}, {"B", {{"g", 1}}}});
  ServeOptions options;
  options.duration_s = 10;
  options.warmup_s = 1;
  options.compression = 4;
  auto report = Serve(problem, plan, options);
  REQUIRE(report.ok());
  std::printf("%s", ServeSummary(problem, *report).c_str());
  RequireExact(*report);
  REQUIRE(report->injected == 10'000);
  const std::vector<double> shares = {0.5, 0.3, 0.2};
  for (const WorkerServeReport& w : report->workers) {
    if (w.worker == problem.FindWorker("g")) continue;
    const size_t i = static_cast<size_t>(w.worker - problem.FindWorker("e-0"));
    INFO(problem.workers[w.worker].name << " processed " << w.processed);
    CHECK(std::abs(static_cast<double>(w.processed) / 10'000 - shares[i]) < 0.02 * shares[i]);
  }
}

TEST_CASE("a plan that cannot keep up is reported as not sustained, without hanging", "[serving]") {
  // 40 requests per second on one worker that serves 10 per second.
  const Problem problem = MustParse(Workflow(
      {"cam"}, {"A", "B"}, {{"cam", "A"}, {"A", "B"}},
      json::array({Workers("edge", "gpu", "e", 1), Workers("cloud", "gpu", "g", 1)}), 40, 100));
  const Plan plan = MustPlan(problem, {{"A", {{"e", 1}}}, {"B", {{"g", 1}}}});
  CHECK_FALSE(plan.capacity_ok);
  ServeOptions options = TwentySeconds();
  options.drain_timeout_s = 0.5;
  int progress_calls = 0;
  options.progress = [&](const ServeProgress&) { ++progress_calls; };
  auto report = Serve(problem, plan, options);
  REQUIRE(report.ok());
  std::printf("%s", ServeSummary(problem, *report).c_str());
  CHECK_FALSE(report->sustained);
  CHECK(report->throughput_ratio < 0.5);
  CHECK(report->unfinished > 0);
  CHECK(report->completed + report->dropped + report->unfinished == report->injected);
  CHECK(report->wall_s < 10);
  CHECK(progress_calls >= 1);
  bool queued = false;
  for (const WorkerServeReport& w : report->workers) queued |= w.queue_at_end > 10;
  CHECK(queued);
}

TEST_CASE("a killed worker is detected, the plan re-optimised and every request served once",
          "[serving][failure]") {
  const Wire wire = GENERATE(Wire::kInproc, Wire::kTcp);
  const Problem problem = ChainProblem();
  const Plan plan = ChainPlan(problem);
  ServeOptions options = TwentySeconds();
  options.wire = wire;
  options.failures = {{"g-0", 8}};
  std::vector<std::string> replanned_workers;
  options.replan = [&](const Problem& remaining) {
    for (const auto& w : remaining.workers) replanned_workers.push_back(w.name);
    return placement::Optimize(remaining, placement::Strategy::kJellyBean);
  };
  auto report = Serve(problem, plan, options);
  REQUIRE(report.ok());
  std::printf("%s", ServeSummary(problem, *report).c_str());
  RequireExact(*report);
  CHECK(report->injected == 40 * 20);
  REQUIRE(report->failures.size() == 1);
  const FailureReport& f = report->failures[0];
  INFO("detected after " << f.detected_after_ms << " ms, recovered after " << f.recovered_after_s
                         << " s, retried " << f.retried);
  CHECK(f.error.empty());
  CHECK(f.worker == "g-0");
  CHECK(f.killed_at_s == Approx(8).margin(0.5));
  CHECK(f.detected_after_ms < 1000);
  CHECK(f.retried > 0);
  CHECK(report->retried == f.retried);
  CHECK(std::find(f.moved.begin(), f.moved.end(), "C") != f.moved.end());
  CHECK(f.recovered_after_s > 0);
  // Back at the rate within 5 plan seconds of the detection (recovered_after_s counts from the
  // kill in plan seconds, the detection's wall milliseconds are 10x as many of them: a busy
  // machine's slow detection, allowed up to 1 s above, is not held against the recovery).
  const double detected_plan_s = f.detected_after_ms / 1000 * options.compression;
  CHECK(f.recovered_after_s - detected_plan_s < 5);
  // The re-plan saw every worker but the failed one, and the last deployment does not use it.
  CHECK(replanned_workers == std::vector<std::string>{"e-0", "e-1", "g-1"});
  for (const WorkerServeReport& w : report->workers) CHECK(problem.workers[w.worker].name != "g-0");
  // The timeline shows the outage and the return to the rate.
  REQUIRE(report->timeline.size() >= 10);
  double lowest = 1e9;
  for (const TimelinePoint& point : report->timeline) {
    if (point.t_s >= 2 && point.t_s < 19) lowest = std::min(lowest, point.completion_rate);
  }
  CHECK(lowest < 40);
}

TEST_CASE("a failure that leaves no feasible plan stops serving and drops what was owed",
          "[serving][failure]") {
  const Problem problem = MustParse(Workflow(
      {"cam"}, {"A", "B"}, {{"cam", "A"}, {"A", "B"}},
      json::array({Workers("edge", "cpu", "e", 1), Workers("cloud", "gpu", "g", 1)}), 40, 2));
  const Plan plan = MustPlan(problem, {{"A", {{"e", 1}}}, {"B", {{"g", 1}}}});
  ServeOptions options = TwentySeconds();
  options.failures = {{"g", 5}};
  // Only the cloud GPU may run B: without it nothing can.
  options.replan = [](const Problem&) -> absl::StatusOr<Plan> {
    return absl::FailedPreconditionError("operator 'B': no worker left that can run it");
  };
  auto report = Serve(problem, plan, options);
  REQUIRE(report.ok());
  std::printf("%s", ServeSummary(problem, *report).c_str());
  REQUIRE(report->failures.size() == 1);
  const FailureReport& f = report->failures[0];
  CHECK_THAT(f.error, Catch::Contains("'g'") && Catch::Contains("no worker left"));
  CHECK_FALSE(report->sustained);
  CHECK(report->duplicates == 0);
  CHECK(report->unfinished == 0);
  CHECK(report->dropped > 0);
  CHECK(report->completed + report->dropped == report->injected);
  CHECK(report->injected < 40 * 20);  // the sources stopped
  CHECK(report->wall_s < 10);
  bool reason = false;
  for (const auto& [why, count] : report->drops_by_reason) reason |= why == f.error;
  CHECK(reason);
}

TEST_CASE("Daronpon moves load off a slower worker that static shares overload",
          "[serving][balance]") {
  // B runs 2 ms on the cloud GPU and 4 ms on the edge CPU; the plan gives the CPU 54 % of the
  // requests, 104 % of its capacity, and the GPU 46 %, 44 % of its own: with static shares the
  // CPU's queue grows all run long, and Daronpon sends more to the GPU. (Overloaded rather than
  // nearly loaded, so that the static run's tail is far above any scheduling noise.)
  const Problem problem = MustParse(Workflow(
      {"cam"}, {"B"}, {{"cam", "B"}},
      json::array({Workers("edge", "cpu", "e", 1), Workers("cloud", "gpu", "g", 1)}), 480, 2));
  const Plan plan = MustPlan(problem, {{"B", {{"e", 0.54}, {"g", 0.46}}}});
  auto serve = [&](Balance balance) {
    ServeOptions options;
    options.duration_s = 10;
    options.warmup_s = 2;
    options.compression = 2;
    options.cpu_spins = false;
    options.poisson_arrivals = true;  // with constant gaps and service times nothing queues
    options.balance = balance;
    auto report = Serve(problem, plan, options);
    REQUIRE(report.ok());
    std::printf("%s", ServeSummary(problem, *report).c_str());
    RequireExact(*report);
    return *report;
  };
  const ServeReport shares = serve(Balance::kShares);
  const ServeReport daronpon = serve(Balance::kDaronpon);
  std::map<std::string, int64_t> processed;
  for (const WorkerServeReport& w : daronpon.workers) {
    processed[problem.workers[w.worker].name] = w.processed;
  }
  INFO("p99 shares " << shares.latency_p99_ms << " ms, Daronpon " << daronpon.latency_p99_ms
                     << " ms; Daronpon sent " << processed["g"] << " to the GPU, " << processed["e"]
                     << " to the CPU");
  CHECK(processed["g"] > processed["e"]);
  CHECK(daronpon.latency_p99_ms < shares.latency_p99_ms);
}

TEST_CASE("the admin endpoint shows the plan, the workers' queues and rates while serving",
          "[serving][admin]") {
  const Problem problem = ChainProblem();
  const Plan plan = ChainPlan(problem);
  base::admin::AdminOptions admin_options;
  admin_options.token = "serving-test";
  auto admin = base::admin::AdminServer::Start(admin_options);
  REQUIRE(admin.ok());
  ServeOptions options;
  options.duration_s = 30;
  options.warmup_s = 2;
  options.compression = 10;
  options.admin = admin->get();
  const base::admin::AdminRequest request{"serving-test", "serving", {}};
  std::string during;
  std::thread watcher([&] {
    // From 1 wall second in (10 plan seconds, past the warm-up), the first status that has two
    // health checks to take rates from; a slow start-up only delays it, within the 3 s run.
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    for (int attempt = 0; attempt < 15; ++attempt) {
      auto reply = base::admin::AdminCall((*admin)->address(), request);
      during = reply.ok() ? *reply : std::string(reply.status().message());
      const json status = json::parse(during, nullptr, false);
      if (status.is_object() && status.contains("workers") && !status["workers"].empty() &&
          status["workers"][0]["rate"].get<double>() > 0) {
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  auto report = Serve(problem, plan, options);
  watcher.join();
  REQUIRE(report.ok());
  INFO(during);
  const json status = json::parse(during, nullptr, false);
  REQUIRE(status.is_object());
  CHECK(status["scenario"] == "test");
  CHECK(status["plan"]["operators"].size() == 3);
  CHECK(status["injected"].get<int64_t>() > 0);
  REQUIRE(status["workers"].size() == 3);
  for (const json& w : status["workers"]) {
    CHECK(w["processed"].get<int64_t>() > 0);
    CHECK(w["queued"].get<int64_t>() >= 0);
    // Every worker serves the whole 40 requests per second.
    CHECK(w["rate"].get<double>() == Approx(40).epsilon(0.5));
  }
  // After the run the command is gone.
  auto after = base::admin::AdminCall((*admin)->address(), request);
  CHECK_FALSE(after.ok());
}

TEST_CASE("a load spike multiplies the sources' rate during its window", "[serving][balance]") {
  const Problem problem = ChainProblem();
  const Plan plan = ChainPlan(problem);
  ServeOptions options = TwentySeconds();
  options.spike = {5, 5, 2};  // 40 -> 80 requests per second from 5 s to 10 s
  auto report = Serve(problem, plan, options);
  REQUIRE(report.ok());
  RequireExact(*report);
  CHECK(report->injected >= 40 * 20 + 40 * 5 - 2);
  CHECK(report->injected <= 40 * 20 + 40 * 5 + 2);
  double peak = 0;
  for (const TimelinePoint& point : report->timeline) peak = std::max(peak, point.completion_rate);
  CHECK(peak >= 70);
  options.spike = {5, 5, 0};
  CHECK_THAT(std::string(Serve(problem, plan, options).status().message()),
             Catch::Contains("ServeOptions::spike"));
}

TEST_CASE("failure drills are checked, naming the element", "[serving][failure]") {
  const Problem problem = MustParse(Workflow(
      {"cam"}, {"A", "B"}, {{"cam", "A"}, {"A", "B"}},
      json::array({Workers("edge", "cpu", "e", 2), Workers("cloud", "gpu", "g", 1)}), 40, 2));
  const Plan plan = MustPlan(problem, {{"A", {{"e-0", 1}}}, {"B", {{"g", 1}}}});
  ServeOptions options;
  options.failures = {{"e-1", 5}};
  CHECK_THAT(std::string(CheckServable(problem, plan, options).message()),
             Catch::Contains("failures[0]") && Catch::Contains("'e-1'"));
  options.failures = {{"g", 60}};
  CHECK_THAT(std::string(CheckServable(problem, plan, options).message()),
             Catch::Contains("at_s 60"));
}

TEST_CASE("bad plans and options are refused, naming the element", "[serving]") {
  json input = Workflow(
      {"cam"}, {"A", "B"}, {{"cam", "A"}, {"A", "B"}},
      json::array({Workers("edge", "gpu", "e", 2), Workers("cloud", "gpu", "g", 1)}), 10, 1);
  const Problem problem = MustParse(input);
  Plan plan = MustPlan(problem, {{"A", {{"e-0", 1}}}, {"B", {{"g", 1}}}});

  Plan bad = plan;
  bad.workers[problem.FindOperator("A")][0].share = 0.5;
  auto shares = Serve(problem, bad);
  REQUIRE_FALSE(shares.ok());
  CHECK_THAT(std::string(shares.status().message()), Catch::Contains("A"));

  Plan downwards = plan;
  downwards.workers[problem.FindOperator("A")][0].worker = problem.FindWorker("g");
  downwards.workers[problem.FindOperator("B")][0].worker = problem.FindWorker("e-1");
  auto down = CheckServable(problem, downwards);
  REQUIRE_FALSE(down.ok());
  CHECK_THAT(std::string(down.message()), Catch::Contains("B"));

  // Several messages per request above a join: a join pairs one message per request and input.
  json fan = Workflow(
      {"cam"}, {"L", "R", "J"}, {{"cam", "L"}, {"cam", "R"}, {"L", "J"}, {"R", "J"}},
      json::array({Workers("edge", "gpu", "e", 2), Workers("cloud", "gpu", "g", 1)}), 10, 1, "J");
  fan["workflow"]["edges"][0]["rate_ratio"] = 2;
  fan["workflow"]["edges"][1]["rate_ratio"] = 2;
  const Problem ratio = MustParse(fan);
  const Plan ratio_plan =
      MustPlan(ratio, {{"L", {{"e-0", 1}}}, {"R", {{"e-1", 1}}}, {"J", {{"g", 1}}}});
  auto refused = CheckServable(ratio, ratio_plan);
  REQUIRE(refused.code() == absl::StatusCode::kUnimplemented);
  CHECK_THAT(std::string(refused.message()),
             Catch::Contains("workflow.edges[2] (L -> J)") && Catch::Contains("rate_ratio"));
  input["workflow"]["edges"][1]["rate_ratio"] = 5000;
  const Problem huge = MustParse(input);
  auto huge_plan = placement::ParsePlan(huge, placement::PlanToJson(huge, plan));
  REQUIRE(huge_plan.ok());
  auto too_many = CheckServable(huge, *huge_plan);
  REQUIRE_FALSE(too_many.ok());
  CHECK_THAT(std::string(too_many.message()), Catch::Contains("workflow.edges[1] (A -> B)"));
  input["workflow"]["edges"][1]["rate_ratio"] = 1;

  ServeOptions options;
  options.operators["Nope"] = [](const Request&) { return std::string(); };
  auto unknown = CheckServable(problem, plan, options);
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(std::string(unknown.message()), Catch::Contains("'Nope'"));

  ServeOptions times;
  times.warmup_s = times.duration_s;
  auto when = Serve(problem, plan, times);
  REQUIRE_FALSE(when.ok());
  CHECK_THAT(std::string(when.status().message()), Catch::Contains("warmup_s"));

  json no_rate = input;
  no_rate["workflow"]["edges"][0]["to"] = "Z";
  auto broken = placement::ParseProblem(no_rate.dump());
  REQUIRE_FALSE(broken.ok());
  CHECK_THAT(std::string(broken.status().message()), Catch::Contains("workflow.edges[0].to"));
}

TEST_CASE("a real operator replaces the emulation and sees the bytes", "[serving]") {
  const Problem problem = MustParse(Workflow(
      {"cam"}, {"Filter", "Count"}, {{"cam", "Filter"}, {"Filter", "Count"}},
      json::array({Workers("edge", "cpu", "e", 1), Workers("cloud", "gpu", "g", 1)}), 20, 1));
  const Plan plan = MustPlan(problem, {{"Filter", {{"e", 1}}}, {"Count", {{"g", 1}}}});
  std::atomic<int> checked{0}, wrong{0};
  ServeOptions options;
  options.duration_s = 10;
  options.warmup_s = 1;
  options.compression = 10;
  // The source's 2 KB are the bytes 0, 1, ..., 255 over and over; the filter keeps those < 100.
  options.operators["Filter"] = [](const Request& r) -> absl::StatusOr<std::string> {
    std::string kept;
    for (char c : r.inputs.at(0)) {
      if (static_cast<unsigned char>(c) < 100) kept.push_back(c);
    }
    return kept;
  };
  options.operators["Count"] = [&](const Request& r) -> absl::StatusOr<std::string> {
    const std::string_view in = r.inputs.at(0);
    const bool ok = in.size() == 7 * 100 + 100 &&  // 2000 bytes: 7 full cycles and 208 more
                    std::all_of(in.begin(), in.end(),
                                [](char c) { return static_cast<unsigned char>(c) < 100; });
    ++(ok ? checked : wrong);
    return std::string();
  };
  auto report = Serve(problem, plan, options);
  REQUIRE(report.ok());
  RequireExact(*report);
  CHECK(wrong == 0);
  CHECK(checked == report->injected);
}

// `scenario` (examples/data/placement) under JellyBean's plan for 40 plan seconds, against the
// simulator for the same plan.
void ServeLikeTheSimulator(const std::string& scenario) {
  auto problem =
      placement::LoadProblem(std::string(PLEXUS_PLACEMENT_DATA_DIR) + "/" + scenario + ".json");
  REQUIRE(problem.ok());
  auto plan = placement::Optimize(*problem, placement::Strategy::kJellyBean);
  REQUIRE(plan.ok());
  std::printf("%s", placement::PlanSummary(*problem, *plan).c_str());
  placement::SimulationOptions sim;
  sim.duration_s = 40;
  sim.warmup_s = 5;
  auto simulated = placement::Simulate(*problem, *plan, sim);
  REQUIRE(simulated.ok());
  ServeOptions options;
  options.duration_s = 40;
  options.warmup_s = 5;
  options.compression = 10;
  // The plans keep several CPU workers near full load; spinning needs a core for each.
  options.cpu_spins = false;
  auto served = Serve(*problem, *plan, options);
  REQUIRE(served.ok());
  std::printf("simulated: %s", placement::SimulationSummary(*problem, *simulated).c_str());
  std::printf("served: %s", ServeSummary(*problem, *served).c_str());
  std::printf("%s p50 served/simulated %.2f, p99 %.2f; network cost %.3f vs %.3f per hour\n",
              scenario.c_str(), served->latency_p50_ms / simulated->latency_p50_ms,
              served->latency_p99_ms / simulated->latency_p99_ms, served->network_cost_per_hour,
              simulated->network_cost_per_hour);
  CHECK(served->sustained);
  CHECK(served->duplicates == 0);
  CHECK(served->latency_p50_ms < 2 * simulated->latency_p50_ms);
  CHECK(served->latency_p50_ms > simulated->latency_p50_ms / 2);
  CHECK(served->latency_p99_ms < 2 * simulated->latency_p99_ms);
  CHECK(std::abs(served->network_cost_per_hour - simulated->network_cost_per_hour) <
        0.1 * simulated->network_cost_per_hour + 1e-9);
  CHECK(served->compute_cost_per_hour == Approx(plan->compute_cost));
}

TEST_CASE("VQA medium under JellyBean's plan is sustained, latency near the simulator's",
          "[serving][vqa]") {
  ServeLikeTheSimulator("vqa-medium");
}

TEST_CASE("AI City medium (3 crops per frame) under JellyBean's plan is sustained",
          "[serving][aicity]") {
  ServeLikeTheSimulator("aicity-medium");
}

}  // namespace
}  // namespace plexus::serving
