// The sending half of a tcp connection, without sockets: our operations in posting order, the
// frames each one is cut into over the connection's sockets (striping), the bytes queued on each
// socket and how far the kernel took them, which one-sided writes the peer acknowledged, and the
// completions, in posting order. tcp/core.cpp only hands FrameQueue::Gather's bytes to
// sendmsg() and reports back how many were taken; the ack frames arrive through ReceiveState
// (tcp/receive_state.hpp). Unit-tested without sockets (tests/transport/tcp_state_test.cpp).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/memory.hpp"
#include "tcp/frame.hpp"
#include "tcp/protocol.hpp"

namespace plexus::transport::internal::tcp {

// One of our operations in flight: a send (done when written) or a write (done when acked).
struct OutOp {
  Opcode opcode = Opcode::kSend;
  uint64_t wr_id = 0;
  size_t bytes = 0;
  size_t frames_left = 0;        // frames not yet written completely
  std::vector<uint8_t> staging;  // host copy of a CUDA source; a produced send's two chunks
  // A produced send (PostSendProduced): its payload is made chunk by chunk into `staging` as
  // the socket takes it. Never striped. Destroyed once the operation completed.
  Producer producer;
  bool written = false;
  bool acked = false;
  bool done() const { return written && (opcode == Opcode::kSend || acked); }
};

// One frame of an operation: the socket it goes on, its header, and the range of the
// operation's payload that follows the header.
struct FramePlan {
  size_t socket = 0;
  FrameHeader header;
  StripeRange payload;
};
using FramePlans = absl::InlinedVector<FramePlan, 1>;

// A frame's payload in the caller's memory. Four entries inline: a send of up to four buffers
// (an rpc frame is its head plus one to three body segments) and every write need no heap
// allocation per message.
using IovList = absl::InlinedVector<iovec, 4>;

// A send or write as the user posted it: the operation (its record is taken from
// SendState::NewOp when it is queued), its (unstriped) frame header, and the payload in the
// caller's memory.
struct PostedOp {
  OutOp op;
  FrameHeader header;
  IovList payload;
  size_t already_written = 0;  // bytes of the frame a first send() took (TcpCore::TrySendAtOnce)
};
// InvalidArgument for a null buffer, or a message over `max_message_bytes`.
absl::StatusOr<PostedOp> PrepareSend(absl::Span<const ConstBuffer> buffers, uint64_t wr_id,
                                     uint64_t max_message_bytes);
// A produced send of `length` bytes: its payload is produced while it is written (FrameQueue).
// InvalidArgument for a message over `max_message_bytes`.
absl::StatusOr<PostedOp> PrepareProducedSend(size_t length, Producer producer, uint64_t wr_id,
                                             uint64_t max_message_bytes);
// Checks the local range and the remote one (InvalidArgument, OutOfRange naming them); a CUDA
// source is copied to host memory now.
absl::StatusOr<PostedOp> PrepareWrite(const MemoryRegion& local, size_t local_offset, size_t length,
                                      const RegionHandle& remote, size_t remote_offset,
                                      std::optional<uint32_t> immediate, uint64_t wr_id);

class SendState {
 public:
  // Completions go to `cq` under `connection_id`. Operations of at least `stripe_threshold`
  // bytes are striped when the connection has more than one socket.
  SendState(CompletionQueue* cq, uint64_t connection_id, size_t sockets, uint64_t stripe_threshold)
      : cq_(cq), connection_id_(connection_id), sockets_(sockets), threshold_(stripe_threshold) {}
  SendState(const SendState&) = delete;
  SendState& operator=(const SendState&) = delete;

  // Kept for reuse: the records of this many completed operations, at most.
  static constexpr size_t kSpareOps = 8;

  // A record for an operation of `fields`: a completed one's, recycled, when one is spare (one
  // allocation less per operation), else a new one.
  std::shared_ptr<OutOp> NewOp(OutOp fields);
  // Completed records kept for NewOp (at most kSpareOps).
  size_t spare_ops() const { return spare_.size(); }

