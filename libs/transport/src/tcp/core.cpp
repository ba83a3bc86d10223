// TcpCore's definitions: connections, posts, the progress loop (epoll, the lone-socket and
// busy-poll shortcuts), reading and writing the sockets, backpressure and timeouts.
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "backends.hpp"
#include "make_completion.hpp"
#include "matcher.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "region_registry.hpp"
#include "tcp/core.hpp"
#include "tcp/frame.hpp"
#include "tcp/listener.hpp"
#include "tcp/receive_state.hpp"
#include "tcp/send_state.hpp"
#include "tcp/sockets.hpp"

namespace plexus::transport::internal::tcp {

namespace net = base::net;

namespace {

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
// Blocking drives of a lone socket in a row before it leaves the epoll set (Socket::in_epoll):
// a waiter that alternates with epoll waits keeps it there (no epoll_ctl per message).
constexpr uint32_t kLoneStreakOutOfEpoll = 16;
// A small gather leaves as one contiguous send(): copying a few hundred bytes costs less than
// the kernel's import of the msghdr and its iovec array (a visible share of a small RPC's round
// trip on loopback; docs/measurements/rpc.md, "Where the same-CPU time goes").
constexpr size_t kCoalesceBytes = 1024;
constexpr int kCoalesceIov = 8;

uint64_t EpollKey(uint64_t conn_id, int socket_index) {
  return (conn_id << 8) | static_cast<uint64_t>(socket_index);
}
constexpr uint64_t kWakeKey = ~uint64_t{0};

}  // namespace

absl::Status TcpCore::Init() {
  PLEXUS_ASSIGN_OR_RETURN(held_limits_, ResolveHoldLimits(options_));
  held_budget_ = std::make_shared<HoldBudget>(held_limits_.per_device);
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) return net::ErrnoStatus(errno, "epoll_create1");
  wakefd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wakefd_ < 0) return net::ErrnoStatus(errno, "eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeKey;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev) < 0) {
    return net::ErrnoStatus(errno, "epoll_ctl(eventfd)");
  }
  if (options_.progress == ProgressMode::kThread) {
    thread_ = std::thread([this] {
      while (!stop_.load(std::memory_order_acquire)) Drive(absl::Milliseconds(100));
    });
  }
  return absl::OkStatus();
}

TcpCore::~TcpCore() {
  if (epfd_ >= 0) close(epfd_);
  if (wakefd_ >= 0) close(wakefd_);
}

void TcpCore::Shutdown() {
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

void TcpCore::Wake() {
  wake_pending_.store(true, std::memory_order_release);
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wakefd_, &one, sizeof one);
}

absl::Status TcpCore::AddConnection(uint64_t id, std::vector<int> fds, CompletionQueue* cq,
                                    std::string peer) {
  // Before anything is registered: a refused name fails the connection as it is made.
  if (!options_.tcp.loopback_congestion_control.empty()) {
    for (const int fd : fds) {
      if (!tcp::IsLoopbackPath(fd)) continue;
      PLEXUS_RETURN_IF_ERROR(
          tcp::SetCongestionControl(fd, options_.tcp.loopback_congestion_control, peer));
    }
  }
  tcp::ReceiveConfig rx{
      .peer = peer,
      .connection_id = id,
      .sockets = fds.size(),
      .max_message_bytes = options_.max_message_bytes,
      .matcher = {.backend = "tcp",
                  .peer = peer,
                  .connection_cap = held_limits_.per_connection,
                  .device = held_budget_,
                  .max_spare_bytes = SpareBytesFor(held_limits_.per_connection),
                  .deliver_eagerly = false},
      .resolve_write = [registry = registry_](uint64_t region, uint64_t offset, uint64_t length) {
        return registry->Resolve(region, offset, length);
      }};
  auto conn =
      std::make_shared<TcpConn>(id, cq, std::move(peer), fds.size(), options_, std::move(rx));
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
    PLEXUS_RETURN_IF_ERROR(net::SetNonBlocking(s->fd, false));
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
      return net::ErrnoStatus(errno, "epoll_ctl(add socket)");
    }
  }
  conns_[id] = std::move(conn);
  return absl::OkStatus();
}

