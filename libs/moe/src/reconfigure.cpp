#include "plexus/moe/reconfigure.hpp"

#include <algorithm>
#include <limits>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"

namespace plexus::moe {
namespace {

// Matching survivors to plan nodes scores every (survivor, plan node) pair; the optimal
// assignment is cubic in the nodes. Beyond these the time and memory are out of proportion.
constexpr int64_t kMaxScoredPairs = 10'000'000;
constexpr int kMaxOptimalNodes = 1'000;

// Minimum-cost perfect assignment (Hungarian, O(n^3)); returns row -> column.
std::vector<int> HungarianMinCost(const std::vector<std::vector<int64_t>>& cost) {
  const int n = static_cast<int>(cost.size());
  const int64_t inf = std::numeric_limits<int64_t>::max() / 4;
  std::vector<int64_t> u(n + 1, 0), v(n + 1, 0);
  std::vector<int> p(n + 1, 0), way(n + 1, 0);
  for (int i = 1; i <= n; ++i) {
    p[0] = i;
    int j0 = 0;
    std::vector<int64_t> minv(n + 1, inf);
    std::vector<bool> used(n + 1, false);
    do {
      used[j0] = true;
      const int i0 = p[j0];
      int64_t delta = inf;
      int j1 = 0;
      for (int j = 1; j <= n; ++j) {
        if (used[j]) continue;
        const int64_t cur = cost[i0 - 1][j - 1] - u[i0] - v[j];
        if (cur < minv[j]) {
          minv[j] = cur;
          way[j] = j0;
        }
        if (minv[j] < delta) {
          delta = minv[j];
          j1 = j;
        }
      }
      for (int j = 0; j <= n; ++j) {
        if (used[j]) {
          u[p[j]] += delta;
          v[j] -= delta;
        } else {
          minv[j] -= delta;
        }
      }
      j0 = j1;
    } while (p[j0] != 0);
    do {
      const int j1 = way[j0];
      p[j0] = p[j1];
      j0 = j1;
    } while (j0);
  }
  std::vector<int> row_to_col(n, -1);
  for (int j = 1; j <= n; ++j) row_to_col[p[j] - 1] = j - 1;
  return row_to_col;
}

std::vector<int> CountsOn(const Placement& p, int node) {
  std::vector<int> c(p.num_experts, 0);
  for (int e : p.node_slots[node]) ++c[e];
  return c;
}

}  // namespace

absl::StatusOr<ReconfigurePlan> PlanReconfiguration(const ReconfigureInput& input) {
  const int layers = static_cast<int>(input.current.size());
  if (layers == 0) return absl::InvalidArgumentError("the current deployment has no layers");
  if (static_cast<int>(input.layer_loads.size()) != layers) {
    return absl::InvalidArgumentError(absl::StrCat("got loads for ", input.layer_loads.size(),
                                                   " layers, the deployment has ", layers));
  }
  const int old_nodes = input.current[0].num_nodes;
  for (int l = 0; l < layers; ++l) {
    if (absl::Status s = ValidatePlacement(input.current[l]); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("current placement of layer ", l, ": ", std::string(s.message())));
    }
    if (input.current[l].num_nodes != old_nodes) {
      return absl::InvalidArgumentError("every layer's placement must span the same nodes");
    }
    if (static_cast<int>(input.layer_loads[l].size()) != input.current[l].num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, " has ",
                                                     input.layer_loads[l].size(), " loads for ",
                                                     input.current[l].num_experts, " experts"));
    }
  }
  if (static_cast<int>(input.current_physical.size()) != old_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("current_physical names ",
                                                   input.current_physical.size(),
                                                   " nodes, the placements have ", old_nodes));
  }
  if (input.new_physical.empty()) {
    return absl::InvalidArgumentError("the new cluster has no nodes: nothing can train");
  }
  if (input.expert_state_bytes < 0) {
    return absl::InvalidArgumentError("expert_state_bytes must be >= 0");
  }
  absl::flat_hash_map<int, int> old_index;  // physical -> old plan node
  for (int i = 0; i < old_nodes; ++i) {
    if (!old_index.emplace(input.current_physical[i], i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("physical node ", input.current_physical[i], " appears twice in current"));
    }
  }
  {
    absl::flat_hash_map<int, int> seen;
    for (int id : input.new_physical) {
      if (!seen.emplace(id, 0).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("physical node ", id, " appears twice in the new cluster"));
      }
    }
  }

  const int new_nodes = static_cast<int>(input.new_physical.size());
  const int slots = input.slots_per_node;
  ReconfigurePlan plan;
  for (int l = 0; l < layers; ++l) {
    absl::StatusOr<Allocation> alloc = AllocateReplicas(
        input.layer_loads[l], AllocationOptions{new_nodes, slots, input.min_replicas});
    if (!alloc.ok()) {
      return absl::Status(alloc.status().code(),
                          absl::StrCat("layer ", l, ": ", std::string(alloc.status().message())));
    }
    PLEXUS_ASSIGN_OR_RETURN(Placement placement,
                            PlaceExperts(input.policy, alloc->replicas, new_nodes, slots,
                                         alloc->ascending, input.failures));
    plan.allocations.push_back(*std::move(alloc));
    plan.placements.push_back(std::move(placement));
  }

  // held[l][k]: expert counts that survivor k (new-cluster node survivors[k]) holds today;
  // joined nodes hold nothing, so only survivors can share experts with a plan node.
  std::vector<int> survivors;
  std::vector<int> survivor_of(new_nodes, -1);  // new-cluster node -> k, or -1 for a joined one
  for (int i = 0; i < new_nodes; ++i) {
    if (old_index.contains(input.new_physical[i])) {
      survivor_of[i] = static_cast<int>(survivors.size());
      survivors.push_back(i);
    }
  }
  const int64_t pairs_to_score = static_cast<int64_t>(survivors.size()) * new_nodes;
  if (pairs_to_score > kMaxScoredPairs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("reconfiguration: matching ", survivors.size(), " surviving nodes to ",
                     new_nodes, " plan nodes scores ", pairs_to_score, " pairs; at most ",
                     kMaxScoredPairs, " are supported (fewer nodes)"));
  }
  if (input.assignment == AssignmentMethod::kOptimal && new_nodes > kMaxOptimalNodes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "reconfiguration: the optimal assignment is cubic in the nodes and supports at most ",
        kMaxOptimalNodes, " nodes, the new cluster has ", new_nodes, " (use the greedy one)"));
  }
  std::vector<std::vector<std::vector<int>>> held(layers);
  for (int l = 0; l < layers; ++l) {
    for (int i : survivors) {
      held[l].push_back(CountsOn(input.current[l], old_index.at(input.new_physical[i])));
    }
  }
  // overlap[k][q]: (layer, expert) pairs plan node q needs that survivor k already holds.
  std::vector<std::vector<int64_t>> overlap(survivors.size(), std::vector<int64_t>(new_nodes, 0));
  for (int l = 0; l < layers; ++l) {
    for (int q = 0; q < new_nodes; ++q) {
      const std::vector<int> want = CountsOn(plan.placements[l], q);
      for (size_t k = 0; k < survivors.size(); ++k) {
        for (size_t e = 0; e < want.size(); ++e) {
          overlap[k][q] += (want[e] > 0 && held[l][k][e] > 0) ? 1 : 0;
        }
      }
    }
  }
  std::vector<int> node_of_plan(new_nodes, -1);  // plan node -> index into new_physical
  if (input.assignment == AssignmentMethod::kOptimal) {
    std::vector<std::vector<int64_t>> cost(new_nodes, std::vector<int64_t>(new_nodes, 0));
    for (size_t k = 0; k < survivors.size(); ++k) {
      for (int q = 0; q < new_nodes; ++q) cost[survivors[k]][q] = -overlap[k][q];
    }
    const std::vector<int> assign = HungarianMinCost(cost);
    for (int i = 0; i < new_nodes; ++i) node_of_plan[assign[i]] = i;
  } else {
    std::vector<std::tuple<int64_t, int, int>> pairs;
    for (size_t k = 0; k < survivors.size(); ++k) {
      for (int q = 0; q < new_nodes; ++q) {
        if (overlap[k][q] > 0) pairs.emplace_back(-overlap[k][q], survivors[k], q);
      }
    }
    std::sort(pairs.begin(), pairs.end());
    std::vector<bool> node_used(new_nodes, false);
    for (const auto& [neg, i, q] : pairs) {
      if (node_used[i] || node_of_plan[q] >= 0) continue;
      node_used[i] = true;
      node_of_plan[q] = i;
    }
    int next = 0;
    for (int q = 0; q < new_nodes; ++q) {
      if (node_of_plan[q] >= 0) continue;
      while (node_used[next]) ++next;
      node_used[next] = true;
      node_of_plan[q] = next;
    }
  }
  plan.physical.resize(new_nodes);
  for (int q = 0; q < new_nodes; ++q) plan.physical[q] = input.new_physical[node_of_plan[q]];

  // Each missing replica is fetched from a surviving owner, rotating over the owners so that
  // the sends of one expert spread over all of them.
  for (int l = 0; l < layers; ++l) {
    const int experts = input.current[l].num_experts;
    std::vector<std::vector<int>> owners(experts);
    for (size_t k = 0; k < survivors.size(); ++k) {
      for (int e = 0; e < experts; ++e) {
        if (held[l][k][e] > 0) owners[e].push_back(input.new_physical[survivors[k]]);
      }
    }
    for (auto& o : owners) std::sort(o.begin(), o.end());
    std::vector<size_t> next_owner(experts, 0);
    for (int q = 0; q < new_nodes; ++q) {
      const int k = survivor_of[node_of_plan[q]];
      const std::vector<int> want = CountsOn(plan.placements[l], q);
      for (int e = 0; e < experts; ++e) {
        // A second copy on the same node is made locally: only absent experts travel.
        if (want[e] == 0 || (k >= 0 && held[l][k][e] > 0)) continue;
        ++plan.newly_assigned;
        if (owners[e].empty()) continue;  // restored from the checkpoint instead
        const int src = owners[e][next_owner[e]++ % owners[e].size()];
        plan.transfers.push_back(
            ExpertTransfer{l, e, src, plan.physical[q], input.expert_state_bytes});
        plan.bytes_moved += input.expert_state_bytes;
      }
    }
    for (int e = 0; e < experts; ++e) {
      if (owners[e].empty()) plan.lost_experts.emplace_back(l, e);
    }
  }
  return plan;
}

}  // namespace plexus::moe
