#include "shm/connection_state.hpp"
#include "make_completion.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"
#include "cuda_copy.hpp"
#include "plexus/base/status.hpp"
#include "produce_consume.hpp"

namespace plexus::transport::internal::shm {
namespace {

constexpr uint64_t kMinPartialPayload = 16 << 10;
constexpr size_t kReadBudgetFrames = 256;
constexpr uint64_t kReadBudgetBytes = 32 << 20;

uint64_t ChunkBytes(uint64_t capacity) { return std::min<uint64_t>(capacity / 8, 512 << 10); }

// Copies ring bytes to `dst`, which is host or CUDA memory.
absl::Status CopyFromRing(const Ring& ring, uint64_t pos, uint8_t* dst, size_t n, MemoryKind kind) {
  if (kind == MemoryKind::kHost) {
    ring.CopyOut(pos, dst, n);
    return absl::OkStatus();
  }
  const Ring::Pieces p = ring.View(pos, n);
  PLEXUS_RETURN_IF_ERROR(CopyHostToCuda(dst, p.first, p.first_size));
  if (p.second_size > 0) return CopyHostToCuda(dst + p.first_size, p.second, p.second_size);
  return absl::OkStatus();
}

}  // namespace

ConnectionState::ConnectionState(Session session, CompletionQueue* cq,
                                 std::shared_ptr<RegionRegistry> registry, Doorbell own_doorbell,
                                 const EngineConfig& config)
    : session_(std::move(session)),
      cq_(cq),
      registry_(std::move(registry)),
      own_doorbell_(own_doorbell),
      config_(config),
      limits_{static_cast<size_t>(session_.rx.capacity() - 64), config.max_message_bytes},
      chunk_bytes_(ChunkBytes(session_.tx.capacity())),
      matcher_(MatcherConfig{.backend = "shm",
                             .peer = absl::StrCat("process ", session_.peer_pid, " ('",
                                                  session_.peer_address, "')"),
                             .connection_cap = config.held_bytes_per_connection,
                             .device = config.held_budget,
                             .max_spare_bytes = SpareBytesFor(config.held_bytes_per_connection)},
               [this](uint64_t wr_id, absl::Status status, size_t bytes) {
                 PushLocked(wr_id, Opcode::kRecv, std::move(status), bytes);
               }),
      last_progress_(absl::Now()),
      mailbox_(session_.mail_tx, session_.mail_rx, &done_, [this] { return status(); }) {
  // A freshly created ring starts at zero; an acceptor may see a peer that already wrote.
  tx_head_ = session_.tx.LoadHead();
  tx_tail_seen_ = tx_head_;
  rx_tail_ = session_.rx.LoadTail();
}

ConnectionState::~ConnectionState() = default;

absl::Status ConnectionState::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

ConnectionStats ConnectionState::stats() const {
  ConnectionStats s;
  s.peer_can_pull = session_.peer_can_pull;
  s.cma_bytes_sent = cma_sent_.load();
  s.cma_bytes_received = cma_received_.load();
  s.ring_bytes_sent = ring_sent_.load();
  s.ring_bytes_received = ring_received_.load();
  s.held_messages = held_messages_.load();
  return s;
}

void ConnectionState::PushLocked(uint64_t wr_id, Opcode opcode, absl::Status status, size_t bytes,
                                 std::optional<uint32_t> immediate) {
  cq_->Push(MakeCompletion(id_, opcode, wr_id, std::move(status), bytes, immediate));
}

absl::Status ConnectionState::PostSend(absl::Span<const ConstBuffer> buffers, uint64_t wr_id) {
  SendOp op;
  op.wr_id = wr_id;
  for (const ConstBuffer& b : buffers) {
    if (b.data == nullptr && b.size > 0) {
      return absl::InvalidArgumentError(
          "PostSend: a buffer has a null pointer and a non-zero size");
    }
    if (b.size > config_.max_message_bytes - op.total) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PostSend: message exceeds max_message_bytes = ", config_.max_message_bytes));
    }
    op.total += b.size;
    if (b.size > 0) op.buffers.push_back(b);
  }
  op.cma_possible = session_.peer_can_pull && op.buffers.size() <= kMaxCmaSegments;
  op.use_cma = op.cma_possible && op.total >= config_.cma_threshold;
  return EnqueueLocked(std::move(op));
}

