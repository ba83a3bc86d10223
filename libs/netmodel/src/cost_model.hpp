// The cost models as data: a schedule (plexus/netmodel/schedule.hpp) read under a pricing rule
// becomes a list of groups of transfers between positions, combined either as a sum over groups
// of the slowest transfer of the group (kRounds: one round per group; kLinks: one link per
// group) or as the slowest group of a sum (kChains: one dependency chain per group). One
// evaluator serves exact costs, annealing and the branch-and-bound lower bound, so that all
// three agree bit for bit.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "plexus/netmodel/reorder.hpp"
#include "plexus/netmodel/schedule.hpp"

namespace plexus::netmodel::internal {

struct PricedTransfer {
  int from;  // position
  int to;    // position
  double bytes;
};

struct CostStructure {
  bool max_of_sums = false;  // false: sum over groups of max; true: max over groups of sum
  std::vector<std::vector<PricedTransfer>> groups;
};

// The groups of `schedule` under `pricing`, in the order the evaluator adds them (rounds in
// order, links in order of first use, chains from their first transfer); local steps are left
// out. InvalidArgument when kChains would enumerate more than a few million transfers.
absl::StatusOr<CostStructure> PriceStructure(const Schedule& schedule, Pricing pricing);

// The model's schedule over n positions under its pricing (CostModelSchedule, CostModelPricing).
absl::StatusOr<CostStructure> BuildCostStructure(int n, const CostOptions& options);

// Evaluates the structure with edge(from_pos, to_pos, bytes) as the cost of each transfer. Costs
// are non-decreasing in every edge cost, so edges replaced by lower bounds give a lower bound;
// the order of additions is fixed, so that bounds of complete orders equal their costs exactly.
template <typename Edge>
double Evaluate(const CostStructure& s, Edge&& edge) {
  double total = 0;
  for (const auto& group : s.groups) {
    double acc = 0;
    for (const PricedTransfer& t : group) {
      const double c = edge(t.from, t.to, t.bytes);
      if (s.max_of_sums) {
        acc += c;
      } else if (c > acc) {
        acc = c;
      }
    }
    if (s.max_of_sums) {
      if (acc > total) total = acc;
    } else {
      total += acc;
    }
  }
  return total;
}

inline double EvaluateOrder(const CostStructure& s, const CostMatrix& m,
                            const std::vector<int>& order) {
  return Evaluate(s, [&](int a, int b, double bytes) { return m.Cost(order[a], order[b], bytes); });
}

}  // namespace plexus::netmodel::internal
