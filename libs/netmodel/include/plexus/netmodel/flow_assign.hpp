// Strategy helpers of MCCS (seed 000 §4.4.2): locality-aware ring orders, and the assignment of
// flows (a communicator's connections, known exactly from its ring) to equal-cost routes:
//  - ECMP: a hash of the connection picks the route, as switches do by default; flows collide;
//  - FFA (best-fit fair flow assignment, a modified Hedera greedy): flows taken round-robin
//    across jobs, each on the route with the least excess demand;
//  - PFA (priority flow assignment): FFA where low-priority flows avoid reserved routes.
// A route index maps to whatever pins a connection to a path: the source address or UDP source
// port a policy-based route matches (MCCS sets the RoCEv2 source port), or a multipath path.
// The flow simulator (flow_sim.hpp) runs the same assignments; docs/netmodel.md, "Flow
// assignment".
//
//   std::vector<Flow> flows = ...;   // one per connection, routes = the pair's equal-cost paths
//   auto routes = AssignFlows(flows, capacity, {.policy = FlowAssignPolicy::kFfa});
//   // connection i uses (*routes)[i]
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace plexus::netmodel {

enum class FlowAssignPolicy : uint8_t { kEcmp, kFfa, kPfa };
std::string_view FlowAssignPolicyName(FlowAssignPolicy policy);
// "ecmp", "ffa", "pfa".
absl::StatusOr<FlowAssignPolicy> ParseFlowAssignPolicy(std::string_view name);

struct Flow {
  int job = 0;                 // the communicator (application) it belongs to
  double demand = 1;           // bytes/s it wants (FFA fits demands into capacities); > 0
  bool high_priority = false;  // PFA: may use reserved routes
  uint64_t key = 0;  // ECMP: what the switch hashes (a digest of the connection's 5-tuple)
  // The equal-cost routes it may take, each the links (indices into the capacities) it crosses.
  // Route indices are the pair's, e.g. the spine of a leaf/spine fabric; at least one.
  std::vector<std::vector<int>> routes;
};

struct FlowAssignOptions {
  FlowAssignPolicy policy = FlowAssignPolicy::kFfa;
  uint64_t ecmp_seed = 0;  // ECMP: the switches' hash seed
  // PFA: route indices that low-priority flows avoid (e.g. one spine of each pair dedicated to a
  // prioritised job); a low-priority flow whose every route is reserved takes them all.
  std::vector<int> reserved_routes;
};

// The route (index into flow.routes) of every flow.
//  ECMP: Mix(key, ecmp_seed) % routes (Mix a fixed 64-bit mixer), independent of the others.
//  FFA: flows in round-robin order across jobs (jobs in order of first appearance; a job's flows
//    in input order); each takes the route whose most loaded link would be least over capacity
//    after adding it: argmin over routes of max over links of (load + demand - capacity), over
//    the links that are not on every route of the flow (its NICs weigh alike on all); ties
//    go to the route whose links carry fewest flows of the same job (so that a job's flows
//    spread and every route gets flows of every job, the seed's example), then to the lower
//    index; then its demand is added to every link of the route.
//  PFA: low-priority flows first, by the FFA rule over their non-reserved routes; then
//    high-priority flows by the FFA rule over all routes.
// `capacity[l]` is link l's bytes/s. InvalidArgument (naming the flow) for a flow without
// routes, a link outside the capacities, a demand <= 0 or a capacity <= 0.
absl::StatusOr<std::vector<int>> AssignFlows(const std::vector<Flow>& flows,
                                             std::span<const double> capacity,
                                             const FlowAssignOptions& options);

// ECMP's hash: a 64-bit mixer (splitmix64's finaliser) of key ^ seed.
uint64_t EcmpHash(uint64_t key, uint64_t seed);

// Where a member of a communicator sits. Members with equal pod, rack and host are on one
// machine.
struct Locality {
  int pod = 0;
  int rack = 0;
  int host = 0;
};

// MCCS's locality-aware ring (Example #1): members grouped by pod, then rack, then host, and
// chained in that order (member index breaks ties), so that the ring leaves each host, rack and
// pod once. `channel` rotates the members inside each host's block by `channel` places, so that
// channel c's ring enters and leaves every host through different members (NICs) than channel
// c - 1's, as NCCL's rings over multi-NIC hosts do. Returns position -> member index.
std::vector<int> LocalityRingOrder(std::span<const Locality> members, int channel = 0);

}  // namespace plexus::netmodel
