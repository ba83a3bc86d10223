// Wire format of the tcp backend. Every frame starts with a fixed 32-byte header; the payload
// (if any) follows. DecodeFrameHeader is the only parser of untrusted bytes: it is fuzzed
// (tests/fuzz/tcp_frame_fuzz.cpp) and must reject anything malformed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace plexus::transport::internal::tcp {

enum class FrameType : uint8_t {
  kMessage = 1,     // two-sided message; payload = length bytes
  kWrite = 2,       // one-sided write of `length` bytes to region `a` at offset `b`
  kStripeHead = 3,  // striped op over all sockets: announces `length` total bytes (message, or
                    // write to region `a` at offset `b`); part 0 of the payload follows
  kStripePart = 4,  // part of stripe number `a` at offset `b` of its op, on sockets 1..n-1
  kWriteAck = 5,    // the peer placed `a` more one-sided writes of ours (no payload)
  kClose = 6,       // the peer closes the connection deliberately (no payload)
};

inline constexpr uint8_t kFlagImmediate = 1;  // kWrite / kStripeHead: `immediate` is valid
inline constexpr uint8_t kFlagWrite = 2;      // kStripeHead: the op is a one-sided write
inline constexpr size_t kFrameHeaderSize = 32;

struct FrameHeader {
  FrameType type = FrameType::kMessage;
  uint8_t flags = 0;
  uint32_t immediate = 0;
  uint64_t length = 0;
  uint64_t a = 0;
  uint64_t b = 0;
};

void EncodeFrameHeader(const FrameHeader& header, uint8_t* out);
// Rejects unknown types and flags, a bad check word, and lengths over `max_length`.
absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::Span<const uint8_t> bytes, uint64_t max_length);

// Sent once by the connecting side on each socket of a connection.
inline constexpr size_t kHelloSize = 24;
struct Hello {
  uint16_t socket_index = 0;
  uint16_t socket_count = 1;
  uint64_t token = 0;  // groups the sockets of one connection
};
void EncodeHello(const Hello& hello, uint8_t* out);
absl::StatusOr<Hello> DecodeHello(absl::Span<const uint8_t> bytes);

}  // namespace plexus::transport::internal::tcp
