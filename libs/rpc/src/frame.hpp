// The rpc frame: a request, response, cancel or handshake. A transport message carries one
// frame, or (between peers that agreed on it in the handshake, kFlagBatch) several frames back
// to back, each starting at a multiple of 8 bytes from the message start (a batch).
//
//   fixed header (48 bytes, little-endian): magic "PXR1", version, type, flags, call id,
//     service id, method id, status code, status message length, deadline budget (us) or load,
//     metadata count, segment count, metadata bytes
//   table: per metadata entry (u32 key length, u32 value length); per segment its u32 length
//   status message, metadata keys and values back to back
//   segments, each starting at a multiple of 8 bytes from the frame start (segment 0 is the
//   message's structure, the others its data segments)
//
// ParseFrame checks every count and length against the frame's size and the limits, so that a
// hostile peer gets an error naming the field and never an out-of-bounds read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "codec.hpp"

namespace plexus::rpc::internal {

inline constexpr uint32_t kFrameMagic = 0x31525850;  // "PXR1"
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr size_t kFixedHeaderBytes = 48;
inline constexpr size_t kSegmentAlign = 8;

enum class FrameType : uint8_t {
  kRequest = 1,
  kResponse = 2,
  kCancel = 3,
  kHello = 4,     // client -> server: (service name, schema hash) pairs as metadata
  kHelloAck = 5,  // server -> client: status OK or the reason for refusal
  kLoad = 6,      // server -> client: the server's calls being handled (gossip), no message
};

// FrameHeader::flags.
// kHello: the client balances across replicas and wants the server's load reports (kLoad).
// kResponse, kLoad: `load` holds the server's calls being handled.
inline constexpr uint16_t kFlagLoad = 1;
// kRequest: a server forwarded this call to its peer replica (server-side Daronpon); the peer
// serves it and never forwards it again (one hop).
inline constexpr uint16_t kFlagForwarded = 2;
// kHello: the client accepts batches (several frames per transport message); bytes 32-35 hold
// its receive buffer's size. kHelloAck: the server accepts batches too; its limits are in the
// ack's metadata (kBatchLimitsKey: "<frames> <bytes>").
inline constexpr uint16_t kFlagBatch = 4;
inline constexpr std::string_view kBatchLimitsKey = "plexus-batch";

struct FrameHeader {
  FrameType type = FrameType::kRequest;
  uint16_t flags = 0;
  uint64_t call_id = 0;
  uint32_t service_id = 0;
  uint32_t method_id = 0;
  uint32_t status_code = 0;
  // Bytes 32-35 carry one of the two: a request's deadline budget, or (kResponse and kLoad with
  // kFlagLoad) the server's load.
  uint32_t deadline_us = 0;  // 0: none; else the budget left when sent
  uint32_t load = 0;
};

struct FrameLimits {
  size_t max_metadata_entries = 64;
  size_t max_metadata_bytes = 16 << 10;
  size_t max_status_bytes = 4 << 10;
  size_t max_segments = 1 << 16;
};

// A frame to send: `head` (owned) then the message's data segments (views) with padding.
struct OutFrame {
  std::string head;
  std::vector<Part> parts;  // parts[0] is head; all of them back to back form the frame
  size_t bytes = 0;
};

void BuildFrame(const FrameHeader& header, std::string_view status_message,
                absl::Span<const std::pair<std::string, std::string>> metadata,
                const EncodedMessage* message, OutFrame* out);

struct FrameView {
  FrameHeader header;
  std::string_view status_message;
  std::vector<std::pair<std::string_view, std::string_view>> metadata;
  absl::Span<const uint8_t> structure;  // empty when the frame carries no message
  // Data segments; a few inline (no allocation per received message for small ones).
  absl::InlinedVector<absl::Span<const uint8_t>, 4> segments;
};

// `frame` must start 8-byte aligned (segments are mapped in place).
absl::StatusOr<FrameView> ParseFrame(absl::Span<const uint8_t> frame,
                                     const FrameLimits& limits = {});

// Parses the frame at the start of `bytes` (8-byte aligned), which may be followed by further
// frames of a batch; `*length` is the frame's own size. Every length is checked against `bytes`.
absl::StatusOr<FrameView> ParseFramePrefix(absl::Span<const uint8_t> bytes, size_t* length,
                                           const FrameLimits& limits = {});

// Where the frame after one that ended at `end` starts in a batch of `total` bytes: nullopt when
// the batch ends there; an error when only padding (or a stray tail under 8 bytes) follows.
absl::StatusOr<std::optional<size_t>> NextFrameOffset(size_t end, size_t total);

// Appends `frame` to a batch being gathered in `parts` (`*bytes` so far), after the zero padding
// that starts it at a multiple of 8 bytes.
void AppendToBatch(const OutFrame& frame, std::vector<Part>* parts, size_t* bytes);

}  // namespace plexus::rpc::internal
