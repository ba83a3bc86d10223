// tcp: non-blocking sockets driven by epoll, writev/readv straight from and into the caller's
// buffers, TCP_NODELAY, optional several sockets per connection with large operations striped
// across them, and binding to a chosen local address so that a multipath layer can pick the path.
//
// Locking: one mutex per device guards every connection's state. Posts write inline when the
// socket has room (no thread hop on the fast path); the progress loop (a device thread, or the
// caller's thread in ProgressMode::kCaller) waits in epoll without the lock.
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "backends.hpp"
#include "cuda_copy.hpp"
#include "make_completion.hpp"
#include "matcher.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "region_registry.hpp"
#include "tcp/frame.hpp"
#include "tcp/listener.hpp"
#include "tcp/protocol.hpp"

namespace plexus::transport::internal {

namespace net = base::net;
namespace tcp {
// The backend's socket helpers live in the base layer (plexus/base/net.hpp).
using net::ErrnoStatus;
using net::SetNonBlocking;
}  // namespace tcp

namespace {

using tcp::FrameHeader;
using tcp::FrameType;

// Payload bytes still to come above this go straight from the socket into their destination.
constexpr size_t kDirectReadBytes = 32 * 1024;
// At most this much is read into the staging buffer at once: it still batches many small frames
// per recv(), while the bulk of a large payload that follows a header goes straight to its
// destination instead of being copied twice (reads of up to 256 KiB staged half of a 512 KiB
// message).
constexpr size_t kStagedReadBytes = kDirectReadBytes;
// What is left of one staged read (a partial frame) plus the next one.
constexpr size_t kRxBufferBytes = 2 * kStagedReadBytes;
// Bytes read from one socket before giving the others a turn.
constexpr size_t kReadBudgetBytes = 8 << 20;
constexpr int kMaxIov = 512;
// Longest a caller-mode driver blocks in recv() before it looks at timeouts and wake-ups again.
constexpr absl::Duration kLoneSocketTick = absl::Milliseconds(10);
// Caller-mode polls that find at most this many sockets expecting bytes read them directly
// (recv with MSG_DONTWAIT) instead of asking epoll first: one system call per arriving message
// instead of two. Every kEpollEvery-th poll still goes through epoll, which sees everything else
// (unexpected messages, hang-ups) and checks timeouts.
constexpr size_t kBusyPollSockets = 2;
constexpr uint32_t kEpollEvery = 8;

// One of our operations in flight: a send (done when written) or a write (done when acked).
struct OutOp {
  Opcode opcode = Opcode::kSend;
  uint64_t wr_id = 0;
  size_t bytes = 0;
  int segments_left = 0;
  bool written = false;
  bool acked = false;
  std::vector<uint8_t> staging;  // host copy of a CUDA source
  bool done() const { return written && (opcode == Opcode::kSend || acked); }
};

// Bytes queued on one socket: a header and a slice of an op's payload.
struct Segment {
  uint8_t header[tcp::kFrameHeaderSize];
  std::vector<iovec> payload;
  size_t total = 0;  // header + payload bytes
  size_t sent = 0;
  std::shared_ptr<OutOp> op;  // null for control frames (acks)
};

// A peer's operation being received, in arrival order.
struct InOp {
  bool is_message = true;
  bool has_immediate = false;
  uint32_t immediate = 0;
  size_t length = 0;
  size_t remaining = 0;   // bytes not yet placed
  size_t parts_left = 1;  // payload parts (one per socket when striped) not yet read
  // Message: the matched receive's buffer, or bytes held until one is posted.
  Matcher::Slot slot;
  // Write: where the bytes land (host), or a host staging buffer for a CUDA region.
  uint8_t* target = nullptr;
  MemoryKind target_kind = MemoryKind::kHost;
  std::vector<uint8_t> staging;

  bool placed() const { return remaining == 0 && parts_left == 0; }
  // Where the bytes go, fixed on arrival: the slot's buffer, the write's target, or `staging`
  // for a CUDA target.
  uint8_t* base = nullptr;
};

struct TcpConn;

struct Socket {
  TcpConn* conn = nullptr;
  int index = 0;
  int fd = -1;
  bool want_out = false;
  std::deque<Segment> sendq;
  // Receive state.
  std::unique_ptr<uint8_t[]> rx{new uint8_t[kRxBufferBytes]};
  size_t rx_begin = 0;
  size_t rx_end = 0;
  // kParked: a stripe part waits for its head. kAwaitRoom (socket 0): the message whose header
  // was just read does not fit under the caps on held bytes; the connection is not read from
  // until receives are posted or held messages are delivered.
  enum class Phase { kHeader, kPayload, kParked, kAwaitRoom } phase = Phase::kHeader;
  FrameHeader header;
  InOp* op = nullptr;        // op the current payload belongs to
  size_t offset = 0;         // where the current payload goes in op
  size_t remaining = 0;      // payload bytes of the current frame still to read
  uint64_t next_stripe = 0;  // sockets 1..n-1: stripe number of the next part
};

struct TcpConn {
  uint64_t id = 0;
  CompletionQueue* cq = nullptr;
  std::string peer;
  std::vector<std::unique_ptr<Socket>> sockets;
  absl::Status status;
  absl::Time last_progress = absl::Now();
  std::deque<std::shared_ptr<OutOp>> out_ops;
  std::deque<std::shared_ptr<OutOp>> awaiting_ack;
  std::deque<std::unique_ptr<InOp>> in_ops;
  std::unique_ptr<Matcher> matcher;  // posted receives, held messages
  bool paused = false;               // sockets[0] is in kAwaitRoom; no socket is read
  uint64_t stripes_sent = 0;
  uint64_t stripe_heads_received = 0;
  absl::flat_hash_map<uint64_t, InOp*> stripes;  // stripe number -> op, until placed
  uint64_t acks_owed = 0;
  // A driver is blocked in recv() on sockets[0] without the device lock; closing the fds then
  // waits for it (so that a reused fd number is never read).
  bool driver_reading = false;
  bool close_deferred = false;
};

uint64_t EpollKey(uint64_t conn_id, int socket_index) {
  return (conn_id << 8) | static_cast<uint64_t>(socket_index);
}
constexpr uint64_t kWakeKey = ~uint64_t{0};

class TcpCore {
 public:
  explicit TcpCore(const DeviceOptions& options)
      : options_(options), registry_(std::make_shared<RegionRegistry>(Backend::kTcp)) {}

