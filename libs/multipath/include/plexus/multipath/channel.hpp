// MultipathChannel: one logical link to a peer over K transport connections, one per network
// path (Maestro). Large operations are cut into chunks over disjoint sub-ranges of the user's
// buffer, each chunk goes on the path the scheduler picks, and the user gets exactly one
// completion per operation once every chunk is in place.
//
// Both peers create a channel and add the two ends of each path's connection with AddPath (in
// any order; paths may be added, lost and re-added while traffic flows). All path connections
// of one side must come from one Device in ProgressMode::kThread (Device::ConnectOnPath binds
// each path: its source address on tcp and verbs, plus its GID index and flow label on verbs),
// so that one registration serves every path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "plexus/multipath/scheduler.hpp"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/connection.hpp"
#include "plexus/transport/memory.hpp"

namespace plexus::multipath {

namespace internal {
class ChannelFactory;
class ChannelTestAccess;
}  // namespace internal

struct ChannelOptions {
  // Bytes per chunk (Maestro: 50 KB). SetChunkBytes changes it while traffic flows.
  size_t chunk_bytes = 50 * 1000;
  // The largest chunk this side accepts; sizes its receive buffers. The sender uses the smaller
  // of its chunk_bytes and the peer's max_chunk_bytes.
  size_t max_chunk_bytes = 256 * 1024;
  // Chunks in flight per path, 1..64 (Maestro: at most 8 live work requests per queue pair; a
  // path whose bandwidth-delay product exceeds 8 chunks needs more to stay full).
  int max_chunks_in_flight = 8;
  // Operations below this many bytes go whole on the lowest-RTT path (mice); 0 = never.
  size_t mice_bytes = 16 * 1024;
  // The path scheduler (plexus/multipath/scheduler.hpp): a built-in by name (MakeScheduler), or,
  // when make_scheduler is set, the one it returns (called once per channel: a MultipathDevice
  // makes a channel per connection; a null result fails Create). SetScheduler switches at run
  // time.
  std::string scheduler = "weighted";
  std::function<std::unique_ptr<Scheduler>()> make_scheduler;
  // A path with work outstanding and no completion for this long, while another path was heard
  // within the last half of that time, is declared dead; 0 = the environment's
  // PLEXUS_MULTIPATH_PATH_TIMEOUT (default 100 ms). When every path goes silent at once the
  // channel waits (a stalled process is not a broken network), up to silence_timeout.
  absl::Duration path_timeout = absl::ZeroDuration();
  // With operations outstanding and nothing heard from the peer on any path (or no live path)
  // for this long, the channel fails and they complete with Unavailable: the peer or every
  // path is gone (bytes the kernel accepted into a blackholed path never complete a send).
  absl::Duration silence_timeout = absl::Seconds(30);
  // Idle paths are probed this often (RTT, liveness).
  absl::Duration probe_interval = absl::Milliseconds(20);
  // Bytes of messages held for Recvs not posted yet; beyond half of it the receiver tells the
  // sender it is overloaded, beyond all of it the channel fails (ResourceExhausted).
  size_t max_held_bytes = size_t{256} << 20;
  // RTT inflation that counts as congestion: srtt > factor x min_rtt + slack.
  double congestion_rtt_factor = 4;
  absl::Duration congestion_rtt_slack = absl::Milliseconds(20);
  // The receiver acks each chunk on the path it arrived on and, when it has chunks of its own
  // in flight on that path (both directions loaded) and another live path has a lower RTT,
  // sends a copy of the ack there too: the sender frees the chunk's slot on the first to
  // arrive, so the ack does not wait behind the receiver's own data on a slow path (the copy on
  // the chunk's own path keeps the failure handling unchanged).
  bool ack_ahead = true;
  // Revival of dead paths without the application: when set, whenever a lane (the network path
  // a first AddPath opened; AddPath returns it) has no live or greeting path, the channel's
  // revival thread calls redial(lane) until it returns a new connection to the peer on that
  // network path, reporting to path_queue() (dial it, or accept it on a listener the peer
  // dials), and adds it to the lane: it carries chunks again once greeted. Failed tries back off
  // from reconnect_backoff, doubling up to max_reconnect_backoff. Both sides need it (one dials,
  // the other accepts). Each call should return within about max_reconnect_backoff (the
  // channel's destructor waits for a call in progress). Empty: a dead path stays dead until
  // the application calls AddPath.
  std::function<absl::StatusOr<std::unique_ptr<transport::Connection>>(int lane)> redial;
  absl::Duration reconnect_backoff = absl::Milliseconds(50);
  absl::Duration max_reconnect_backoff = absl::Seconds(1);
};

// A snapshot of one path, for tools and tests.
struct PathStats {
  int index = 0;
  int lane = 0;  // the network path: a revived path keeps its lane, gets a new index
  bool up = false;
  bool greeted = false;  // the peer's hello arrived: the path was up at some point
  std::string peer;
  uint64_t bytes_acked = 0;  // chunk payload bytes this side sent that completed on the path
  uint64_t chunks_acked = 0;
  uint64_t chunks_reposted = 0;  // chunks of this path moved to others when it died
  int in_flight = 0;
  int cap = 0;
  double bandwidth = 0;  // bytes/s
  absl::Duration srtt = absl::ZeroDuration();
  double rate_factor = 1;
  uint64_t congestion_signals = 0;  // RTT-inflation cuts of this path's rate
  std::string error;                // why it went down
};

struct ChannelStats {
  std::vector<PathStats> paths;
  uint64_t duplicates_dropped = 0;  // receiver: chunks that arrived twice (reposts), not applied
  uint64_t overload_signals = 0;    // receiver: overload messages sent
  uint64_t acks_sent_ahead = 0;     // receiver: ack copies sent on a faster path (ack_ahead)
  uint64_t paths_revived = 0;       // paths the revival thread re-established (redial)
  std::string last_redial_error;    // why the last failed redial failed
};

class MultipathChannel {
 public:
  // `user_cq` receives one completion per operation: kSend, kRecv (bytes = message length),
  // kWrite, and kRemoteWrite for a peer's Write with an immediate; connection_id is id().
  static absl::StatusOr<std::unique_ptr<MultipathChannel>> Create(
      const ChannelOptions& options, transport::CompletionQueue* user_cq);
  ~MultipathChannel();
  MultipathChannel(const MultipathChannel&) = delete;
  MultipathChannel& operator=(const MultipathChannel&) = delete;

