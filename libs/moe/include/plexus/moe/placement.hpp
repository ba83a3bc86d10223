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
  kMro,      // max rank overlap (Lazarus Theorem 1): optimal recovery probability
  kSpread,   // experts in id order, replicas dealt round-robin over distinct nodes
  kCompact,  // each expert packed onto as few nodes as possible
};

// "mro", "spread", "compact".
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
// (MRO groups them in that order); empty means by replica count, ties by id.
absl::StatusOr<Placement> PlaceExperts(PlacementPolicy policy, absl::Span<const int> replicas,
                                       int num_nodes, int slots_per_node,
                                       absl::Span<const int> ascending = {});

}  // namespace plexus::moe