absl::Status ConnectionState::PostSendProduced(size_t length, Producer producer, uint64_t wr_id) {
  if (length > config_.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PostSendProduced: message exceeds max_message_bytes = ", config_.max_message_bytes));
  }
  SendOp op;
  op.wr_id = wr_id;
  op.total = length;
  op.producer = std::move(producer);
  return EnqueueLocked(std::move(op));
}

absl::Status ConnectionState::PostWrite(const MemoryRegion& local, size_t local_offset,
                                        size_t length, const RegionHandle& remote,
                                        size_t remote_offset, std::optional<uint32_t> immediate,
                                        uint64_t wr_id) {
  PLEXUS_RETURN_IF_ERROR(CheckLocalRange(local, local_offset, length));
  if (remote.backend != Backend::kShm) {
    return absl::InvalidArgumentError(absl::StrCat("PostWrite: remote region belongs to the ",
                                                   std::string(BackendName(remote.backend)),
                                                   " backend, not shm"));
  }
  if (remote.id == 0) return absl::InvalidArgumentError("PostWrite: remote region id is 0");
  if (remote_offset > remote.length || length > remote.length - remote_offset) {
    return absl::OutOfRangeError(absl::StrCat("PostWrite: ", length, " bytes at offset ",
                                              remote_offset, " exceed the remote region of ",
                                              remote.length, " bytes"));
  }
  if (length > config_.max_message_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("PostWrite: ", length, " bytes exceed max_message_bytes"));
  }
  SendOp op;
  op.is_write = true;
  op.wr_id = wr_id;
  op.total = length;
  op.region_id = remote.id;
  op.remote_offset = remote_offset;
  op.immediate = immediate;
  const uint8_t* src = static_cast<const uint8_t*>(local.data()) + local_offset;
  if (local.kind() == MemoryKind::kCuda && length > 0) {
    // Staged once at post time: the ring and cross-memory attach both read host memory.
    op.staging.reset(new (std::nothrow) uint8_t[length]);
    if (op.staging == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("PostWrite: cannot allocate ", length, " bytes to stage CUDA memory"));
    }
    PLEXUS_RETURN_IF_ERROR(CopyCudaToHost(op.staging.get(), src, length));
    src = op.staging.get();
  }
  if (length > 0) op.buffers.push_back(ConstBuffer{src, length});
  op.use_cma = session_.peer_can_pull && length >= config_.cma_threshold;
  return EnqueueLocked(std::move(op));
}

absl::Status ConnectionState::EnqueueLocked(SendOp op) {
  bool produced = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!status_.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("shm connection is down: ", std::string(status_.message())));
    }
    if (send_queue_.empty() && awaiting_.empty()) last_progress_ = absl::Now();
    if (!op.use_cma && op.cma_possible && op.total >= config_.exchange_cma_threshold &&
        PostedRecvBytesAtLeastLocked(config_.exchange_cma_threshold)) {
      op.use_cma = true;
    }
    if (!op.use_cma && op.cma_possible && op.total >= config_.lone_cma_threshold &&
        send_queue_.empty() && awaiting_.empty()) {
      op.use_cma = true;
    }
    const bool was_empty = send_queue_.empty();
    send_queue_.push_back(std::move(op));
    // Straight into the ring from the posting thread when nothing is queued ahead: no hop to
    // the progress loop for the common small message.
    if (was_empty) {
      ReapAcksLocked();
      produced = WriteFramesLocked();
    }
    if (!send_queue_.empty()) own_doorbell_.Ring();
  }
  if (produced) session_.peer_doorbell.Ring();
  return absl::OkStatus();
}