  // The queue every path connection must report to: pass it to Device::Connect/ConnectFrom and
  // Listener::Accept for the connections given to AddPath.
  transport::CompletionQueue* path_queue();
  // Adds a connected path (new, or replacing a dead one) on a new lane; returns its index (=
  // its lane unless paths were revived). It carries traffic once the peer's greeting arrived.
  absl::StatusOr<int> AddPath(std::unique_ptr<transport::Connection> connection);

  // Sends `buffer` (any size, including 0) as one message; matched to the peer's Recvs in Send
  // order. The bytes must stay valid until the kSend completion.
  absl::Status Send(transport::ConstBuffer buffer, uint64_t wr_id);
  // Sends the concatenation of `buffers` as one message (gather, no copy: each chunk's transport
  // send takes the slices of the parts it covers). The span itself may go away on return; the
  // bytes must stay valid until the kSend completion.
  absl::Status Send(absl::Span<const transport::ConstBuffer> buffers, uint64_t wr_id);
  absl::Status Recv(transport::MutableBuffer buffer, uint64_t wr_id);
  // One-sided write of local[local_offset, +length) to remote[remote_offset, +length), in chunks
  // over all paths; with an immediate the peer gets one kRemoteWrite after every byte is placed.
  absl::Status Write(const transport::MemoryRegion& local, size_t local_offset, size_t length,
                     const transport::RegionHandle& remote, size_t remote_offset,
                     std::optional<uint32_t> immediate, uint64_t wr_id);

  // Ends the channel: every path connection is closed, outstanding operations complete with
  // Cancelled and later calls fail (Cancelled). The peer sees every path break: a channel made
  // by Create keeps its operations up to 30 s for a new path (AddPath), one made by
  // MultipathDevice fails at once with Aborted. Idempotent; never blocks on the network.
  void Close();

  // Run-time knobs: take effect for the next chunk cut.
  absl::Status SetChunkBytes(size_t bytes);
  absl::Status SetMaxChunksInFlight(int chunks);
  // Switches to the built-in scheduler `name` (MakeScheduler); the running one keeps its state
  // when it already is that built-in. InvalidArgument for an unknown name.
  absl::Status SetScheduler(std::string_view name);
  // Switches to an application's own scheduler (InvalidArgument when null).
  absl::Status SetScheduler(std::unique_ptr<Scheduler> scheduler);
  // The running scheduler's name().
  std::string scheduler() const;

  ChannelStats Stats() const;
  // Paths currently up (greeted, not failed).
  int live_paths() const;
  // OK while at least one path is up or may come back; the error once the channel failed.
  absl::Status status() const;
  uint64_t id() const;

  class Impl;

 private:
  friend class internal::ChannelFactory;
  friend class internal::ChannelTestAccess;
  explicit MultipathChannel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace plexus::multipath
