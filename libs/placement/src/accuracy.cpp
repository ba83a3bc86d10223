// The conservative workflow accuracy estimate (monotonicity assumption of JellyBean).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "internal.hpp"
#include "plexus/placement/optimizer.hpp"

namespace plexus::placement {
namespace internal {

double OperatorAccuracy(const Problem& problem, int op, int variant,
                        const std::vector<double>& accuracy) {
  const Operator& o = problem.operators[op];
  double best = -kInfinity;
  // Among the rows whose inputs are all reached, the best output: higher input accuracy can only
  // help, so a measured row with lower inputs is a safe estimate.
  for (const AccuracyRow& row : o.accuracy_rows[variant]) {
    bool reached = true;
    for (size_t k = 0; k < row.inputs.size() && reached; ++k) {
      reached = row.inputs[k] <= accuracy[o.accuracy_inputs[k]] + 1e-9;
    }
    if (reached) best = std::max(best, row.output);
  }
  return best;
}

std::vector<int> DefaultVariants(const Problem& problem) {
  std::vector<int> variant(problem.operators.size(), 0);
  for (size_t op = 0; op < problem.operators.size(); ++op) {
    if (problem.operators[op].kind == OperatorKind::kSource) variant[op] = -1;
  }
  return variant;
}

absl::Status UnreachableAccuracyError(const Problem& problem) {
  std::vector<int> variant;
  const double best = BestReachableAccuracy(problem, &variant);
  std::vector<std::string> choice;
  for (int op : problem.topological_order) {
    if (problem.operators[op].kind != OperatorKind::kMl) continue;
    choice.push_back(
        absl::StrCat(problem.operators[op].name, "=", problem.operators[op].variants[variant[op]]));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("infeasible: accuracy target ", problem.objective.accuracy_target, " at '",
                   problem.operators[problem.objective.sink].name,
                   "' is unreachable; the best reachable accuracy is ", best, " (",
                   absl::StrJoin(choice, ", "), ")"));
}

}  // namespace internal

double EstimateAccuracy(const Problem& problem, const std::vector<int>& variant) {
  std::vector<double> accuracy(problem.operators.size(), internal::kInfinity);
  for (int op : problem.topological_order) {
    if (problem.operators[op].kind != OperatorKind::kMl) continue;
    accuracy[op] = internal::OperatorAccuracy(problem, op, variant[op], accuracy);
  }
  return accuracy[problem.objective.sink];
}

double BestReachableAccuracy(const Problem& problem, std::vector<int>* variant_out) {
  // With monotone estimates, the best input accuracies give every operator its best output, so
  // maximising operator by operator in topological order reaches the global best.
  std::vector<double> accuracy(problem.operators.size(), internal::kInfinity);
  std::vector<int> variant = internal::DefaultVariants(problem);
  for (int op : problem.topological_order) {
    if (problem.operators[op].kind != OperatorKind::kMl) continue;
    double best = -internal::kInfinity;
    for (size_t v = 0; v < problem.operators[op].variants.size(); ++v) {
      const double a = internal::OperatorAccuracy(problem, op, static_cast<int>(v), accuracy);
      if (a > best) {
        best = a;
        variant[op] = static_cast<int>(v);
      }
    }
    accuracy[op] = best;
  }
  if (variant_out != nullptr) *variant_out = variant;
  return accuracy[problem.objective.sink];
}

}  // namespace plexus::placement