absl::Status ConnectionState::PostRecv(MutableBuffer buffer, uint64_t wr_id) {
  if (buffer.data == nullptr && buffer.size > 0) {
    return absl::InvalidArgumentError("PostRecv: null buffer with a non-zero size");
  }
  return PostReceive([&] { return matcher_.PostRecv(buffer, wr_id); });
}

absl::Status ConnectionState::PostRecvConsumed(size_t max_length, Consumer consumer,
                                               uint64_t wr_id) {
  return PostReceive(
      [&] { return matcher_.PostRecvConsumed(max_length, std::move(consumer), wr_id); });
}

template <typename Post>
absl::Status ConnectionState::PostReceive(Post post) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok() && !matcher_.has_unclaimed()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm connection is down: ", std::string(status_.message())));
  }
  if (auto s = post(); !s.ok()) {
    FailLocked(s, true);
  } else if (paused_) {
    own_doorbell_.Ring();  // the progress loop reads the ring again
  }
  return absl::OkStatus();
}

void ConnectionState::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok()) return;
  FailLocked(absl::CancelledError("shm connection closed locally"), false);
}

void ConnectionState::FailLocked(const absl::Status& why, bool tell_peer_error) {
  if (!status_.ok()) return;
  // What the peer sent before the failure stays deliverable (not after our own Close): the
  // messages waiting in the ring are held first.
  if (waiting_in_ring_ && !spill_ && !absl::IsCancelled(why)) {
    SpillRingLocked();
    if (!status_.ok()) return;  // the ring itself was malformed: that is the failure
  }
  status_ = why;
  for (SendOp& op : send_queue_) {
    PushLocked(op.wr_id, op.is_write ? Opcode::kWrite : Opcode::kSend, why, 0);
  }
  send_queue_.clear();
  for (AwaitingAck& a : awaiting_) {
    a.completion.status = why;
    cq_->Push(std::move(a.completion));
  }
  awaiting_.clear();
  if (incoming_.active && !incoming_.slot.held) {
    PushLocked(incoming_.slot.wr_id, Opcode::kRecv, why, 0);
  }
  incoming_ = Incoming{};
  paused_ = false;
  waiting_in_ring_ = false;
  // Messages that arrived whole stay deliverable (what the peer sent before it went away is
  // not lost), unless we closed the connection ourselves.
  matcher_.Fail(why, /*keep_whole=*/!absl::IsCancelled(why));

  // Tell the peer why, when its ring has room (it also sees the socket shut down below).
  const std::string reason(why.message().substr(0, kMaxCloseReasonBytes));
  const uint64_t tail = session_.tx.LoadTail();
  const uint64_t used = tx_head_ - tail;
  if (used <= session_.tx.capacity() &&
      session_.tx.capacity() - used >= FrameFootprint(reason.size())) {
    FrameHeader h;
    h.type = FrameType::kClose;
    h.flags = tell_peer_error ? kFlagError : 0;
    h.payload_bytes = static_cast<uint32_t>(reason.size());
    uint8_t header[kFrameHeaderBytes];
    EncodeFrameHeader(h, header);
    session_.tx.CopyIn(tx_head_, header, sizeof header);
    session_.tx.CopyIn(tx_head_ + kFrameHeaderBytes, reason.data(), reason.size());
    tx_head_ += FrameFootprint(reason.size());
    session_.tx.StoreHead(tx_head_);
  }
  ::shutdown(session_.socket.get(), SHUT_RDWR);
  session_.peer_doorbell.Ring();
  done_.store(true, std::memory_order_release);
}

bool ConnectionState::HasPeerDependentWorkLocked() const {
  return !send_queue_.empty() || !awaiting_.empty() || incoming_.active;
}

