// How close the placement policies come to the optimum recovery on tiny random instances, against
// ExactPlacement: the measurement behind docs/moe.md's placement-quality table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace plexus::moe {

struct PlacementQualityOptions {
  uint64_t seed = 1;
  int instances_per_class = 300;  // random instances of each shape class
  int max_nodes = 6;              // N drawn from 2..max_nodes (<= 12)
  int max_slots = 3;              // c drawn from 1..max_slots (2.. for the partial class)
};

// One shape class ("c|E": c divides E, "partial": it does not) and one failure count k, or every
// k of the class (failures == -1). A case is an (instance, k) pair with 1 <= k < N.
struct PlacementQualityRow {
  std::string shape;
  int failures = -1;
  int64_t cases = 0;
  // Cases where each policy recovers from as many failure sets as the optimum.
  int64_t best_optimal = 0, mro_optimal = 0, spread_optimal = 0, compact_optimal = 0;
  // Cases where kBest recovers from fewer sets than spread or compact (must stay 0), and where
  // MRO does.
  int64_t best_below_baseline = 0, mro_below_baseline = 0;
  double best_worst_ratio = 1;  // min over cases of kBest's recovery / the optimum's
  double mro_worst_ratio = 1;
  double best_fraction() const { return cases ? static_cast<double>(best_optimal) / cases : 1; }
  double mro_fraction() const { return cases ? static_cast<double>(mro_optimal) / cases : 1; }
};

// Rows per (shape, k), then one per shape for every k. Instances: N, c, E uniform in their
// ranges (E from 1..N*c, of the class's shape), replica counts a uniform random composition of
// N*c into E parts >= 1. Deterministic for a seed.
absl::StatusOr<std::vector<PlacementQualityRow>> PlacementQualitySweep(
    const PlacementQualityOptions& options);

}  // namespace plexus::moe
