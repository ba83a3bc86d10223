#include "frame.hpp"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "plexus/base/byte_order.hpp"
#include "plexus/base/status.hpp"

namespace plexus::rpc::internal {
namespace {

constexpr uint8_t kZeros[kSegmentAlign] = {};

size_t Pad(size_t n) { return (kSegmentAlign - n % kSegmentAlign) % kSegmentAlign; }

template <typename T>
T Get(const uint8_t* p) {
  return base::LoadLittleEndian<T>(p);
}

bool CarriesLoad(const FrameHeader& h) {
  return (h.flags & kFlagLoad) != 0 &&
         (h.type == FrameType::kResponse || h.type == FrameType::kLoad);
}

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed rpc frame: ", what));
}

}  // namespace

void BuildFrame(const FrameHeader& h, std::string_view status_message,
                absl::Span<const std::pair<std::string, std::string>> metadata,
                const EncodedMessage* message, OutFrame* out) {
  std::string& s = out->head;
  out->parts.clear();
  const size_t segments = message ? 1 + message->segment_bytes.size() : 0;
  size_t md_bytes = 0;
  for (const auto& [k, v] : metadata) md_bytes += k.size() + v.size();
  // The head's size is known up front: one allocation at most (none when `out` is reused, as
  // the pooled call states do), and the fixed fields are stored in place.
  const size_t table = metadata.size() * 8 + segments * 4;
  size_t head = kFixedHeaderBytes + table + status_message.size() + md_bytes;
  if (message) {
    head += Pad(head) + message->structure.size();
    if (!message->segment_bytes.empty()) head += Pad(head);
  }
  s.resize(head);
  uint8_t* p = reinterpret_cast<uint8_t*>(s.data());
  base::StoreLittleEndian<uint32_t>(p, kFrameMagic);
  p[4] = kFrameVersion;
  p[5] = static_cast<uint8_t>(h.type);
  base::StoreLittleEndian<uint16_t>(p + 6, h.flags);
  base::StoreLittleEndian<uint64_t>(p + 8, h.call_id);
  base::StoreLittleEndian<uint32_t>(p + 16, h.service_id);
  base::StoreLittleEndian<uint32_t>(p + 20, h.method_id);
  base::StoreLittleEndian<uint32_t>(p + 24, h.status_code);
  base::StoreLittleEndian<uint32_t>(p + 28, static_cast<uint32_t>(status_message.size()));
  base::StoreLittleEndian<uint32_t>(p + 32, CarriesLoad(h) ? h.load : h.deadline_us);
  base::StoreLittleEndian<uint16_t>(p + 36, static_cast<uint16_t>(metadata.size()));
  base::StoreLittleEndian<uint16_t>(p + 38, 0);  // reserved
  base::StoreLittleEndian<uint32_t>(p + 40, static_cast<uint32_t>(segments));
  base::StoreLittleEndian<uint32_t>(p + 44, static_cast<uint32_t>(md_bytes));
  uint8_t* w = p + kFixedHeaderBytes;
  for (const auto& [k, v] : metadata) {
    base::StoreLittleEndian<uint32_t>(w, static_cast<uint32_t>(k.size()));
    base::StoreLittleEndian<uint32_t>(w + 4, static_cast<uint32_t>(v.size()));
    w += 8;
  }
  if (message) {
    base::StoreLittleEndian<uint32_t>(w, static_cast<uint32_t>(message->structure.size()));
    w += 4;
    for (uint64_t b : message->segment_bytes) {
      base::StoreLittleEndian<uint32_t>(w, static_cast<uint32_t>(b));
      w += 4;
    }
  }
  auto put = [&w](std::string_view bytes) {
    if (!bytes.empty()) std::memcpy(w, bytes.data(), bytes.size());
    w += bytes.size();
  };
  put(status_message);
  for (const auto& [k, v] : metadata) {
    put(k);
    put(v);
  }
  if (message) {
    const size_t pad = Pad(static_cast<size_t>(w - p));
    std::memset(w, 0, pad);
    w += pad;
    put(message->structure);
    // Segment 0's padding is part of the head; later segments' padding are parts of their own.
    if (!message->segment_bytes.empty()) {
      const size_t pad0 = Pad(static_cast<size_t>(w - p));
      std::memset(w, 0, pad0);
      w += pad0;
    }
  }
  out->parts.push_back({s.data(), s.size()});
  size_t at = s.size();
  if (message) {
    for (size_t i = 0; i < message->segment_bytes.size(); ++i) {
      const size_t pad = Pad(at);
      if (pad && i > 0) {
        out->parts.push_back({kZeros, pad});
        at += pad;
      }
      for (uint32_t k = 0; k < message->segment_parts[i]; ++k) {
        out->parts.push_back(message->parts[message->segment_first[i] + k]);
      }
      at += message->segment_bytes[i];
    }
  }
  out->bytes = at;
}

absl::StatusOr<FrameView> ParseFrame(absl::Span<const uint8_t> f, const FrameLimits& limits) {
  size_t length = 0;
  PLEXUS_ASSIGN_OR_RETURN(FrameView v, ParseFramePrefix(f, &length, limits));
  if (length != f.size()) {
    return Bad(absl::StrCat("length: the frame has ", f.size(), " bytes, its header accounts for ",
                            length));
  }
  return v;
}

