// The protocol of a verbs connection, free of libibverbs so that it is unit-tested without RDMA
// hardware (tests/transport/verbs_protocol_test.cpp). The ibverbs layer (verbs_device.cpp) only
// turns the Wire calls below into ibv_post_send / ibv_post_recv and feeds work completions back.
//
// Two-sided messages travel through registered bounce buffers, so user buffers need no
// registration: each side posts `recv_slots` receives of `slot_bytes`; a message is cut into
// chunks (a 16-byte ChunkHeader, then payload) that each fill one receive, and is reassembled in
// order into the matched PostRecv buffer, or into a held copy when no receive is posted yet.
// Credit-based flow control guarantees a receive is always posted for every SEND and
// WRITE_WITH_IMM: a sender holds one credit per free peer receive, data needs two credits (the
// last one is reserved for a credit-only chunk, so two blocked peers can always unblock each
// other), and receivers return credits in the header of every data chunk they send, or in a
// credit-only chunk once half their receives await being announced.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "matcher.hpp"
#include "plexus/base/net.hpp"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/types.hpp"
#include "verbs/slot_table.hpp"

namespace plexus::transport::verbs {

// ---- Encodings --------------------------------------------------------------------------------

inline constexpr size_t kChunkHeaderBytes = 16;

enum class ChunkType : uint8_t {
  kData = 1,    // a piece of a two-sided message
  kCredit = 2,  // no payload: returns credits only
};
inline constexpr uint8_t kFirstChunk = 1;
inline constexpr uint8_t kLastChunk = 2;

struct ChunkHeader {
  ChunkType type = ChunkType::kData;
  uint8_t flags = 0;         // kFirstChunk | kLastChunk
  uint32_t credits = 0;      // receives the sender re-posted since its previous announcement
  uint64_t total_bytes = 0;  // length of the whole message this chunk belongs to
};

void EncodeChunkHeader(const ChunkHeader& header, uint8_t* out);
// Rejects a wrong magic, an unknown type or flags, and a credit chunk with message fields.
absl::StatusOr<ChunkHeader> DecodeChunkHeader(absl::Span<const uint8_t> bytes);

// Private data of the librdmacm handshake: what each side tells the other about its receives.
struct Hello {
  uint32_t recv_slots = 0;
  uint32_t slot_bytes = 0;
};
inline constexpr size_t kHelloBytes = 16;
// At least 4 receives, so that the credit threshold (half of them) is at least 2: a credit-only
// chunk then never triggers another one by itself, and credit chunks cannot ping-pong.
inline constexpr uint32_t kMinSlots = 4;
inline constexpr uint32_t kMaxSlots = 1 << 16;
inline constexpr uint32_t kMinSlotBytes = kChunkHeaderBytes + 16;
inline constexpr uint32_t kMaxSlotBytes = 1 << 24;

std::array<uint8_t, kHelloBytes> EncodeHello(const Hello& hello);
// Accepts trailing padding (InfiniBand CM pads private data); rejects anything else malformed.
absl::StatusOr<Hello> DecodeHello(absl::Span<const uint8_t> bytes);

// "1.2.3.4:5678" or "[fe80::1]:5678": base::net::ParseHostPort's syntax, except that the host
// may not be empty (rdma_cm binds and connects to one interface). Port 0 is accepted (listen on
// any port).
using HostPort = base::net::HostPort;
absl::StatusOr<HostPort> ParseHostPort(std::string_view address);
std::string FormatHostPort(std::string_view host, uint16_t port);  // base::net::JoinHostPort

// The immediate travels big-endian (verbs imm_data is __be32).
uint32_t ImmediateToWire(uint32_t host);
uint32_t ImmediateFromWire(uint32_t wire);

// ---- Engine -----------------------------------------------------------------------------------

struct ProtocolConfig {
  uint32_t slot_bytes = 32 << 10;  // bytes of one bounce buffer, chunk header included
  uint32_t recv_slots = 32;        // receives kept posted
  uint32_t send_slots = 32;        // send bounce buffers
  uint32_t max_send_wr = 128;      // send-queue depth of the queue pair
  uint64_t max_write_bytes = uint64_t{1} << 30;  // longest single RDMA WRITE work request
  uint64_t max_message_bytes = uint64_t{1} << 34;
  absl::Duration op_timeout = absl::Seconds(30);
  // Caps on messages held before their receive is posted (DeviceOptions::max_held_bytes_*).
  uint64_t held_bytes_per_connection = kDefaultHeldBytesPerConnection;
  std::shared_ptr<HoldBudget> held_budget;  // the device's; null = no device cap
};
absl::Status ValidateConfig(const ProtocolConfig& config);

// A work completion, as the engine needs it. `immediate` is set only for the receive consumed by
// an incoming RDMA WRITE_WITH_IMM, whose `byte_len` is the length of the write.
struct WireCompletion {
  WireCompletion() = default;
  WireCompletion(absl::Status s, uint32_t len = 0, std::optional<uint32_t> imm = std::nullopt)
      : status(std::move(s)), byte_len(len), immediate(imm) {}

