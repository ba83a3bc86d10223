// Fuzzes the tcp backend's frame header and hello decoders: no input may crash them, and every
// header they accept must re-encode to the same bytes.
#include <cstdint>
#include <cstring>

#include "tcp/frame.hpp"

namespace tcp = plexus::transport::internal::tcp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto header = tcp::DecodeFrameHeader(absl::MakeConstSpan(data, size), uint64_t{1} << 34);
  if (header.ok()) {
    uint8_t again[tcp::kFrameHeaderSize];
    tcp::EncodeFrameHeader(*header, again);
    if (std::memcmp(again, data, tcp::kFrameHeaderSize) != 0) __builtin_trap();
  }
  auto hello = tcp::DecodeHello(absl::MakeConstSpan(data, size));
  if (hello.ok() && hello->socket_index >= hello->socket_count) __builtin_trap();
  return 0;
}