  absl::Status Init() {
    PLEXUS_ASSIGN_OR_RETURN(held_limits_, ResolveHoldLimits(options_));
    held_budget_ = std::make_shared<HoldBudget>(held_limits_.per_device);
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) return tcp::ErrnoStatus(errno, "epoll_create1");
    wakefd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wakefd_ < 0) return tcp::ErrnoStatus(errno, "eventfd");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeKey;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev) < 0) {
      return tcp::ErrnoStatus(errno, "epoll_ctl(eventfd)");
    }
    if (options_.progress == ProgressMode::kThread) {
      thread_ = std::thread([this] {
        while (!stop_.load(std::memory_order_acquire)) Drive(absl::Milliseconds(100));
      });
    }
    return absl::OkStatus();
  }

  ~TcpCore() {
    if (epfd_ >= 0) close(epfd_);
    if (wakefd_ >= 0) close(wakefd_);
  }

  // Stops the progress thread and fails every connection: the device is going away.
  void Shutdown() {
    stop_.store(true, std::memory_order_release);
    Wake();
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, conn] : conns_) {
      Fail(*conn, absl::CancelledError("the tcp device was destroyed"));
      ReleaseSockets(*conn);
    }
    conns_.clear();
  }

  void Wake() {
    wake_pending_.store(true, std::memory_order_release);
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wakefd_, &one, sizeof one);
  }

  const DeviceOptions& options() const { return options_; }
  RegionRegistry& registry() { return *registry_; }

  absl::Status AddConnection(uint64_t id, std::vector<int> fds, CompletionQueue* cq,
                             std::string peer) {
    auto conn = std::make_shared<TcpConn>();
    conn->id = id;
    conn->cq = cq;
    conn->peer = std::move(peer);
    conn->matcher = std::make_unique<Matcher>(
        MatcherConfig{.backend = "tcp",
                      .peer = conn->peer,
                      .connection_cap = held_limits_.per_connection,
                      .device = held_budget_,
                      .max_spare_bytes = SpareBytesFor(held_limits_.per_connection),
                      .deliver_eagerly = false},
        [this, c = conn.get()](uint64_t wr_id, absl::Status status, size_t bytes) {
          Complete(*c, Opcode::kRecv, wr_id, std::move(status), bytes);
        });
    for (size_t i = 0; i < fds.size(); ++i) {
      auto s = std::make_unique<Socket>();
      s->conn = conn.get();
      s->index = static_cast<int>(i);
      s->fd = fds[i];
      const int one = 1;
      setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      // The socket stays in blocking mode: every send and receive passes MSG_DONTWAIT, except
      // the caller-mode wait of a lone socket (DriveLoneSocket), which blocks in recv() itself
      // instead of epoll_wait() + recv(): one system call less per message. SO_RCVTIMEO bounds
      // that wait so that timeouts are still checked.
      PLEXUS_RETURN_IF_ERROR(tcp::SetNonBlocking(s->fd, false));
      const timeval tick = absl::ToTimeval(kLoneSocketTick);
      setsockopt(s->fd, SOL_SOCKET, SO_RCVTIMEO, &tick, sizeof tick);
      conn->sockets.push_back(std::move(s));
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : conn->sockets) {
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u64 = EpollKey(id, s->index);
      if (epoll_ctl(epfd_, EPOLL_CTL_ADD, s->fd, &ev) < 0) {
        return tcp::ErrnoStatus(errno, "epoll_ctl(add socket)");
      }
    }
    conns_[id] = std::move(conn);
    return absl::OkStatus();
  }

  // --- Operations posted by the user -------------------------------------------------------

  absl::Status PostSend(uint64_t id, absl::Span<const ConstBuffer> buffers, uint64_t wr_id) {
    size_t total = 0;
    for (const ConstBuffer& b : buffers) {
      if (b.data == nullptr && b.size > 0)
        return absl::InvalidArgumentError("PostSend: null buffer");
      total += b.size;
    }
    if (total > options_.max_message_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("PostSend: message of ", total,
                                                     " bytes exceeds max_message_bytes (",
                                                     options_.max_message_bytes, ")"));
    }
    std::lock_guard<std::mutex> lock(mu_);
    TcpConn* conn = Find(id);
    if (conn == nullptr) return absl::FailedPreconditionError("connection is closed");
    PLEXUS_RETURN_IF_ERROR(conn->status);
    auto op = std::make_shared<OutOp>();
    op->opcode = Opcode::kSend;
    op->wr_id = wr_id;
    op->bytes = total;
    std::vector<iovec> iov;
    iov.reserve(buffers.size());
    for (const ConstBuffer& b : buffers) {
      if (b.size > 0) iov.push_back({const_cast<void*>(b.data), b.size});
    }
    FrameHeader h;
    h.type = FrameType::kMessage;
    h.length = total;
    Enqueue(*conn, op, h, std::move(iov));
    return absl::OkStatus();
  }

  absl::Status PostRecv(uint64_t id, MutableBuffer buffer, uint64_t wr_id) {
    if (buffer.data == nullptr && buffer.size > 0) {
      return absl::InvalidArgumentError("PostRecv: null buffer");
    }
    std::lock_guard<std::mutex> lock(mu_);
    TcpConn* conn = Find(id);
    if (conn == nullptr) return absl::FailedPreconditionError("connection is closed");
    Matcher& m = *conn->matcher;
    if (!conn->status.ok() && !m.has_unclaimed()) return conn->status;  // after whole messages
    if (absl::Status s = m.PostRecv(buffer, wr_id); !s.ok()) {
      Fail(*conn, s);
      return absl::OkStatus();
    }
    ReleaseInbound(*conn);
    if (conn->paused) room_freed_ = true;  // the waiting message may go into this receive
    MaybeUnpause();
    return absl::OkStatus();
  }

  absl::Status PostWrite(uint64_t id, const MemoryRegion& local, size_t local_offset, size_t length,
                         const RegionHandle& remote, size_t remote_offset,
                         std::optional<uint32_t> immediate, uint64_t wr_id) {
    PLEXUS_RETURN_IF_ERROR(CheckLocalRange(local, local_offset, length));
    if (remote.backend != Backend::kTcp) {
      return absl::InvalidArgumentError(absl::StrCat("PostWrite: remote handle is for backend ",
                                                     std::string(BackendName(remote.backend))));
    }
    if (remote_offset > remote.length || length > remote.length - remote_offset) {
      return absl::OutOfRangeError(absl::StrCat("PostWrite: ", length, " bytes at offset ",
                                                remote_offset, " exceed the remote region of ",
                                                remote.length, " bytes"));
    }
    auto op = std::make_shared<OutOp>();
    op->opcode = Opcode::kWrite;
    op->wr_id = wr_id;
    op->bytes = length;
    const uint8_t* src = static_cast<const uint8_t*>(local.data()) + local_offset;
    if (local.kind() == MemoryKind::kCuda && length > 0) {
      op->staging.resize(length);
      PLEXUS_RETURN_IF_ERROR(CopyCudaToHost(op->staging.data(), src, length));
      src = op->staging.data();
    }
    std::lock_guard<std::mutex> lock(mu_);
    TcpConn* conn = Find(id);
    if (conn == nullptr) return absl::FailedPreconditionError("connection is closed");
    PLEXUS_RETURN_IF_ERROR(conn->status);
    FrameHeader h;
    h.type = FrameType::kWrite;
    h.length = length;
    h.a = remote.id;
    h.b = remote_offset;
    if (immediate.has_value()) {
      h.flags = tcp::kFlagImmediate;
      h.immediate = *immediate;
    }
    std::vector<iovec> iov;
    if (length > 0) iov.push_back({const_cast<uint8_t*>(src), length});
    conn->awaiting_ack.push_back(op);
    Enqueue(*conn, op, h, std::move(iov));
    return absl::OkStatus();
  }

  void Close(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    TcpConn& conn = *it->second;
    // Tell the peer this is a deliberate close, not a death: best effort, and only between
    // frames (a half-sent frame is cut off and the peer sees a truncated stream instead).
    Socket& control = *conn.sockets[0];
    if (conn.status.ok() && control.sendq.empty()) {
      uint8_t frame[tcp::kFrameHeaderSize];
      FrameHeader h;
      h.type = FrameType::kClose;
      tcp::EncodeFrameHeader(h, frame);
      [[maybe_unused]] ssize_t n =
          send(control.fd, frame, sizeof frame, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    Fail(conn, absl::CancelledError("connection closed locally"));
    ReleaseSockets(*it->second);
    conns_.erase(it);  // frees its held messages
    MaybeUnpause();
  }

  absl::Status Status(uint64_t id) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = conns_.find(id);
    if (it == conns_.end()) return absl::CancelledError("connection closed locally");
    return it->second->status;
  }

  // --- Progress ------------------------------------------------------------------------------

  // Caller mode with a single connection of a single socket and nothing waiting to be sent (the
  // ping-pong case): block in recv() on it directly. Returns false when the case does not apply.
  bool DriveLoneSocket() {
    std::shared_ptr<TcpConn> conn;
    Socket* s = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (conns_.size() != 1 || wake_pending_.load(std::memory_order_acquire)) return false;
      conn = conns_.begin()->second;
      if (!conn->status.ok() || conn->sockets.size() != 1) return false;
      s = conn->sockets[0].get();
      if (!s->sendq.empty() || s->phase == Socket::Phase::kParked || conn->paused ||
          s->rx_end > s->rx_begin || s->fd < 0) {
        return false;
      }
      s->rx_begin = s->rx_end = 0;
      conn->driver_reading = true;
    }
    // Only this thread (it holds drive_mu_) reads sockets, so the staging buffer is ours.
    const ssize_t r = recv(s->fd, s->rx.get(), kStagedReadBytes, 0);
    const int err = errno;
    std::lock_guard<std::mutex> lock(mu_);
    conn->driver_reading = false;
    if (conn->close_deferred) {
      conn->close_deferred = false;
      ReleaseSockets(*conn);
      return true;
    }
    if (!conn->status.ok()) return true;
    if (r > 0) {
      s->rx_end = static_cast<size_t>(r);
      conn->last_progress = absl::Now();
      Read(*s, /*drained=*/static_cast<size_t>(r) < kStagedReadBytes);
      if (conn->status.ok()) SendAcks(*conn);
    } else if (r == 0) {
      Fail(*conn,
           absl::UnavailableError(absl::StrCat("tcp peer ", conn->peer, " closed the connection")));
    } else if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR) {
      Fail(*conn, tcp::ErrnoStatus(err, absl::StrCat("tcp receive from ", conn->peer)));
    }
    MaybeUnpause();
    const absl::Time now = absl::Now();
    if (now - last_timeout_check_ > absl::Milliseconds(50)) {
      last_timeout_check_ = now;
      CheckTimeouts(now);
    }
    return true;
  }

  void Drive(absl::Duration max_block) {
    std::unique_lock<std::mutex> driving(drive_mu_, std::try_to_lock);
    if (!driving.owns_lock()) return;
    if (options_.progress == ProgressMode::kCaller && max_block >= kLoneSocketTick &&
        DriveLoneSocket()) {
      return;
    }
    if (options_.progress == ProgressMode::kCaller && max_block <= absl::ZeroDuration() &&
        ++polls_ % kEpollEvery != 0 && BusyPoll()) {
      return;
    }
    wake_pending_.store(false, std::memory_order_relaxed);
    epoll_event events[64];
    const absl::Duration block = std::min(max_block, absl::Milliseconds(100));
    timespec ts = absl::ToTimespec(std::max(block, absl::ZeroDuration()));
    int n = epoll_pwait2(epfd_, events, 64, &ts, nullptr);
    if (n < 0) n = 0;
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[i].data.u64;
      if (key == kWakeKey) {
        uint64_t drained;
        [[maybe_unused]] ssize_t r = read(wakefd_, &drained, sizeof drained);
        continue;
      }
      TcpConn* conn = Find(key >> 8);
      if (conn == nullptr || !conn->status.ok()) continue;
      const size_t index = key & 0xff;
      if (index >= conn->sockets.size()) continue;
      Socket& s = *conn->sockets[index];
      if (conn->paused && (events[i].events & (EPOLLHUP | EPOLLERR))) {
        Fail(*conn, absl::UnavailableError(absl::StrCat(
                        "tcp peer ", conn->peer,
                        " reset the connection while its messages waited for receives")));
        continue;
      }
      if (events[i].events & EPOLLOUT) Flush(s);
      if (conn->status.ok() && (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
        Read(s);
      }
      if (conn->status.ok()) SendAcks(*conn);
    }
    MaybeUnpause();
    const absl::Time now = absl::Now();
    if (now - last_timeout_check_ > absl::Milliseconds(50)) {
      last_timeout_check_ = now;
      CheckTimeouts(now);
    }
  }

 private:
  // Reads the sockets that expect bytes (a posted receive, or a payload under way) when there
  // are at most kBusyPollSockets of them, all of single-socket connections; false otherwise.
  bool BusyPoll() {
    if (wake_pending_.load(std::memory_order_acquire)) return false;
    std::lock_guard<std::mutex> lock(mu_);
    Socket* expecting[kBusyPollSockets];
    size_t count = 0;
    for (auto& [id, conn] : conns_) {
      if (!conn->status.ok() || conn->sockets.empty() || conn->paused) continue;
      Socket& s = *conn->sockets[0];
      const bool expects = conn->matcher->has_posted_recv() || s.phase != Socket::Phase::kHeader;
      if (!expects) continue;
      if (conn->sockets.size() != 1 || count == kBusyPollSockets || s.fd < 0 ||
          conn->driver_reading) {
        return false;
      }
      expecting[count++] = &s;
    }
    if (count == 0) return false;
    for (size_t i = 0; i < count; ++i) {
      TcpConn& conn = *expecting[i]->conn;
      Read(*expecting[i]);
      if (conn.status.ok()) SendAcks(conn);
    }
    MaybeUnpause();
    return true;
  }

  TcpConn* Find(uint64_t id) {
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : it->second.get();
  }
  const TcpConn* Find(uint64_t id) const {
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : it->second.get();
  }

  void Complete(TcpConn& conn, Opcode op, uint64_t wr_id, absl::Status status, size_t bytes,
                std::optional<uint32_t> immediate = std::nullopt) {
    conn.cq->Push(MakeCompletion(conn.id, op, wr_id, std::move(status), bytes, immediate));
  }

  // Queues `op` (header + payload) on the sockets, striping large payloads, and writes what the
  // sockets accept right now.
  void Enqueue(TcpConn& conn, const std::shared_ptr<OutOp>& op, FrameHeader h,
               std::vector<iovec> payload) {
    if (conn.out_ops.empty()) conn.last_progress = absl::Now();  // the clock starts now
    conn.out_ops.push_back(op);
    const size_t nsock = conn.sockets.size();
    if (nsock == 1 || h.length < options_.stripe_threshold) {
      op->segments_left = 1;
      PushSegment(*conn.sockets[0], op, h, std::move(payload));
      Flush(*conn.sockets[0]);
      return;
    }
    // Striped: a head on socket 0 carrying part 0, then part k on socket k (empty parts too:
    // every data socket sees every stripe number).
    const uint64_t stripe = conn.stripes_sent++;
    FrameHeader head = h;
    head.type = FrameType::kStripeHead;
    if (h.type == FrameType::kWrite) head.flags |= tcp::kFlagWrite;
    op->segments_left = static_cast<int>(nsock);
    for (size_t k = 0; k < nsock; ++k) {
      const tcp::StripeRange range = tcp::StripePart(h.length, nsock, k);
      std::vector<iovec> slice = Slice(payload, range.offset, range.length);
      if (k == 0) {
        PushSegment(*conn.sockets[0], op, head, std::move(slice));
      } else {
        FrameHeader p;
        p.type = FrameType::kStripePart;
        p.length = range.length;
        p.a = stripe;
        p.b = range.offset;
        PushSegment(*conn.sockets[k], op, p, std::move(slice));
      }
    }
    for (auto& s : conn.sockets) {
      if (conn.status.ok()) Flush(*s);
    }
  }

  static std::vector<iovec> Slice(const std::vector<iovec>& iov, size_t offset, size_t length) {
    std::vector<iovec> out;
    for (const iovec& v : iov) {
      if (length == 0) break;
      if (offset >= v.iov_len) {
        offset -= v.iov_len;
        continue;
      }
      const size_t take = std::min(v.iov_len - offset, length);
      out.push_back({static_cast<uint8_t*>(v.iov_base) + offset, take});
      length -= take;
      offset = 0;
    }
    return out;
  }

  static void PushSegment(Socket& s, const std::shared_ptr<OutOp>& op, const FrameHeader& h,
                          std::vector<iovec> payload) {
    Segment seg;
    tcp::EncodeFrameHeader(h, seg.header);
    seg.total = tcp::kFrameHeaderSize;
    for (const iovec& v : payload) seg.total += v.iov_len;
    seg.payload = std::move(payload);
    seg.op = op;
    s.sendq.push_back(std::move(seg));
  }

  void SendAcks(TcpConn& conn) {
    if (conn.acks_owed == 0) return;
    FrameHeader h;
    h.type = FrameType::kWriteAck;
    h.a = conn.acks_owed;
    conn.acks_owed = 0;
    PushSegment(*conn.sockets[0], nullptr, h, {});
    Flush(*conn.sockets[0]);
  }

  // Writes queued segments until the socket is full; arms EPOLLOUT when it is.
  void Flush(Socket& s) {
    TcpConn& conn = *s.conn;
    while (!s.sendq.empty()) {
      iovec iov[kMaxIov];
      int n = 0;
      for (auto it = s.sendq.begin(); it != s.sendq.end() && n < kMaxIov - 1; ++it) {
        size_t skip = it->sent;
        if (skip < tcp::kFrameHeaderSize) {
          iov[n++] = {it->header + skip, tcp::kFrameHeaderSize - skip};
          skip = 0;
        } else {
          skip -= tcp::kFrameHeaderSize;
        }
        for (const iovec& v : it->payload) {
          if (n == kMaxIov) break;
          if (skip >= v.iov_len) {
            skip -= v.iov_len;
            continue;
          }
          iov[n++] = {static_cast<uint8_t*>(v.iov_base) + skip, v.iov_len - skip};
          skip = 0;
        }
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      const ssize_t w = sendmsg(s.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          SetWantOut(s, true);
          return;
        }
        Fail(conn, tcp::ErrnoStatus(errno, absl::StrCat("tcp send to ", conn.peer)));
        return;
      }
      conn.last_progress = absl::Now();
      size_t written = static_cast<size_t>(w);
      while (written > 0) {
        Segment& seg = s.sendq.front();
        const size_t take = std::min(written, seg.total - seg.sent);
        seg.sent += take;
        written -= take;
        if (seg.sent == seg.total) {
          std::shared_ptr<OutOp> op = std::move(seg.op);
          s.sendq.pop_front();
          if (op && --op->segments_left == 0) {
            op->written = true;
            ReleaseOutbound(conn);
          }
        }
      }
    }
    SetWantOut(s, false);
  }

  void SetWantOut(Socket& s, bool want) {
    if (s.want_out == want) return;
    s.want_out = want;
    Arm(s);
  }

  // What epoll watches on `s`: output when queued; input unless `s` waits for room (socket 0
  // of a paused connection) or, while paused, for a stripe head that waits for room. The data
  // sockets of a paused connection still read the payloads of operations already admitted.
  void Arm(Socket& s) {
    if (!s.conn->status.ok() || s.fd < 0) return;
    const bool stalled = s.phase == Socket::Phase::kAwaitRoom ||
                         (s.conn->paused && s.phase == Socket::Phase::kParked);
    epoll_event ev{};
    ev.events = (stalled ? uint32_t{0} : uint32_t{EPOLLIN | EPOLLRDHUP}) |
                (s.want_out ? uint32_t{EPOLLOUT} : uint32_t{0});
    ev.data.u64 = EpollKey(s.conn->id, s.index);
    epoll_ctl(epfd_, EPOLL_CTL_MOD, s.fd, &ev);
  }

  // Backpressure: stop reading from `conn` until its waiting message fits (the peer's sends
  // block once the socket buffers are full).
  void Pause(Socket& s) {
    TcpConn& conn = *s.conn;
    s.phase = Socket::Phase::kAwaitRoom;
    conn.paused = true;
    ++paused_conns_;
    for (auto& other : conn.sockets) Arm(*other);
  }

  // Retries the waiting messages of paused connections after room was freed (a receive posted,
  // a held message delivered, a connection closed).
  void MaybeUnpause() {
    if (!room_freed_ || paused_conns_ == 0 || unpausing_) return;
    unpausing_ = true;
    while (room_freed_ && paused_conns_ > 0) {
      room_freed_ = false;
      std::vector<TcpConn*> paused;
      for (auto& [id, conn] : conns_) {
        if (conn->paused) paused.push_back(conn.get());
      }
      for (TcpConn* conn : paused) Unpause(*conn);
    }
    unpausing_ = false;
  }

  void Unpause(TcpConn& conn) {
    Socket& s = *conn.sockets[0];
    if (!conn.paused || !conn.status.ok()) return;
    conn.paused = false;
    --paused_conns_;
    s.phase = Socket::Phase::kHeader;
    OnHeader(s);  // the header read before the pause, again: it may pause once more
    if (conn.paused || !conn.status.ok()) return;
    for (auto& other : conn.sockets) Arm(*other);
    // Bytes may wait in the staging buffers already: epoll would not report them.
    for (auto& other : conn.sockets) {
      if (conn.status.ok()) Read(*other);
    }
    if (conn.status.ok()) SendAcks(conn);
  }

  // Completes our operations in posting order.
  void ReleaseOutbound(TcpConn& conn) {
    while (!conn.out_ops.empty() && conn.out_ops.front()->done()) {
      std::shared_ptr<OutOp> op = std::move(conn.out_ops.front());
      conn.out_ops.pop_front();
      Complete(conn, op->opcode, op->wr_id, absl::OkStatus(), op->bytes);
    }
  }

  // Reads and dispatches frames until the socket is drained or the budget is spent.
  // `drained`: the caller just saw a short read, so the socket has nothing more for now.
  void Read(Socket& s, bool drained = false) {
    TcpConn& conn = *s.conn;
    size_t budget = kReadBudgetBytes;
    while (conn.status.ok() && budget > 0) {
      if (s.phase == Socket::Phase::kParked || s.phase == Socket::Phase::kAwaitRoom) return;
      if (s.phase == Socket::Phase::kHeader) {
        if (s.rx_end - s.rx_begin < tcp::kFrameHeaderSize) {
          if (!Fill(s, budget, &drained)) return;
          continue;
        }
        absl::StatusOr<FrameHeader> h = tcp::DecodeFrameHeader(
            absl::MakeConstSpan(s.rx.get() + s.rx_begin, tcp::kFrameHeaderSize),
            options_.max_message_bytes);
        if (!h.ok()) {
          Fail(conn, absl::DataLossError(absl::StrCat("tcp peer ", conn.peer, " sent a ",
                                                      std::string(h.status().message()))));
          return;
        }
        s.rx_begin += tcp::kFrameHeaderSize;
        s.header = *h;
        OnHeader(s);
        continue;
      }
      // Payload.
      if (s.remaining == 0) {
        OnPayloadDone(s);
        continue;
      }
      uint8_t* dst = s.op->base + s.offset;
      const size_t buffered = s.rx_end - s.rx_begin;
      size_t moved = 0;
      if (buffered > 0) {
        moved = std::min(buffered, s.remaining);
        std::memcpy(dst, s.rx.get() + s.rx_begin, moved);
        s.rx_begin += moved;
      } else if (s.remaining >= kDirectReadBytes) {
        if (drained) return;
        const size_t want = std::min(s.remaining, budget);
        const ssize_t r = recv(s.fd, dst, want, MSG_DONTWAIT);
        if (!Received(s, r)) return;
        moved = static_cast<size_t>(r);
        budget -= std::min(budget, moved);
        drained = moved < want;
      } else {
        if (!Fill(s, budget, &drained)) return;
        continue;
      }
      s.offset += moved;
      s.remaining -= moved;
      s.op->remaining -= moved;
    }
  }

  // Reads into the staging buffer; false when nothing more can be read now. A short read means
  // the socket is drained: *drained tells the caller not to ask again until epoll says so
  // (level-triggered), saving the recv() that would only return EAGAIN.
  bool Fill(Socket& s, size_t& budget, bool* drained) {
    if (*drained) return false;
    if (s.rx_begin == s.rx_end) {
      s.rx_begin = s.rx_end = 0;
    } else if (s.rx_begin > 0) {
      std::memmove(s.rx.get(), s.rx.get() + s.rx_begin, s.rx_end - s.rx_begin);
      s.rx_end -= s.rx_begin;
      s.rx_begin = 0;
    }
    const size_t room = std::min(kRxBufferBytes - s.rx_end, kStagedReadBytes);
    const ssize_t r = recv(s.fd, s.rx.get() + s.rx_end, room, MSG_DONTWAIT);
    if (!Received(s, r)) return false;
    s.rx_end += static_cast<size_t>(r);
    budget -= std::min(budget, static_cast<size_t>(r));
    *drained = static_cast<size_t>(r) < room;
    return true;
  }

  // Interprets a recv() result; false (and the connection failed where due) when not > 0.
  bool Received(Socket& s, ssize_t r) {
    TcpConn& conn = *s.conn;
    if (r > 0) {
      conn.last_progress = absl::Now();
      return true;
    }
    if (r == 0) {
      Fail(conn,
           absl::UnavailableError(absl::StrCat("tcp peer ", conn.peer, " closed the connection")));
      return false;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
    Fail(conn, tcp::ErrnoStatus(errno, absl::StrCat("tcp receive from ", conn.peer)));
    return false;
  }

  void OnHeader(Socket& s) {
    TcpConn& conn = *s.conn;
    const FrameHeader& h = s.header;
    const size_t nsock = conn.sockets.size();
    absl::StatusOr<tcp::HeaderPlan> plan = tcp::PlanHeader(h, static_cast<size_t>(s.index), nsock,
                                                           conn.awaiting_ack.size(), s.next_stripe);
    if (!plan.ok()) {
      Fail(conn, absl::DataLossError(absl::StrCat("tcp peer ", conn.peer, " sent a malformed ",
                                                  std::string(plan.status().message()))));
      return;
    }
    switch (plan->action) {
      case tcp::HeaderAction::kClose:
        Fail(conn,
             absl::AbortedError(absl::StrCat("tcp peer ", conn.peer, " closed the connection")));
        return;
      case tcp::HeaderAction::kAck:
        for (uint64_t i = 0; i < plan->acked; ++i) {
          conn.awaiting_ack.front()->acked = true;
          conn.awaiting_ack.pop_front();
        }
        ReleaseOutbound(conn);
        s.phase = Socket::Phase::kHeader;
        return;
      case tcp::HeaderAction::kOperation: {
        absl::StatusOr<std::unique_ptr<InOp>> op = NewInOp(conn, h, plan->is_write);
        if (!op.ok()) {
          Fail(conn, op.status());
          return;
        }
        if (*op == nullptr) {  // no room to hold it yet
          Pause(s);
          return;
        }
        InOp* raw = op->get();
        conn.in_ops.push_back(*std::move(op));
        StartPayload(s, raw, 0, plan->first_bytes);
        if (!plan->striped) return;
        raw->parts_left = nsock;
        conn.stripes[conn.stripe_heads_received++] = raw;
        for (auto& other : conn.sockets) {  // parts that waited for this head
          if (other->phase != Socket::Phase::kParked) continue;
          Resume(*other);
          // Its bytes may all sit in its staging buffer already: epoll would not report them.
          if (conn.status.ok() && other->phase == Socket::Phase::kPayload) Read(*other);
        }
        return;
      }
      case tcp::HeaderAction::kStripePart:
        s.phase = Socket::Phase::kParked;
        Resume(s);
        if (conn.paused && s.phase == Socket::Phase::kParked) Arm(s);  // no busy epoll meanwhile
        return;
    }
  }

  // A parked data socket continues once the head of its stripe has arrived.
  void Resume(Socket& s) {
    TcpConn& conn = *s.conn;
    auto it = conn.stripes.find(s.header.a);
    if (it == conn.stripes.end()) {
      if (s.header.a < conn.stripe_heads_received) {
        Fail(conn, absl::DataLossError(absl::StrCat("tcp peer ", conn.peer,
                                                    " sent a stripe part for a finished op")));
      }
      return;  // stays parked
    }
    InOp* op = it->second;
    if (!tcp::PartMatches(s.header, static_cast<size_t>(s.index), conn.sockets.size(),
                          op->length)) {
      Fail(conn, absl::DataLossError(
                     absl::StrCat("tcp peer ", conn.peer, " sent a stripe part with a bad range")));
      return;
    }
    ++s.next_stripe;
    StartPayload(s, op, s.header.b, s.header.length);
  }

  void StartPayload(Socket& s, InOp* op, size_t offset, size_t length) {
    s.phase = Socket::Phase::kPayload;
    s.op = op;
    s.offset = offset;
    s.remaining = length;
  }

  void OnPayloadDone(Socket& s) {
    TcpConn& conn = *s.conn;
    InOp* op = s.op;
    s.phase = Socket::Phase::kHeader;
    s.op = nullptr;
    --op->parts_left;
    if (op->placed()) {
      for (auto it = conn.stripes.begin(); it != conn.stripes.end(); ++it) {
        if (it->second == op) {
          conn.stripes.erase(it);
          break;
        }
      }
      ReleaseInbound(conn);
    }
  }

  absl::StatusOr<std::unique_ptr<InOp>> NewInOp(TcpConn& conn, const FrameHeader& h,
                                                bool is_write) {
    auto op = std::make_unique<InOp>();
    op->is_message = !is_write;
    op->length = op->remaining = h.length;
    op->has_immediate = (h.flags & tcp::kFlagImmediate) != 0;
    op->immediate = h.immediate;
    if (is_write) {
      absl::StatusOr<WriteTarget> t = registry_->Resolve(h.a, h.b, h.length);
      if (!t.ok()) {
        return absl::DataLossError(
            absl::StrCat("tcp peer ", conn.peer, ": ", std::string(t.status().message())));
      }
      op->target = t->data;
      op->target_kind = t->kind;
      op->base = t->data;
      if (t->kind == MemoryKind::kCuda) {
        PLEXUS_RETURN_IF_ERROR(Allocate(op->staging, h.length));
        op->base = op->staging.data();
      }
      return op;
    }
    // A message: null when it cannot be held yet (the caller pauses the connection).
    PLEXUS_ASSIGN_OR_RETURN(Matcher::Admission admitted, conn.matcher->Admit(h.length, &op->slot));
    if (admitted == Matcher::Admission::kWait) return nullptr;
    op->base = op->slot.dest;
    return op;
  }

  static absl::Status Allocate(std::vector<uint8_t>& buffer, size_t bytes) {
    try {
      buffer.resize(bytes);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes to hold an incoming message"));
    }
    return absl::OkStatus();
  }

  // Completes the peer's operations in arrival order, once placed (and matched, for messages).
  void ReleaseInbound(TcpConn& conn) {
    while (!conn.in_ops.empty()) {
      InOp& op = *conn.in_ops.front();
      if (!op.placed()) return;
      if (op.is_message) {
        // Direct: completes the receive. Held: whole now; delivered once a receive claims it.
        conn.matcher->Placed(op.slot);
        if (op.slot.held) {
          if (!conn.matcher->DeliverOldest()) return;
          room_freed_ = true;
        }
      } else {
        if (op.target_kind == MemoryKind::kCuda && op.length > 0) {
          if (absl::Status s = CopyHostToCuda(op.target, op.staging.data(), op.length); !s.ok()) {
            Fail(conn, s);
            return;
          }
        }
        ++conn.acks_owed;
        if (op.has_immediate) {
          Complete(conn, Opcode::kRemoteWrite, 0, absl::OkStatus(), op.length, op.immediate);
        }
      }
      conn.in_ops.pop_front();
    }
  }

  // Ends the connection: every outstanding operation completes with `why`, in order.
  void Fail(TcpConn& conn, absl::Status why) {
    if (!conn.status.ok()) return;
    conn.status = why;
    for (auto& op : conn.out_ops) Complete(conn, op->opcode, op->wr_id, why, 0);
    conn.out_ops.clear();
    conn.awaiting_ack.clear();
    // Messages that arrived whole stay deliverable (in the matcher): what the peer sent before
    // it closed is not lost. Everything from the first incomplete operation on is.
    size_t whole = 0;
    while (whole < conn.in_ops.size() && conn.in_ops[whole]->is_message &&
           conn.in_ops[whole]->placed()) {
      conn.matcher->Placed(conn.in_ops[whole]->slot);  // held: marks it whole
      ++whole;
    }
    for (size_t i = whole; i < conn.in_ops.size(); ++i) {
      const InOp& op = *conn.in_ops[i];
      if (op.is_message && !op.slot.held) Complete(conn, Opcode::kRecv, op.slot.wr_id, why, 0);
    }
    conn.in_ops.clear();
    conn.stripes.clear();
    conn.matcher->Fail(why, /*keep_whole=*/!absl::IsCancelled(why));
    if (conn.paused) {
      conn.paused = false;
      --paused_conns_;
    }
    room_freed_ = true;
    for (auto& s : conn.sockets) {
      s->sendq.clear();
      if (s->fd >= 0) {
        epoll_ctl(epfd_, EPOLL_CTL_DEL, s->fd, nullptr);
        shutdown(s->fd, SHUT_RDWR);
      }
    }
  }

  void ReleaseSockets(TcpConn& conn) {
    if (conn.driver_reading) {
      conn.close_deferred = true;  // the driver closes them when its recv() returns
      return;
    }
    for (auto& s : conn.sockets) {
      if (s->fd >= 0) close(s->fd);
      s->fd = -1;
    }
  }

  void CheckTimeouts(absl::Time now) {
    for (auto& [id, conn] : conns_) {
      if (!conn->status.ok()) continue;
      bool busy = !conn->out_ops.empty() || !conn->awaiting_ack.empty();
      // A paused connection waits for the local user's receives, not for the peer.
      for (auto& s : conn->sockets) {
        if (conn->paused) break;
        busy |= s->phase != Socket::Phase::kHeader || s->rx_end > s->rx_begin;
      }
      if (busy && now - conn->last_progress > options_.op_timeout) {
        Fail(*conn, absl::DeadlineExceededError(
                        absl::StrCat("tcp peer ", conn->peer, " made no progress for ",
                                     absl::FormatDuration(options_.op_timeout), " (op_timeout)")));
      }
    }
  }

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
  HoldLimits held_limits_;
  std::shared_ptr<HoldBudget> held_budget_;
  size_t paused_conns_ = 0;  // connections in backpressure
  bool room_freed_ = false;  // since paused connections last retried
  bool unpausing_ = false;
};

