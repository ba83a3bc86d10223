// The paper's baselines: best fit, first fit, PyTorch on one edge/cloud GPU, data-parallel on
// every cloud GPU. All use the most accurate variants (the paper's baselines do not trade
// accuracy for cost).
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "internal.hpp"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"

namespace plexus::placement::internal {
namespace {

std::vector<int> MostAccurateVariants(const Problem& problem) {
  std::vector<int> variant;
  BestReachableAccuracy(problem, &variant);
  return variant;
}

int HighestParentTier(const Problem& problem, const Plan& plan, int op) {
  int tier = 0;
  for (int e : problem.in_edges[op]) {
    const int parent = problem.edges[e].from;
    if (problem.operators[parent].kind == OperatorKind::kSource) {
      tier = std::max(tier, problem.operators[parent].source_tier);
    } else {
      for (const WorkerShare& w : plan.workers[parent]) {
        tier = std::max(tier, problem.workers[w.worker].tier);
      }
    }
  }
  return tier;
}

// Best fit (same_tier_first) fills an operator from its parents' tier, moving one tier up only
// when that tier is exhausted; first fit takes the cheapest worker of any allowed tier. Both rank
// workers by compute price per request (price / throughput) and ignore the network.
absl::StatusOr<Plan> FitPlan(const Problem& problem, bool same_tier_first) {
  Plan plan;
  plan.variant = MostAccurateVariants(problem);
  plan.workers.assign(problem.operators.size(), {});
  std::vector<bool> used(problem.workers.size(), false);
  for (int op : problem.topological_order) {
    if (problem.operators[op].kind == OperatorKind::kSource) continue;
    const int lowest = HighestParentTier(problem, plan, op);
    double remaining = problem.rate[op];
    int tier_limit = same_tier_first ? lowest : static_cast<int>(problem.tiers.size()) - 1;
    while (remaining > 1e-9 * problem.rate[op]) {
      int best = -1;
      double best_unit = kInfinity;
      for (size_t w = 0; w < problem.workers.size(); ++w) {
        const int tier = problem.workers[w].tier;
        if (used[w] || tier < lowest || tier > tier_limit) continue;
        const double throughput =
            WorkerThroughput(problem, op, plan.variant[op], static_cast<int>(w));
        if (throughput <= 0) continue;
        const double unit = WorkerPrice(problem, static_cast<int>(w)) / throughput;
        if (unit < best_unit) {
          best_unit = unit;
          best = static_cast<int>(w);
        }
      }
      if (best < 0) {
        if (tier_limit + 1 < static_cast<int>(problem.tiers.size())) {
          ++tier_limit;
          continue;
        }
        return absl::FailedPreconditionError(absl::StrFormat(
            "infeasible: not enough free workers able to run '%s' (variant '%s') at %.4g req/s",
            problem.operators[op].name, problem.operators[op].variants[plan.variant[op]],
            problem.rate[op]));
      }
      used[best] = true;
      plan.workers[op].push_back({best, 0});
      remaining -= WorkerThroughput(problem, op, plan.variant[op], best);
    }
    SetProportionalShares(problem, op, plan.variant[op], plan.workers[op]);
  }
  return plan;
}

bool RunsEverything(const Problem& problem, const std::vector<int>& variant, int worker) {
  for (size_t op = 0; op < problem.operators.size(); ++op) {
    if (problem.operators[op].kind == OperatorKind::kSource) continue;
    if (WorkerThroughput(problem, static_cast<int>(op), variant[op], worker) <= 0) return false;
  }
  return true;
}

// Busy seconds per second if `worker` ran the whole workflow alone.
double WholeWorkflowLoad(const Problem& problem, const std::vector<int>& variant, int worker) {
  double load = 0;
  for (size_t op = 0; op < problem.operators.size(); ++op) {
    if (problem.operators[op].kind == OperatorKind::kSource) continue;
    load += problem.rate[op] / WorkerThroughput(problem, static_cast<int>(op), variant[op], worker);
  }
  return load;
}

std::vector<int> GpusOnTier(const Problem& problem, const std::vector<int>& variant, int tier) {
  std::vector<int> gpus;
  for (size_t w = 0; w < problem.workers.size(); ++w) {
    const Worker& worker = problem.workers[w];
    if (worker.tier == tier && problem.worker_types[worker.type].gpu &&
        RunsEverything(problem, variant, static_cast<int>(w))) {
      gpus.push_back(static_cast<int>(w));
    }
  }
  return gpus;
}

absl::StatusOr<Plan> WholeWorkflowPlan(const Problem& problem, Strategy strategy) {
  Plan plan;
  plan.variant = MostAccurateVariants(problem);
  plan.workers.assign(problem.operators.size(), {});
  const bool edge = strategy == Strategy::kEdgeGpu;
  const int tier = edge ? 0 : static_cast<int>(problem.tiers.size()) - 1;
  std::vector<int> gpus = GpusOnTier(problem, plan.variant, tier);
  if (gpus.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("not applicable: no GPU worker on tier '", problem.tiers[tier].name,
                     "' can run every operator with the most accurate variants"));
  }
  for (size_t op = 0; op < problem.operators.size(); ++op) {
    if (problem.operators[op].kind == OperatorKind::kSource &&
        problem.operators[op].source_tier > tier) {
      return absl::FailedPreconditionError(
          absl::StrCat("not applicable: source '", problem.operators[op].name, "' is above tier '",
                       problem.tiers[tier].name, "' and data only flows upwards"));
    }
  }
  if (strategy != Strategy::kCloudDataParallel) {
    // One GPU: the one that serves the workflow fastest, cheapest on ties.
    int best = gpus.front();
    for (int w : gpus) {
      const double load = WholeWorkflowLoad(problem, plan.variant, w);
      const double best_load = WholeWorkflowLoad(problem, plan.variant, best);
      if (load < best_load - 1e-12 ||
          (load <= best_load + 1e-12 && WorkerPrice(problem, w) < WorkerPrice(problem, best))) {
        best = w;
      }
    }
    gpus = {best};
  }
  // Every GPU runs the whole workflow; requests are split in proportion to how fast each GPU
  // serves the whole workflow.
  double total_speed = 0;
  for (int w : gpus) total_speed += 1.0 / WholeWorkflowLoad(problem, plan.variant, w);
  for (size_t op = 0; op < problem.operators.size(); ++op) {
    if (problem.operators[op].kind == OperatorKind::kSource) continue;
    for (int w : gpus) {
      plan.workers[op].push_back(
          {w, 1.0 / WholeWorkflowLoad(problem, plan.variant, w) / total_speed});
    }
  }
  return plan;
}

}  // namespace

