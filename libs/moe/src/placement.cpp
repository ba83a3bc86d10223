#include "plexus/moe/placement.hpp"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "placement_internal.hpp"
#include "plexus/base/status.hpp"

namespace plexus::moe {

const char* PlacementPolicyName(PlacementPolicy policy) {
  switch (policy) {
    case PlacementPolicy::kMro:
      return "mro";
    case PlacementPolicy::kSpread:
      return "spread";
    case PlacementPolicy::kCompact:
      return "compact";
    case PlacementPolicy::kBest:
      return "best";
    case PlacementPolicy::kExact:
      return "exact";
  }
  return "?";
}

absl::StatusOr<PlacementPolicy> ParsePlacementPolicy(const std::string& name) {
  if (name == "mro") return PlacementPolicy::kMro;
  if (name == "spread") return PlacementPolicy::kSpread;
  if (name == "compact") return PlacementPolicy::kCompact;
  if (name == "best") return PlacementPolicy::kBest;
  if (name == "exact") return PlacementPolicy::kExact;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown placement policy '", name, "' (expected mro, spread, compact, best or exact)"));
}

std::vector<int> Placement::ReplicaMatrix() const {
  std::vector<int> matrix(static_cast<size_t>(num_experts) * num_nodes, 0);
  for (int n = 0; n < num_nodes; ++n) {
    for (int e : node_slots[n]) ++matrix[static_cast<size_t>(e) * num_nodes + n];
  }
  return matrix;
}

std::vector<int> Placement::ReplicaCounts() const {
  std::vector<int> counts(num_experts, 0);
  for (const auto& slots : node_slots) {
    for (int e : slots) ++counts[e];
  }
  return counts;
}

std::vector<std::vector<int>> Placement::ExpertNodes() const {
  std::vector<std::vector<int>> nodes(num_experts);
  for (int n = 0; n < num_nodes; ++n) {
    for (int e : node_slots[n]) {
      if (nodes[e].empty() || nodes[e].back() != n) nodes[e].push_back(n);
    }
  }
  return nodes;
}

absl::Status ValidatePlacement(const Placement& placement, absl::Span<const int> replicas) {
  if (placement.num_nodes <= 0 || placement.slots_per_node <= 0 || placement.num_experts <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement needs positive nodes, slots and experts (got ", placement.num_nodes,
                     ", ", placement.slots_per_node, ", ", placement.num_experts, ")"));
  }
  if (static_cast<int>(placement.node_slots.size()) != placement.num_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("placement lists ", placement.node_slots.size(),
                                                   " nodes, expected ", placement.num_nodes));
  }
  for (int n = 0; n < placement.num_nodes; ++n) {
    const auto& slots = placement.node_slots[n];
    if (static_cast<int>(slots.size()) != placement.slots_per_node) {
      return absl::InvalidArgumentError(absl::StrCat(
          "node ", n, " has ", slots.size(), " slots, expected ", placement.slots_per_node));
    }
    for (int e : slots) {
      if (e < 0 || e >= placement.num_experts) {
        return absl::InvalidArgumentError(absl::StrCat(
            "node ", n, " holds expert ", e, ", outside [0, ", placement.num_experts, ")"));
      }
    }
  }
  if (!replicas.empty()) {
    if (static_cast<int>(replicas.size()) != placement.num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("replica vector has ", replicas.size(),
                                                     " entries for ", placement.num_experts,
                                                     " experts"));
    }
    const std::vector<int> counts = placement.ReplicaCounts();
    for (int e = 0; e < placement.num_experts; ++e) {
      if (counts[e] != replicas[e]) {
        return absl::InvalidArgumentError(absl::StrCat("expert ", e, " has ", counts[e],
                                                       " replicas placed, expected ", replicas[e]));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// Slot bookkeeping shared by the policies.
class Builder {
 public:
  Builder(int num_experts, int num_nodes, int slots_per_node) : slots_per_node_(slots_per_node) {
    placement_.num_nodes = num_nodes;
    placement_.slots_per_node = slots_per_node;
    placement_.num_experts = num_experts;
    placement_.node_slots.assign(num_nodes, {});
    for (auto& slots : placement_.node_slots) slots.reserve(slots_per_node);
  }
  bool HasRoom(int node) const {
    return static_cast<int>(placement_.node_slots[node].size()) < slots_per_node_;
  }
  bool Holds(int node, int expert) const {
    const auto& slots = placement_.node_slots[node];
    return std::find(slots.begin(), slots.end(), expert) != slots.end();
  }
  void Put(int node, int expert) { placement_.node_slots[node].push_back(expert); }

  // Places `count` replicas of `expert` on `candidates`, searching from *cursor for a node with
  // room that does not hold the expert yet (any node with room when none is left); the cursor
  // moves past each node used, so consecutive experts continue round-robin.
  //
  // A node passed over (full, or holding the expert) stays so for the rest of the call, so the
  // search for non-holders is one pass around the ring; once it comes back to where it began,
  // every node with room holds the expert and the rest go round-robin over the nodes with room.
  // Linear in the candidates per call, where a search from the cursor for every replica was
  // quadratic in the nodes.
  void PutSpread(int expert, int count, int* cursor, std::vector<int>* candidate_list) {
    const std::vector<int>& candidates = *candidate_list;
    const int size = static_cast<int>(candidates.size());
    int placed = 0;
    for (int step = 0, idx = *cursor; step < size && placed < count; ++step) {
      const int node = candidates[idx];
      if (HasRoom(node) && !Holds(node, expert)) {
        Put(node, expert);
        ++placed;
        *cursor = (idx + 1) % size;
      }
      idx = (idx + 1) % size;
    }
    for (; placed < count; ++placed) {
      int idx = *cursor;
      while (!HasRoom(candidates[idx])) idx = (idx + 1) % size;
      Put(candidates[idx], expert);
      *cursor = (idx + 1) % size;
    }
    // Drop nodes that filled up, keeping the order, so later experts do not rescan them.
    std::vector<int> kept;
    kept.reserve(candidates.size());
    int kept_before_cursor = 0;
    for (int idx = 0; idx < size; ++idx) {
      if (!HasRoom(candidates[idx])) continue;
      if (idx < *cursor) ++kept_before_cursor;
      kept.push_back(candidates[idx]);
    }
    *cursor = kept.empty() ? 0 : kept_before_cursor % static_cast<int>(kept.size());
    *candidate_list = std::move(kept);
  }
  Placement Take() { return std::move(placement_); }

 private:
  int slots_per_node_;
  Placement placement_;
};

}  // namespace

namespace internal {

absl::Status CheckPlacementRequest(absl::Span<const int> replicas, int num_nodes,
                                   int slots_per_node) {
  const int num_experts = static_cast<int>(replicas.size());
  if (num_experts == 0) return absl::InvalidArgumentError("no experts to place");
  if (num_nodes <= 0 || slots_per_node <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("need positive nodes and slots (got ", num_nodes,
                                                   " nodes, ", slots_per_node, " slots)"));
  }
  int64_t total = 0;
  for (int e = 0; e < num_experts; ++e) {
    if (replicas[e] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert ", e, " has ", replicas[e], " replicas; at least 1 is needed"));
    }
    total += replicas[e];
  }
  if (total != int64_t{num_nodes} * slots_per_node) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas sum to ", total, " but ", num_nodes, " nodes x ", slots_per_node,
                     " slots = ", int64_t{num_nodes} * slots_per_node));
  }
  return absl::OkStatus();
}

}  // namespace internal