bool ConnectionState::Pump(absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok()) return false;
  const bool consumed = ReadFramesLocked();
  if (!status_.ok()) return true;
  const bool acked = ReapAcksLocked();
  if (!status_.ok()) return true;
  const bool produced = WriteFramesLocked();
  if (consumed || produced) session_.peer_doorbell.Ring();
  const bool did = consumed || acked || produced;
  if (did) last_progress_ = now;
  return did;
}

void ConnectionState::OnSocketHangup() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok()) return;
  // Whatever the peer wrote before it went away is still delivered.
  SpillRingLocked();
  // The rest waits in the ring (still mapped) for receives; the hang-up is reported again.
  if (!status_.ok() || paused_) return;
  FailLocked(absl::UnavailableError(absl::StrCat("shm: peer process ", session_.peer_pid, " ('",
                                                 session_.peer_address,
                                                 "') disconnected: it closed or died")),
             false);
}

void ConnectionState::CheckTimeout(absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok() || !HasPeerDependentWorkLocked()) return;
  if (now - last_progress_ > config_.op_timeout) {
    FailLocked(absl::DeadlineExceededError(
                   absl::StrCat("shm: no progress with peer process ", session_.peer_pid, " for ",
                                absl::FormatDuration(now - last_progress_), " (op_timeout ",
                                absl::FormatDuration(config_.op_timeout), "): peer stalled")),
               true);
  }
}

// ---- receiving ----

void ConnectionState::SpillRingLocked() {
  spill_ = true;
  while (status_.ok() && ReadFramesLocked()) {
  }
  spill_ = false;
}

std::optional<size_t> ConnectionState::PeekNext(MutableBuffer head) {
  std::lock_guard<std::mutex> lock(mu_);
  // The matcher shows held messages only: one waiting in the ring is held first.
  if (waiting_in_ring_ && status_.ok()) SpillRingLocked();
  return matcher_.PeekNext(head);
}

bool ConnectionState::ReadFramesLocked() {
  Ring& rx = session_.rx;
  const uint64_t head = rx.LoadHead();
  if (head - rx_tail_ > rx.capacity()) {
    FailLocked(absl::DataLossError(absl::StrCat("malformed shm ring: peer's head ", head,
                                                " is out of range (consumed ", rx_tail_,
                                                ", capacity ", rx.capacity(), ")")),
               true);
    return true;
  }
  bool any = false;
  size_t frames = 0;
  uint64_t bytes = 0;
  while (head != rx_tail_ && frames < kReadBudgetFrames && bytes < kReadBudgetBytes) {
    const uint64_t available = head - rx_tail_;
    rx_unread_ = available;
    uint8_t raw[kFrameHeaderBytes];
    const size_t have = std::min<uint64_t>(available, kFrameHeaderBytes);
    rx.CopyOut(rx_tail_, raw, have);
    absl::StatusOr<FrameHeader> h = DecodeFrameHeader(absl::MakeConstSpan(raw, have), limits_);
    if (!h.ok()) {
      FailLocked(h.status(), true);
      return true;
    }
    const uint64_t footprint = FrameFootprint(h->payload_bytes);
    if (footprint > available) {
      FailLocked(
          absl::DataLossError(absl::StrCat("malformed shm frame: truncated (needs ", footprint,
                                           " bytes, ring holds ", available, ")")),
          true);
      return true;
    }
    if (absl::Status s = ProcessFrameLocked(*h, rx_tail_ + kFrameHeaderBytes); !s.ok()) {
      FailLocked(s, true);
      return true;
    }
    if (!status_.ok()) return true;  // a close frame
    if (paused_) break;              // the frame stays in the ring
    rx_tail_ += footprint;
    rx.StoreTail(rx_tail_);
    any = true;
    ++frames;
    bytes += h->payload_bytes;
    if (h->type == FrameType::kMessageCma || h->type == FrameType::kWriteCma) {
      bytes += h->total_bytes;
    }
  }
  return any;
}