class TcpConnection final : public Connection {
 public:
  TcpConnection(std::shared_ptr<TcpCore> core, std::string peer)
      : core_(std::move(core)), peer_(std::move(peer)) {}
  ~TcpConnection() override { Close(); }

  absl::Status PostSend(absl::Span<const ConstBuffer> buffers, uint64_t wr_id) override {
    return core_->PostSend(id(), buffers, wr_id);
  }
  absl::Status PostRecv(MutableBuffer buffer, uint64_t wr_id) override {
    return core_->PostRecv(id(), buffer, wr_id);
  }
  absl::Status PostWrite(const MemoryRegion& local, size_t local_offset, size_t length,
                         const RegionHandle& remote, size_t remote_offset,
                         std::optional<uint32_t> immediate, uint64_t wr_id) override {
    return core_->PostWrite(id(), local, local_offset, length, remote, remote_offset, immediate,
                            wr_id);
  }
  void Close() override { core_->Close(id()); }
  absl::Status status() const override { return core_->Status(id()); }
  std::string peer_address() const override { return peer_; }

 private:
  std::shared_ptr<TcpCore> core_;
  std::string peer_;
};

// DeviceOptions::local_address without the brackets an IPv6 literal may come in.
std::string LocalHost(const std::string& local_address) {
  if (local_address.size() > 2 && local_address.front() == '[' && local_address.back() == ']') {
    return local_address.substr(1, local_address.size() - 2);
  }
  return local_address;
}

