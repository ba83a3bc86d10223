// The receiving half of a tcp connection, without sockets: parses the byte stream of each of the
// connection's sockets into frames, reassembles striped operations, places payloads into the
// matched receive or held memory (matcher.hpp) or a registered region, completes the peer's
// operations in arrival order, counts the acks owed for its writes and hands the acks it sends
// to SendState. tcp/core.cpp reads the sockets and feeds the bytes in (or lets the socket
// write straight into PayloadWindow); every decision about those bytes is made here.
// Unit-tested without sockets (tests/transport/tcp_state_test.cpp) and fuzzed
// (tests/fuzz/tcp_receive_fuzz.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "matcher.hpp"
#include "plexus/transport/completion.hpp"
#include "region_registry.hpp"
#include "tcp/frame.hpp"
#include "tcp/send_state.hpp"

namespace plexus::transport::internal::tcp {

// Where an incoming one-sided write of `length` bytes at `offset` of region `region` lands, or
// why it may not (RegionRegistry::Resolve in the device).
using ResolveWriteFn =
    std::function<absl::StatusOr<WriteTarget>(uint64_t region, uint64_t offset, uint64_t length)>;

struct ReceiveConfig {
  std::string peer;  // error messages: "tcp peer <peer> ..."
  uint64_t connection_id = 0;
  size_t sockets = 1;
  uint64_t max_message_bytes = 0;
  MatcherConfig matcher;  // posted receives and held messages
  ResolveWriteFn resolve_write;
};

class ReceiveState {
 public:
  // Where a socket's stream stands. kParked: a stripe part waits for its head. kAwaitRoom
  // (socket 0 only): the message whose header was just read does not fit under the caps on held
  // bytes; the whole connection is paused until Readmit.
  enum class Phase : uint8_t { kHeader, kPayload, kParked, kAwaitRoom };
  // Why Consume stopped before the end of its bytes (besides a socket that waits: see waiting()).
  enum class Event : uint8_t {
    kNone,
    kPaused,        // socket 0 waits for room: stop reading every socket of the connection
    kStalled,       // this data socket parked while the connection is paused: stop reading it
    kPartsResumed,  // a stripe head let the sockets in resumed() continue: read them now (their
                    // bytes may already be buffered, where epoll would not report them)
  };
  struct Consumed {
    size_t bytes = 0;
    Event event = Event::kNone;
  };

  // Completions (receives, writes with an immediate) go to `cq`; acks for our writes go to
  // `send`, which must outlive this.
  ReceiveState(ReceiveConfig config, CompletionQueue* cq, SendState* send);
  ~ReceiveState();
  ReceiveState(const ReceiveState&) = delete;
  ReceiveState& operator=(const ReceiveState&) = delete;

  // Bytes that arrived on socket `socket`, in order. Returns how many were taken: all of them,
  // unless the socket waits (see waiting()) or an event asks for the caller's attention (call
  // again with the rest after handling it). An error (DataLoss naming the peer and what is
  // malformed, or the peer's deliberate close as Aborted) ends the connection: call Fail.
  absl::StatusOr<Consumed> Consume(size_t socket, absl::Span<const uint8_t> bytes);
  // Where the payload arriving on `socket` goes next, so that a large payload can be read
  // straight into its destination; empty unless the socket is in kPayload.
  absl::Span<uint8_t> PayloadWindow(size_t socket);
  // `bytes` (at most the window's size) were written into PayloadWindow(socket).
  absl::Status Placed(size_t socket, size_t bytes);

  // The paused connection retries the message that did not fit (call once room may have been
  // freed). Returns kPaused again when it still does not fit.
  absl::StatusOr<Event> Readmit();

  // The user posted a receive. An error (the message it took is longer) ends the connection:
  // it sticks like Consume's.
  absl::Status PostRecv(MutableBuffer buffer, uint64_t wr_id);
  // A consumed receive (Connection::PostRecvConsumed). A message admitted into it is read into
  // a chunk of at most kMaxProduceConsumeBytes (PayloadWindow), handed to the consumer whenever
  // the chunk is full or the message ends; a striped message is staged whole and handed over
  // once placed. A consumer error ends the connection (it sticks like Consume's) and fails the
  // receive with it.
  absl::Status PostRecvConsumed(size_t max_length, Consumer consumer, uint64_t wr_id);
  // Connection::PeekNext.
  std::optional<size_t> PeekNext(MutableBuffer head) const { return matcher_.PeekNext(head); }

  // The connection ended with `why`: whole messages stay deliverable (unless `why` is a local
  // close), everything else the peer was sending is dropped and the receives waiting for it
  // complete with `why`.
  void Fail(const absl::Status& why);