absl::StatusOr<std::optional<size_t>> NextFrameOffset(size_t end, size_t total) {
  if (end >= total) return std::optional<size_t>();
  const size_t next = end + Pad(end);
  if (next + kFixedHeaderBytes > total) {
    return Bad(absl::StrCat("batch: ", total - end, " stray bytes after the frame ending at ", end,
                            " (a frame needs ", kFixedHeaderBytes, ")"));
  }
  return std::optional<size_t>(next);
}

void AppendToBatch(const OutFrame& frame, std::vector<Part>* parts, size_t* bytes) {
  if (const size_t pad = Pad(*bytes); pad > 0) {
    parts->push_back({kZeros, pad});
    *bytes += pad;
  }
  parts->insert(parts->end(), frame.parts.begin(), frame.parts.end());
  *bytes += frame.bytes;
}

absl::StatusOr<FrameView> ParseFramePrefix(absl::Span<const uint8_t> f, size_t* length,
                                           const FrameLimits& limits) {
  if (f.size() < kFixedHeaderBytes) {
    return Bad(
        absl::StrCat("header: ", f.size(), " bytes, the fixed header needs ", kFixedHeaderBytes));
  }
  const uint8_t* p = f.data();
  if (Get<uint32_t>(p) != kFrameMagic) return Bad("magic: not a plexus rpc frame");
  if (p[4] != kFrameVersion) {
    return Bad(absl::StrCat("version: ", p[4], " (this side speaks ", kFrameVersion, ")"));
  }
  FrameView v;
  const uint8_t type = p[5];
  if (type < 1 || type > 6) return Bad(absl::StrCat("type: ", type, " is not a frame type"));
  v.header.type = static_cast<FrameType>(type);
  v.header.flags = Get<uint16_t>(p + 6);
  v.header.call_id = Get<uint64_t>(p + 8);
  v.header.service_id = Get<uint32_t>(p + 16);
  v.header.method_id = Get<uint32_t>(p + 20);
  v.header.status_code = Get<uint32_t>(p + 24);
  const uint32_t status_len = Get<uint32_t>(p + 28);
  if (CarriesLoad(v.header)) {
    v.header.load = Get<uint32_t>(p + 32);
  } else {
    v.header.deadline_us = Get<uint32_t>(p + 32);
  }
  const uint16_t md_count = Get<uint16_t>(p + 36);
  const uint32_t seg_count = Get<uint32_t>(p + 40);
  const uint32_t md_bytes = Get<uint32_t>(p + 44);
  if (v.header.status_code > 16) {
    return Bad(absl::StrCat("status code: ", v.header.status_code, " is not a gRPC code"));
  }
  if (status_len > limits.max_status_bytes) {
    return Bad(absl::StrCat("status message length: ", status_len, " over the limit of ",
                            limits.max_status_bytes));
  }
  if (md_count > limits.max_metadata_entries) {
    return Bad(absl::StrCat("metadata count: ", md_count, " over the limit of ",
                            limits.max_metadata_entries));
  }
  if (md_bytes > limits.max_metadata_bytes) {
    return Bad(absl::StrCat("metadata bytes: ", md_bytes, " over the limit of ",
                            limits.max_metadata_bytes));
  }
  if (seg_count > limits.max_segments) {
    return Bad(
        absl::StrCat("segment count: ", seg_count, " over the limit of ", limits.max_segments));
  }
  const uint64_t table = uint64_t{md_count} * 8 + uint64_t{seg_count} * 4;
  uint64_t at = kFixedHeaderBytes + table;
  if (at + status_len + md_bytes > f.size()) {
    return Bad(absl::StrCat("lengths: the table, status and metadata need ",
                            at + status_len + md_bytes, " bytes, the frame has ", f.size()));
  }
  const uint8_t* t = p + kFixedHeaderBytes;
  v.status_message = std::string_view(reinterpret_cast<const char*>(p + at), status_len);
  at += status_len;
  uint64_t md_sum = 0;
  v.metadata.reserve(md_count);
  for (uint16_t i = 0; i < md_count; ++i) {
    const uint32_t kl = Get<uint32_t>(t + 8 * i), vl = Get<uint32_t>(t + 8 * i + 4);
    md_sum += uint64_t{kl} + vl;
    if (md_sum > md_bytes) {
      return Bad(absl::StrCat("metadata[", i, "]: lengths exceed the ", md_bytes,
                              " metadata bytes announced"));
    }
    const char* base = reinterpret_cast<const char*>(p + at);
    v.metadata.emplace_back(std::string_view(base, kl), std::string_view(base + kl, vl));
    at += uint64_t{kl} + vl;
  }
  if (md_sum != md_bytes) {
    return Bad(absl::StrCat("metadata bytes: ", md_bytes, " announced, the entries hold ", md_sum));
  }
  const uint8_t* s = t + 8 * md_count;
  v.segments.reserve(seg_count > 0 ? seg_count - 1 : 0);
  for (uint32_t i = 0; i < seg_count; ++i) {
    const uint32_t len = Get<uint32_t>(s + 4 * i);
    at += Pad(at);
    if (at + len > f.size()) {
      return Bad(absl::StrCat("segment ", i, ": ", len, " bytes at offset ", at,
                              " run past the frame's ", f.size(), " bytes"));
    }
    absl::Span<const uint8_t> seg(p + at, len);
    if (i == 0) {
      v.structure = seg;
    } else {
      v.segments.push_back(seg);
    }
    at += len;
  }
  *length = static_cast<size_t>(at);
  return v;
}

}  // namespace plexus::rpc::internal