// The address outgoing sockets to `target` bind to: local_address, in target's family.
absl::StatusOr<net::SocketAddress> LocalBinding(const DeviceOptions& options,
                                                const net::SocketAddress& target,
                                                const std::string& where) {
  PLEXUS_ASSIGN_OR_RETURN(const std::vector<net::SocketAddress> all,
                          net::Resolve(net::HostPort{LocalHost(options.local_address), 0}));
  for (const net::SocketAddress& a : all) {
    if (a.family() == target.family()) return a;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("tcp local_address ", options.local_address, " has no ",
                   target.family() == AF_INET6 ? "IPv6" : "IPv4", " address to reach ", where));
}

// Accepts tcp connections: the HelloAcceptor (tcp/listener.hpp) assembles each connection's
// socket group from the clients' hellos, then the core takes the sockets over.
class TcpListener final : public Listener {
 public:
  TcpListener(std::shared_ptr<TcpCore> core, int fd, std::string address)
      : core_(std::move(core)),
        acceptor_(fd, std::move(address), core_->options().connect_timeout) {}
  std::string address() const override { return acceptor_.address(); }

  absl::StatusOr<std::unique_ptr<Connection>> Accept(CompletionQueue* cq,
                                                     absl::Duration timeout) override {
    if (cq == nullptr) return absl::InvalidArgumentError("Accept: null completion queue");
    PLEXUS_ASSIGN_OR_RETURN(tcp::SocketGroup group, acceptor_.Next(timeout));
    auto conn = std::make_unique<TcpConnection>(core_, group.peer);
    if (absl::Status s = core_->AddConnection(conn->id(), group.fds, cq, group.peer); !s.ok()) {
      tcp::CloseSocketGroup(group);
      return s;
    }
    return conn;
  }

