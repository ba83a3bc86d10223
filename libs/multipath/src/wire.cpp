#include "wire.hpp"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "plexus/base/byte_order.hpp"

namespace plexus::multipath::internal {
namespace {

void Put16(uint8_t* p, uint16_t v) { base::StoreLittleEndian(p, v); }
void Put32(uint8_t* p, uint32_t v) { base::StoreLittleEndian(p, v); }
void Put64(uint8_t* p, uint64_t v) { base::StoreLittleEndian(p, v); }
uint16_t Get16(const uint8_t* p) { return base::LoadLittleEndian<uint16_t>(p); }
uint32_t Get32(const uint8_t* p) { return base::LoadLittleEndian<uint32_t>(p); }
uint64_t Get64(const uint8_t* p) { return base::LoadLittleEndian<uint64_t>(p); }

// Flags each frame type may carry.
uint16_t AllowedFlags(FrameType type) {
  switch (type) {
    case FrameType::kChunk:
      return kFlagLast;
    case FrameType::kNotify:
      return kFlagImmediate | kFlagWrite;
    case FrameType::kAck:
      return kFlagNotify;
    default:
      return 0;
  }
}

}  // namespace

void EncodeHeader(const Frame& f, uint8_t* out) {
  std::memset(out, 0, kHeaderSize);
  Put32(out, kMagic);
  out[4] = kVersion;
  out[5] = static_cast<uint8_t>(f.type);
  Put16(out + 6, f.flags);
  Put64(out + 8, f.seq);
  Put64(out + 16, f.offset);
  Put64(out + 24, f.total);
  Put64(out + 32, f.send_index);
  Put32(out + 40, f.chunk);
  Put32(out + 44, f.length);
  Put32(out + 48, f.immediate);
}

std::array<uint8_t, kHeaderSize> EncodeHeader(const Frame& frame) {
  std::array<uint8_t, kHeaderSize> out;
  EncodeHeader(frame, out.data());
  return out;
}

absl::StatusOr<Frame> DecodeFrame(absl::Span<const uint8_t> message, uint64_t max_total) {
  if (message.size() < kHeaderSize) {
    return absl::DataLossError(absl::StrCat("multipath frame of ", message.size(),
                                            " bytes is shorter than its ", kHeaderSize,
                                            "-byte header"));
  }
  const uint8_t* p = message.data();
  if (Get32(p) != kMagic) return absl::DataLossError("multipath frame: bad magic");
  if (p[4] != kVersion) {
    return absl::DataLossError(
        absl::StrCat("multipath frame: version ", p[4], ", expected ", kVersion));
  }
  if (p[5] < static_cast<uint8_t>(FrameType::kHello) ||
      p[5] > static_cast<uint8_t>(FrameType::kOverload)) {
    return absl::DataLossError(absl::StrCat("multipath frame: unknown type ", p[5]));
  }
  Frame f;
  f.type = static_cast<FrameType>(p[5]);
  f.flags = Get16(p + 6);
  f.seq = Get64(p + 8);
  f.offset = Get64(p + 16);
  f.total = Get64(p + 24);
  f.send_index = Get64(p + 32);
  f.chunk = Get32(p + 40);
  f.length = Get32(p + 44);
  f.immediate = Get32(p + 48);
  for (size_t i = 52; i < kHeaderSize; ++i) {
    if (p[i] != 0) return absl::DataLossError("multipath frame: reserved bytes are not zero");
  }
  if ((f.flags & ~AllowedFlags(f.type)) != 0) {
    return absl::DataLossError(
        absl::StrCat("multipath frame type ", p[5], ": unexpected flags ", f.flags));
  }
  const size_t payload = message.size() - kHeaderSize;
  if (f.type != FrameType::kChunk) {
    if (payload != 0 || f.length != 0) {
      return absl::DataLossError(
          absl::StrCat("multipath frame type ", p[5], " carries ", payload, " payload bytes"));
    }
  }
  switch (f.type) {
    case FrameType::kChunk:
      if (f.length != payload) {
        return absl::DataLossError(absl::StrCat("multipath chunk: header says ", f.length,
                                                " bytes, message carries ", payload));
      }
      if (f.total > max_total) {
        return absl::DataLossError(absl::StrCat("multipath chunk: message of ", f.total,
                                                " bytes exceeds the limit ", max_total));
      }
      if (f.offset > f.total || f.length > f.total - f.offset) {
        return absl::DataLossError(absl::StrCat("multipath chunk: bytes [", f.offset, ", +",
                                                f.length, ") outside the message of ", f.total));
      }
      if (f.length == 0 && f.total != 0) {
        return absl::DataLossError("multipath chunk: empty chunk of a non-empty message");
      }
      if ((f.flags & kFlagLast) != 0 && (f.chunk != 0 || f.length != f.total)) {
        return absl::DataLossError(
            "multipath chunk: a last-and-only chunk must be the whole message");
      }
      break;
    case FrameType::kNotify:
      if (f.total > max_total) {
        return absl::DataLossError(absl::StrCat("multipath notify: message of ", f.total,
                                                " bytes exceeds the limit ", max_total));
      }
      if ((f.flags & kFlagWrite) == 0 && (f.flags & kFlagImmediate) != 0) {
        return absl::DataLossError("multipath notify: immediate on a Send");
      }
      if ((f.flags & kFlagWrite) == 0 && f.total > 0 && (f.chunk == 0 || f.chunk > f.total)) {
        return absl::DataLossError(absl::StrCat("multipath notify: ", f.chunk,
                                                " chunks for a message of ", f.total, " bytes"));
      }
      break;
    default:
      break;
  }
  return f;
}

}  // namespace plexus::multipath::internal
