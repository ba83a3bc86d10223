// MultipathDevice: a transport::Device whose connections are MultipathChannels over K tcp or
// verbs paths, so that code written against Device/Connection (a collectives communicator, rpc)
// runs over several network paths unchanged.
//
//   pm::MultipathDeviceOptions o;
//   o.local_addresses = {"10.77.1.1", "10.77.2.1"};        // path k leaves from this IP
//   auto device = *pm::MultipathDevice::Create(o);
//   auto listener = *device->Listen("");                   // "mp:10.77.1.1:41000,10.77.2.1"
//   auto conn = *peer_device->Connect(listener->address(), &cq);   // on the peer
//
// Composite address: "mp:IP0:PORT,IP1,...,IPK-1". IP0:PORT is the listener on path 0's address
// that takes set-up requests; IPk is path k's address on the listening side. A connection is set
// up over a short-lived control connection on path 0: the connector asks for K paths, the
// listener opens one ephemeral listener per path address for this connection alone and names
// them, and the connector opens path k from its local_addresses[k] to the listener's path k (so
// concurrent connectors can never mix up their paths). Both sides need the same K. The control
// connection serves set-up only; a path that dies later is redialed by the connector to the
// path listener the listening side keeps for the connection (revive_paths), so no path,
// path 0 included, is special after set-up.
//
// A connection's operations map one to one onto the channel's: PostSend -> Send (gathered, no
// copy), PostRecv -> Recv, PostWrite -> Write, each with exactly one completion carrying the
// caller's wr_id, the message or write length in `bytes`, and the Connection's id(). The
// transport contract holds (tests/multipath/device_test.cpp), with two differences: the
// connection fails only when every path is down (the peer's Close: Aborted; otherwise
// Unavailable, naming each path's error), and after a failure messages that had arrived whole
// are not delivered to later receives (the channel refuses new calls at once).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/multipath/channel.hpp"
#include "plexus/transport/device.hpp"

namespace plexus::multipath {

namespace internal {
struct DeviceRegistry;
}  // namespace internal

// A path's settings beyond its source address, for the verbs backend (one RC queue pair per
// path); tcp takes only the defaults.
struct PathOptions {
  // The queue pair's source GID table index; -1 = the GID of the path's local address (its
  // RoCE v2 entry where the port has one). An explicit index must hold that address.
  int gid_index = -1;
  // The flow label of the path's queue pair, at most 20 bits (transport::kMaxFlowLabel). RoCE v2
  // NICs derive the UDP source port from it, which ECMP switches hash. nullopt = a label from
  // DefaultFlowLabels (distinct per path of a connection, drawn anew per connection, kept when
  // the path is redialed); 0 = the NIC's own choice (mlx5, rxe: from the queue pair numbers).
  std::optional<uint32_t> flow_label;
};

// The flow labels of K paths when PathOptions::flow_label is unset: non-zero, 20 bits, with
// pairwise distinct RoCE v2 UDP source ports (transport::RoceV2SourcePort), so that ECMP can
// spread the paths; a pure function of (paths, seed).
std::vector<uint32_t> DefaultFlowLabels(int paths, uint64_t seed);

struct MultipathDeviceOptions {
  // The local IP address (IPv4 or IPv6, numeric) of each path, in path order (K = size, at least
  // 1). Sockets of path k bind to local_addresses[k], so routing (or a source rule, as tools/netbed
  // sets up) picks the path. Listen binds there too. The peer must have the same number of paths.
  std::vector<std::string> local_addresses;
  // verbs: the GID index and flow label of each path, in path order: empty (every path takes
  // the defaults) or one entry per local_addresses entry. With tcp, every entry must be the
  // default (InvalidArgument naming the path and field otherwise).
  std::vector<PathOptions> path_options;
  // Settings of every connection's channel (chunk size, scheduler, path timeout, ...;
  // channel.redial is ignored: see revive_paths).
  ChannelOptions channel;
  // A dead path comes back by itself: the connector redials it (from local_addresses[k] to the
  // listener's path-k address, which the listener keeps open for the connection's lifetime),
  // with channel.reconnect_backoff doubling up to channel.max_reconnect_backoff between tries,
  // and the channel resumes chunks on it once greeted. No Accept call is involved, so losing
  // path 0 is no different from losing any other. Closing a connection may wait for a redial
  // in progress: up to device.connect_timeout on the connector, max_reconnect_backoff on the
  // listener. false: a dead path stays dead for the connection's lifetime.
  bool revive_paths = true;
  // The inner device that carries every path: backend kTcp or kVerbs (one RDMA device holding
  // every path's address: one protection domain, so one registration serves every path, as
  // Maestro's one PD for all queue pairs) and progress kThread (the channel's own thread
  // consumes the path completions); local_address is set to local_addresses[0] (for verbs it
  // picks the RDMA device). connect_timeout bounds a whole Connect or Accept set-up; op_timeout
  // ends a path whose peer stopped reading.
  transport::DeviceOptions device;
};

// Each path's transport::PathBinding for a connection: local_addresses[k], path_options[k]
// (or the defaults), the flow label from `default_labels` where path_options leaves it unset.
// Verbs only gets GIDs and labels: for tcp every binding is the address alone.
std::vector<transport::PathBinding> PathBindings(const MultipathDeviceOptions& options,
                                                 const std::vector<uint32_t>& default_labels);

class MultipathDevice : public transport::Device {
 public:
  // InvalidArgument naming the field for an empty or malformed local_addresses entry, a backend
  // other than tcp or verbs, kCaller progress, path_options of another size than
  // local_addresses or with a flow label over 20 bits or a gid_index below -1 (naming the path),
  // GID or flow label settings on tcp, or ChannelOptions that MultipathChannel::Create rejects.
  // The devices of both peers must have the same backend.
  static absl::StatusOr<std::shared_ptr<MultipathDevice>> Create(
      const MultipathDeviceOptions& options);

