// Fuzzes the tcp backend's frame header and hello decoders: no input may crash them, and every
// header they accept must re-encode to the same bytes. Accepted headers then go through the
// socket-free protocol (src/tcp/protocol.*): planning never crashes, stripe layouts tile the
// operation exactly, and a part matches only its own socket's range.
#include <cstdint>
#include <cstring>

#include "tcp/frame.hpp"
#include "tcp/protocol.hpp"

namespace tcp = plexus::transport::internal::tcp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto header = tcp::DecodeFrameHeader(absl::MakeConstSpan(data, size), uint64_t{1} << 34);
  if (header.ok()) {
    uint8_t again[tcp::kFrameHeaderSize];
    tcp::EncodeFrameHeader(*header, again);
    if (std::memcmp(again, data, tcp::kFrameHeaderSize) != 0) __builtin_trap();
    const size_t extra = size > tcp::kFrameHeaderSize ? data[tcp::kFrameHeaderSize] : 0;
    const size_t sockets = 1 + extra % 64;
    const size_t socket = (extra >> 6) % sockets;
    auto plan = tcp::PlanHeader(*header, socket, sockets, extra, extra / 3);
    if (plan.ok() && plan->action == tcp::HeaderAction::kOperation &&
        plan->first_bytes > header->length) {
      __builtin_trap();
    }
    // The parts of an operation of this length tile it, in order, over every socket count.
    for (size_t n = 1; n <= 64; n += 1 + n / 8) {
      uint64_t next = 0;
      for (size_t k = 0; k < n; ++k) {
        const tcp::StripeRange r = tcp::StripePart(header->length, n, k);
        if (r.offset != next || r.length > header->length / n + 1) __builtin_trap();
        next += r.length;
        tcp::FrameHeader part;
        part.type = tcp::FrameType::kStripePart;
        part.b = r.offset;
        part.length = r.length;
        if (k > 0 && !tcp::PartMatches(part, k, n, header->length)) __builtin_trap();
        if (k > 0 && (header->b != r.offset || header->length != r.length) &&
            tcp::PartMatches(*header, k, n, header->length)) {
          __builtin_trap();
        }
      }
      if (next != header->length) __builtin_trap();
    }
  }
  auto hello = tcp::DecodeHello(absl::MakeConstSpan(data, size));
  if (hello.ok() && hello->socket_index >= hello->socket_count) __builtin_trap();
  return 0;
}
