// A communicator's connection set: its devices, completion queue, progress driver, connections
// per channel and peer, and mailboxes. Built at creation (Make) and again by
// a live change of the transport or the channel count (ChangeConnections), which takes over the
// connections that do not change and swaps the set in between two collectives.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "peer_transport.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace plexus::collectives::internal {

struct ConnectionSet {
  // One device per backend in use, shm first (MultiDeviceDriver drives the last one blocking);
  // `device` is the last of them (null without peers).
  std::vector<std::shared_ptr<transport::Device>> devices;
  transport::Device* device = nullptr;
  // Caller-mode progress of the devices for `cq` (null for the caller's device and inproc,
  // whose own queue is used): it outlives a change of devices when connections are kept.
  std::unique_ptr<MultiDeviceDriver> driver;
  std::unique_ptr<transport::CompletionQueue> cq;
  // conns[channel][rank]; null for this rank.
  std::vector<std::vector<std::unique_ptr<transport::Connection>>> conns;
  absl::flat_hash_map<uint64_t, int> peer_of_connection;
  // mailboxes[rank]: the channel-0 connection's mailbox (null for this rank).
  std::vector<transport::Mailbox*> mailboxes;
  bool mailboxes_ready = false;  // every peer connection has one, and the mailbox path is on

  // Closes every connection (the peers' receives on them fail; nothing is posted on a retired
  // set).
  void Close();
  // Drives the devices' progress, blocking at most max_block (sleeps without devices).
  void Progress(absl::Duration max_block);
  // "rank 2, rank 3 (closed its connection)": the ranks (of n) with a connection that failed.
  std::string DownRanks(int n) const;
  // Every connection (each channel, each peer).
  std::vector<const transport::Connection*> Connections() const;
};

// What a connection set is built from; the same on every rank but `rank` and `peer_backend`.
struct ConnectionSpec {
  int rank = 0;
  int n = 1;
  std::vector<transport::Backend> peer_backend;  // [rank]: the backend to that rank
  // Every pair of the communicator is on shm or inproc and mailboxes are allowed
  // (PLEXUS_COLL_MAILBOX): the small-message path may be used.
  bool mailboxes = false;
  transport::DeviceOptions device_options;           // for the devices it creates
  std::shared_ptr<transport::Device> caller_device;  // Create on a caller's device: every peer
  int channels = 1;
  std::vector<std::string> channel_local_addresses;  // tcp sources per channel (may be empty)
  std::string tag;                                   // the store key of the connections' exchange
  absl::Duration timeout = absl::Seconds(10);
  // keep[c][r]: channel c to rank r is taken over from the current set, not connected (a live
  // change; the same on both ranks of the pair). Empty: connect every channel to every peer.
  std::vector<std::vector<bool>> keep;
};

// The backend of every pair of ranks [a][b] (the diagonal: `base`): a pure function of inputs
// that are equal on every rank, so every rank derives the same matrix.
std::vector<std::vector<transport::Backend>> PairBackends(TransportPolicy policy,
                                                          transport::Backend base,
                                                          const std::vector<std::string>& hosts);

// The devices of `spec` (the caller's, or one per backend this rank uses, taken from `reuse`
// when one of that backend is there, else created).
absl::Status OpenDevices(const ConnectionSpec& spec,
                         absl::Span<const std::shared_ptr<transport::Device>> reuse,
                         ConnectionSet* set);
// A completion queue over set->devices (and its driver, except for the caller's device and
// inproc). Nothing without peers.
void MakeQueue(const ConnectionSpec& spec, ConnectionSet* set);
// set->mailboxes: every peer's channel-0 mailbox when spec.mailboxes and every one has one.
void FindMailboxes(const ConnectionSpec& spec, ConnectionSet* set);

// Judges every rank's note (ConnectAll): an error stops every rank before any connection.
using NoteCheck = std::function<absl::Status(absl::Span<const std::string> notes)>;

// Connects every channel to every peer but the pairs spec.keep leaves alone (set->conns holds
// null there) over the devices OpenDevices opened, completions to `cq` (collective: every rank
// calls it with the same spec.tag). One store exchange for all channels carries each rank's
// listening addresses, whether `opened` (OpenDevices' result) is OK (a rank whose devices did
// not open fails every rank at once, named), and `note`, which `check` then judges on every
// rank alike. Errors name the rank or peer; spec.timeout bounds it. Mailboxes: FindMailboxes.
absl::Status ConnectAll(transport::Rendezvous& rendezvous, const ConnectionSpec& spec,
                        ConnectionSet* set, transport::CompletionQueue* cq,
                        const absl::Status& opened = absl::OkStatus(), std::string_view note = "",
                        const NoteCheck& check = nullptr);

}  // namespace plexus::collectives::internal
