// PLink (dissertation ch. 4): find the locality of a set of nodes from pairwise probes
// (ProbeEmbed: probe, embed with Adam, constrained k-means into ~sqrt(n) groups), build a
// two-level plan over the groups (plan.hpp), and rebalance its masters when links change
// (Autotune: Quicktune, then blame-driven Finetune).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/aggregation/plan.hpp"

namespace plexus::collectives {
class Communicator;
}

namespace plexus::aggregation {

using Matrix = std::vector<std::vector<double>>;

struct ProbeOptions {
  int probes_per_pair = 16;
  double percentile = 0.1;  // of the round-trip times of a pair (the seed: 10th percentile)
  absl::Duration deadline = absl::Seconds(30);  // for the whole probe; checked between rounds
};

// Every rank calls this together: in n-1 (n even) or n (odd) round-robin rounds of disjoint pairs
// each pair ping-pongs 8-byte messages over the communicator; the matrix of one-way latencies
// (half the chosen round-trip percentile, seconds, symmetrised with the larger of the two
// directions) is then shared with every rank. Fails with DeadlineExceeded naming the round when
// the deadline passes between rounds; a silent peer fails a ping within the communicator's own
// timeout.
absl::StatusOr<Matrix> ProbeLatencies(collectives::Communicator& comm,
                                      const ProbeOptions& options = {});

// Checks a distance matrix: square, n >= 1, finite, >= 0, zero diagonal. Errors name the entry.
absl::Status CheckDistances(const Matrix& distance);

struct EmbedOptions {
  int dims = 2;              // fewer dimensions denoise more (the seed)
  double alpha = 2;          // in [1, 2]: 2 compacts long distances (the seed's choice)
  bool node_offset = false;  // a non-negative per-node term h_i (Vivaldi's height)
  int iterations = 3000;
  double learning_rate = 0.05;
  uint64_t seed = 1;
};

struct Embedding {
  Matrix coords;               // n x dims
  std::vector<double> offset;  // h_i (zeros without node_offset)
  double loss = 0;             // Eq. 4.1 on distances scaled to a maximum of 1
};

// Minimises Eq. 4.1, sum_{i<j} (|v_i - v_j|^alpha + h_i + h_j - p_ij)^2, with Adam.
absl::StatusOr<Embedding> Embed(const Matrix& distance, const EmbedOptions& options = {});

struct ClusterOptions {
  int groups = 0;         // 0: round(sqrt(n))
  double elasticity = 1;  // in [1, 2]: minimum group size = floor(n / groups / elasticity)
  int restarts = 8;       // clusterings tried (k-means++ seeds); the most even sizes wins
  int iterations = 100;
  uint64_t seed = 1;
};

// k-means with k-means++ seeding and a minimum cluster size (assign to the nearest centre, then
// move the cheapest points from clusters above the minimum into those below). Returns the groups,
// each sorted, ordered by their smallest member.
absl::StatusOr<std::vector<std::vector<int>>> ConstrainedKMeans(const Matrix& points,
                                                                const ClusterOptions& options = {});

// ProbeEmbed's grouping: embed the distances, then cluster the coordinates.
absl::StatusOr<std::vector<std::vector<int>>> GroupByDistance(const Matrix& distance,
                                                              const EmbedOptions& embed = {},
                                                              const ClusterOptions& cluster = {});

// The bytes every pair of nodes exchanges under a plan (both directions, element_bytes each).
Matrix PlanTraffic(const Plan& plan, double element_bytes);

// Quicktune: node weights for BuildTwoLevelPlan from measured bandwidths, bandwidth[i][j] in
// bytes/s: a node's weight is its total bandwidth to the others (so a group's GM share follows
// its members' aggregate bandwidth and a member's LM share its own).
absl::StatusOr<std::vector<double>> QuicktuneWeights(const Matrix& bandwidth);

struct FinetuneOptions {
  double beta = 1;       // weight of the imbalance l(i)
  double gamma = 1;      // weight of the time t(i)
  double epsilon = 1.1;  // act when max blame / min blame exceeds this
};

// One Finetune step: blame B(i) = beta * l^(i) + gamma * t^(i) with t(i) = max_j RTT(i,j) +
// sum_j D(i,j) / sum_j BW(i,j) (normalised by the mean) and l(i) = sum_j D(i,j) (min-max
// normalised); moves `moves` GMs (or, when it has none, LMs) from the most to the least blamed
// node (an LM only inside its group). Returns nullopt when the blame is within epsilon.
absl::StatusOr<std::optional<Plan>> FinetuneStep(const Plan& plan, const Matrix& rtt,
                                                 const Matrix& bandwidth, double element_bytes,
                                                 int moves, const FinetuneOptions& options = {});

// Autotune: rebuilds the plan (Quicktune) when some link's measured bandwidth moved by more than
// `threshold` (the seed: 20%) from the one the current plan was built for, else runs Finetune
// steps, moving exponentially more while the same node stays the bottleneck.
class Autotuner {
 public:
  Autotuner(Plan plan, Matrix bandwidth, double element_bytes, double threshold = 0.2);

  const Plan& plan() const { return plan_; }
  // What the last Observe did: "quicktune", "finetune", or "none".
  const std::string& last_action() const { return last_action_; }

  // Feeds new measurements; returns the plan to install (a new one, or the current one).
  absl::StatusOr<Plan> Observe(const Matrix& bandwidth, const Matrix& rtt);

 private:
  Plan plan_;
  Matrix built_for_;
  double element_bytes_;
  double threshold_;
  int last_bottleneck_ = -1;
  int repeats_ = 0;
  std::string last_action_ = "none";
};

}  // namespace plexus::aggregation