absl::Status ConnectionState::ProcessFrameLocked(const FrameHeader& h, uint64_t payload_pos) {
  const Ring& rx = session_.rx;
  switch (h.type) {
    case FrameType::kMessage:
    case FrameType::kMessagePart: {
      if (h.type == FrameType::kMessage) {
        if (auto s = BeginMessageLocked(h.total_bytes, true); !s.ok() || paused_) return s;
      } else if (!incoming_.active || h.total_bytes != incoming_.total ||
                 h.offset != incoming_.received) {
        return absl::DataLossError(
            absl::StrCat("malformed shm frame: message part at offset ", h.offset, " of ",
                         h.total_bytes, " bytes does not continue the message being received"));
      }
      if (incoming_.slot.consumer != nullptr) {
        PLEXUS_RETURN_IF_ERROR(ConsumeRingLocked(payload_pos, h.offset, h.payload_bytes));
      } else if (incoming_.slot.dest != nullptr) {
        rx.CopyOut(payload_pos, incoming_.slot.dest + h.offset, h.payload_bytes);
      }
      incoming_.received += h.payload_bytes;
      ring_received_.fetch_add(h.payload_bytes, std::memory_order_relaxed);
      if (incoming_.received == incoming_.total) return FinishMessageLocked();
      return absl::OkStatus();
    }
    case FrameType::kMessageCma: {
      scratch_.resize(h.payload_bytes);
      rx.CopyOut(payload_pos, scratch_.data(), h.payload_bytes);
      PLEXUS_ASSIGN_OR_RETURN(auto segments, DecodeCmaSegments(scratch_, h));
      if (auto s = BeginMessageLocked(h.total_bytes, false); !s.ok() || paused_) return s;
      if (!status_.ok()) return absl::OkStatus();
      if (incoming_.slot.consumer != nullptr) {
        PLEXUS_RETURN_IF_ERROR(ConsumeCmaLocked(segments));
      } else {
        PLEXUS_RETURN_IF_ERROR(CmaRead(session_.peer_pid, incoming_.slot.dest, segments));
      }
      cma_received_.fetch_add(h.total_bytes, std::memory_order_relaxed);
      incoming_.received = incoming_.total;
      return FinishMessageLocked();
    }
    case FrameType::kWrite:
    case FrameType::kWriteImm:
    case FrameType::kWriteCma:
      return PlaceWriteLocked(h, payload_pos);
    case FrameType::kClose: {
      std::string reason(h.payload_bytes, '\0');
      rx.CopyOut(payload_pos, reason.data(), reason.size());
      const bool error = (h.flags & kFlagError) != 0;
      // A deliberate close is Aborted; a peer that died (no close frame) is Unavailable.
      const std::string text =
          absl::StrCat("shm: peer process ", session_.peer_pid, " closed the connection",
                       error ? " because of an error: " : "", error ? reason : "");
      FailLocked(error ? absl::UnavailableError(text) : absl::AbortedError(text), false);
      return absl::OkStatus();
    }
  }
  return absl::DataLossError("malformed shm frame: unknown type");
}

absl::Status ConnectionState::BeginMessageLocked(uint64_t total, bool in_ring) {
  if (incoming_.active) {
    return absl::DataLossError(
        "malformed shm frame: a new message starts before the previous one is complete");
  }
  // A ring-borne message nobody asked for yet waits in the ring while the sender still has room
  // to write: the receive posted next takes it straight from there (a broadcast root or any
  // sender that runs ahead otherwise costs its receiver a second copy, into held memory).
  // The sender is (about to be) blocked once less than a partial frame's room is left.
  const uint64_t capacity = session_.rx.capacity();
  const uint64_t blocked_at = capacity - 2 * (kFrameHeaderBytes + kMinPartialPayload);
  waiting_in_ring_ = in_ring && !spill_ && !matcher_.has_posted_recv() && total <= capacity / 2 &&
                     rx_unread_ < blocked_at;
  if (waiting_in_ring_) {
    paused_ = true;
    return absl::OkStatus();
  }
  Matcher::Slot slot;
  PLEXUS_ASSIGN_OR_RETURN(Matcher::Admission admitted, matcher_.Admit(total, &slot));
  paused_ = admitted == Matcher::Admission::kWait;
  if (paused_) return absl::OkStatus();
  if (slot.held) held_messages_.fetch_add(1, std::memory_order_relaxed);
  incoming_ = Incoming{};
  incoming_.active = true;
  incoming_.total = total;
  incoming_.slot = slot;
  return absl::OkStatus();
}

