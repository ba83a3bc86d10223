// A reliable, ordered, bidirectional connection between two endpoints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "plexus/transport/memory.hpp"
#include "plexus/transport/types.hpp"

namespace plexus::transport {

// The contract every backend honours (tested by tests/transport/conformance_test.cpp):
//  - Two-sided messages are delivered whole, once, in PostSend order, into receives matched in
//    PostRecv order. A message longer than the matched receive fails that receive
//    (ResourceExhausted) and closes the connection. Messages arriving before a receive is posted
//    are held by the backend.
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

  // Posts `buffer` for the next incoming message not yet matched.
  virtual absl::Status PostRecv(MutableBuffer buffer, uint64_t wr_id) = 0;

  // One-sided write of local[local_offset, +length) to remote[remote_offset, +length).
  virtual absl::Status PostWrite(const MemoryRegion& local, size_t local_offset, size_t length,
                                 const RegionHandle& remote, size_t remote_offset,
                                 std::optional<uint32_t> immediate, uint64_t wr_id) = 0;

  // Fails outstanding operations with Cancelled; the peer's fail with Aborted. Idempotent.
  virtual void Close() = 0;

  // OK while usable; otherwise the error that ended the connection.
  virtual absl::Status status() const = 0;
  virtual std::string peer_address() const = 0;
  // Process-unique id, reported in every Completion of this connection.
  uint64_t id() const { return id_; }

 protected:
  Connection();

 private:
  uint64_t id_;
};

}  // namespace plexus::transport