  Phase phase(size_t socket) const { return streams_[socket].phase; }
  // The socket takes no bytes until something else happens (a stripe head, Readmit).
  bool waiting(size_t socket) const {
    return streams_[socket].phase == Phase::kParked || streams_[socket].phase == Phase::kAwaitRoom;
  }
  // The socket should not be read at all until the connection resumes.
  bool stalled(size_t socket) const {
    return streams_[socket].phase == Phase::kAwaitRoom ||
           (paused_ && streams_[socket].phase == Phase::kParked);
  }
  // A frame is under way on the socket (part of a header, a payload, a parked part).
  bool mid_frame(size_t socket) const {
    return streams_[socket].phase != Phase::kHeader || streams_[socket].header_got > 0;
  }
  bool paused() const { return paused_; }
  // Frame headers read so far (a new one means a new frame began).
  uint64_t headers_read() const { return headers_read_; }
  // The sockets the last kPartsResumed event let continue.
  const absl::InlinedVector<size_t, 8>& resumed() const { return resumed_; }

  // Acks owed to the peer for writes placed since the last call.
  uint64_t TakeAcksOwed() {
    const uint64_t n = acks_owed_;
    acks_owed_ = 0;
    return n;
  }
  // Whether a held message was delivered (room freed under the caps) since the last call.
  bool TakeRoomFreed() {
    const bool freed = room_freed_;
    room_freed_ = false;
    return freed;
  }

  bool has_posted_recv() const { return matcher_.has_posted_recv(); }
  bool has_unclaimed() const { return matcher_.has_unclaimed(); }
  size_t incoming_operations() const { return in_ops_.size(); }
  const Matcher& matcher() const { return matcher_; }

 private:
  // One of the peer's operations being received, in arrival order.
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
    // Where the bytes go, fixed on arrival: the slot's buffer, the write's target, or `staging`.
    uint8_t* base = nullptr;
    // A message into a consumed receive (slot.consumer): `staging` holds payload bytes from
    // chunk_begin on (a chunk at a time), or the whole message when `consume_whole` (striped).
    size_t chunk_begin = 0;
    bool consume_whole = false;
    bool streams() const { return slot.consumer != nullptr && !consume_whole; }
    bool placed() const { return remaining == 0 && parts_left == 0; }
  };
  struct Stream {
    Phase phase = Phase::kHeader;
    uint8_t header_bytes[kFrameHeaderSize] = {};  // a header split over reads
    size_t header_got = 0;
    FrameHeader header;        // the last header read
    InOp* op = nullptr;        // the op the current payload belongs to
    size_t offset = 0;         // where the current payload goes in op
    size_t remaining = 0;      // payload bytes of the current frame still to come
    uint64_t next_stripe = 0;  // data sockets: stripe number of the next part
  };

  absl::StatusOr<Event> OnHeaderBytes(size_t socket, const uint8_t* bytes);
  absl::StatusOr<Event> OnHeader(size_t socket);
  // A parked data socket continues once the head of its stripe has arrived.
  absl::Status Resume(size_t socket);
  absl::Status StartPayload(size_t socket, InOp* op, size_t offset, size_t length);
  absl::Status PayloadDone(size_t socket);
  absl::StatusOr<std::unique_ptr<InOp>> NewInOp(const FrameHeader& h, bool is_write, bool striped);
  // Where the payload arriving on the socket goes next: the rest of it, or, for a message
  // streamed to a consumer, what fits in its chunk.
  absl::Span<uint8_t> Window(const Stream& s) const;
  // Hands the bytes of the op's chunk received so far to its consumer.
  absl::Status ConsumeChunk(InOp& op, size_t end);
  // A fresh InOp, from spare_in_ops_ when one is there: no allocation per message.
  std::unique_ptr<InOp> TakeInOp();
  // Resets `op` (its staging buffer is freed now, as destroying it would) and keeps it as a
  // spare, up to kSpareInOps; beyond that it is destroyed.
  void RecycleInOp(std::unique_ptr<InOp> op);
  // Completes the peer's operations in arrival order, once placed (and matched, for messages).
  absl::Status ReleaseInbound();
  // Advances the socket's payload by `bytes` (at most what remains of it).
  absl::Status Advance(size_t socket, size_t bytes);
  absl::Status Malformed(absl::string_view what) const;

  const ReceiveConfig config_;
  CompletionQueue* const cq_;
  SendState* const send_;
  Matcher matcher_;
  std::vector<Stream> streams_;
  std::deque<std::unique_ptr<InOp>> in_ops_;
  // Released InOps kept for the next ones (bounded: a burst does not pin memory afterwards).
  static constexpr size_t kSpareInOps = 8;
  std::vector<std::unique_ptr<InOp>> spare_in_ops_;
  absl::flat_hash_map<uint64_t, InOp*> stripes_;  // stripe number -> op, until placed
  uint64_t stripe_heads_received_ = 0;
  uint64_t acks_owed_ = 0;
  bool paused_ = false;
  bool room_freed_ = false;
  uint64_t headers_read_ = 0;
  absl::Status broken_;  // the first error: every later Consume, Placed and Readmit returns it
  absl::InlinedVector<size_t, 8> resumed_;
};

}  // namespace plexus::transport::internal::tcp
