// Lazarus as plain function calls: replicas per expert from token loads (Eq. 6.1), their
// placement on nodes, the probability that training survives k node failures without a
// checkpoint restart, and the reconfiguration (new plan + expert transfers) after node 2 fails.
//
//   build/examples/lazarus-plan
#include <cstdio>
#include <string>
#include <vector>

#include "plexus/moe/allocation.hpp"
#include "plexus/moe/placement.hpp"
#include "plexus/moe/reconfigure.hpp"
#include "plexus/moe/recovery.hpp"

namespace pm = plexus::moe;

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "lazarus-plan: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main() {
  // 8 experts with skewed token loads (a few carry most tokens), 6 nodes of 4 slots each.
  const std::vector<double> loads = {0.02, 0.03, 0.05, 0.05, 0.10, 0.15, 0.25, 0.35};
  const int nodes = 6, slots = 4;
  auto allocation = pm::AllocateReplicas(loads, {.num_nodes = nodes, .slots_per_node = slots});
  if (!allocation.ok()) return Fail(allocation.status());
  std::printf("replicas per expert:");
  for (int r : allocation->replicas) std::printf(" %d", r);
  std::printf("\n");

  auto placement = pm::PlaceExperts(pm::PlacementPolicy::kMro, allocation->replicas, nodes, slots,
                                    allocation->ascending);
  if (!placement.ok()) return Fail(placement.status());
  for (int n = 0; n < nodes; ++n) {
    std::printf("  node %d holds experts", n);
    for (int e : placement->node_slots[n]) std::printf(" %d", e);
    std::printf("\n");
  }
  for (int k = 1; k <= 4; ++k) {
    auto recovery = pm::RecoveryProbability({&*placement, 1}, k);
    if (!recovery.ok()) return Fail(recovery.status());
    std::printf("P(recover without restart | %d of %d nodes fail) = %.3f (%s)\n", k, nodes,
                recovery->probability, recovery->method.c_str());
  }

  // Node 2 fails: re-plan on the five survivors and move only what is missing.
  pm::ReconfigureInput input;
  input.current = {*placement};
  input.current_physical = {0, 1, 2, 3, 4, 5};
  input.new_physical = {0, 1, 3, 4, 5};
  input.layer_loads = {loads};
  input.slots_per_node = slots;
  input.expert_state_bytes = 64 << 20;
  auto plan = pm::PlanReconfiguration(input);
  if (!plan.ok()) return Fail(plan.status());
  std::printf("after node 2 fails: %zu transfers, %.0f MiB moved, %s\n", plan->transfers.size(),
              plan->bytes_moved / 1048576.0,
              plan->needs_checkpoint_restart() ? "CHECKPOINT RESTART needed"
                                               : "no checkpoint restart needed");
  for (const pm::ExpertTransfer& t : plan->transfers) {
    std::printf("  expert %d: node %d -> node %d\n", t.expert, t.src_physical, t.dst_physical);
  }
  return plan->needs_checkpoint_restart() ? 1 : 0;
}