absl::Status ConnectionState::ReceiveError(const absl::Status& s) const {
  return absl::Status(s.code(),
                      absl::StrCat("shm receive (wr_id ", incoming_.slot.wr_id, ") from process ",
                                   session_.peer_pid, ": ", s.message()));
}

absl::Status ConnectionState::ConsumeRingLocked(uint64_t pos, uint64_t offset, size_t n) {
  const Ring::Pieces p = session_.rx.View(pos, n);
  Consumer& consumer = *incoming_.slot.consumer;
  absl::Status s =
      ConsumeRange(consumer, offset, absl::MakeConstSpan(p.first, p.first_size), incoming_.total);
  if (s.ok() && p.second_size > 0) {
    s = ConsumeRange(consumer, offset + p.first_size, absl::MakeConstSpan(p.second, p.second_size),
                     incoming_.total);
  }
  return s.ok() ? s : ReceiveError(s);
}

absl::Status ConnectionState::ConsumeCmaLocked(absl::Span<const CmaSegment> segments) {
  std::vector<uint8_t> chunk(std::min<uint64_t>(incoming_.total, kMaxProduceConsumeBytes));
  uint64_t offset = 0;
  for (const CmaSegment& segment : segments) {
    for (uint64_t at = 0; at < segment.length;) {
      const size_t n = std::min<uint64_t>(segment.length - at, chunk.size());
      const CmaSegment part{segment.address + at, n};
      PLEXUS_RETURN_IF_ERROR(
          CmaRead(session_.peer_pid, chunk.data(), absl::MakeConstSpan(&part, 1)));
      absl::Status s = ConsumeRange(*incoming_.slot.consumer, offset,
                                    absl::MakeConstSpan(chunk.data(), n), incoming_.total);
      if (!s.ok()) return ReceiveError(s);
      at += n;
      offset += n;
    }
  }
  return absl::OkStatus();
}

absl::Status ConnectionState::FinishMessageLocked() {
  const Matcher::Slot slot = incoming_.slot;
  incoming_ = Incoming{};
  return matcher_.Placed(slot);  // an error: a consumer failed
}

absl::Status ConnectionState::PlaceWriteLocked(const FrameHeader& h, uint64_t payload_pos) {
  if (incoming_.active) {
    return absl::DataLossError("malformed shm frame: a write interrupts a message");
  }
  // The whole write's range is checked with every frame: a region deregistered midway stops it.
  absl::StatusOr<WriteTarget> target =
      registry_->Resolve(h.region_id, h.remote_offset, h.total_bytes);
  if (!target.ok()) {
    return absl::Status(target.status().code(),
                        absl::StrCat("shm: peer's one-sided write failed: ",
                                     std::string(target.status().message())));
  }
  bool last = false;
  if (h.type == FrameType::kWriteCma) {
    scratch_.resize(h.payload_bytes);
    session_.rx.CopyOut(payload_pos, scratch_.data(), h.payload_bytes);
    PLEXUS_ASSIGN_OR_RETURN(auto segments, DecodeCmaSegments(scratch_, h));
    if (target->kind == MemoryKind::kHost) {
      PLEXUS_RETURN_IF_ERROR(CmaRead(session_.peer_pid, target->data, segments));
    } else {
      std::unique_ptr<uint8_t[]> staging(new (std::nothrow) uint8_t[h.total_bytes]);
      if (staging == nullptr) {
        return absl::ResourceExhaustedError("shm: cannot allocate a staging buffer for CUDA");
      }
      PLEXUS_RETURN_IF_ERROR(CmaRead(session_.peer_pid, staging.get(), segments));
      PLEXUS_RETURN_IF_ERROR(CopyHostToCuda(target->data, staging.get(), h.total_bytes));
    }
    cma_received_.fetch_add(h.total_bytes, std::memory_order_relaxed);
    last = true;
  } else {
    PLEXUS_RETURN_IF_ERROR(CopyFromRing(session_.rx, payload_pos, target->data + h.offset,
                                        h.payload_bytes, target->kind));
    ring_received_.fetch_add(h.payload_bytes, std::memory_order_relaxed);
    last = h.offset + h.payload_bytes == h.total_bytes;
  }
  const bool has_immediate = h.type == FrameType::kWriteImm ||
                             (h.type == FrameType::kWriteCma && (h.flags & kFlagImmediate) != 0);
  if (last && has_immediate) {
    PushLocked(0, Opcode::kRemoteWrite, absl::OkStatus(), h.total_bytes, h.immediate);
  }
  return absl::OkStatus();
}

