// The strategy provider (MCCS, seed 000 §4.4.2): given where each rank of a communicator sits,
// it chooses the communicator's ring order, algorithm overrides, channel count, per-channel
// routes (flow assignment over equal-cost routes, each route pinned by a source address) and QoS
// windows. The default provider implements MCCS's examples; users plug their own by deriving
// from StrategyProvider. docs/collectives.md, "Strategy provider".
//
//   DefaultStrategyProvider provider({.routes = 2, .flow_policy = FlowAssignPolicy::kFfa});
//   RankPlacement here{.locality = {.pod = 0, .rack = 3, .host = 17},
//                      .route_addresses = {"10.0.3.17", "10.1.3.17"}};  // one alias per route
//   auto comm = CreateWithProvider(*rdv, options, provider, here);
//
// Or without the communicator: Strategy s = provider.Choose({request})->front();
// options = ApplyStrategy(options, s, rank);
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/collectives/communicator.hpp"
#include "plexus/collectives/qos.hpp"
#include "plexus/collectives/selector.hpp"
#include "plexus/netmodel/flow_assign.hpp"
#include "plexus/netmodel/reorder.hpp"
#include "plexus/netmodel/topology.hpp"

namespace plexus::collectives {

// Where one rank sits, and the source addresses that pin its traffic to each equal-cost route
// (route_addresses[k]: the local IP alias whose flows the fabric sends over route k; empty when
// the rank cannot choose).
struct RankPlacement {
  netmodel::Locality locality;
  std::vector<std::string> route_addresses;
};

// One communicator (a job) for the provider to plan.
struct StrategyRequest {
  int job = 0;                       // distinguishes communicators in a joint plan (FFA)
  bool high_priority = false;        // PFA: may use the reserved routes
  std::vector<RankPlacement> ranks;  // by rank
  int channels = 0;                  // requested; 0: the provider decides
};

struct Strategy {
  std::vector<int> ring_order;    // position -> rank; empty: identity
  AlgorithmOverrides algorithms;  // kAuto entries leave the choice to the communicator
  int channels = 0;               // 0: the communicator's default
  // routes[c][r]: the route (index into the ranks' route_addresses) of rank r's channel-c
  // connection to its ring successor; empty: no assignment (the fabric's ECMP decides).
  std::vector<std::vector<int>> routes;
  // addresses[r][c]: rank r's source address for channel c (route_addresses[routes[c][r]]), or
  // empty strings where the rank gave no addresses.
  std::vector<std::vector<std::string>> addresses;
  QosTimetable qos;  // disabled: none
};

// The interface a user implements. Choose plans every communicator it is given at once (FFA
// balances flows across them) and returns one Strategy per request, in order. It must be
// deterministic: CreateWithProvider calls it on every rank with the same input, and ranks whose
// strategies differ fail creation (their options differ).
class StrategyProvider {
 public:
  virtual ~StrategyProvider() = default;
  virtual absl::StatusOr<std::vector<Strategy>> Choose(
      std::span<const StrategyRequest> communicators) = 0;
};

struct DefaultProviderOptions {
  enum class Ring : uint8_t {
    kIdentity,  // rank order
    kLocality,  // MCCS Example #1: grouped by pod, then rack, then host (LocalityRingOrder)
    kReorder,   // the reorder optimiser (reorder.hpp) over the latencies of `topology`
  };
  Ring ring = Ring::kLocality;
  // kReorder: the fabric (Locality::host indexes topology.hosts); required for kReorder.
  std::optional<netmodel::Topology> topology;
  netmodel::ReorderOptions reorder;
  // Equal-cost routes between racks (spines, or source-address aliases per host); 0: the
  // largest number of route_addresses any rank gives (1 when none).
  int routes = 0;
  // Channels when a request leaves them at 0: one per route (MCCS: a ring per route).
  int channels = 0;
  netmodel::FlowAssignPolicy flow_policy = netmodel::FlowAssignPolicy::kFfa;
  std::vector<int> reserved_routes;  // PFA
  uint64_t ecmp_seed = 0;
  // Capacity of each route's link out of (and into) a rack, and each flow's demand, in bytes/s;
  // what matters to FFA is their ratio (a flow per channel and rank, demand = nic / channels).
  double route_bytes_per_s = 12.5e9;
  double nic_bytes_per_s = 12.5e9;
  AlgorithmOverrides algorithms;  // passed through
  QosTimetable qos;               // passed through (high-priority and other jobs: see qos_of)
  // Per job id, when set: its QoS schedule (overrides `qos`).
  std::vector<std::pair<int, QosTimetable>> qos_of;
};

// MCCS's provider: ring by locality (or the reorder optimiser), one channel per route, every
// channel's ring flows (rank -> its successor, one per channel) assigned to routes by ECMP, FFA
// or PFA jointly over all requests; a flow between racks has `routes` routes, route k crossing
// the source rack's k-th uplink and the destination rack's k-th downlink; flows inside a rack
// cross no shared link (route 0 unless ECMP hashes them elsewhere).
class DefaultStrategyProvider : public StrategyProvider {
 public:
  explicit DefaultStrategyProvider(DefaultProviderOptions options = {})
      : options_(std::move(options)) {}
  absl::StatusOr<std::vector<Strategy>> Choose(
      std::span<const StrategyRequest> communicators) override;
  const DefaultProviderOptions& options() const { return options_; }

 private:
  DefaultProviderOptions options_;
};

// `options` with the strategy applied for rank `rank` (pure): ring_order, the non-kAuto
// algorithm overrides, channels (when > 0), channel_local_addresses (the rank's addresses, when
// any is non-empty) and qos (when enabled).
CommunicatorOptions ApplyStrategy(const CommunicatorOptions& options, const Strategy& strategy,
                                  int rank);

// Ring hops whose two ends sit in different racks (different pods count too), around the whole
// ring (position n-1 to 0 included).
int CrossRackHops(std::span<const netmodel::Locality> ranks, const std::vector<int>& ring_order);

// Creates a communicator whose strategy `provider` chooses (collective: every rank calls it):
// the ranks exchange their placements over the rendezvous, every rank asks the provider for the
// same single-request plan (job = 0, channels = options.channels) and creates the communicator
// with ApplyStrategy(options, strategy, rank). Errors of the exchange, the provider (named as
// such) and Create.
absl::StatusOr<std::unique_ptr<Communicator>> CreateWithProvider(transport::Rendezvous& rendezvous,
                                                                 CommunicatorOptions options,
                                                                 StrategyProvider& provider,
                                                                 const RankPlacement& here);

}  // namespace plexus::collectives
