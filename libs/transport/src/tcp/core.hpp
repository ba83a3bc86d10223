// TcpCore: the tcp device's engine, which tcp_device.cpp wraps as Device, Connection and
// Listener. The protocol lives in socket-free classes that it feeds: tcp::SendState (frames,
// striping, acks, completions) and tcp::ReceiveState (parsing, reassembly, matching);
// tcp/listener.* and tcp/sockets.* open the sockets. Here: epoll, the sockets and their staging
// buffers, and the device-wide backpressure across connections.
//
// Locking: one mutex per device guards every connection's state. Posts write inline when the
// socket has room (no thread hop on the fast path); the progress loop (a device thread, or the
// caller's thread in ProgressMode::kCaller) waits in epoll without the lock.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "matcher.hpp"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"
#include "plexus/transport/memory.hpp"
#include "region_registry.hpp"
#include "tcp/receive_state.hpp"
#include "tcp/send_state.hpp"

namespace plexus::transport::internal::tcp {

// At most this much is read into the staging buffer at once: it still batches many small frames
// per recv(), while the bulk of a large payload that follows a header goes straight to its
// destination instead of being copied twice (reads of up to 256 KiB staged half of a 512 KiB
// message). The rest of a payload under way is always read straight into its destination, with
// the bytes after it into the staging buffer in the same read (TcpCore::ReadPayload).
constexpr size_t kStagedReadBytes = 32 * 1024;
// What a read takes into the staging buffer after the tail of a payload of at least
// kStagedReadBytes: the next header and a little of what follows, not up to 32 KiB of the next
// payload to copy again (a stream of 64 KiB messages: ~4 KiB copied per message, not ~32 KiB).
constexpr size_t kSmallStagedReadBytes = 4 * 1024;

struct TcpConn;

struct Socket {
  TcpConn* conn = nullptr;
  int index = 0;
  int fd = -1;
  bool want_out = false;
  // Registered with the device's epoll set. A lone socket whose driver blocks in recv() leaves
  // the set while it does (DriveLoneSocket): with a receive timeout and an epoll registration
  // both on it, the kernel's wake-up costs more per message on loopback
  // (docs/measurements/rpc.md, "Where the same-CPU time goes").
  bool in_epoll = true;
  tcp::FrameQueue sendq;
  // Bytes read but not yet taken by the connection's ReceiveState (it stops at events and
  // while the socket waits).
  std::unique_ptr<uint8_t[]> rx{new uint8_t[kStagedReadBytes]};
  size_t rx_begin = 0;
  size_t rx_end = 0;
  size_t staged_read = kStagedReadBytes;  // what the next read into `rx` asks for
};

// The socket-free protocol state (send, receive) plus the sockets and clocks around it.
struct TcpConn {
  TcpConn(uint64_t id, CompletionQueue* cq, std::string peer, size_t sockets,
          const DeviceOptions& options, tcp::ReceiveConfig rx_config)
      : id(id),
        cq(cq),
        peer(std::move(peer)),
        send(cq, id, sockets, options.tcp.stripe_threshold),
        rx(std::move(rx_config), cq, &send) {}

  uint64_t id = 0;
  CompletionQueue* cq = nullptr;
  std::string peer;
  std::vector<std::unique_ptr<Socket>> sockets;
  absl::Status status;
  absl::Time last_progress = absl::Now();
  // When the frame under way began to arrive (none between frames), and rx.headers_read() then.
  std::optional<absl::Time> receiving_since;
  uint64_t headers_seen = 0;
  tcp::SendState send;
  tcp::ReceiveState rx;  // posted receives and held messages too
  // A driver is blocked in recv() on sockets[0] without the device lock; closing the fds then
  // waits for it (so that a reused fd number is never read).
  bool driver_reading = false;
  bool close_deferred = false;
};

class TcpCore {
 public:
  explicit TcpCore(const DeviceOptions& options)
      : options_(options), registry_(std::make_shared<RegionRegistry>(Backend::kTcp)) {}

  absl::Status Init();

  ~TcpCore();

  // Stops the progress thread and fails every connection: the device is going away.
  void Shutdown();

  void Wake();

  const DeviceOptions& options() const { return options_; }
  RegionRegistry& registry() { return *registry_; }

  absl::Status AddConnection(uint64_t id, std::vector<int> fds, CompletionQueue* cq,
                             std::string peer);

  // --- Operations posted by the user -------------------------------------------------------

  // `sent_now` (Connection::SendNowOrPost): set when the whole frame left within the call, in
  // which case no completion is pushed; null: a completion always follows.
  absl::Status PostSend(uint64_t id, absl::Span<const ConstBuffer> buffers, uint64_t wr_id,
                        bool* sent_now = nullptr);

  absl::Status PostRecv(uint64_t id, MutableBuffer buffer, uint64_t wr_id);
  absl::Status PostSendProduced(uint64_t id, size_t length, Producer producer, uint64_t wr_id);
  absl::Status PostRecvConsumed(uint64_t id, size_t max_length, Consumer consumer, uint64_t wr_id);
  absl::StatusOr<std::optional<size_t>> PeekNext(uint64_t id, MutableBuffer head);

  absl::Status PostWrite(uint64_t id, const MemoryRegion& local, size_t local_offset, size_t length,
                         const RegionHandle& remote, size_t remote_offset,
                         std::optional<uint32_t> immediate, uint64_t wr_id);