// ---- sending ----

bool ConnectionState::PostedRecvBytesAtLeastLocked(size_t bytes) const {
  // The first few only: a send must not cost a walk over thousands of small posted receives.
  constexpr size_t kMaxLooked = 16;
  size_t sum = 0;
  for (size_t i = 0; sum < bytes; ++i) {
    if (i == kMaxLooked) return false;
    const MutableBuffer* recv = matcher_.PostedRecv(i);
    if (recv == nullptr) return false;
    sum += recv->size;
  }
  return true;
}

bool ConnectionState::ReapAcksLocked() {
  const uint64_t tail = session_.tx.LoadTail();
  if (tail == tx_tail_seen_) return false;
  if (tail - tx_tail_seen_ > tx_head_ - tx_tail_seen_) {
    FailLocked(absl::DataLossError(absl::StrCat("malformed shm ring: peer's tail ", tail,
                                                " is out of range (produced ", tx_head_, ")")),
               true);
    return true;
  }
  tx_tail_seen_ = tail;
  while (!awaiting_.empty() && awaiting_.front().end_position <= tail) {
    cq_->Push(std::move(awaiting_.front().completion));
    awaiting_.pop_front();
  }
  return true;
}

bool ConnectionState::WriteFramesLocked() {
  bool any = false;
  while (!send_queue_.empty()) {
    const uint64_t free_bytes = session_.tx.capacity() - (tx_head_ - tx_tail_seen_);
    if (!WriteOneFrameLocked(send_queue_.front(), free_bytes)) {
      // Maybe the peer consumed meanwhile.
      const uint64_t before = tx_tail_seen_;
      ReapAcksLocked();
      if (!status_.ok() || tx_tail_seen_ == before) break;
      continue;
    }
    any = true;
    SendOp& op = send_queue_.front();
    if (op.framed < op.total) continue;
    Completion c = MakeCompletion(id_, op.is_write ? Opcode::kWrite : Opcode::kSend, op.wr_id,
                                  absl::OkStatus(), op.total);
    if (op.is_write || op.use_cma) {
      // Done only once the peer consumed the frame: it placed (or pulled) the bytes.
      awaiting_.push_back(AwaitingAck{tx_head_, std::move(c)});
    } else {
      cq_->Push(std::move(c));  // the bytes are in the ring; the caller's buffers are free
    }
    send_queue_.pop_front();
  }
  return any;
}

