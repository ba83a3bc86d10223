// One transport per peer: which backend connects each pair of ranks, and the connections over
// several devices (shm to the ranks of this host, tcp or verbs to the others).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "plexus/collectives/communicator.hpp"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace plexus::collectives::internal {

// The backend between two ranks on hosts `a` and `b` under `policy`, with `base` the
// communicator's device.backend. The same on every rank (a pure function of shared inputs).
transport::Backend PairBackend(TransportPolicy policy, transport::Backend base,
                               std::string_view host_a, std::string_view host_b);

// Parses "per_peer" or "uniform" (PLEXUS_COLL_TRANSPORT_POLICY).
absl::StatusOr<TransportPolicy> ParseTransportPolicy(std::string_view text);

// Connects this rank to every other rank, rank r over device_of[r] (null for this rank),
// completions to `cq` (collective: every rank calls it with the same `tag`). Each rank listens
// once per distinct backend it uses and publishes the addresses; the higher rank of each pair
// connects and introduces itself. Result[r] is the connection to rank r; null for this rank.
// A non-empty `local_address` binds this rank's tcp connections to it (the tcp listener listens
// on it, outgoing connections are made from it: CommunicatorOptions::channel_local_addresses);
// other backends ignore it.
absl::StatusOr<std::vector<std::unique_ptr<transport::Connection>>> ConnectPeers(
    transport::Rendezvous& rendezvous, absl::Span<transport::Device* const> device_of,
    transport::CompletionQueue* cq, std::string_view tag, absl::Duration timeout,
    std::string_view local_address = "");

// Caller-mode progress over several devices for one completion queue: each pass drives every
// device without blocking but the last, which blocks at most 200 us (a device blocked in its own
// wait cannot see another's bytes).
class MultiDeviceDriver : public transport::ProgressDriver {
 public:
  explicit MultiDeviceDriver(std::vector<transport::Device*> devices)
      : devices_(std::move(devices)) {}
  void Progress(absl::Duration max_block) override;
  void Wake() override;

 private:
  std::vector<transport::Device*> devices_;
};

}  // namespace plexus::collectives::internal