  // Takes `op` (a send or a write; `h` is its kMessage or kWrite header) and returns its frames
  // in the order they are queued: one on socket 0, or, striped, a head with part 0 on socket 0
  // and part k on socket k (empty parts too: every data socket sees every stripe number). A
  // produced send is never striped: its bytes are made in order, one chunk at a time.
  FramePlans Start(const std::shared_ptr<OutOp>& op, const FrameHeader& h);
  // Every byte of one of `op`'s frames was written.
  void FrameWritten(OutOp& op);
  // The peer placed `count` more of our writes (oldest first). FailedPrecondition when fewer
  // writes wait for an ack (the receiving side checks that first: see PlanHeader).
  absl::Status Acked(uint64_t count);
  // Every outstanding operation completes with `why`, in posting order.
  void Fail(const absl::Status& why);

  // No operation waits to be written or acknowledged.
  bool idle() const { return ops_.empty(); }
  size_t outstanding() const { return ops_.size(); }
  uint64_t writes_awaiting_ack() const { return awaiting_ack_.size(); }

 private:
  // Completes our operations in posting order.
  void Release();

  CompletionQueue* const cq_;
  const uint64_t connection_id_;
  const size_t sockets_;
  const uint64_t threshold_;
  std::deque<std::shared_ptr<OutOp>> ops_;
  std::deque<std::shared_ptr<OutOp>> awaiting_ack_;
  // Records of completed operations that nothing else referred to any more.
  std::vector<std::shared_ptr<OutOp>> spare_;
  uint64_t stripes_sent_ = 0;
};

// The slice [offset, offset + length) of the bytes described by `iov`.
IovList SliceIov(absl::Span<const iovec> iov, size_t offset, size_t length);

// The frames queued on one socket, oldest first, and how much of the oldest the kernel took.
// A produced send's frame carries no payload list: its bytes are produced into the operation's
// staging, two chunks of kMaxProduceConsumeBytes used in turn, the next chunk as soon as the
// socket took the one before the previous whole. So one chunk is produced while the kernel
// drains the other (Flush produces again before it waits for the socket), and the memory does
// not grow with the message.
class FrameQueue {
 public:
  // Queues a frame: `h` and `payload` (the caller's memory, which stays valid until the frame
  // is written or the connection fails). `op` is null for control frames (acks, closes); for a
  // produced send, `payload` is empty and the bytes come from its producer.
  void Push(const FrameHeader& h, IovList payload, std::shared_ptr<OutOp> op);
  // Produces the next chunk of every produced frame Gather would reach whose chunk was written
  // whole. Call before Gather. An error is the producer's, annotated: fail the connection.
  absl::Status Produce();
  // Fills `iov` (room for `max` >= 2 entries) with the bytes to send next; returns how many
  // entries it used (0 when the queue is empty).
  int Gather(iovec* iov, int max) const;
  // The kernel took `bytes` of what Gather described: frames written completely leave the queue
  // and are reported to `send` (after the queue dropped its reference to the operation, so that
  // `send` can recycle the record of one that completes).
  void Advance(size_t bytes, SendState& send);
  void Clear() {
    frames_.clear();
    produced_frames_ = 0;
  }
  bool empty() const { return frames_.empty(); }
  size_t size() const { return frames_.size(); }

 private:
  struct Frame {
    uint8_t header[kFrameHeaderSize];
    IovList payload;
    size_t total = 0;  // header + payload bytes
    size_t sent = 0;
    std::shared_ptr<OutOp> op;
    // A produced send: the payload is produced up to chunk_end; its bytes the socket has not
    // taken yet (two chunks at most) are in op->staging, chunk k in half k % 2.
    bool produced = false;
    size_t chunk_end = 0;
  };
  std::deque<Frame> frames_;
  size_t produced_frames_ = 0;
};

}  // namespace plexus::transport::internal::tcp
