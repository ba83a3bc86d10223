// Frames of the shm backend: what one side writes into its ring for the other to read.
//
// Every frame is a fixed 48-byte little-endian header followed by `payload_bytes` of payload,
// padded to 8 bytes. The header is decoded by a pure function that validates every field, so
// that a corrupt or hostile peer can only ever make the connection fail, never crash the process.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace plexus::transport::internal::shm {

enum class FrameType : uint8_t {
  kMessage = 1,      // first (or only) part of a two-sided message; offset 0
  kMessagePart = 2,  // continuation of the message being received, at `offset`
  kWrite = 3,        // one-sided write: payload goes to remote_offset + offset of region_id
  kWriteImm = 4,     // the same, and the last part raises kRemoteWrite with `immediate`
  kClose = 5,        // the sender closes the connection; payload is an optional reason text
  kMessageCma = 6,   // whole message pulled by the receiver from the sender's memory; payload
                     // lists the sender's segments (cross-memory attach)
  kWriteCma = 7,     // one-sided write pulled by the target; kFlagImmediate says if it has one
};

inline constexpr uint8_t kFlagImmediate = 0x01;  // kWriteCma: `immediate` is meaningful
inline constexpr uint8_t kFlagError = 0x02;      // kClose: the sender closes because of an error

inline constexpr size_t kFrameHeaderBytes = 48;
inline constexpr uint16_t kFrameMagic = 0x5346;  // "FS"
inline constexpr size_t kMaxCloseReasonBytes = 1024;
inline constexpr size_t kMaxCmaSegments = 1024;  // IOV_MAX
inline constexpr size_t kCmaSegmentBytes = 16;   // u64 address, u64 length

struct FrameHeader {
  FrameType type = FrameType::kMessage;
  uint8_t flags = 0;
  uint32_t payload_bytes = 0;  // bytes of payload after the header (before padding)
  uint64_t total_bytes = 0;    // length of the whole message or write
  uint64_t offset = 0;         // where this frame's payload starts within the message/write
  uint64_t region_id = 0;      // writes: the target region
  uint64_t remote_offset = 0;  // writes: where in the region the write starts
  uint32_t immediate = 0;      // kWriteImm and kWriteCma with kFlagImmediate
};

// What a decoder accepts. Anything outside is malformed.
struct FrameLimits {
  size_t max_payload_bytes = 0;  // the most payload one frame may carry (ring-derived)
  size_t max_message_bytes = 0;  // DeviceOptions::max_message_bytes
};

// Bytes the frame occupies in the ring (header + payload rounded up to 8).
inline size_t FrameFootprint(size_t payload_bytes) {
  return kFrameHeaderBytes + ((payload_bytes + 7) & ~size_t{7});
}

void EncodeFrameHeader(const FrameHeader& header, uint8_t* out);
// Decodes and validates a header; `bytes` may be longer than the header (the rest is ignored).
absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::Span<const uint8_t> bytes,
                                              const FrameLimits& limits);

struct CmaSegment {
  uint64_t address = 0;
  uint64_t length = 0;
};
void EncodeCmaSegments(absl::Span<const CmaSegment> segments, uint8_t* out);
// Decodes the payload of a kMessageCma/kWriteCma frame whose header is `header`; the segment
// lengths must add up to header.total_bytes and no segment may wrap the address space.
absl::StatusOr<std::vector<CmaSegment>> DecodeCmaSegments(absl::Span<const uint8_t> payload,
                                                          const FrameHeader& header);

}  // namespace plexus::transport::internal::shm
