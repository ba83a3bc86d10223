// Placement strategies: the JellyBean optimizer, the exact optimum `lb` and the paper's baselines.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/placement/plan.hpp"
#include "plexus/placement/problem.hpp"

namespace plexus::placement {

enum class Strategy : uint8_t {
  kJellyBean,          // jb: beam-searched model selection + tiered greedy worker assignment
  kExact,              // lb: branch-and-bound optimum under the same rules (node/time limited)
  kBestFit,            // bf: most accurate variants, cheapest workers on the parents' tier
  kFirstFit,           // ff: most accurate variants, cheapest workers on any allowed tier
  kEdgeGpu,            // pte: the whole workflow on one edge GPU
  kCloudGpu,           // ptc: the whole workflow on one cloud GPU
  kCloudDataParallel,  // spc: the whole workflow replicated on every cloud GPU
};

std::string_view StrategyName(Strategy strategy);  // "jb", "lb", "bf", ...
absl::StatusOr<Strategy> ParseStrategy(std::string_view name);
std::vector<Strategy> AllStrategies();

// Called by long searches (lb) about once a second with a line to show the user.
using ProgressFn = std::function<void(const std::string&)>;

// The conservative accuracy estimate at the sink for one variant per operator (sources: -1).
// Returns -inf when a profile has no row whose inputs are all reached.
double EstimateAccuracy(const Problem& problem, const std::vector<int>& variant);

// The best accuracy any variant choice reaches at the sink, and one choice reaching it.
double BestReachableAccuracy(const Problem& problem, std::vector<int>* variant = nullptr);

// Runs one strategy. Errors: an unreachable accuracy target (naming the best reachable accuracy),
// too little capacity for an operator (naming it), or a strategy that does not apply (e.g. pte
// without an edge GPU). The plan is evaluated (EvaluatePlan) and carries its optimizer time.
absl::StatusOr<Plan> Optimize(const Problem& problem, Strategy strategy,
                              const ProgressFn& progress = nullptr);

// One row per strategy; a strategy that fails keeps its error.
struct ComparisonRow {
  Strategy strategy;
  absl::StatusOr<Plan> plan;
};
std::vector<ComparisonRow> CompareStrategies(const Problem& problem,
                                             const std::vector<Strategy>& strategies,
                                             const ProgressFn& progress = nullptr);
// The comparison as an aligned text table.
std::string ComparisonTable(const std::vector<ComparisonRow>& rows);

}  // namespace plexus::placement