namespace {

ssize_t SendGathered(int fd, const iovec* iov, int n) {
  constexpr int kFlags = MSG_NOSIGNAL | MSG_DONTWAIT;
  if (n == 1) return send(fd, iov[0].iov_base, iov[0].iov_len, kFlags);
  if (n <= kCoalesceIov) {
    size_t total = 0;
    for (int i = 0; i < n; ++i) total += iov[i].iov_len;
    if (total <= kCoalesceBytes) {
      uint8_t flat[kCoalesceBytes];
      size_t at = 0;
      for (int i = 0; i < n; ++i) {
        if (iov[i].iov_len > 0) std::memcpy(flat + at, iov[i].iov_base, iov[i].iov_len);
        at += iov[i].iov_len;
      }
      return send(fd, flat, total, kFlags);
    }
  }
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(n);
  return sendmsg(fd, &msg, kFlags);
}

}  // namespace

absl::Status TcpCore::PostSend(uint64_t id, absl::Span<const ConstBuffer> buffers, uint64_t wr_id,
                               bool* sent_now) {
  PLEXUS_ASSIGN_OR_RETURN(tcp::PostedOp posted,
                          tcp::PrepareSend(buffers, wr_id, options_.max_message_bytes));
  if (posted.op.bytes + tcp::kFrameHeaderSize <= kCoalesceBytes &&
      posted.payload.size() < kCoalesceIov) {
    std::lock_guard<std::mutex> lock(mu_);
    TcpConn* conn = Find(id);
    if (conn == nullptr) return absl::FailedPreconditionError("connection is closed");
    PLEXUS_RETURN_IF_ERROR(conn->status);
    if (TrySendAtOnce(*conn, posted, /*complete=*/sent_now == nullptr)) {
      if (sent_now != nullptr) *sent_now = true;
      return absl::OkStatus();
    }
    Enqueue(*conn, posted);
    return absl::OkStatus();
  }
  return Post(id, std::move(posted));
}

bool TcpCore::TrySendAtOnce(TcpConn& conn, tcp::PostedOp& posted, bool complete) {
  // Only where the whole frame is next on the wire and its completion next in order: one
  // socket, nothing queued, no operation outstanding (a write awaiting its ack completes first).
  if (conn.sockets.size() != 1 || !conn.send.idle()) return false;
  Socket& s = *conn.sockets[0];
  if (!s.sendq.empty() || s.fd < 0) return false;
  uint8_t header[tcp::kFrameHeaderSize];
  tcp::EncodeFrameHeader(posted.header, header);
  iovec iov[kCoalesceIov];
  int n = 0;
  iov[n++] = {header, sizeof header};
  for (const iovec& v : posted.payload) iov[n++] = v;
  const size_t at = sizeof header + posted.op.bytes;
  ssize_t w;
  do {
    w = SendGathered(s.fd, iov, n);  // one send() of a flat copy: the caller checked the size
  } while (w < 0 && errno == EINTR);
  if (w != static_cast<ssize_t>(at)) {
    // Part of it, or nothing (a full socket buffer, an error): the frame is queued with the
    // bytes written counted, and Flush goes on (or meets the error again and fails the
    // connection, as for any send).
    posted.already_written = w > 0 ? static_cast<size_t>(w) : 0;
    return false;
  }
  conn.last_progress = absl::Now();
  if (complete) {
    conn.cq->Push(
        MakeCompletion(conn.id, Opcode::kSend, posted.op.wr_id, absl::OkStatus(), posted.op.bytes));
  }
  return true;
}

absl::StatusOr<std::optional<size_t>> TcpCore::PeekNext(uint64_t id, MutableBuffer head) {
  std::lock_guard<std::mutex> lock(mu_);
  TcpConn* conn = Find(id);
  if (conn == nullptr) return absl::FailedPreconditionError("connection is closed");
  return conn->rx.PeekNext(head);
}

absl::Status TcpCore::PostSendProduced(uint64_t id, size_t length, Producer producer,
                                       uint64_t wr_id) {
  PLEXUS_ASSIGN_OR_RETURN(
      tcp::PostedOp posted,
      tcp::PrepareProducedSend(length, std::move(producer), wr_id, options_.max_message_bytes));
  return Post(id, std::move(posted));
}

absl::Status TcpCore::PostRecv(uint64_t id, MutableBuffer buffer, uint64_t wr_id) {
  if (buffer.data == nullptr && buffer.size > 0) {
    return absl::InvalidArgumentError("PostRecv: null buffer");
  }
  return PostReceive(id, [&](tcp::ReceiveState& rx) { return rx.PostRecv(buffer, wr_id); });
}

