// A discrete-event simulator that serves a workflow under a plan, to check what the optimizer's
// cost model promises: sustained throughput, utilisation, latency and traffic.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/placement/plan.hpp"
#include "plexus/placement/problem.hpp"

namespace plexus::placement {

// The service time of one (operator, variant, worker type): a log-normal whose median is the
// profile's p50 and whose spread is fitted to its p75 and p90 (the mean of the two fits). The
// simulator and the serving runtime's emulated operators draw from it.
struct ServiceTime {
  double mu = 0;     // log of the median, in seconds
  double sigma = 0;  // 0: every draw is the median
  static ServiceTime Fit(const LatencyProfile& profile);
  // One service time in seconds; `normal` is a standard normal distribution.
  double Draw(std::mt19937_64& random, std::normal_distribution<double>& normal) const;
};

struct SimulationOptions {
  double duration_s = 60;  // simulated time during which sources inject
  double warmup_s = 5;     // excluded from the measurements
  uint64_t seed = 1;
  bool poisson_arrivals = false;    // false: constant inter-arrival time at the target rate
  int64_t max_events = 50'000'000;  // guards against runaway simulations
};

struct WorkerReport {
  int worker = -1;
  std::vector<int> operators;
  double planned_utilisation = 0;  // the plan's load / throughput at the chosen percentile
  double utilisation = 0;          // busy time / measured time, per server of the worker
  int64_t queue_at_end = 0;        // requests queued or in service when injection stops
};

struct SinkReport {
  int op = -1;
  double target_rate = 0;    // requests per second the sink should complete
  double achieved_rate = 0;  // completed per second during the measured window
};

struct SimulationReport {
  double measured_s = 0;
  std::vector<SinkReport> sinks;
  double throughput_ratio = 0;  // min over sinks of achieved / target
  bool sustained = false;       // throughput_ratio >= 0.98
  double latency_p50_ms = 0;    // end to end, from the earliest source injection
  double latency_p90_ms = 0;
  double latency_p99_ms = 0;
  std::vector<WorkerReport> workers;  // the plan's workers
  // Bytes sent per "from-tier->to-tier" pair during the measured window, and the network cost
  // per hour those bytes imply (comparable with the plan's network cost).
  std::map<std::string, double> bytes_per_tier_pair;
  double network_cost_per_hour = 0;
  double compute_cost_per_hour = 0;
  int64_t events = 0;
};

// Simulates the plan. Service times are drawn from a log-normal fitted to each profile's
// p50/p75/p90; a worker of a replicated tier has one server per location. Errors: an invalid plan
// (see EvaluatePlan), bad options, or more than max_events events.
absl::StatusOr<SimulationReport> Simulate(const Problem& problem, const Plan& plan,
                                          const SimulationOptions& options = {});

std::string SimulationSummary(const Problem& problem, const SimulationReport& report);
std::string SimulationToJson(const Problem& problem, const SimulationReport& report);

}  // namespace plexus::placement
