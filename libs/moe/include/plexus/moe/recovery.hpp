// Probability that training recovers without a checkpoint restart when k of N nodes fail
// uniformly at random: every expert (of every layer) keeps at least one replica.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "plexus/moe/placement.hpp"

namespace plexus::moe {

struct RecoveryResult {
  double probability = 0;  // of recovery
  double ci_low = 0;       // confidence interval (equal to probability when exact)
  double ci_high = 0;
  bool exact = false;
  std::string method;  // "closed_form", "enumeration" or "monte_carlo"
  // Exact methods with N <= 62: failure sets that recover, out of C(N, k).
  uint64_t recovering_sets = 0;
  uint64_t total_sets = 0;
  int64_t samples = 0;  // Monte Carlo draws
};

// Exact closed form, valid when the minimal replica sets (supports) of all experts of all layers
// are pairwise disjoint, as MRO guarantees: inclusion-exclusion over those disjoint node groups.
// FailedPrecondition when they overlap.
absl::StatusOr<RecoveryResult> RecoveryClosedForm(absl::Span<const Placement> layers, int failures);

// Exact, by visiting every k-subset of nodes; ResourceExhausted above `max_sets` subsets.
absl::StatusOr<RecoveryResult> RecoveryEnumerate(absl::Span<const Placement> layers, int failures,
                                                 uint64_t max_sets = 20'000'000);

// Monte Carlo with a Wilson score interval at `confidence`.
absl::StatusOr<RecoveryResult> RecoveryMonteCarlo(absl::Span<const Placement> layers, int failures,
                                                  int64_t samples, uint64_t seed = 1,
                                                  double confidence = 0.95);

// Closed form when it applies, else enumeration when C(N,k) <= max_sets, else Monte Carlo.
absl::StatusOr<RecoveryResult> RecoveryProbability(absl::Span<const Placement> layers, int failures,
                                                   uint64_t max_sets = 2'000'000,
                                                   int64_t mc_samples = 200'000);

struct BruteForceResult {
  // best_recovering_sets[k]: the most k-subsets of failures any placement recovers from
  // (k = 0..N), out of C(N, k); best_placement[k] achieves it.
  std::vector<uint64_t> best_recovering_sets;
  std::vector<Placement> best_placement;
  int64_t placements_visited = 0;
};

// Searches every placement of `replicas` on num_nodes x slots_per_node (up to node symmetry).
// For tiny instances only: ResourceExhausted when N > 8 or more than `max_placements` visited.
absl::StatusOr<BruteForceResult> BruteForceOptimalRecovery(absl::Span<const int> replicas,
                                                           int num_nodes, int slots_per_node,
                                                           int64_t max_placements = 5'000'000);

// C(n, k) as an exact integer (n <= 62).
uint64_t Binomial(int n, int k);

}  // namespace plexus::moe
