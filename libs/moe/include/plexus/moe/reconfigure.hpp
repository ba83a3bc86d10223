// Reconfiguration after failures or joins: new allocation and placement, a mapping of physical
// nodes onto the new plan's nodes, and the expert transfers that rebuild it.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/moe/allocation.hpp"
#include "plexus/moe/placement.hpp"

namespace plexus::moe {

enum class AssignmentMethod {
  kGreedy,   // Lazarus: repeatedly match the (physical, plan) pair sharing the most experts
  kOptimal,  // Hungarian assignment: the fewest newly assigned experts
};

struct ReconfigureInput {
  // Current deployment: one placement per layer over plan nodes 0..N-1, and the physical node
  // id that runs each plan node.
  std::vector<Placement> current;
  std::vector<int> current_physical;
  // Physical ids of the nodes of the new cluster: the survivors plus any joined nodes.
  std::vector<int> new_physical;
  // layer_loads[l][e]: expert loads for the new allocation.
  std::vector<std::vector<double>> layer_loads;
  int slots_per_node = 0;
  int min_replicas = 2;
  // The library's default (kBest): never below MRO, spread or compact for `failures` failed
  // nodes of one layer, and MRO itself whenever MRO is optimal (always when c divides E).
  PlacementPolicy policy = PlacementPolicy::kBest;
  int failures = 1;
  AssignmentMethod assignment = AssignmentMethod::kGreedy;
  // Bytes of one expert's state (weights + optimizer state), the same for every expert.
  int64_t expert_state_bytes = 0;
};

struct ExpertTransfer {
  int layer = 0;
  int expert = 0;
  int src_physical = 0;
  int dst_physical = 0;
  int64_t bytes = 0;
};

struct ReconfigurePlan {
  std::vector<Allocation> allocations;  // per layer
  std::vector<Placement> placements;    // per layer, over the new plan nodes
  std::vector<int> physical;            // physical id of each new plan node
  // (node, layer, expert) triples the new plan needs on a node that did not hold that expert.
  int64_t newly_assigned = 0;
  std::vector<ExpertTransfer> transfers;  // sources spread over every surviving owner
  int64_t bytes_moved = 0;
  // (layer, expert) pairs with no surviving replica: their state must come from a checkpoint.
  std::vector<std::pair<int, int>> lost_experts;
  bool needs_checkpoint_restart() const { return !lost_experts.empty(); }
};

// InvalidArgument on inconsistent input (unknown or duplicate physical ids, empty cluster, load
// vectors of the wrong length...).
absl::StatusOr<ReconfigurePlan> PlanReconfiguration(const ReconfigureInput& input);

}  // namespace plexus::moe
