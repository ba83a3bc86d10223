// Live reconfiguration of a communicator (docs/collectives_operations.md, "Live reconfiguration"):
// what a change may carry and what a communicator reports as its active configuration.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/collectives/selector.hpp"
#include "plexus/transport/types.hpp"

namespace plexus::collectives {

// The transport of a communicator's connections: device.backend and the policy that derives
// each pair's backend from it (docs/collectives.md, "Transport per peer").
struct TransportChoice {
  transport::Backend backend = transport::Backend::kTcp;
  TransportPolicy policy = TransportPolicy::kUniform;
  bool operator==(const TransportChoice&) const = default;
};

// A change requested with Communicator::RequestReconfiguration. Unset fields keep their value.
struct Reconfiguration {
  // A permutation of 0..size-1 (as CommunicatorOptions::ring_order).
  std::optional<std::vector<int>> ring_order;
  // Replaces the communicator's overrides (CommunicatorOptions::algorithms) as a whole;
  // PLEXUS_COLL_ALGO and per-call CallOptions::algorithm still take precedence.
  std::optional<AlgorithmOverrides> algorithms;
  // Channels: 1 to kMaxChannels. At the collective the change lands on every rank connects the
  // channels added (channel c >= the old count, to every peer) and closes the channels dropped
  // once every rank is past the collectives before it; channels below both counts keep their
  // connections. Collectives and point-to-point calls stripe over this many.
  std::optional<int> channels;
  // The backends `transport` picks per pair (e.g. tcp -> shm for ranks of one host), at the
  // collective the change lands on: every rank connects the pairs whose backend changes (every
  // channel) and keeps the connections of the others; collectives before it finish on the old
  // connections, the replaced ones closed once every rank is past them. Not for a communicator
  // created on a caller's device.
  // With `channels` or `transport`, point-to-point messages of a pair whose connections change
  // must not straddle the change (a Send before it whose Recv runs after it): the landing
  // collective fails with FailedPrecondition naming the pair.
  std::optional<TransportChoice> transport;
};

// The configuration collectives run with, and since when.
struct ActiveConfiguration {
  // 0: as created; else the epoch RequestReconfiguration returned for the last change applied.
  uint64_t epoch = 0;
  // The sequence number (0-based, counting every collective of the communicator) of the first
  // collective that ran with this configuration; equal on every rank.
  uint64_t since_sequence = 0;
  std::vector<int> ring_order;
  AlgorithmOverrides algorithms;
  int channels = 1;            // in use by collectives and point-to-point calls
  int connected_channels = 1;  // connected per peer (equal to `channels` since they change live)
  TransportChoice transport;   // the connections' transport
  // peer_backends[r]: the backend of this rank's connections to rank r (this rank: backend).
  std::vector<transport::Backend> peer_backends;
};

// Text forms, for the admin endpoint and logs. "0,2,1,3" <-> a ring order (no range check);
// AlgorithmOverrides <-> "allreduce:ring,broadcast:tree" (kAuto entries left out; "" = none).
std::string RingOrderText(const std::vector<int>& order);
absl::StatusOr<std::vector<int>> ParseRingOrder(std::string_view text);
std::string OverridesText(const AlgorithmOverrides& overrides);
// "tcp" (uniform) or "shm/per_peer" <-> a TransportChoice ("tcp/uniform" parses too).
std::string TransportChoiceText(const TransportChoice& choice);
absl::StatusOr<TransportChoice> ParseTransportChoice(std::string_view text);

}  // namespace plexus::collectives
