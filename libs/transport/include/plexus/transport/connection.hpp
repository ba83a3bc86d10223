// A reliable, ordered, bidirectional connection between two endpoints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "plexus/transport/memory.hpp"
#include "plexus/transport/types.hpp"

namespace plexus::transport {

// A low-latency side channel for small messages, offered by backends whose peer memory is
// directly reachable (shm, inproc). The sender copies the message into a slot of the peer's
// inbox and the receiver polls that slot in place: no completion queue, no progress engine, no
// system call unless the receiver sleeps. It is independent of the connection's message stream
// (no ordering between the two) and is used by at most one sending and one receiving thread at
// a time. Messages are delivered whole, once, in TrySend order; those that arrived before the
// connection went down are still delivered.
class Mailbox {
 public:
  static constexpr size_t kMaxMessageBytes = 2040;
  static constexpr int kSlots = 16;  // messages that may wait in an inbox

  virtual ~Mailbox() = default;
  // Copies the concatenation of `parts` (at most kMaxMessageBytes) into the peer's inbox: true;
  // false when all its slots still hold messages the peer has not released (try again). An
  // error once the connection is down.
  virtual absl::StatusOr<bool> TrySend(absl::Span<const ConstBuffer> parts) = 0;
  absl::StatusOr<bool> TrySend(absl::Span<const uint8_t> message) {
    const ConstBuffer part{message.data(), message.size()};
    return TrySend(absl::MakeConstSpan(&part, 1));
  }
  // The oldest waiting message, in place in the inbox (no copy) until Release(). nullopt when
  // none waits; an error when none waits and the connection is down, or when the peer wrote a
  // malformed slot. The span's bounds are checked; a misbehaving peer could still change the
  // bytes under it, so validate what you copy out, not what you read twice.
  virtual absl::StatusOr<std::optional<absl::Span<const uint8_t>>> Peek() = 0;
  // Frees the slot of the message Peek() returned, for the peer to reuse.
  virtual void Release() = 0;
  // Copies the oldest waiting message into `out` (kMaxMessageBytes always fit) and releases it;
  // returns its size, or nullopt when none waits.
  absl::StatusOr<std::optional<size_t>> TryReceive(absl::Span<uint8_t> out);
  // Sleeps until a message may have arrived or `max` passed (a futex on the slot: wake-ups can
  // be spurious, and a peer that died does not wake it: bound `max`).
  virtual void Wait(absl::Duration max) = 0;
};

// The contract every backend honours (tested by tests/transport/conformance_test.cpp):
//  - Two-sided messages are delivered whole, once, in PostSend order, into receives matched in
//    PostRecv order. A message longer than the matched receive fails that receive
//    (ResourceExhausted) and closes the connection. Messages arriving before a receive is posted
//    are held by the backend, within DeviceOptions::max_held_bytes_per_{connection,device}.
//  - PostWrite places `length` bytes at `remote_offset` of the peer's region. The initiator gets
//    kWrite once the bytes are in place; with an immediate, the peer gets one kRemoteWrite
//    completion carrying it, ordered after every earlier message and write of this connection.
//  - Every Post returns an error right away for invalid arguments or a connection already
//    down; otherwise exactly one completion follows. When the connection fails (peer died,
//    malformed frame, timeout) or is closed, every outstanding operation completes with a non-OK
//    status; nothing hangs. Messages that had arrived whole before a failure (not a local Close)
//    are still delivered to later receives, so nothing the peer sent before it went away is lost.
//  - The peer's deliberate Close() surfaces as Aborted; a peer that died as Unavailable (or
//    DeadlineExceeded when it stopped making progress).
class Connection {
 public:
  virtual ~Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends the concatenation of `buffers` as one message (scatter-gather).
  virtual absl::Status PostSend(absl::Span<const ConstBuffer> buffers, uint64_t wr_id) = 0;
  absl::Status PostSend(ConstBuffer buffer, uint64_t wr_id) {
    return PostSend(absl::MakeConstSpan(&buffer, 1), wr_id);
  }

  // Sends like PostSend, except when the whole message leaves within this call (tcp: one write
  // took it; the backends that stage every send never say so): then no completion follows, the
  // result is true and `buffers` may be reused at once. False: the send was posted as by
  // PostSend, and its one completion follows. Errors and ordering are PostSend's. For a caller
  // that sends small messages on an idle connection, it saves a completion's round through the
  // queue per message. The default posts with PostSend and returns false.
  virtual absl::StatusOr<bool> SendNowOrPost(absl::Span<const ConstBuffer> buffers,
                                             uint64_t wr_id) {
    absl::Status posted = PostSend(buffers, wr_id);
    if (!posted.ok()) return posted;
    return false;
  }
  absl::StatusOr<bool> SendNowOrPost(ConstBuffer buffer, uint64_t wr_id) {
    return SendNowOrPost(absl::MakeConstSpan(&buffer, 1), wr_id);
  }

  // Posts `buffer` for the next incoming message not yet matched.
  virtual absl::Status PostRecv(MutableBuffer buffer, uint64_t wr_id) = 0;