absl::StatusOr<Plan> RunBaseline(const Problem& problem, Strategy strategy) {
  const auto start = std::chrono::steady_clock::now();
  if (BestReachableAccuracy(problem) < problem.objective.accuracy_target - 1e-9) {
    return UnreachableAccuracyError(problem);
  }
  absl::StatusOr<Plan> plan;
  switch (strategy) {
    case Strategy::kBestFit:
      plan = FitPlan(problem, /*same_tier_first=*/true);
      break;
    case Strategy::kFirstFit:
      plan = FitPlan(problem, /*same_tier_first=*/false);
      break;
    case Strategy::kEdgeGpu:
    case Strategy::kCloudGpu:
    case Strategy::kCloudDataParallel:
      plan = WholeWorkflowPlan(problem, strategy);
      break;
    default:
      return absl::InvalidArgumentError("not a baseline strategy");
  }
  PLEXUS_RETURN_IF_ERROR(plan.status());
  plan->strategy = std::string(StrategyName(strategy));
  PLEXUS_RETURN_IF_ERROR(EvaluatePlan(problem, *plan));
  if (!plan->capacity_ok) {
    double worst = 0;
    for (double u : plan->worker_utilisation) worst = std::max(worst, u);
    plan->note =
        absl::StrFormat("over capacity: busiest worker at %.0f%% of its throughput", 100 * worst);
  }
  plan->optimizer_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

}  // namespace plexus::placement::internal