  void Close(uint64_t id);

  absl::Status Status(uint64_t id) const;

  // Connection::ReceivingSince: nullopt while paused for receives.
  std::optional<absl::Time> ReceivingSince(uint64_t id) const;

  // --- Progress ------------------------------------------------------------------------------

  // Caller mode with a single connection of a single socket and nothing waiting to be sent (the
  // ping-pong case): block in recv() on it directly. Returns false when the case does not apply.
  bool DriveLoneSocket();

  void Drive(absl::Duration max_block);

 private:
  // Reads the sockets that expect bytes (a posted receive, or a payload under way) when there
  // are at most kBusyPollSockets of them, all of single-socket connections; false otherwise.
  bool BusyPoll();

  TcpConn* Find(uint64_t id);
  const TcpConn* Find(uint64_t id) const;

  absl::Status Post(uint64_t id, tcp::PostedOp posted);
  // A receive posted by `post` (ReceiveState::PostRecv or PostRecvConsumed).
  absl::Status PostReceive(uint64_t id, absl::FunctionRef<absl::Status(tcp::ReceiveState&)> post);

  // Queues the frames SendState cuts the op into on the sockets, and writes what the sockets
  // accept right now.
  void Enqueue(TcpConn& conn, tcp::PostedOp& posted);

  // A small send's fast path: when the frame is next on the wire and its completion next in
  // order, it is written here in one send() and completed, with no queue entry or operation
  // record. False when that does not apply or the socket took only part of it (the bytes it took
  // are in posted.already_written; Enqueue queues the rest).
  // `complete`: push its completion (false for SendNowOrPost, whose caller is told instead).
  bool TrySendAtOnce(TcpConn& conn, tcp::PostedOp& posted, bool complete);

  void SendAcks(TcpConn& conn);

  // Writes queued segments until the socket is full; arms EPOLLOUT when it is. True when it
  // wrote bytes (and so stamped the connection's last_progress).
  bool Flush(Socket& s);

  void SetWantOut(Socket& s, bool want);

  // What epoll watches on `s`: output when queued; input unless `s` waits for room (socket 0
  // of a paused connection) or, while paused, for a stripe head that waits for room. The data
  // sockets of a paused connection still read the payloads of operations already admitted.
  void Arm(Socket& s);

  // Retries the waiting messages of paused connections after room was freed (a receive posted,
  // a held message delivered, a connection closed).
  void MaybeUnpause();

  void Unpause(TcpConn& conn);

  // What the receive state asked for when it stopped (see ReceiveState::Event).
  void OnReceiveEvent(Socket& s, tcp::ReceiveState::Event event);

  // Reads the socket and feeds its bytes to the receive state until the socket is drained or
  // the budget is spent. `drained`: the caller just saw a short read, so the socket has nothing
  // more for now.
  void Read(Socket& s, bool drained = false);

  // Reads into the staging buffer; false when nothing more can be read now. A short read means
  // the socket is drained: *drained tells the caller not to ask again until epoll says so
  // (level-triggered), saving the recv() that would only return EAGAIN.
  // The buffer is empty here: ReceiveState takes every byte unless the socket waits.
  bool Fill(Socket& s, size_t& budget, bool* drained);
  // One read of the payload under way on `s` straight into `window` (its destination), and of
  // what follows into the (empty) staging buffer; false when the socket had nothing or failed.
  bool ReadPayload(Socket& s, absl::Span<uint8_t> window, size_t& budget, bool* drained);

  // Interprets a recv() result (and its errno); false (and the connection failed where due)
  // when not > 0.
  bool Received(Socket& s, ssize_t r, int err);

  // Ends the connection: every outstanding operation completes with `why`, in order.
  void Fail(TcpConn& conn, absl::Status why);

  void ReleaseSockets(TcpConn& conn);

  // The epoll events a socket waits for now (receive unless stalled, send while queued).
  uint32_t EpollEvents(const Socket& s) const;

  // Puts the socket that left the epoll set for lone blocking drives back (before an epoll wait).
  void RejoinEpoll();

  // Checks timeouts at most every 50 ms; `now` is a clock reading the caller already took.
  void MaybeCheckTimeouts(absl::Time now);

  void CheckTimeouts(absl::Time now);

  const DeviceOptions options_;
  std::shared_ptr<RegionRegistry> registry_;
  int epfd_ = -1;
  int wakefd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> wake_pending_{false};
  std::mutex drive_mu_;  // one driver at a time
  mutable std::mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<TcpConn>> conns_;
  absl::Time last_timeout_check_ = absl::Now();
  uint32_t polls_ = 0;  // caller-mode polls (guarded by drive_mu_)
  // Consecutive blocking drives of a lone socket, and the connection whose socket left the
  // epoll set for them (0: none); both guarded by drive_mu_.
  uint32_t lone_streak_ = 0;
  uint64_t out_of_epoll_ = 0;
  HoldLimits held_limits_;
  std::shared_ptr<HoldBudget> held_budget_;
  size_t paused_conns_ = 0;  // connections in backpressure
  bool room_freed_ = false;  // since paused connections last retried
  bool unpausing_ = false;
};

}  // namespace plexus::transport::internal::tcp
