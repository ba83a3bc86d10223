// A tcp connection's socket-free protocol state (src/tcp/send_state.*, src/tcp/receive_state.*)
// with a completion queue and a registered region, fed bytes the way the device feeds them; for
// the tests that drive it without sockets (tcp_state_test, tcp_produce_consume_test).
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/transport/completion.hpp"
#include "tcp/frame.hpp"
#include "tcp/receive_state.hpp"
#include "tcp/send_state.hpp"

namespace plexus::testing::tcp_state {

namespace pt = plexus::transport;
namespace pi = plexus::transport::internal;
namespace tcp = plexus::transport::internal::tcp;

using Bytes = std::vector<uint8_t>;
using Event = tcp::ReceiveState::Event;

inline constexpr uint64_t kRegion = 7;
inline constexpr char kPeer[] = "10.0.0.2:5000";

// Appends a frame (header, then payload) to `stream`.
inline void Append(Bytes& stream, const tcp::FrameHeader& h, const Bytes& payload = {}) {
  const size_t at = stream.size();
  stream.resize(at + tcp::kFrameHeaderSize);
  tcp::EncodeFrameHeader(h, stream.data() + at);
  stream.insert(stream.end(), payload.begin(), payload.end());
}

inline Bytes Pattern(size_t n, uint8_t seed) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + 7 * i);
  return b;
}

// One connection's state, a completion queue, and a registered region (id kRegion) of 64 bytes.
struct Harness {
  explicit Harness(size_t sockets, size_t held_cap = size_t{1} << 20,
                   uint64_t max_message_bytes = 1 << 20)
      : send(&cq, 1, sockets, /*stripe_threshold=*/0),
        rx(
            tcp::ReceiveConfig{
                .peer = kPeer,
                .connection_id = 1,
                .sockets = sockets,
                .max_message_bytes = max_message_bytes,
                .matcher = {.backend = "tcp",
                            .peer = kPeer,
                            .connection_cap = held_cap,
                            .device = nullptr,
                            .max_spare_bytes = 0,
                            .deliver_eagerly = false},
                .resolve_write = [this](uint64_t id, uint64_t offset,
                                        uint64_t length) -> absl::StatusOr<pi::WriteTarget> {
                  if (id != kRegion) {
                    return absl::NotFoundError(absl::StrCat("one-sided write to unknown region id ",
                                                            id, " (not registered here)"));
                  }
                  if (offset + length > region.size()) return absl::OutOfRangeError("too far");
                  return pi::WriteTarget{region.data() + offset, pt::MemoryKind::kHost};
                }},
            &cq, &send),
        pending(sockets) {}

  // Feeds `bytes` to socket `k` the way the device does: what a waiting socket does not take
  // stays buffered, and sockets let go by a stripe head are fed again. Returns the events seen.
  std::vector<Event> Feed(size_t k, const Bytes& bytes) {
    pending[k].insert(pending[k].end(), bytes.begin(), bytes.end());
    std::vector<Event> events;
    for (bool progress = true; progress && error.ok();) {
      progress = false;
      for (size_t s = 0; s < pending.size() && error.ok(); ++s) {
        while (!pending[s].empty() && !rx.waiting(s)) {
          absl::StatusOr<tcp::ReceiveState::Consumed> c = rx.Consume(s, pending[s]);
          if (!c.ok()) {
            error = c.status();
            break;
          }
          pending[s].erase(pending[s].begin(), pending[s].begin() + c->bytes);
          if (c->event != Event::kNone) events.push_back(c->event);
          if (c->bytes == 0 && c->event == Event::kNone) break;
          progress = true;
        }
      }
    }
    return events;
  }

  std::vector<pt::Completion> Completions() {
    std::vector<pt::Completion> out(64);
    out.resize(cq.Poll(absl::MakeSpan(out)));
    return out;
  }

  pt::CompletionQueue cq;
  Bytes region = Bytes(64, 0);
  tcp::SendState send;
  tcp::ReceiveState rx;
  std::vector<Bytes> pending;
  absl::Status error;
};

}  // namespace plexus::testing::tcp_state
