// Fuzzes the verbs backend's decoders of peer-supplied bytes: chunk headers (every received
// SEND), the librdmacm private-data hello, and addresses. No input may crash them; accepted
// chunk headers and hellos must re-encode to an equivalent value.
#include <cstdint>
#include <string_view>

#include "verbs/protocol.hpp"

namespace vp = plexus::transport::verbs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = absl::MakeConstSpan(data, size);
  if (auto chunk = vp::DecodeChunkHeader(bytes); chunk.ok()) {
    uint8_t again[vp::kChunkHeaderBytes];
    vp::EncodeChunkHeader(*chunk, again);
    auto back = vp::DecodeChunkHeader(absl::MakeConstSpan(again, sizeof again));
    if (!back.ok() || back->total_bytes != chunk->total_bytes || back->credits != chunk->credits ||
        back->flags != chunk->flags) {
      __builtin_trap();
    }
  }
  if (auto hello = vp::DecodeHello(bytes); hello.ok()) {
    auto back = vp::DecodeHello(vp::EncodeHello(*hello));
    if (!back.ok() || back->recv_slots != hello->recv_slots) __builtin_trap();
  }
  (void)vp::ParseHostPort(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
