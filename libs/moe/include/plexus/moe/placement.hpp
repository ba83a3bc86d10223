// Expert placement: which experts each node's slots hold (one MoE layer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace plexus::moe {

enum class PlacementPolicy {
  kMro,      // max rank overlap (Lazarus Theorem 1): optimal recovery probability when c | E
  kSpread,   // experts in id order, replicas dealt round-robin over distinct nodes
  kCompact,  // each expert packed onto as few nodes as possible
  // The library's default: MRO, spread, compact, and MRO and spread improved by replica swaps,
  // each scored exactly for `failures` failed nodes; the best (ties: that order, so MRO when it
  // is optimal). Never below MRO, spread or compact. When the exact score is too costly (more
  // than 62 nodes or C(N, failures) > 200,000) it is plain MRO.
  kBest,
  // The optimum for `failures` by branch and bound (ExactPlacement); small instances only.
  kExact,
};

// "mro", "spread", "compact", "best", "exact".
const char* PlacementPolicyName(PlacementPolicy policy);
absl::StatusOr<PlacementPolicy> ParsePlacementPolicy(const std::string& name);

struct Placement {
  int num_nodes = 0;
  int slots_per_node = 0;
  int num_experts = 0;
  // node_slots[n]: the expert id in each of node n's slots (a node may hold an expert twice
  // when the expert has more replicas than there are nodes).
  std::vector<std::vector<int>> node_slots;

  // replicas[e * num_nodes + n]: copies of expert e on node n (the dispatcher's R matrix).
  std::vector<int> ReplicaMatrix() const;
  std::vector<int> ReplicaCounts() const;
  // Distinct nodes holding each expert, ascending.
  std::vector<std::vector<int>> ExpertNodes() const;
};

// Checks shape, expert ids and, when `replicas` is not empty, the per-expert replica counts.
absl::Status ValidatePlacement(const Placement& placement, absl::Span<const int> replicas = {});

// Places `replicas[e]` copies of every expert on `num_nodes` nodes of `slots_per_node` slots.
// The replicas must sum to num_nodes * slots_per_node. `ascending` orders the experts by load
// (MRO groups them in that order); empty means by replica count, ties by id. `failures`: the
// number of failed nodes kBest and kExact maximise the recovery probability for (0..num_nodes).
absl::StatusOr<Placement> PlaceExperts(PlacementPolicy policy, absl::Span<const int> replicas,
                                       int num_nodes, int slots_per_node,
                                       absl::Span<const int> ascending = {}, int failures = 1);

// The placement with the most recovering failure sets of size `failures`, by branch and bound
// over placements reduced by symmetry (nodes interchangeable, experts with equal replica counts
// interchangeable, slots unordered: a placement is an expert x node count matrix with
// lexicographically ordered columns and ordered rows within a replica class), bounded by the
// failure sets the fully placed experts already survive. InvalidArgument on bad input;
// ResourceExhausted above 12 nodes or `max_search_nodes` search nodes.
absl::StatusOr<Placement> ExactPlacement(absl::Span<const int> replicas, int num_nodes,
                                         int slots_per_node, int failures,
                                         int64_t max_search_nodes = 5'000'000);

}  // namespace plexus::moe
