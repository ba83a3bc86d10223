// Strategy dispatch and the comparison table.
#include "plexus/placement/optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "internal.hpp"
#include "plexus/base/status.hpp"

namespace plexus::placement {

std::string_view StrategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kJellyBean:
      return "jb";
    case Strategy::kExact:
      return "lb";
    case Strategy::kBestFit:
      return "bf";
    case Strategy::kFirstFit:
      return "ff";
    case Strategy::kEdgeGpu:
      return "pte";
    case Strategy::kCloudGpu:
      return "ptc";
    case Strategy::kCloudDataParallel:
      return "spc";
  }
  return "?";
}

std::vector<Strategy> AllStrategies() {
  return {Strategy::kJellyBean,        Strategy::kExact,   Strategy::kBestFit,
          Strategy::kFirstFit,         Strategy::kEdgeGpu, Strategy::kCloudGpu,
          Strategy::kCloudDataParallel};
}

absl::StatusOr<Strategy> ParseStrategy(std::string_view name) {
  for (Strategy strategy : AllStrategies()) {
    if (StrategyName(strategy) == name) return strategy;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown strategy '", std::string(name),
                                                 "' (expected jb, lb, bf, ff, pte, ptc, spc)"));
}

namespace {

absl::StatusOr<Plan> Run(const Problem& problem, Strategy strategy, const ProgressFn& progress) {
  switch (strategy) {
    case Strategy::kJellyBean:
      return internal::RunJellyBean(problem);
    case Strategy::kExact:
      return internal::RunExact(problem, progress);
    default:
      return internal::RunBaseline(problem, strategy);
  }
}

}  // namespace

absl::StatusOr<Plan> Optimize(const Problem& problem, Strategy strategy,
                              const ProgressFn& progress) {
  absl::StatusOr<Plan> plan = Run(problem, strategy, progress);
  // The searches choose worker sets under proportional shares; the release's fill-in-order rule
  // re-splits each set (pte/ptc use one worker, spc splits by whole-workflow speed on purpose).
  if (!plan.ok() || problem.options.share_rule == ShareRule::kProportional ||
      strategy == Strategy::kCloudDataParallel) {
    return plan;
  }
  internal::ApplyShareRule(problem, *plan);
  PLEXUS_RETURN_IF_ERROR(EvaluatePlan(problem, *plan));
  if (strategy == Strategy::kExact && plan->proven_optimal) {
    plan->proven_optimal = false;
    plan->note =
        "optimal under proportional shares; re-split fill_in_order, optimality not proven for "
        "that rule";
  }
  return plan;
}

std::vector<ComparisonRow> CompareStrategies(const Problem& problem,
                                             const std::vector<Strategy>& strategies,
                                             const ProgressFn& progress) {
  std::vector<ComparisonRow> rows;
  for (Strategy strategy : strategies) {
    if (progress) progress(absl::StrCat("running ", std::string(StrategyName(strategy)), "..."));
    rows.push_back({strategy, Optimize(problem, strategy, progress)});
  }
  return rows;
}

std::string ComparisonTable(const std::vector<ComparisonRow>& rows) {
  const Plan* jb = nullptr;
  for (const ComparisonRow& row : rows) {
    if (row.strategy == Strategy::kJellyBean && row.plan.ok()) jb = &*row.plan;
  }
  std::string out =
      absl::StrFormat("%-9s %10s %10s %10s %8s %9s %8s %10s  %s\n", "strategy", "compute/h",
                      "network/h", "total/h", "vs jb", "accuracy", "capacity", "time ms", "note");
  absl::StrAppend(&out, std::string(out.size() - 1, '-'), "\n");
  for (const ComparisonRow& row : rows) {
    const std::string name(StrategyName(row.strategy));
    if (!row.plan.ok()) {
      absl::StrAppendFormat(&out, "%-9s %10s %10s %10s %8s %9s %8s %10s  %s\n", name, "-", "-", "-",
                            "-", "-", "-", "-", std::string(row.plan.status().message()));
      continue;
    }
    const Plan& plan = *row.plan;
    std::string versus = "-";
    if (jb != nullptr && jb->total_cost > 0) {
      versus = absl::StrFormat("%+.1f%%", 100 * (plan.total_cost / jb->total_cost - 1));
    }
    std::string note = plan.note;
    if (row.strategy == Strategy::kExact && plan.proven_optimal) {
      note = absl::StrCat("proven optimal, ", plan.search_nodes, " nodes");
    }
    absl::StrAppendFormat(&out, "%-9s %10.3f %10.3f %10.3f %8s %9.4g %8s %10.2f  %s\n", name,
                          plan.compute_cost, plan.network_cost, plan.total_cost, versus,
                          plan.accuracy, plan.capacity_ok ? "ok" : "OVER", plan.optimizer_ms, note);
  }
  return out;
}

}  // namespace plexus::placement
