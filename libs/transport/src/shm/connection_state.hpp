// The per-connection engine of the shm backend: the operation queues of one side and the code
// that moves them through the two rings. Driven by ShmDevice's progress loop (or directly by a
// posting thread when that is cheaper); every method takes the connection's lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "mailbox.hpp"
#include "matcher.hpp"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/connection.hpp"
#include "region_registry.hpp"
#include "shm/frame.hpp"
#include "shm/session.hpp"
#include "shm/stats.hpp"

namespace plexus::transport::internal::shm {

struct EngineConfig {
  size_t max_message_bytes = 0;
  absl::Duration op_timeout = absl::Seconds(30);
  // Bulk sends at least this long use CMA. Below it the ring wins: both processes copy at once
  // (sender in, receiver out) from cache-hot ring memory, while process_vm_readv pays for
  // pinning every page it touches (docs/measurements/transport.md, "Figures first recorded in
  // code comments").
  size_t cma_threshold = size_t{2} << 20;
  // ... and from this size when the sending process has at least as many bytes of receives
  // posted on the same connection (a two-way exchange): its CPU then has its own copy to make,
  // so the ring's copy-in would not run beside the peer's copy-out but in series with it
  // (docs/measurements/collectives.md, "Single copy for two-way exchanges").
  size_t exchange_cma_threshold = size_t{128} << 10;
  // ... and from this size when nothing is queued or awaiting an acknowledgement on the
  // connection (a lone one-way message; ShmOptions::lone_cma_threshold). Off by default.
  size_t lone_cma_threshold = std::numeric_limits<size_t>::max();
  // Caps on messages held before their receive is posted (DeviceOptions::max_held_bytes_*).
  size_t held_bytes_per_connection = kDefaultHeldBytesPerConnection;
  std::shared_ptr<HoldBudget> held_budget;  // the device's
};

class ConnectionState {
 public:
  ConnectionState(Session session, CompletionQueue* cq, std::shared_ptr<RegionRegistry> registry,
                  Doorbell own_doorbell, const EngineConfig& config);
  ~ConnectionState();

  void set_id(uint64_t id) { id_ = id; }
  int socket_fd() const { return session_.socket.get(); }

  absl::Status PostSend(absl::Span<const ConstBuffer> buffers, uint64_t wr_id);
  absl::Status PostRecv(MutableBuffer buffer, uint64_t wr_id);
  // Connection::PostSendProduced: the payload is produced straight into the ring's free space,
  // frame by frame; never by cross-memory attach, whatever its size.
  absl::Status PostSendProduced(size_t length, Producer producer, uint64_t wr_id);
  // Connection::PostRecvConsumed: ring frames are handed to the consumer in place; a message
  // the peer sent by cross-memory attach is pulled a chunk at a time into a buffer of at most
  // kMaxProduceConsumeBytes and handed over from there.
  absl::Status PostRecvConsumed(size_t max_length, Consumer consumer, uint64_t wr_id);
  std::optional<size_t> PeekNext(MutableBuffer head);
  absl::Status PostWrite(const MemoryRegion& local, size_t local_offset, size_t length,
                         const RegionHandle& remote, size_t remote_offset,
                         std::optional<uint32_t> immediate, uint64_t wr_id);
  void Close();
  absl::Status status() const;
  const std::string& peer_address() const { return session_.peer_address; }
  ConnectionStats stats() const;

  // Moves whatever can move now; true when anything did.
  bool Pump(absl::Time now);
  // The liveness socket reported hang-up or data: the peer process closed or died.
  void OnSocketHangup();
  // Fails the connection when peer-dependent work made no progress for op_timeout.
  void CheckTimeout(absl::Time now);
  // Whether the connection is finished (failed or closed) and needs no more progress.
  bool done() const { return done_.load(std::memory_order_acquire); }
  Mailbox* mailbox() { return &mailbox_; }