  // Produced sends and consumed receives: the bytes of a message are made by `producer`, or
  // taken by `consumer`, while the transport moves them, so that a caller that restructures data
  // on the way needs no intermediate buffer of the message's size. The wire does not change: a
  // produced send is one message of `length` bytes that the peer may take with PostRecv, and a
  // consumed receive may take a message the peer sent with PostSend. Completions are those of
  // PostSend and PostRecv (kSend, kRecv with the message length); ordering and matching are
  // unchanged (a consumed receive is matched in PostRecv order like any other).
  //
  // The callbacks:
  //  - cover the message in increasing offset order, every byte exactly once, at most
  //    kMaxProduceConsumeBytes per call (an empty message makes no call);
  //  - run on whatever thread moves the bytes: the posting thread, a thread calling PostRecv
  //    or the completion queue (ProgressMode::kCaller), or the device's progress thread; one call
  //    at a time per operation. They run under the backend's lock: they must not block for long
  //    nor call into the transport (a Post, Close or Poll of any connection of the device).
  //  - are owned by the backend: never called once the operation's completion was pushed, and
  //    destroyed by then or right after (verbs destroys a producer once it produced).
  //
  // Blocking. Neither call waits for the peer, but either may run its callback in the calling
  // thread before it returns: PostSendProduced produces what fits now (shm: as much as the ring
  // takes; inproc: the whole message, as PostSend copies it; verbs: the whole message; tcp: the
  // first two chunks once the socket is free), PostRecvConsumed consumes a message that had
  // arrived.
  //
  // Errors. An error from `producer` fails the send: its completion carries the producer's code
  // and message, annotated "producing bytes [offset, +n) of a message of L bytes". The
  // connection fails with the same status (the peer was promised `length` bytes and a stream
  // cannot take the promise back): the peer's receive of that message fails (Unavailable), it
  // never completes with part of it. An error from `consumer` fails the receive the same way
  // ("consuming bytes [offset, +n) ...") and the connection with it. Bytes already handed to a
  // consumer of a receive that then fails (a consumer error, the connection failing mid-message)
  // are not taken back: the completion's status says the message is not whole.
  //
  // Memory. tcp, shm and inproc produce into and consume from memory of at most two
  // kMaxProduceConsumeBytes chunks per operation in flight, or the peer's buffer itself: tcp
  // stages two chunks per produced send, used in turn (the next is produced while the kernel
  // drains the other, once the socket took the chunk before it), and one per socket read; shm
  // produces into the ring's free space (never by cross-memory attach, whatever the size) and
  // consumes ring bytes in place, or pulls a message the peer sent by cross-memory attach a chunk
  // at a time; inproc produces straight into the matched receive (or the held copy) and consumes
  // the sender's bytes. Exceptions, where the whole message is staged once: a tcp message the peer
  // striped over several sockets (an ordinary PostSend) into a consumed receive (a produced send
  // itself is never striped), a message that arrived before its consumed receive was posted (it was
  // held whole, as any early message is; the consumer takes it in chunks), and verbs, which
  // produces the whole message into a buffer at post time and consumes it once it arrived whole.
  //
  // PostSendProduced returns an error right away for a message over max_message_bytes or a
  // connection already down (as PostSend); the producer is then never called. The default, for
  // connections built on others (multipath's) and backends outside Plexus, is Unimplemented.
  virtual absl::Status PostSendProduced(size_t length, Producer producer, uint64_t wr_id) {
    (void)length;
    (void)producer;
    (void)wr_id;
    return absl::UnimplementedError("this connection cannot send a produced message");
  }
  // Posts a receive of the next incoming message not yet matched, of at most `max_length` bytes
  // (longer: ResourceExhausted, as PostRecv), whose bytes go to `consumer`. May call `consumer`
  // before it returns (a message that had arrived whole). Unimplemented by default.
  virtual absl::Status PostRecvConsumed(size_t max_length, Consumer consumer, uint64_t wr_id) {
    (void)max_length;
    (void)consumer;
    (void)wr_id;
    return absl::UnimplementedError("this connection cannot hand a message to a consumer");
  }

  // One-sided write of local[local_offset, +length) to remote[remote_offset, +length).
  virtual absl::Status PostWrite(const MemoryRegion& local, size_t local_offset, size_t length,
                                 const RegionHandle& remote, size_t remote_offset,
                                 std::optional<uint32_t> immediate, uint64_t wr_id) = 0;

  // Never blocks: when the next incoming message (the one the next PostRecv would take) has
  // arrived whole and no receive is posted for it, copies its first min(head.size, length) bytes
  // into `head` and returns its length; nullopt otherwise (nothing arrived, a receive is posted,
  // or the connection failed with nothing left). Nothing is consumed. Lets a caller choose among
  // connections by what waits on them (a receive from any source). Unimplemented: the backend
  // cannot look ahead (the default).
  virtual absl::StatusOr<std::optional<size_t>> PeekNext(MutableBuffer head) {
    (void)head;
    return absl::UnimplementedError("this connection cannot look at a message before receiving it");
  }

  // Fails outstanding operations with Cancelled; the peer's fail with Aborted. Idempotent.
  virtual void Close() = 0;

  // OK while usable; otherwise the error that ended the connection.
  virtual absl::Status status() const = 0;
  virtual std::string peer_address() const = 0;
  // When the incoming message under way began to arrive (its first bytes were read); nullopt
  // between messages and while the backend waits for receives to be posted. Lets a server drop
  // a peer that trickles a message. Backends that take messages whole return nullopt (all but
  // tcp).
  virtual std::optional<absl::Time> ReceivingSince() const { return std::nullopt; }
  // The connection's mailbox, owned by it; null when the backend has none (tcp, verbs).
  virtual Mailbox* mailbox() { return nullptr; }
  // Process-unique id, reported in every Completion of this connection.
  uint64_t id() const { return id_; }

 protected:
  Connection();

 private:
  uint64_t id_;
};

}  // namespace plexus::transport