  absl::Status status;
  uint32_t byte_len = 0;
  std::optional<uint32_t> immediate;
};

// One RDMA WRITE work request (at most ProtocolConfig::max_write_bytes).
struct WriteSegment {
  uint64_t local_addr = 0;
  uint32_t lkey = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
  std::optional<uint32_t> immediate;  // host order; WRITE_WITH_IMM when set
};

// What the engine asks of the queue pair. Every post that returns OK yields exactly one
// OnCompletion with the same handle (flushed ones included).
class Wire {
 public:
  virtual ~Wire() = default;
  // A receive of the whole recv slot `slot`.
  virtual absl::Status PostRecv(uint32_t wr_handle, uint32_t slot) = 0;
  // A signalled SEND of the first `bytes` of send slot `slot`.
  virtual absl::Status PostSendSlot(uint32_t wr_handle, uint32_t slot, uint32_t bytes) = 0;
  // A signalled RDMA WRITE (with immediate when segment.immediate is set).
  virtual absl::Status PostWrite(uint32_t wr_handle, const WriteSegment& segment) = 0;
  // Called once, when the connection fails: stop the queue pair and tell the peer.
  virtual void Abort(const absl::Status& reason) = 0;
};

// A one-sided write as the user asked for it (addresses already resolved and bounds-checked).
struct WriteRequest {
  uint64_t local_addr = 0;
  uint32_t lkey = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t length = 0;
  std::optional<uint32_t> immediate;
};

// The state machine of one connection. Not thread-safe: the owner serialises calls.
class Protocol {
 public:
  // `send_pool` and `recv_pool` hold send_slots and recv_slots buffers of slot_bytes each; they
  // are registered with the device by the owner and must outlive every posted work request.
  Protocol(const ProtocolConfig& config, absl::Span<uint8_t> send_pool,
           absl::Span<uint8_t> recv_pool, Wire* wire, CompletionQueue* cq, uint64_t connection_id,
           std::string peer);
  Protocol(const Protocol&) = delete;
  Protocol& operator=(const Protocol&) = delete;

  Hello local_hello() const { return {config_.recv_slots, config_.slot_bytes}; }
  // Posts every receive; call before the handshake so that the peer's first SEND finds one.
  absl::Status Start();
  // The handshake is done: `peer` is what the other side announced.
  absl::Status Connected(const Hello& peer, absl::Time now);

  absl::Status PostSend(absl::Span<const ConstBuffer> buffers, uint64_t wr_id, absl::Time now);
  absl::Status PostSend(ConstBuffer buffer, uint64_t wr_id, absl::Time now) {
    return PostSend(absl::MakeConstSpan(&buffer, 1), wr_id, now);
  }
  absl::Status PostRecv(MutableBuffer buffer, uint64_t wr_id);
  // Connection::PostSendProduced: the message is produced whole into a buffer of the operation
  // now, then sent as PostSend sends it. A producer error fails the send and the connection.
  absl::Status PostSendProduced(size_t length, Producer producer, uint64_t wr_id, absl::Time now);
  // Connection::PostRecvConsumed: the message is held until whole, then consumed.
  absl::Status PostRecvConsumed(size_t max_length, Consumer consumer, uint64_t wr_id);
  std::optional<size_t> PeekNext(MutableBuffer head) const { return matcher_.PeekNext(head); }
  absl::Status PostWrite(const WriteRequest& request, uint64_t wr_id, absl::Time now);