bool ConnectionState::WriteOneFrameLocked(SendOp& op, uint64_t free_bytes) {
  Ring& tx = session_.tx;
  FrameHeader h;
  h.total_bytes = op.total;
  h.region_id = op.region_id;
  h.remote_offset = op.remote_offset;
  uint8_t header[kFrameHeaderBytes];

  if (op.use_cma) {
    const size_t payload = op.buffers.size() * kCmaSegmentBytes;
    if (free_bytes < FrameFootprint(payload)) return false;
    h.type = op.is_write ? FrameType::kWriteCma : FrameType::kMessageCma;
    h.payload_bytes = static_cast<uint32_t>(payload);
    if (op.is_write && op.immediate) {
      h.flags = kFlagImmediate;
      h.immediate = *op.immediate;
    }
    EncodeFrameHeader(h, header);
    tx.CopyIn(tx_head_, header, sizeof header);
    scratch_.resize(payload);
    // Segment by segment: a CmaSegment[kMaxCmaSegments] on the stack was zero-filled (16 KiB)
    // on every frame (docs/measurements/collectives.md, "What made the difference").
    for (size_t i = 0; i < op.buffers.size(); ++i) {
      const CmaSegment segment{reinterpret_cast<uintptr_t>(op.buffers[i].data), op.buffers[i].size};
      EncodeCmaSegments(absl::MakeConstSpan(&segment, 1), scratch_.data() + i * kCmaSegmentBytes);
    }
    tx.CopyIn(tx_head_ + kFrameHeaderBytes, scratch_.data(), payload);
    tx_head_ += FrameFootprint(payload);
    tx.StoreHead(tx_head_);
    op.framed = op.total;
    cma_sent_.fetch_add(op.total, std::memory_order_relaxed);
    return true;
  }

  const uint64_t remaining = op.total - op.framed;
  uint64_t piece = std::min(remaining, chunk_bytes_);
  if (free_bytes < FrameFootprint(piece)) {
    // Use what room there is rather than wait for a whole chunk.
    if (free_bytes < kFrameHeaderBytes + kMinPartialPayload) return false;
    piece = std::min(remaining, (free_bytes - kFrameHeaderBytes) & ~uint64_t{7});
  }
  if (op.is_write) {
    h.type = op.immediate ? FrameType::kWriteImm : FrameType::kWrite;
    h.immediate = op.immediate.value_or(0);
    h.offset = op.framed;
  } else {
    h.type = op.framed == 0 ? FrameType::kMessage : FrameType::kMessagePart;
    h.offset = op.framed;
  }
  h.payload_bytes = static_cast<uint32_t>(piece);
  EncodeFrameHeader(h, header);
  tx.CopyIn(tx_head_, header, sizeof header);
  uint64_t pos = tx_head_ + kFrameHeaderBytes;
  uint64_t left = piece;
  if (op.producer != nullptr) {
    // Straight into the ring's free space; the frame is published (StoreHead) only once whole.
    auto [first, second] = tx.WritableView(pos, piece);
    absl::Status s = ProduceRange(op.producer, op.framed, first, op.total);
    if (s.ok() && !second.empty()) {
      s = ProduceRange(op.producer, op.framed + first.size(), second, op.total);
    }
    if (!s.ok()) {
      FailLocked(absl::Status(s.code(), absl::StrCat("shm send (wr_id ", op.wr_id, ") to process ",
                                                     session_.peer_pid, ": ", s.message())),
                 true);
      return false;  // `op` is gone with the send queue
    }
    left = 0;
  }
  while (left > 0) {
    const ConstBuffer& b = op.buffers[op.cursor_buffer];
    const size_t n = std::min<uint64_t>(left, b.size - op.cursor_offset);
    tx.CopyIn(pos, static_cast<const uint8_t*>(b.data) + op.cursor_offset, n);
    pos += n;
    left -= n;
    op.cursor_offset += n;
    if (op.cursor_offset == b.size) {
      ++op.cursor_buffer;
      op.cursor_offset = 0;
    }
  }
  tx_head_ += FrameFootprint(piece);
  tx.StoreHead(tx_head_);
  op.framed += piece;
  ring_sent_.fetch_add(piece, std::memory_order_relaxed);
  if (piece >= (64 << 10)) session_.peer_doorbell.Ring();  // let the reader start early
  return true;
}

}  // namespace plexus::transport::internal::shm