absl::StatusOr<Placement> PlaceExperts(PlacementPolicy policy, absl::Span<const int> replicas,
                                       int num_nodes, int slots_per_node,
                                       absl::Span<const int> ascending, int failures) {
  PLEXUS_RETURN_IF_ERROR(internal::CheckPlacementRequest(replicas, num_nodes, slots_per_node));
  if (policy == PlacementPolicy::kBest) {
    return internal::BestPlacement(replicas, num_nodes, slots_per_node, ascending, failures);
  }
  if (policy == PlacementPolicy::kExact) {
    return ExactPlacement(replicas, num_nodes, slots_per_node, failures);
  }
  const int num_experts = static_cast<int>(replicas.size());
  // Order: by replica count, then by the caller's load order, then by id.
  std::vector<int> position(num_experts);
  std::iota(position.begin(), position.end(), 0);
  if (!ascending.empty()) {
    if (static_cast<int>(ascending.size()) != num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("load order has ", ascending.size(),
                                                     " entries for ", num_experts, " experts"));
    }
    std::vector<bool> seen(num_experts, false);
    for (int i = 0; i < num_experts; ++i) {
      const int e = ascending[i];
      if (e < 0 || e >= num_experts || seen[e]) {
        return absl::InvalidArgumentError("load order is not a permutation of the experts");
      }
      seen[e] = true;
      position[e] = i;
    }
  }
  std::vector<int> order(num_experts);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    if (replicas[a] != replicas[b]) return replicas[a] < replicas[b];
    return position[a] < position[b];
  });

  Builder builder(num_experts, num_nodes, slots_per_node);
  std::vector<int> all_nodes(num_nodes);
  std::iota(all_nodes.begin(), all_nodes.end(), 0);

  switch (policy) {
    case PlacementPolicy::kMro: {
      std::vector<int> extra(replicas.begin(), replicas.end());
      int next_node = 0;
      for (int first = 0; first < num_experts; first += slots_per_node) {
        const int last = std::min(num_experts, first + slots_per_node);
        // The group's node set has as many nodes as its least-loaded expert has replicas, so
        // that expert lives exactly there and the group fails only when all of them fail.
        const int group_nodes = std::min(replicas[order[first]], num_nodes - next_node);
        for (int n = next_node; n < next_node + group_nodes; ++n) {
          for (int i = first; i < last; ++i) {
            builder.Put(n, order[i]);
            --extra[order[i]];
          }
        }
        next_node += group_nodes;
      }
      // Remaining replicas go to vacant slots, the most numerous first, each on nodes that do
      // not hold that expert where possible.
      std::vector<int> by_extra = order;
      std::stable_sort(by_extra.begin(), by_extra.end(),
                       [&](int a, int b) { return extra[a] > extra[b]; });
      std::vector<int> vacant;
      for (int n = 0; n < num_nodes; ++n) {
        if (builder.HasRoom(n)) vacant.push_back(n);
      }
      int cursor = 0;
      for (int e : by_extra) {
        if (extra[e] > 0) builder.PutSpread(e, extra[e], &cursor, &vacant);
      }
      break;
    }
    case PlacementPolicy::kSpread: {
      // Experts in id order; the cursor carries over, so replicas deal round-robin over nodes.
      int cursor = 0;
      for (int e = 0; e < num_experts; ++e) builder.PutSpread(e, replicas[e], &cursor, &all_nodes);
      break;
    }
    case PlacementPolicy::kCompact: {
      int node = 0;
      for (int e = 0; e < num_experts; ++e) {
        for (int r = 0; r < replicas[e]; ++r) {
          while (!builder.HasRoom(node)) ++node;
          builder.Put(node, e);
        }
      }
      break;
    }
    case PlacementPolicy::kBest:
    case PlacementPolicy::kExact:
      break;  // handled above
  }
  Placement placement = builder.Take();
  if (absl::Status status = ValidatePlacement(placement, replicas); !status.ok()) {
    return absl::InternalError(
        absl::StrCat("placement invariant broken: ", std::string(status.message())));
  }
  return placement;
}

}  // namespace plexus::moe
