// A deployment plan: one model variant per operator, the workers serving it and the share of the
// operator's rate each worker serves, with its cost and estimated accuracy.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/placement/problem.hpp"

namespace plexus::placement {

struct WorkerShare {
  int worker = -1;
  double share = 0;  // fraction of the operator's rate this worker serves
};

struct Plan {
  std::string strategy;
  // Per operator (indexed like Problem::operators); sources keep variant -1 and no workers.
  std::vector<int> variant;
  std::vector<std::vector<WorkerShare>> workers;

  // Filled by EvaluatePlan.
  double compute_cost = 0;                 // per hour
  double network_cost = 0;                 // per hour
  double total_cost = 0;                   // per hour
  double accuracy = 0;                     // conservative estimate at the objective's sink
  bool capacity_ok = false;                // no worker is loaded beyond its throughput
  std::vector<double> worker_utilisation;  // planned load / throughput, per worker (0: unused)

  // Filled by the optimizer.
  double optimizer_ms = 0;
  bool proven_optimal = false;  // `lb` only: the search finished within its limits
  int64_t search_nodes = 0;
  std::string note;
};

// Checks a plan against the problem's rules (known variants, shares of each operator summing to
// 1, workers able to run their variant, data never flowing to a lower tier) and fills its cost,
// accuracy, utilisation and capacity_ok. An over-committed plan is not an error: capacity_ok says
// so. A plan whose accuracy is unreachable from the profiles gets accuracy -inf.
absl::Status EvaluatePlan(const Problem& problem, Plan& plan);

// Network cost per hour of one edge under the plan's variants and shares.
double EdgeNetworkCost(const Problem& problem, const Plan& plan, int edge);

// JSON: {"strategy", "operators": [{"name", "variant", "rate", "workers": [{"name", "share",
// "tier", "location", "throughput"}]}], "compute_cost", "network_cost", "total_cost",
// "accuracy", "capacity_ok", "optimizer_ms", ...}.
std::string PlanToJson(const Problem& problem, const Plan& plan);
// Reads a plan written by PlanToJson (names are resolved against the problem; costs are
// recomputed, not trusted) and evaluates it.
absl::StatusOr<Plan> ParsePlan(const Problem& problem, std::string_view json_text);
absl::StatusOr<Plan> LoadPlan(const Problem& problem, const std::string& path);

// A human-readable summary of a plan.
std::string PlanSummary(const Problem& problem, const Plan& plan);

}  // namespace plexus::placement
