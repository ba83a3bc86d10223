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

// Connecting this rank to every other rank over device_of[r] (null for this rank), in two
// steps so that a caller can publish the records of several channels in one store exchange.
// ListenForPeers: one listener per distinct backend this rank uses, and the record peers connect
// by ("backend=address;..."). ConnectListening, with every rank's record (records[r], gathered
// by the caller): the higher rank of each pair connects and introduces itself, completions to
// `cq`; result[r] is the connection to rank r (null for this rank); errors name the peer, and
// the ranks still missing at `deadline`. A non-empty `local_address` binds this rank's tcp
// connections to it (the tcp listener listens on it, outgoing connections are made from it:
// CommunicatorOptions::channel_local_addresses); other backends ignore it.
struct PeerListeners {
  std::vector<transport::Device*> devices;
  std::vector<std::unique_ptr<transport::Listener>> listeners;
  std::vector<int> expected;  // per listener: the higher ranks that connect to it
  std::string record;
};
absl::StatusOr<PeerListeners> ListenForPeers(int rank,
                                             absl::Span<transport::Device* const> device_of,
                                             std::string_view local_address = "");
absl::StatusOr<std::vector<std::unique_ptr<transport::Connection>>> ConnectListening(
    int rank, PeerListeners& listening, absl::Span<const std::string> records,
    absl::Span<transport::Device* const> device_of, transport::CompletionQueue* cq,
    absl::Time deadline, std::string_view local_address = "");

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
