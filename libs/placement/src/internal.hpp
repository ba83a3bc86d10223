// Cost-model helpers shared by the strategies, the plan evaluation and the simulator.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/placement/network.hpp"
#include "plexus/placement/optimizer.hpp"
#include "plexus/placement/plan.hpp"
#include "plexus/placement/problem.hpp"

namespace plexus::placement::internal {

inline constexpr double kInfinity = std::numeric_limits<double>::infinity();
inline constexpr double kSecondsPerHour = 3600;
// The public helpers of plexus/placement/network.hpp, by their internal names too.
using placement::BytesPerGb;
using placement::BytesPerKb;
using placement::LinkBetween;
using placement::MessageKb;
using placement::Position;
using placement::PricePerGb;
using placement::SourcePosition;
using placement::WorkerPosition;

// GB per hour carried by one KB per second.
inline double HourlyGbPerKbPerSecond(const Problem& problem) {
  return BytesPerKb(problem) / BytesPerGb(problem) * kSecondsPerHour;
}

// KB per second that `edge` carries with the operators' `variant`s (sources count as variant 0).
inline double EdgeKbPerSecond(const Problem& problem, int edge, const std::vector<int>& variant) {
  const Edge& e = problem.edges[edge];
  return problem.rate[e.from] * e.rate_ratio *
         MessageKb(problem, edge, variant[e.from], variant[e.to]);
}

// Eq. 5.2: the network cost, per request of `op`, of bringing its inputs to a worker at `to`:
// each in-edge's KB per request times the hourly GB price from where the parent runs, which is
// the source's position for a source and `parent_price(parent)` (per GB, weighted over the
// parent's placed workers as the caller knows them) for an operator.
template <typename ParentPrice>
double InputNetworkCost(const Problem& problem, int op, const std::vector<int>& variant,
                        Position to, ParentPrice&& parent_price) {
  double net = 0;
  for (int edge : problem.in_edges[op]) {
    const int from = problem.edges[edge].from;
    const double kb = EdgeKbPerSecond(problem, edge, variant) / problem.rate[op];
    if (kb <= 0) continue;
    const double price = problem.operators[from].kind == OperatorKind::kSource
                             ? PricePerGb(problem, SourcePosition(problem, from), to)
                             : parent_price(from);
    net += kb * HourlyGbPerKbPerSecond(problem) * price;
  }
  return net;
}

// Latency of (op, variant, worker type) at the options' percentile; 0 when it cannot run there.
inline double LatencyMs(const Problem& problem, int op, int variant, int type) {
  const auto& profile = problem.latency[op][variant][type];
  if (!profile.has_value()) return 0;
  switch (problem.options.percentile) {
    case Percentile::kP50:
      return profile->p50;
    case Percentile::kP75:
      return profile->p75;
    case Percentile::kP90:
      return profile->p90;
  }
  return profile->p75;
}

// Accuracy of `op` with `variant` given its ML inputs' accuracies (conservative estimate).
double OperatorAccuracy(const Problem& problem, int op, int variant,
                        const std::vector<double>& accuracy);

// Sets shares proportional to each worker's throughput for the op's variant.
void SetProportionalShares(const Problem& problem, int op, int variant,
                           std::vector<WorkerShare>& workers);
// Sets the shares of every operator of `plan` by problem.options.share_rule (kFillInOrder also
// reorders each operator's workers into the release's pick order). The searches price worker sets
// with proportional shares; this is applied to their result before EvaluatePlan.
void ApplyShareRule(const Problem& problem, Plan& plan);

// A variant vector with 0 for every operator and -1 for sources.
std::vector<int> DefaultVariants(const Problem& problem);

// JellyBean's model selection: the surviving variant vectors, cheapest proxy first.
std::vector<std::vector<int>> SelectModels(const Problem& problem, int beam_width);
// Up to `count` distinct topological orders of the non-source operators, the canonical one first.
std::vector<std::vector<int>> TopologicalOrders(const Problem& problem, int count);

// The JellyBean optimizer's plan (also `lb`'s first incumbent).
absl::StatusOr<Plan> RunJellyBean(const Problem& problem);
absl::StatusOr<Plan> RunExact(const Problem& problem, const ProgressFn& progress);
absl::StatusOr<Plan> RunBaseline(const Problem& problem, Strategy strategy);

// The "accuracy target unreachable" error, naming the best reachable accuracy.
absl::Status UnreachableAccuracyError(const Problem& problem);

}  // namespace plexus::placement::internal
