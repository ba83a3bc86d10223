// The multipath channel's frames: a fixed header in front of every message a channel sends on a
// path (chunks of Sends, notifications, acks, probes, path management). Decode validates
// everything a hostile or broken peer could put there.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace plexus::multipath::internal {

inline constexpr uint32_t kMagic = 0x504d4c50;  // "PLMP" little-endian
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderSize = 56;

enum class FrameType : uint8_t {
  kHello = 1,   // seq: sender's path index; total: its max chunk payload
  kChunk = 2,   // a piece of a Send: seq, send_index, offset, total, chunk, length
  kNotify = 3,  // every chunk of op `seq` is in place: total, chunk (= chunk count),
                // send_index (Send) or immediate (Write, kFlagImmediate)
  kAck = 4,     // receiver has chunk `chunk` of op `seq` (kFlagNotify: its notification);
                // total: 0 = it arrived on the path the ack travels on, else 1 + the sender's
                // index of the path it arrived on (a copy sent ahead on a faster path)
  kProbe = 5,   // seq: probe id; offset: sender's clock (echoed)
  kProbeReply = 6,
  kPathDown = 7,     // seq: the receiver's path index to close; offset: sender's path index
  kPathDownAck = 8,  // seq: the path index (of the kPathDown sender) now closed at the peer
  kOverload = 9,     // the receiver holds too many bytes for Recvs not yet posted
};

inline constexpr uint16_t kFlagLast = 1;       // kChunk: the op's only chunk, also its notify
inline constexpr uint16_t kFlagImmediate = 2;  // kNotify of a Write: `immediate` is set
inline constexpr uint16_t kFlagWrite = 4;      // kNotify: of a Write (no chunks at receiver)
inline constexpr uint16_t kFlagNotify = 8;     // kAck: acknowledges the notification

struct Frame {
  FrameType type = FrameType::kHello;
  uint16_t flags = 0;
  uint64_t seq = 0;
  uint64_t offset = 0;
  uint64_t total = 0;
  uint64_t send_index = 0;
  uint32_t chunk = 0;
  uint32_t length = 0;  // kChunk: payload bytes after the header
  uint32_t immediate = 0;
};

void EncodeHeader(const Frame& frame, uint8_t* out);  // kHeaderSize bytes
std::array<uint8_t, kHeaderSize> EncodeHeader(const Frame& frame);

// Decodes a whole received message (header plus payload). `max_total` bounds message sizes.
// InvalidArgument/DataLoss naming the field for anything malformed.
absl::StatusOr<Frame> DecodeFrame(absl::Span<const uint8_t> message, uint64_t max_total);

}  // namespace plexus::multipath::internal
