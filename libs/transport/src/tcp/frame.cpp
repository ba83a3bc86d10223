#include "tcp/frame.hpp"

#include "absl/strings/str_cat.h"
#include "plexus/base/byte_order.hpp"

namespace plexus::transport::internal::tcp {
namespace {
constexpr uint16_t kCheck = 0x5850;           // "PX": catches a desynchronised stream early
constexpr uint32_t kHelloMagic = 0x54584c50;  // "PLXT"
constexpr uint16_t kVersion = 1;
}  // namespace

void EncodeFrameHeader(const FrameHeader& h, uint8_t* out) {
  base::ByteWriter w(out);
  w.U8(static_cast<uint8_t>(h.type));
  w.U8(h.flags);
  w.U16(kCheck);
  w.U32(h.immediate);
  w.U64(h.length);
  w.U64(h.a);
  w.U64(h.b);
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::Span<const uint8_t> bytes,
                                              uint64_t max_length) {
  if (bytes.size() < kFrameHeaderSize) {
    return absl::DataLossError(
        absl::StrCat("truncated frame header: ", bytes.size(), " of ", kFrameHeaderSize, " bytes"));
  }
  base::ByteReader r(bytes.data());
  FrameHeader h;
  const uint8_t type = r.U8();
  h.flags = r.U8();
  if (r.U16() != kCheck) return absl::DataLossError("malformed frame: bad check word");
  h.immediate = r.U32();
  h.length = r.U64();
  h.a = r.U64();
  h.b = r.U64();
  if (type < static_cast<uint8_t>(FrameType::kMessage) ||
      type > static_cast<uint8_t>(FrameType::kClose)) {
    return absl::DataLossError(absl::StrCat("malformed frame: unknown type ", type));
  }
  h.type = static_cast<FrameType>(type);
  uint8_t allowed = 0;
  if (h.type == FrameType::kWrite) allowed = kFlagImmediate;
  if (h.type == FrameType::kStripeHead) allowed = kFlagImmediate | kFlagWrite;
  if ((h.flags & ~allowed) != 0) {
    return absl::DataLossError(absl::StrCat("malformed frame: flags ", h.flags, " on type ", type));
  }
  if (h.type == FrameType::kWriteAck || h.type == FrameType::kClose) {
    if (h.length != 0) return absl::DataLossError("malformed frame: control frame with a payload");
  } else if (h.length > max_length) {
    return absl::DataLossError(absl::StrCat("malformed frame: length ", h.length,
                                            " exceeds the limit of ", max_length, " bytes"));
  }
  if (h.type == FrameType::kWrite && h.b + h.length < h.b) {
    return absl::DataLossError("malformed frame: write range overflows");
  }
  return h;
}

void EncodeHello(const Hello& hello, uint8_t* out) {
  base::ByteWriter w(out);
  w.U32(kHelloMagic);
  w.U16(kVersion);
  w.U16(hello.socket_index);
  w.U16(hello.socket_count);
  w.U16(0);
  w.U64(hello.token);
  w.U32(0);
}

absl::StatusOr<Hello> DecodeHello(absl::Span<const uint8_t> bytes) {
  if (bytes.size() != kHelloSize) return absl::DataLossError("truncated tcp hello");
  base::ByteReader r(bytes.data());
  if (r.U32() != kHelloMagic) {
    return absl::DataLossError("not a Plexus tcp peer (bad hello magic)");
  }
  const uint16_t version = r.U16();
  if (version != kVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Plexus tcp protocol version ", version, " is not supported (this is ", kVersion, ")"));
  }
  Hello h;
  h.socket_index = r.U16();
  h.socket_count = r.U16();
  r.U16();
  h.token = r.U64();
  if (h.socket_count == 0 || h.socket_count > 64 || h.socket_index >= h.socket_count) {
    return absl::DataLossError(
        absl::StrCat("malformed tcp hello: socket ", h.socket_index, " of ", h.socket_count));
  }
  return h;
}

}  // namespace plexus::transport::internal::tcp
