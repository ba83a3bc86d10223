// The parameter server's frames: a fixed 48-byte little-endian header and a payload. Every frame
// a service or client receives goes through DecodeFrame, which refuses anything malformed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "plexus/collectives/types.hpp"

namespace plexus::aggregation::internal {

inline constexpr uint32_t kFrameMagic = 0x47415850;  // "PXAG"
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr size_t kHeaderBytes = 48;
inline constexpr size_t kMaxErrorBytes = 4096;
inline constexpr size_t kInitPrefixBytes = 16;  // u64 key elements, u64 chunk offset

enum class FrameType : uint8_t {
  kHello = 1,     // worker -> server, payload u32 connection index, u32 connections
  kHelloAck = 2,  // server -> worker, payload u32 server cores, u32 workers of the namespace
  kInit = 3,      // worker -> server, payload kInitPrefix + the chunk's initial values
  kInitAck = 4,   // server -> worker, no payload
  kPush = 5,      // worker -> server, payload the chunk's gradient for `round`
  kPull = 6,      // worker -> server, no payload: send the current values
  kValues = 7,    // server -> worker, payload the chunk's values after `round`
  kError = 8,     // either way, payload the message (UTF-8); key/chunk/round name the operation
};

struct FrameHeader {
  FrameType type = FrameType::kHello;
  collectives::DataType dtype = collectives::DataType::kF32;
  uint8_t code = 0;  // kError: the absl::StatusCode
  uint32_t ns = 0;
  uint32_t worker = 0;
  uint64_t nonce = 0;
  uint64_t key = 0;
  uint32_t chunk = 0;
  uint32_t payload_bytes = 0;
  uint64_t round = 0;
};

void EncodeHeader(const FrameHeader& h, uint8_t* out);  // kHeaderBytes

struct FrameView {
  FrameHeader header;
  absl::Span<const uint8_t> payload;
};

// Parses and checks a whole frame: magic, version, type, wire dtype, payload length against the
// bytes received and against the type's rules. InvalidArgument naming the field otherwise.
absl::StatusOr<FrameView> DecodeFrame(absl::Span<const uint8_t> bytes);

std::string FrameTypeName(FrameType type);

}  // namespace plexus::aggregation::internal
