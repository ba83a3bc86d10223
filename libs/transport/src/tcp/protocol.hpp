// The tcp backend's protocol decisions that need no socket: how an operation is striped over
// the sockets of a connection, and what a received frame header asks of the connection given
// its state. tcp/core.cpp (TcpCore) does the I/O around them. Unit-tested without sockets
// (tests/transport/tcp_protocol_test.cpp) and fuzzed with the frame decoder
// (tests/fuzz/tcp_frame_fuzz.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "tcp/frame.hpp"

namespace plexus::transport::internal::tcp {

struct StripeRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};
// Part `k` (0 <= k < sockets) of an operation of `length` bytes striped over `sockets` sockets:
// consecutive ranges of ceil(length / sockets) bytes, of which the last ones may be short or
// empty. Part 0 travels with the head on socket 0, part k on socket k; every socket gets its
// part, empty or not, so that each data socket sees every stripe number in order.
StripeRange StripePart(uint64_t length, size_t sockets, size_t k);

enum class HeaderAction : uint8_t {
  kClose,       // the peer closes deliberately
  kAck,         // `acked` more of our one-sided writes are placed
  kOperation,   // a message or write starts; `first_bytes` of its payload follow here
  kStripePart,  // part of a striped operation; wait for its head, then check PartMatches
};
struct HeaderPlan {
  HeaderAction action = HeaderAction::kClose;
  bool is_write = false;     // kOperation
  bool striped = false;      // kOperation: a stripe head
  uint64_t first_bytes = 0;  // kOperation
  uint64_t acked = 0;        // kAck
};
// What header `h`, received on socket `socket` of a connection of `sockets` sockets, asks for.
// `writes_awaiting_ack`: our writes not acknowledged yet; `next_stripe`: the stripe number this
// data socket expects next. DataLoss naming what is malformed otherwise ("close on a data
// socket", "stripe part out of order", ...).
absl::StatusOr<HeaderPlan> PlanHeader(const FrameHeader& h, size_t socket, size_t sockets,
                                      uint64_t writes_awaiting_ack, uint64_t next_stripe);

// Whether stripe part header `part`, received on data socket `socket`, is that socket's part
// of an operation of `op_length` bytes.
bool PartMatches(const FrameHeader& part, size_t socket, size_t sockets, uint64_t op_length);

}  // namespace plexus::transport::internal::tcp