  // A work completion of a request this engine posted. Unknown or stale handles are ignored.
  void OnCompletion(uint32_t wr_handle, const WireCompletion& completion, absl::Time now);
  // Fails every outstanding operation with `reason` (the first reason sticks) and aborts the wire.
  void Fail(const absl::Status& reason);
  // Fails the connection with DeadlineExceeded when operations wait and nothing moved for
  // op_timeout.
  void CheckTimeout(absl::Time now);

  absl::Status status() const { return status_; }
  const std::string& peer() const { return peer_; }
  // Introspection (tests, diagnostics).
  uint32_t credits() const { return credits_; }
  uint32_t owed_credits() const { return owed_; }
  size_t outstanding_operations() const { return ops_.size() + matcher_.posted_recvs(); }
  size_t posted_work_requests() const { return wrs_.size(); }
  size_t held_messages() const { return matcher_.held_messages(); }

 private:
  enum class OpKind : uint8_t { kSend, kWrite };
  struct Op {
    OpKind kind = OpKind::kSend;
    uint64_t wr_id = 0;
    uint64_t seq = 0;
    uint64_t total = 0;
    uint64_t posted = 0;  // bytes handed to the wire so far
    uint32_t inflight = 0;
    bool fully_posted = false;
    std::vector<ConstBuffer> buffers;  // kSend
    std::vector<uint8_t> staged;       // a produced send's bytes (`buffers` points into it)
    size_t buf_index = 0;
    size_t buf_offset = 0;
    WriteRequest write;  // kWrite
  };
  enum class WrKind : uint8_t { kRecv, kSendChunk, kCreditChunk, kWrite };
  struct WrDesc {
    WrKind kind = WrKind::kRecv;
    uint32_t slot = 0;  // bounce slot (kRecv, kSendChunk, kCreditChunk)
    uint32_t op = 0;    // Op handle (kSendChunk, kWrite)
  };
  struct Incoming {
    bool active = false;
    uint64_t total = 0;
    uint64_t received = 0;
    Matcher::Slot slot;  // a posted receive's buffer, or held memory
  };

  uint8_t* send_slot(uint32_t slot) {
    return send_pool_.data() + size_t{slot} * config_.slot_bytes;
  }
  uint8_t* recv_slot(uint32_t slot) {
    return recv_pool_.data() + size_t{slot} * config_.slot_bytes;
  }

  absl::Status AddOp(Op op, absl::Time now);
  absl::Status PostRecvSlot(uint32_t slot);
  // Hands queued work to the wire as far as credits, bounce slots and queue depth allow.
  void Pump();
  bool PostNextSendChunk(Op& op, uint32_t op_handle);
  bool PostNextWriteSegment(Op& op, uint32_t op_handle);
  void MaybeReturnCredits();
  void FinishOpIfDone(uint32_t op_handle);
  void OnRecv(uint32_t slot, const WireCompletion& completion);
  absl::Status OnChunk(uint32_t slot, uint32_t byte_len);
  void Push(Opcode opcode, uint64_t wr_id, absl::Status status, size_t bytes,
            std::optional<uint32_t> immediate = std::nullopt);
  absl::Status Malformed(std::string_view what) const;

  const ProtocolConfig config_;
  absl::Span<uint8_t> send_pool_;
  absl::Span<uint8_t> recv_pool_;
  Wire* const wire_;
  CompletionQueue* const cq_;
  const uint64_t connection_id_;
  const std::string peer_;

  absl::Status status_;
  bool connected_ = false;
  uint32_t peer_recv_slots_ = 0;
  uint32_t chunk_bytes_ = 0;  // min(our slot, peer's slot)
  uint32_t credits_ = 0;      // free receives of the peer we may consume
  uint32_t owed_ = 0;         // receives re-posted but not yet announced to the peer
  uint32_t send_wrs_ = 0;     // send-queue entries in flight
  uint64_t next_seq_ = 0;
  absl::Time last_progress_ = absl::InfinitePast();

  SlotTable<Op> ops_;
  std::deque<uint32_t> pending_;  // ops with work left to post, in post order
  SlotTable<WrDesc> wrs_;
  std::vector<uint32_t> free_send_slots_;
  Matcher matcher_;
  Incoming incoming_;
};

}  // namespace plexus::transport::verbs
