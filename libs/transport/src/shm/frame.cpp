#include "shm/frame.hpp"

#include <limits>

#include "absl/strings/str_cat.h"
#include "plexus/base/byte_order.hpp"
#include "plexus/base/status.hpp"

namespace plexus::transport::internal::shm {
namespace {

absl::Status Malformed(const std::string& what) {
  return absl::DataLossError(absl::StrCat("malformed shm frame: ", what));
}

bool KnownType(uint8_t type) {
  return type >= static_cast<uint8_t>(FrameType::kMessage) &&
         type <= static_cast<uint8_t>(FrameType::kWriteCma);
}

// offset + payload <= total, without overflow.
bool PartFits(const FrameHeader& h) {
  return h.offset <= h.total_bytes && h.payload_bytes <= h.total_bytes - h.offset;
}

absl::Status RequireZero(uint64_t value, const char* field, const char* type) {
  if (value != 0) return Malformed(absl::StrCat(field, " must be 0 in a ", type, " frame"));
  return absl::OkStatus();
}

absl::Status ValidateCmaPayload(const FrameHeader& h) {
  if (h.payload_bytes == 0 || h.payload_bytes % kCmaSegmentBytes != 0 ||
      h.payload_bytes / kCmaSegmentBytes > kMaxCmaSegments) {
    return Malformed(absl::StrCat("cross-memory frame lists ", h.payload_bytes,
                                  " bytes of segments (expected 1 to ", kMaxCmaSegments,
                                  " segments of ", kCmaSegmentBytes, " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateWriteTarget(const FrameHeader& h) {
  if (h.region_id == 0) return Malformed("one-sided write names region id 0");
  if (h.remote_offset > std::numeric_limits<uint64_t>::max() - h.total_bytes) {
    return Malformed("one-sided write range overflows");
  }
  return absl::OkStatus();
}

}  // namespace

void EncodeFrameHeader(const FrameHeader& h, uint8_t* out) {
  base::ByteWriter w(out);
  w.U16(kFrameMagic);
  w.U8(static_cast<uint8_t>(h.type));
  w.U8(h.flags);
  w.U32(h.payload_bytes);
  w.U64(h.total_bytes);
  w.U64(h.offset);
  w.U64(h.region_id);
  w.U64(h.remote_offset);
  w.U32(h.immediate);
  w.U32(0);
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::Span<const uint8_t> bytes,
                                              const FrameLimits& limits) {
  if (bytes.size() < kFrameHeaderBytes) {
    return Malformed(
        absl::StrCat("truncated header (", bytes.size(), " of ", kFrameHeaderBytes, " bytes)"));
  }
  base::ByteReader r(bytes.data());
  if (const uint16_t magic = r.U16(); magic != kFrameMagic) {
    return Malformed(absl::StrCat("bad magic 0x", absl::Hex(magic), " (ring out of sync)"));
  }
  const uint8_t type = r.U8();
  if (!KnownType(type)) return Malformed(absl::StrCat("unknown frame type ", type));
  FrameHeader h;
  h.type = static_cast<FrameType>(type);
  h.flags = r.U8();
  h.payload_bytes = r.U32();
  h.total_bytes = r.U64();
  h.offset = r.U64();
  h.region_id = r.U64();
  h.remote_offset = r.U64();
  h.immediate = r.U32();
  if (r.U32() != 0) return Malformed("reserved header word is not 0");
  if (h.payload_bytes > limits.max_payload_bytes) {
    return Malformed(absl::StrCat("frame payload of ", h.payload_bytes,
                                  " bytes exceeds the ring's limit of ", limits.max_payload_bytes));
  }
  if (h.total_bytes > limits.max_message_bytes) {
    return Malformed(absl::StrCat("frame announces ", h.total_bytes,
                                  " bytes, over max_message_bytes = ", limits.max_message_bytes));
  }

  switch (h.type) {
    case FrameType::kMessage:
    case FrameType::kMessagePart: {
      const char* name = h.type == FrameType::kMessage ? "message" : "message-part";
      if (h.flags != 0) return Malformed(absl::StrCat("unknown flags in a ", name, " frame"));
      PLEXUS_RETURN_IF_ERROR(RequireZero(h.region_id, "region id", name));
      PLEXUS_RETURN_IF_ERROR(RequireZero(h.remote_offset, "remote offset", name));
      PLEXUS_RETURN_IF_ERROR(RequireZero(h.immediate, "immediate", name));
      if (h.type == FrameType::kMessage && h.offset != 0) {
        return Malformed("first message frame has a non-zero offset");
      }
      if (h.type == FrameType::kMessagePart && (h.offset == 0 || h.payload_bytes == 0)) {
        return Malformed("message-part frame must continue a message with at least one byte");
      }
      if (!PartFits(h)) {
        return Malformed(absl::StrCat(name, " frame of ", h.payload_bytes, " bytes at offset ",
                                      h.offset, " overruns its ", h.total_bytes, "-byte message"));
      }
      return h;
    }
    case FrameType::kWrite:
    case FrameType::kWriteImm: {
      if (h.flags != 0) return Malformed("unknown flags in a write frame");
      PLEXUS_RETURN_IF_ERROR(ValidateWriteTarget(h));
      if (h.type == FrameType::kWrite) {
        PLEXUS_RETURN_IF_ERROR(RequireZero(h.immediate, "immediate", "write"));
      }
      if (!PartFits(h)) {
        return Malformed(absl::StrCat("write frame of ", h.payload_bytes, " bytes at offset ",
                                      h.offset, " overruns its ", h.total_bytes, "-byte write"));
      }
      return h;
    }
    case FrameType::kClose: {
      if ((h.flags & ~kFlagError) != 0) return Malformed("unknown flags in a close frame");
      if (h.total_bytes != 0 || h.offset != 0 || h.region_id != 0 || h.remote_offset != 0 ||
          h.immediate != 0) {
        return Malformed("close frame with non-zero fields");
      }
      if (h.payload_bytes > kMaxCloseReasonBytes) {
        return Malformed(absl::StrCat("close reason of ", h.payload_bytes, " bytes (max ",
                                      kMaxCloseReasonBytes, ")"));
      }
      return h;
    }
    case FrameType::kMessageCma: {
      if (h.flags != 0) return Malformed("unknown flags in a cross-memory message frame");
      if (h.offset != 0 || h.region_id != 0 || h.remote_offset != 0 || h.immediate != 0) {
        return Malformed("cross-memory message frame with non-zero write fields");
      }
      PLEXUS_RETURN_IF_ERROR(ValidateCmaPayload(h));
      return h;
    }
    case FrameType::kWriteCma: {
      if ((h.flags & ~kFlagImmediate) != 0) {
        return Malformed("unknown flags in a cross-memory write frame");
      }
      if (h.offset != 0) return Malformed("cross-memory write frame with a non-zero offset");
      if ((h.flags & kFlagImmediate) == 0 && h.immediate != 0) {
        return Malformed("immediate value without the immediate flag");
      }
      PLEXUS_RETURN_IF_ERROR(ValidateWriteTarget(h));
      PLEXUS_RETURN_IF_ERROR(ValidateCmaPayload(h));
      return h;
    }
  }
  return Malformed(absl::StrCat("unknown frame type ", type));
}

void EncodeCmaSegments(absl::Span<const CmaSegment> segments, uint8_t* out) {
  base::ByteWriter w(out);
  for (const CmaSegment& s : segments) {
    w.U64(s.address);
    w.U64(s.length);
  }
}

absl::StatusOr<std::vector<CmaSegment>> DecodeCmaSegments(absl::Span<const uint8_t> payload,
                                                          const FrameHeader& header) {
  if (payload.size() != header.payload_bytes || payload.size() % kCmaSegmentBytes != 0) {
    return Malformed(absl::StrCat("cross-memory segment list of ", payload.size(),
                                  " bytes does not match the header"));
  }
  std::vector<CmaSegment> segments(payload.size() / kCmaSegmentBytes);
  base::ByteReader r(payload.data());
  uint64_t sum = 0;
  for (CmaSegment& s : segments) {
    s.address = r.U64();
    s.length = r.U64();
    if (s.address > std::numeric_limits<uint64_t>::max() - s.length) {
      return Malformed("cross-memory segment wraps the address space");
    }
    if (s.length > header.total_bytes - sum) {
      return Malformed(absl::StrCat("cross-memory segments add up to more than the announced ",
                                    header.total_bytes, " bytes"));
    }
    sum += s.length;
  }
  if (sum != header.total_bytes) {
    return Malformed(absl::StrCat("cross-memory segments add up to ", sum, " bytes, header says ",
                                  header.total_bytes));
  }
  return segments;
}

}  // namespace plexus::transport::internal::shm