  // Parses a composite address; InvalidArgument naming the entry and what is wrong with it.
  struct Address {
    std::string control;             // "IP0:PORT" ("[IP0]:PORT" for IPv6)
    std::vector<std::string> hosts;  // IP of each path (no brackets), hosts[0] = IP0
  };
  static absl::StatusOr<Address> ParseAddress(std::string_view address);

  // The multipath channel of a connection made by a MultipathDevice, for statistics and run-time
  // knobs; null for any other connection.
  static MultipathChannel* ChannelOf(transport::Connection& connection);

  // Payload bytes this side sent that completed on each path (PathStats::bytes_acked), summed
  // over the device's open connections; index k is path k.
  std::vector<uint64_t> PathBytesAcked() const;
  // A snapshot of every open connection's channel (paths, in-flight chunks, caps, RTTs).
  std::vector<ChannelStats> Stats() const;

  transport::Backend backend() const override;
  int paths() const { return static_cast<int>(options_.local_addresses.size()); }
  const MultipathDeviceOptions& multipath_options() const { return options_; }

  // Registers with the inner device: the region serves every path, and handles name it.
  absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> Register(
      void* data, size_t bytes, transport::MemoryKind kind = transport::MemoryKind::kHost) override;

  // `address` "" listens on an ephemeral port of local_addresses[0]; otherwise a composite
  // address whose IPs are this device's local_addresses (in order) and whose port is the one to
  // use (0 = ephemeral). The listener reports the composite address to give to peers. Its
  // Accept(cq, timeout) waits up to `timeout` for a connector, then blocks up to the device's
  // connect_timeout for the set-up (every path connected and greeted); errors name the step and
  // the peer (a peer with a different number of paths: FailedPrecondition).
  absl::StatusOr<std::unique_ptr<transport::Listener>> Listen(std::string_view address) override;

  // Blocks until the K paths are connected and greeted by the peer, at most connect_timeout.
  // InvalidArgument for a malformed composite address (naming the entry) or one whose number of
  // paths differs from this device's; Unavailable / DeadlineExceeded naming the path and
  // address when a path cannot be set up; FailedPrecondition when the peer refuses (its reason).
  absl::StatusOr<std::unique_ptr<transport::Connection>> Connect(
      std::string_view address, transport::CompletionQueue* cq) override;

  // Paths choose their own sources: each path's binding comes from local_addresses and
  // path_options, so only an empty PathBinding (plain Connect / Listen; ConnectFrom "") is
  // accepted (InvalidArgument otherwise).
  absl::StatusOr<std::unique_ptr<transport::Connection>> ConnectOnPath(
      const transport::PathBinding& path, std::string_view address,
      transport::CompletionQueue* cq) override;
  absl::StatusOr<std::unique_ptr<transport::Listener>> ListenOnPath(
      const transport::PathBinding& path, std::string_view address) override;

 protected:
  void DriveProgress(absl::Duration) override {}  // kThread only: nothing to drive

 private:
  MultipathDevice(MultipathDeviceOptions options, std::shared_ptr<transport::Device> inner);

  MultipathDeviceOptions options_;
  std::shared_ptr<transport::Device> inner_;
  std::shared_ptr<internal::DeviceRegistry> registry_;  // the open connections' channels
};

}  // namespace plexus::multipath