absl::Status TcpCore::PostRecvConsumed(uint64_t id, size_t max_length, Consumer consumer,
                                       uint64_t wr_id) {
  return PostReceive(id, [&](tcp::ReceiveState& rx) {
    return rx.PostRecvConsumed(max_length, std::move(consumer), wr_id);
  });
}

absl::Status TcpCore::PostReceive(uint64_t id,
                                  absl::FunctionRef<absl::Status(tcp::ReceiveState&)> post) {
  std::lock_guard<std::mutex> lock(mu_);
  TcpConn* conn = Find(id);
  if (conn == nullptr) return absl::FailedPreconditionError("connection is closed");
  if (!conn->status.ok() && !conn->rx.has_unclaimed()) return conn->status;  // after whole ones
  if (absl::Status s = post(conn->rx); !s.ok()) {
    Fail(*conn, s);
    return absl::OkStatus();
  }
  if (conn->rx.TakeRoomFreed()) room_freed_ = true;
  MaybeUnpause();
  return absl::OkStatus();
}

absl::Status TcpCore::PostWrite(uint64_t id, const MemoryRegion& local, size_t local_offset,
                                size_t length, const RegionHandle& remote, size_t remote_offset,
                                std::optional<uint32_t> immediate, uint64_t wr_id) {
  PLEXUS_ASSIGN_OR_RETURN(
      tcp::PostedOp posted,
      tcp::PrepareWrite(local, local_offset, length, remote, remote_offset, immediate, wr_id));
  return Post(id, std::move(posted));
}

