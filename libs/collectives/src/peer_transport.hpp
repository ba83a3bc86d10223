// One transport per peer: which backend connects each pair of ranks, and the connections over
// several devices (shm to the ranks of this host, tcp or verbs to the others).
#pragma once

#include <memory>
#include <mutex>
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

// Connecting this rank to every other rank over device_of[r] (null for this rank, and for a
// rank this call leaves alone: a live change keeps that pair's connection), in two steps so
// that a caller can publish the records of several channels in one store exchange. Both ranks
// of a pair must agree on whether it is connected.
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

// Caller-mode progress of a communicator's devices for its one completion queue. With one
// device it is that device's own progress; with several, each pass drives every device without
// blocking but the last, which blocks at most 200 us (a device blocked in its own wait cannot
// see another's bytes). The devices can change (SetDevices) while the queue and the connections
// on it stay: a live change that keeps some connections and adds a backend.
class MultiDeviceDriver : public transport::ProgressDriver {
 public:
  explicit MultiDeviceDriver(std::vector<transport::Device*> devices)
      : devices_(std::move(devices)) {}
  // Progress runs on the thread that calls SetDevices (the one running collectives); Wake may
  // come from a backend's thread, hence the lock there.
  void Progress(absl::Duration max_block) override;
  void Wake() override;
  void SetDevices(std::vector<transport::Device*> devices);

 private:
  std::mutex mu_;  // guards devices_ against Wake while SetDevices writes it
  std::vector<transport::Device*> devices_;
};

}  // namespace plexus::collectives::internal
