// libFuzzer target for the shm frame decoder: any byte string must decode to a valid header or a
// clean error, never crash; a decoded header re-encodes to the same bytes, and the segment list
// of a cross-memory frame is checked the same way.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "shm/frame.hpp"

namespace shm = plexus::transport::internal::shm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first bytes choose the limits so that the length checks are exercised as well.
  shm::FrameLimits limits;
  limits.max_payload_bytes = size_t{1} << 20;
  limits.max_message_bytes = size_t{1} << 34;
  bool force_magic = false;
  if (size >= 2) {
    force_magic = (data[0] & 0x80) != 0;
    limits.max_payload_bytes = size_t{1} << (data[0] % 24);
    limits.max_message_bytes = size_t{1} << (data[1] % 40);
    data += 2;
    size -= 2;
  }
  // Half the inputs get a valid magic, so that the fuzzer reaches the field checks behind it.
  std::vector<uint8_t> copy(data, data + size);
  if (force_magic && size >= 2) {
    copy[0] = static_cast<uint8_t>(shm::kFrameMagic & 0xff);
    copy[1] = static_cast<uint8_t>(shm::kFrameMagic >> 8);
  }
  data = copy.data();
  auto header = shm::DecodeFrameHeader(absl::MakeConstSpan(data, size), limits);
  if (!header.ok()) return 0;
  uint8_t again[shm::kFrameHeaderBytes];
  shm::EncodeFrameHeader(*header, again);
  if (std::memcmp(again, data, shm::kFrameHeaderBytes) != 0) std::abort();
  if (header->payload_bytes > limits.max_payload_bytes ||
      header->total_bytes > limits.max_message_bytes) {
    std::abort();
  }
  if (header->type == shm::FrameType::kMessageCma || header->type == shm::FrameType::kWriteCma) {
    const size_t rest = size - shm::kFrameHeaderBytes;
    const size_t n = rest < header->payload_bytes ? rest : header->payload_bytes;
    auto segments =
        shm::DecodeCmaSegments(absl::MakeConstSpan(data + shm::kFrameHeaderBytes, n), *header);
    if (segments.ok()) {
      uint64_t sum = 0;
      for (const auto& s : *segments) sum += s.length;
      if (sum != header->total_bytes) std::abort();
    }
  }
  return 0;
}