void TcpCore::Close(uint64_t id) {
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
    [[maybe_unused]] ssize_t n = send(control.fd, frame, sizeof frame, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  Fail(conn, absl::CancelledError("connection closed locally"));
  ReleaseSockets(*it->second);
  conns_.erase(it);  // frees its held messages
  MaybeUnpause();
}

std::optional<absl::Time> TcpCore::ReceivingSince(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const TcpConn* conn = Find(id);
  if (conn == nullptr || !conn->status.ok() || conn->rx.paused()) return std::nullopt;
  return conn->receiving_since;
}

absl::Status TcpCore::Status(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = conns_.find(id);
  if (it == conns_.end()) return absl::CancelledError("connection closed locally");
  return it->second->status;
}

bool TcpCore::DriveLoneSocket() {
  std::shared_ptr<TcpConn> conn;
  Socket* s = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (conns_.size() != 1 || wake_pending_.load(std::memory_order_acquire)) return false;
    conn = conns_.begin()->second;
    if (!conn->status.ok() || conn->sockets.size() != 1) return false;
    s = conn->sockets[0].get();
    if (!s->sendq.empty() || conn->rx.paused() || s->rx_end > s->rx_begin || s->fd < 0) {
      return false;
    }
    s->rx_begin = s->rx_end = 0;
    conn->driver_reading = true;
    // A steady run of blocking drives (not one between epoll waits): leave the epoll set, which
    // the next epoll wait rejoins (RejoinEpoll).
    if (s->in_epoll && ++lone_streak_ >= kLoneStreakOutOfEpoll &&
        epoll_ctl(epfd_, EPOLL_CTL_DEL, s->fd, nullptr) == 0) {
      s->in_epoll = false;
      out_of_epoll_ = conn->id;
    }
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
  // One clock read serves both the progress stamp and the timeout check: the few microseconds
  // of Read() in between cannot matter against op_timeout, and a reading from before them only
  // makes the check later, never early.
  const absl::Time now = absl::Now();
  if (r > 0) {
    s->rx_end = static_cast<size_t>(r);
    conn->last_progress = now;
    Read(*s, /*drained=*/static_cast<size_t>(r) < kStagedReadBytes);
    if (conn->status.ok()) SendAcks(*conn);
  } else {
    Received(*s, r, err);  // fails the connection where due
  }
  MaybeUnpause();
  MaybeCheckTimeouts(now);
  return true;
}

void TcpCore::Drive(absl::Duration max_block) {
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
  RejoinEpoll();
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
    if (conn->rx.paused() && (events[i].events & (EPOLLHUP | EPOLLERR))) {
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
  MaybeCheckTimeouts(absl::Now());
}

bool TcpCore::BusyPoll() {
  if (wake_pending_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  Socket* expecting[kBusyPollSockets];
  size_t count = 0;
  for (auto& [id, conn] : conns_) {
    if (!conn->status.ok() || conn->sockets.empty() || conn->rx.paused()) continue;
    Socket& s = *conn->sockets[0];
    const bool expects =
        conn->rx.has_posted_recv() || conn->rx.phase(0) != tcp::ReceiveState::Phase::kHeader;
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

TcpConn* TcpCore::Find(uint64_t id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

const TcpConn* TcpCore::Find(uint64_t id) const {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

absl::Status TcpCore::Post(uint64_t id, tcp::PostedOp posted) {
  std::lock_guard<std::mutex> lock(mu_);
  TcpConn* conn = Find(id);
  if (conn == nullptr) return absl::FailedPreconditionError("connection is closed");
  PLEXUS_RETURN_IF_ERROR(conn->status);
  Enqueue(*conn, posted);
  return absl::OkStatus();
}

void TcpCore::Enqueue(TcpConn& conn, tcp::PostedOp& posted) {
  // The op_timeout clock starts now when nothing was outstanding. A Flush that writes stamps
  // last_progress itself, so the clock is read here only when nothing could be written.
  const bool was_idle = conn.send.idle();
  std::shared_ptr<tcp::OutOp> op = conn.send.NewOp(std::move(posted.op));
  const tcp::FramePlans frames = conn.send.Start(op, posted.header);
  bool wrote = false;
  if (frames.size() == 1) {
    Socket& s = *conn.sockets[0];
    s.sendq.Push(frames[0].header, std::move(posted.payload), std::move(op));
    if (posted.already_written > 0) {  // by TrySendAtOnce
      s.sendq.Advance(posted.already_written, conn.send);
      wrote = true;
      conn.last_progress = absl::Now();
    }
    wrote |= Flush(s);
  } else {
    for (const tcp::FramePlan& f : frames) {
      conn.sockets[f.socket]->sendq.Push(
          f.header, tcp::SliceIov(posted.payload, f.payload.offset, f.payload.length), op);
    }
    op.reset();  // the queues hold it now (and SendState): recycled when it completes
    for (auto& s : conn.sockets) {
      if (conn.status.ok()) wrote |= Flush(*s);
    }
  }
  if (was_idle && !wrote) conn.last_progress = absl::Now();
}

void TcpCore::SendAcks(TcpConn& conn) {
  const uint64_t owed = conn.rx.TakeAcksOwed();
  if (owed == 0) return;
  FrameHeader h;
  h.type = FrameType::kWriteAck;
  h.a = owed;
  conn.sockets[0]->sendq.Push(h, {}, nullptr);
  Flush(*conn.sockets[0]);
}

bool TcpCore::Flush(Socket& s) {
  TcpConn& conn = *s.conn;
  bool wrote = false;
  auto produce = [&] {
    absl::Status produced = s.sendq.Produce();
    if (!produced.ok()) {
      Fail(conn, absl::Status(produced.code(),
                              absl::StrCat("tcp ", produced.message(), " (to ", conn.peer, ")")));
    }
    return produced.ok();
  };
  while (!s.sendq.empty()) {
    if (!produce()) return wrote;
    iovec iov[kMaxIov];
    const int n = s.sendq.Gather(iov, kMaxIov);
    const ssize_t w = SendGathered(s.fd, iov, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        // A produced send's next chunk is made while the kernel drains the socket.
        if (!produce()) return wrote;
        SetWantOut(s, true);
        return wrote;
      }
      Fail(conn, net::ErrnoStatus(errno, absl::StrCat("tcp send to ", conn.peer)));
      return wrote;
    }
    conn.last_progress = absl::Now();
    wrote = true;
    s.sendq.Advance(static_cast<size_t>(w), conn.send);
  }
  SetWantOut(s, false);
  return wrote;
}

void TcpCore::SetWantOut(Socket& s, bool want) {
  if (s.want_out == want) return;
  s.want_out = want;
  Arm(s);
}

uint32_t TcpCore::EpollEvents(const Socket& s) const {
  const bool stalled = s.conn->rx.stalled(static_cast<size_t>(s.index));
  return (stalled ? uint32_t{0} : uint32_t{EPOLLIN | EPOLLRDHUP}) |
         (s.want_out ? uint32_t{EPOLLOUT} : uint32_t{0});
}

void TcpCore::Arm(Socket& s) {
  // Out of the set: RejoinEpoll registers it with the events of that moment.
  if (!s.conn->status.ok() || s.fd < 0 || !s.in_epoll) return;
  epoll_event ev{};
  ev.events = EpollEvents(s);
  ev.data.u64 = EpollKey(s.conn->id, s.index);
  epoll_ctl(epfd_, EPOLL_CTL_MOD, s.fd, &ev);
}

void TcpCore::RejoinEpoll() {
  lone_streak_ = 0;
  if (out_of_epoll_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  TcpConn* conn = Find(out_of_epoll_);
  out_of_epoll_ = 0;
  if (conn == nullptr || !conn->status.ok()) return;
  for (auto& s : conn->sockets) {
    if (s->in_epoll || s->fd < 0) continue;
    epoll_event ev{};
    ev.events = EpollEvents(*s);
    ev.data.u64 = EpollKey(conn->id, s->index);
    // Bytes that came meanwhile are reported at once: the registration polls the socket.
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, s->fd, &ev) < 0) {
      Fail(*conn,
           net::ErrnoStatus(errno, absl::StrCat("epoll_ctl(add socket of ", conn->peer, ")")));
      return;
    }
    s->in_epoll = true;
  }
}

void TcpCore::MaybeUnpause() {
  if (!room_freed_ || paused_conns_ == 0 || unpausing_) return;
  unpausing_ = true;
  while (room_freed_ && paused_conns_ > 0) {
    room_freed_ = false;
    std::vector<TcpConn*> paused;
    for (auto& [id, conn] : conns_) {
      if (conn->rx.paused()) paused.push_back(conn.get());
    }
    for (TcpConn* conn : paused) Unpause(*conn);
  }
  unpausing_ = false;
}

void TcpCore::Unpause(TcpConn& conn) {
  if (!conn.rx.paused() || !conn.status.ok()) return;
  --paused_conns_;
  absl::StatusOr<tcp::ReceiveState::Event> event = conn.rx.Readmit();  // may pause once more
  if (!event.ok()) {
    Fail(conn, event.status());
    return;
  }
  OnReceiveEvent(*conn.sockets[0], *event);
  if (conn.rx.paused() || !conn.status.ok()) return;
  for (auto& other : conn.sockets) Arm(*other);
  // Bytes may wait in the staging buffers already: epoll would not report them.
  for (auto& other : conn.sockets) {
    if (conn.status.ok()) Read(*other);
  }
  if (conn.status.ok()) SendAcks(conn);
}

void TcpCore::OnReceiveEvent(Socket& s, tcp::ReceiveState::Event event) {
  TcpConn& conn = *s.conn;
  switch (event) {
    case tcp::ReceiveState::Event::kNone:
      return;
    case tcp::ReceiveState::Event::kPaused:  // backpressure: the peer's sends block meanwhile
      ++paused_conns_;
      for (auto& other : conn.sockets) Arm(*other);
      return;
    case tcp::ReceiveState::Event::kStalled:  // no busy epoll meanwhile
      Arm(s);
      return;
    case tcp::ReceiveState::Event::kPartsResumed: {
      const absl::InlinedVector<size_t, 8> resumed = conn.rx.resumed();
      for (size_t k : resumed) {
        if (conn.status.ok()) Read(*conn.sockets[k]);
      }
      return;
    }
  }
}

void TcpCore::Read(Socket& s, bool drained) {
  TcpConn& conn = *s.conn;
  tcp::ReceiveState& rx = conn.rx;
  const size_t k = static_cast<size_t>(s.index);
  size_t budget = kReadBudgetBytes;
  while (conn.status.ok() && budget > 0 && !rx.waiting(k)) {
    if (s.rx_end > s.rx_begin) {
      absl::StatusOr<tcp::ReceiveState::Consumed> c =
          rx.Consume(k, absl::MakeConstSpan(s.rx.get() + s.rx_begin, s.rx_end - s.rx_begin));
      if (!c.ok()) {
        Fail(conn, c.status());
        break;
      }
      s.rx_begin += c->bytes;
      OnReceiveEvent(s, c->event);
      continue;
    }
    const absl::Span<uint8_t> window = rx.PayloadWindow(k);
    if (window.empty()) {
      if (!Fill(s, budget, &drained)) break;
      continue;
    }
    if (drained || !ReadPayload(s, window, budget, &drained)) break;
  }
  if (rx.TakeRoomFreed()) room_freed_ = true;
  // Stamp when a frame began: at the read that started it (a new header, or the first bytes of
  // one), cleared between frames. last_progress is this read's clock.
  bool mid = false;
  for (const auto& sock : conn.sockets) {
    mid |= rx.mid_frame(static_cast<size_t>(sock->index)) || sock->rx_end > sock->rx_begin;
  }
  if (!mid) {
    conn.receiving_since.reset();
  } else if (!conn.receiving_since || rx.headers_read() != conn.headers_seen) {
    conn.receiving_since = conn.last_progress;
  }
  conn.headers_seen = rx.headers_read();
}

bool TcpCore::Fill(Socket& s, size_t& budget, bool* drained) {
  if (*drained) return false;
  s.rx_begin = s.rx_end = 0;
  const size_t want = std::exchange(s.staged_read, kStagedReadBytes);
  const ssize_t r = recv(s.fd, s.rx.get(), want, MSG_DONTWAIT);
  if (!Received(s, r, errno)) return false;
  s.rx_end = static_cast<size_t>(r);
  budget -= std::min(budget, s.rx_end);
  *drained = s.rx_end < want;
  return true;
}

bool TcpCore::ReadPayload(Socket& s, absl::Span<uint8_t> window, size_t& budget, bool* drained) {
  // The staging buffer is empty here (Read consumes it first): what follows the payload lands at
  // its start. It is read too only when the whole window fits the budget.
  const size_t direct = std::min(window.size(), budget);
  // After a large payload, only a little of the next one is staged (then copied).
  s.staged_read = window.size() >= kStagedReadBytes ? kSmallStagedReadBytes : kStagedReadBytes;
  iovec iov[2] = {{window.data(), direct}, {s.rx.get(), s.staged_read}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = direct == window.size() ? 2 : 1;
  const size_t want = direct + (msg.msg_iovlen == 2 ? s.staged_read : 0);
  const ssize_t r = recvmsg(s.fd, &msg, MSG_DONTWAIT);
  if (!Received(s, r, errno)) return false;
  const size_t moved = static_cast<size_t>(r);
  const size_t placed = std::min(moved, direct);
  s.rx_begin = 0;
  s.rx_end = moved - placed;
  budget -= std::min(budget, moved);
  *drained = moved < want;
  if (absl::Status st = s.conn->rx.Placed(static_cast<size_t>(s.index), placed); !st.ok()) {
    Fail(*s.conn, st);
    return false;
  }
  return true;
}

bool TcpCore::Received(Socket& s, ssize_t r, int err) {
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
  if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) return false;
  Fail(conn, net::ErrnoStatus(err, absl::StrCat("tcp receive from ", conn.peer)));
  return false;
}

void TcpCore::Fail(TcpConn& conn, absl::Status why) {
  if (!conn.status.ok()) return;
  conn.status = why;
  conn.send.Fail(why);
  if (conn.rx.paused()) --paused_conns_;
  conn.rx.Fail(why);
  room_freed_ = true;
  for (auto& s : conn.sockets) {
    s->sendq.Clear();
    if (s->fd >= 0) {
      if (s->in_epoll) epoll_ctl(epfd_, EPOLL_CTL_DEL, s->fd, nullptr);
      s->in_epoll = false;
      shutdown(s->fd, SHUT_RDWR);
    }
  }
}

void TcpCore::ReleaseSockets(TcpConn& conn) {
  if (conn.driver_reading) {
    conn.close_deferred = true;  // the driver closes them when its recv() returns
    return;
  }
  for (auto& s : conn.sockets) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
  }
}

void TcpCore::MaybeCheckTimeouts(absl::Time now) {
  if (now - last_timeout_check_ <= absl::Milliseconds(50)) return;
  last_timeout_check_ = now;
  CheckTimeouts(now);
}

void TcpCore::CheckTimeouts(absl::Time now) {
  for (auto& [id, conn] : conns_) {
    if (!conn->status.ok()) continue;
    bool busy = !conn->send.idle();
    // A paused connection waits for the local user's receives, not for the peer.
    for (auto& s : conn->sockets) {
      if (conn->rx.paused()) break;
      busy |= conn->rx.mid_frame(static_cast<size_t>(s->index)) || s->rx_end > s->rx_begin;
    }
    if (busy && now - conn->last_progress > options_.op_timeout) {
      Fail(*conn, absl::DeadlineExceededError(
                      absl::StrCat("tcp peer ", conn->peer, " made no progress for ",
                                   absl::FormatDuration(options_.op_timeout), " (op_timeout)")));
    }
  }
}

}  // namespace plexus::transport::internal::tcp
