#include "plexus/moe/placement_quality.hpp"

#include <algorithm>
#include <map>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"
#include "plexus/moe/placement.hpp"
#include "plexus/moe/recovery.hpp"
#include "recovery_internal.hpp"

namespace plexus::moe {
namespace {

struct Instance {
  int nodes = 0, slots = 0;
  std::vector<int> replicas;
};

// N*c slots split into E parts >= 1: E-1 distinct cut points among the N*c-1 gaps.
Instance Draw(std::mt19937_64& rng, const PlacementQualityOptions& o, bool divides) {
  while (true) {
    Instance in;
    in.nodes = std::uniform_int_distribution<int>(2, o.max_nodes)(rng);
    in.slots = std::uniform_int_distribution<int>(divides ? 1 : 2, o.max_slots)(rng);
    const int total = in.nodes * in.slots;
    const int experts = std::uniform_int_distribution<int>(1, total)(rng);
    if ((experts % in.slots == 0) != divides) continue;
    std::vector<int> gaps(total - 1);
    for (int i = 0; i < total - 1; ++i) gaps[i] = i + 1;
    std::shuffle(gaps.begin(), gaps.end(), rng);
    std::vector<int> cuts(gaps.begin(), gaps.begin() + (experts - 1));
    cuts.push_back(0);
    cuts.push_back(total);
    std::sort(cuts.begin(), cuts.end());
    for (int e = 0; e < experts; ++e) in.replicas.push_back(cuts[e + 1] - cuts[e]);
    return in;
  }
}

uint64_t Score(const Placement& p, int failures) {
  return internal::CountRecoveringSets(internal::ExpertMasks(p), p.num_nodes, failures);
}

void Count(PlacementQualityRow& row, uint64_t optimum, uint64_t best, uint64_t mro, uint64_t spread,
           uint64_t compact) {
  ++row.cases;
  row.best_optimal += best == optimum;
  row.mro_optimal += mro == optimum;
  row.spread_optimal += spread == optimum;
  row.compact_optimal += compact == optimum;
  const uint64_t baseline = std::max(spread, compact);
  row.best_below_baseline += best < baseline;
  row.mro_below_baseline += mro < baseline;
  if (optimum > 0) {
    row.best_worst_ratio = std::min(row.best_worst_ratio, static_cast<double>(best) / optimum);
    row.mro_worst_ratio = std::min(row.mro_worst_ratio, static_cast<double>(mro) / optimum);
  }
}

}  // namespace

absl::StatusOr<std::vector<PlacementQualityRow>> PlacementQualitySweep(
    const PlacementQualityOptions& options) {
  if (options.max_nodes < 2 || options.max_nodes > 12 || options.max_slots < 2 ||
      options.instances_per_class < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement sweep needs max_nodes in 2..12, max_slots >= 2 and at least one "
        "instance per class (got ",
        options.max_nodes, ", ", options.max_slots, ", ", options.instances_per_class, ")"));
  }
  std::mt19937_64 rng(options.seed);
  std::vector<PlacementQualityRow> rows;
  for (bool divides : {true, false}) {
    const std::string shape = divides ? "c|E" : "partial";
    std::map<int, PlacementQualityRow> by_k;
    PlacementQualityRow all;
    all.shape = shape;
    for (int i = 0; i < options.instances_per_class; ++i) {
      const Instance in = Draw(rng, options, divides);
      for (int k = 1; k < in.nodes; ++k) {
        auto place = [&](PlacementPolicy policy) {
          return PlaceExperts(policy, in.replicas, in.nodes, in.slots, {}, k);
        };
        PLEXUS_ASSIGN_OR_RETURN(Placement exact, place(PlacementPolicy::kExact));
        PLEXUS_ASSIGN_OR_RETURN(Placement best, place(PlacementPolicy::kBest));
        PLEXUS_ASSIGN_OR_RETURN(Placement mro, place(PlacementPolicy::kMro));
        PLEXUS_ASSIGN_OR_RETURN(Placement spread, place(PlacementPolicy::kSpread));
        PLEXUS_ASSIGN_OR_RETURN(Placement compact, place(PlacementPolicy::kCompact));
        PlacementQualityRow& row = by_k[k];
        row.shape = shape;
        row.failures = k;
        const uint64_t scores[] = {Score(exact, k), Score(best, k), Score(mro, k), Score(spread, k),
                                   Score(compact, k)};
        Count(row, scores[0], scores[1], scores[2], scores[3], scores[4]);
        Count(all, scores[0], scores[1], scores[2], scores[3], scores[4]);
      }
    }
    for (auto& [k, row] : by_k) rows.push_back(std::move(row));
    rows.push_back(std::move(all));
  }
  return rows;
}

}  // namespace plexus::moe