 private:
  std::shared_ptr<TcpCore> core_;
  tcp::HelloAcceptor acceptor_;
};

class TcpDevice final : public Device {
 public:
  TcpDevice(const DeviceOptions& options, std::shared_ptr<TcpCore> core)
      : Device(options), core_(std::move(core)) {}
  ~TcpDevice() override { core_->Shutdown(); }

  Backend backend() const override { return Backend::kTcp; }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* data, size_t bytes,
                                                         MemoryKind kind) override {
    return core_->registry().Register(data, bytes, kind);
  }

  // `address` is "ip:port", "[ipv6]:port" or a name; "" listens on local_address (or every
  // IPv4 interface) at an ephemeral port.
  absl::StatusOr<std::unique_ptr<Listener>> Listen(std::string_view address) override {
    std::string where(address);
    if (where.empty()) {
      where = net::JoinHostPort(
          options().local_address.empty() ? "0.0.0.0" : LocalHost(options().local_address), 0);
    }
    PLEXUS_ASSIGN_OR_RETURN(net::HostPort hp, net::ParseHostPort(where, "tcp listen address"));
    if (hp.host == "*") hp.host.clear();
    PLEXUS_ASSIGN_OR_RETURN(const std::vector<net::SocketAddress> all, net::Resolve(hp));
    const net::SocketAddress& addr = all.front();
    const int fd = socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return net::ErrnoStatus(errno, absl::StrCat("tcp socket for ", where));
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, addr.get(), addr.length) < 0) {
      const int err = errno;
      close(fd);
      return net::ErrnoStatus(err, absl::StrCat("tcp bind to ", where));
    }
    if (listen(fd, 512) < 0) {
      const int err = errno;
      close(fd);
      return net::ErrnoStatus(err, absl::StrCat("tcp listen on ", where));
    }
    absl::StatusOr<net::SocketAddress> bound = net::LocalAddress(fd);
    if (!bound.ok()) {
      close(fd);
      return bound.status();
    }
    // A wildcard listener is reached through loopback from this host.
    if (bound->family() == AF_INET) {
      auto* sin = reinterpret_cast<sockaddr_in*>(&bound->storage);
      if (sin->sin_addr.s_addr == htonl(INADDR_ANY)) sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else if (bound->family() == AF_INET6) {
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(&bound->storage);
      if (IN6_IS_ADDR_UNSPECIFIED(&sin6->sin6_addr)) sin6->sin6_addr = in6addr_loopback;
    }
    return std::make_unique<TcpListener>(core_, fd, net::FormatAddress(*bound));
  }

  absl::StatusOr<std::unique_ptr<Connection>> Connect(std::string_view address,
                                                      CompletionQueue* cq) override {
    if (cq == nullptr) return absl::InvalidArgumentError("Connect: null completion queue");
    const std::string where(address);
    PLEXUS_ASSIGN_OR_RETURN(const net::SocketAddress addr,
                            net::ResolveFirst(address, "tcp address"));
    std::optional<net::SocketAddress> local;
    if (!options().local_address.empty()) {
      PLEXUS_ASSIGN_OR_RETURN(local, LocalBinding(options(), addr, where));
    }
    const int count = options().sockets_per_connection;
    const absl::Time deadline = absl::Now() + options().connect_timeout;
    static thread_local absl::BitGen gen;
    tcp::Hello hello;
    hello.socket_count = static_cast<uint16_t>(count);
    hello.token = absl::Uniform<uint64_t>(gen);
    std::vector<int> fds;
    auto fail = [&](absl::Status s) {
      for (int fd : fds) close(fd);
      return s;
    };
    for (int i = 0; i < count; ++i) {
      const int fd = socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) return fail(net::ErrnoStatus(errno, "tcp socket"));
      fds.push_back(fd);
      if (local.has_value() && bind(fd, local->get(), local->length) < 0) {
        return fail(net::ErrnoStatus(
            errno, absl::StrCat("tcp bind to local address ", options().local_address)));
      }
      if (connect(fd, addr.get(), addr.length) < 0 && errno != EINPROGRESS) {
        return fail(net::ErrnoStatus(errno, absl::StrCat("tcp connect to ", where)));
      }
      for (;;) {
        if (absl::Now() >= deadline) {
          return fail(absl::DeadlineExceededError(
              absl::StrCat("tcp connect to ", where, ": no answer within ",
                           absl::FormatDuration(options().connect_timeout))));
        }
        pollfd p{fd, POLLOUT, 0};
        const int rc = poll(&p, 1, net::PollTimeoutMs(deadline));
        if (rc > 0) break;
        if (rc < 0 && errno != EINTR) return fail(net::ErrnoStatus(errno, "poll"));
      }
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return fail(net::ErrnoStatus(err, absl::StrCat("tcp connect to ", where)));
      hello.socket_index = static_cast<uint16_t>(i);
      uint8_t bytes[tcp::kHelloSize];
      tcp::EncodeHello(hello, bytes);
      if (absl::Status s = net::SendAll(fd, bytes, sizeof bytes, deadline); !s.ok()) {
        return fail(base::Annotate(s, absl::StrCat("tcp hello to ", where)));
      }
    }
    auto conn = std::make_unique<TcpConnection>(core_, where);
    if (absl::Status s = core_->AddConnection(conn->id(), fds, cq, where); !s.ok()) {
      return fail(s);
    }
    return conn;
  }

  void Wake() override { core_->Wake(); }

 protected:
  void DriveProgress(absl::Duration max_block) override { core_->Drive(max_block); }

 private:
  std::shared_ptr<TcpCore> core_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Device>> CreateTcpDevice(const DeviceOptions& options) {
  auto core = std::make_shared<TcpCore>(options);
  PLEXUS_RETURN_IF_ERROR(core->Init());
  return std::make_shared<TcpDevice>(options, std::move(core));
}

}  // namespace plexus::transport::internal