 private:
  struct SendOp {
    bool is_write = false;
    uint64_t wr_id = 0;
    absl::InlinedVector<ConstBuffer, 4> buffers;
    uint64_t total = 0;
    uint64_t framed = 0;  // payload bytes already written into the ring
    size_t cursor_buffer = 0;
    size_t cursor_offset = 0;
    bool use_cma = false;
    bool cma_possible = false;  // a send the peer may pull (EnqueueLocked may choose it)
    uint64_t region_id = 0;
    uint64_t remote_offset = 0;
    std::optional<uint32_t> immediate;
    std::unique_ptr<uint8_t[]> staging;  // host copy of a CUDA source
    Producer producer;                   // a produced send: makes the payload in the ring
  };
  struct AwaitingAck {
    uint64_t end_position;  // the op is done once the peer's tail reaches this
    Completion completion;
  };
  struct Incoming {
    bool active = false;
    uint64_t total = 0;
    uint64_t received = 0;
    Matcher::Slot slot;  // a posted receive's buffer, or held memory
  };

  absl::Status EnqueueLocked(SendOp op);
  // A receive posted by `post` (the matcher's PostRecv or PostRecvConsumed) under the lock.
  template <typename Post>
  absl::Status PostReceive(Post post);
  // Fails every outstanding operation with `why`, tells the peer, and marks the connection done.
  void FailLocked(const absl::Status& why, bool tell_peer_error);
  bool ReadFramesLocked();
  absl::Status ProcessFrameLocked(const FrameHeader& h, uint64_t payload_pos);
  // `in_ring`: the message's bytes follow in the ring (not by cross-memory attach), so that it
  // may wait there for its receive.
  absl::Status BeginMessageLocked(uint64_t total, bool in_ring);
  // Reads frames with every early message taken into held memory (none waits in the ring).
  void SpillRingLocked();
  absl::Status FinishMessageLocked();
  // Hands a message's bytes [offset, +n) in the ring at `pos` to the incoming consumer.
  absl::Status ConsumeRingLocked(uint64_t pos, uint64_t offset, size_t n);
  // Pulls a cross-memory-attach message from the peer a chunk at a time into the consumer.
  absl::Status ConsumeCmaLocked(absl::Span<const CmaSegment> segments);
  absl::Status ReceiveError(const absl::Status& s) const;
  absl::Status PlaceWriteLocked(const FrameHeader& h, uint64_t payload_pos);
  bool ReapAcksLocked();
  // Whether the oldest receives posted on this connection (up to 16) take at least `bytes`
  // together (a consumed receive counts with its maximum length).
  bool PostedRecvBytesAtLeastLocked(size_t bytes) const;
  bool WriteFramesLocked();
  bool WriteOneFrameLocked(SendOp& op, uint64_t free_bytes);
  void PushLocked(uint64_t wr_id, Opcode opcode, absl::Status status, size_t bytes,
                  std::optional<uint32_t> immediate = std::nullopt);
  bool HasPeerDependentWorkLocked() const;

  Session session_;
  CompletionQueue* cq_;
  std::shared_ptr<RegionRegistry> registry_;
  Doorbell own_doorbell_;
  const EngineConfig config_;
  const FrameLimits limits_;
  const uint64_t chunk_bytes_;
  uint64_t id_ = 0;

  mutable std::mutex mu_;
  absl::Status status_;
  std::atomic<bool> done_{false};
  std::deque<SendOp> send_queue_;
  std::deque<AwaitingAck> awaiting_;
  Matcher matcher_;
  Incoming incoming_;
  // The next message does not fit under the caps on held bytes: its frame stays in the ring
  // (the peer blocks once the ring is full) until receives are posted.
  bool paused_ = false;
  // The next message has no receive yet and waits in the ring instead of being copied into held
  // memory (paused_ is set too): its receive then takes it straight from the ring, one copy
  // instead of two. Only while the sender has room left to write (a sender blocked on a full
  // ring gets its early messages held, so that its sends complete as the contract says), and
  // never when every early message must be whole in memory (the peer hung up, PeekNext, a
  // failure).
  bool waiting_in_ring_ = false;
  bool spill_ = false;         // SpillRingLocked is reading: hold, never wait in the ring
  uint64_t rx_unread_ = 0;     // ring bytes the peer produced and this side did not consume yet
  uint64_t tx_head_ = 0;       // what this side produced into session_.tx
  uint64_t tx_tail_seen_ = 0;  // the peer's last consumption of session_.tx
  uint64_t rx_tail_ = 0;       // what this side consumed from session_.rx
  absl::Time last_progress_;
  std::vector<uint8_t> scratch_;

  MailboxEndpoint mailbox_;
  std::atomic<uint64_t> cma_sent_{0}, cma_received_{0}, ring_sent_{0}, ring_received_{0},
      held_messages_{0};
};

}  // namespace plexus::transport::internal::shm
