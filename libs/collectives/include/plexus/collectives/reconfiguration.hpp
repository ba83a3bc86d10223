// Live reconfiguration of a communicator (docs/collectives.md, "Live reconfiguration"): what a
// change may carry and what a communicator reports as its active configuration.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/collectives/selector.hpp"

namespace plexus::collectives {

// A change requested with Communicator::RequestReconfiguration. Unset fields keep their value.
struct Reconfiguration {
  // A permutation of 0..size-1 (as CommunicatorOptions::ring_order).
  std::optional<std::vector<int>> ring_order;
  // Replaces the communicator's overrides (CommunicatorOptions::algorithms) as a whole;
  // PLEXUS_COLL_ALGO and per-call CallOptions::algorithm still take precedence.
  std::optional<AlgorithmOverrides> algorithms;
  // Channels collectives stripe over: 1 to the number connected at creation (no connection is
  // opened or closed). Point-to-point calls keep every connected channel.
  std::optional<int> channels;
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
  int channels = 1;            // in use by collectives
  int connected_channels = 1;  // connected at creation (the most `channels` may be)
};

// Text forms, for the admin endpoint and logs. "0,2,1,3" <-> a ring order (no range check);
// AlgorithmOverrides <-> "allreduce:ring,broadcast:tree" (kAuto entries left out; "" = none).
std::string RingOrderText(const std::vector<int>& order);
absl::StatusOr<std::vector<int>> ParseRingOrder(std::string_view text);
std::string OverridesText(const AlgorithmOverrides& overrides);

}  // namespace plexus::collectives
