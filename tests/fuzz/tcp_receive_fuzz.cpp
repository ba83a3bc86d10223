// Fuzzes the tcp backend's receive state machine (src/tcp/receive_state.*) as the device drives
// it: bytes for any socket in any split, receives posted in between, payloads placed straight
// into the window, retries after backpressure. No input may crash it, write outside the
// buffers it was given (ASan), complete a receive twice, or take bytes once it has failed.
//
// Input: byte 0 picks the socket count (1-4); then commands, each one byte followed by its
// arguments: 0 bytes for a socket (socket, length, bytes), 1 post a receive (size), 2 place
// bytes into the payload window (socket, count), 3 Readmit, 4 a frame header built from the
// next fields (socket, type, flags, length, a, b), so that well-formed frames are easy to reach.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "plexus/transport/completion.hpp"
#include "tcp/frame.hpp"
#include "tcp/receive_state.hpp"
#include "tcp/send_state.hpp"

namespace pt = plexus::transport;
namespace pi = plexus::transport::internal;
namespace tcp = plexus::transport::internal::tcp;

namespace {

struct Input {
  const uint8_t* data;
  size_t size;
  size_t at = 0;
  bool done() const { return at >= size; }
  uint8_t U8() { return at < size ? data[at++] : 0; }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  const size_t sockets = 1 + in.U8() % 4;
  pt::CompletionQueue cq;
  std::vector<uint8_t> region(256, 0);
  tcp::SendState send(&cq, 1, sockets, 64);
  tcp::ReceiveState rx(
      tcp::ReceiveConfig{.peer = "fuzz",
                         .connection_id = 1,
                         .sockets = sockets,
                         .max_message_bytes = 1 << 16,
                         .matcher = {.backend = "tcp",
                                     .peer = "fuzz",
                                     .connection_cap = 1 << 16,
                                     .deliver_eagerly = false},
                         .resolve_write = [&region](uint64_t id, uint64_t offset, uint64_t length)
                             -> absl::StatusOr<pi::WriteTarget> {
                           if (id != 1) return absl::NotFoundError("unknown region");
                           if (offset > region.size() || length > region.size() - offset) {
                             return absl::OutOfRangeError("outside the region");
                           }
                           return pi::WriteTarget{region.data() + offset, pt::MemoryKind::kHost};
                         }},
      &cq, &send);
  std::deque<std::vector<uint8_t>> buffers;  // posted receives' memory, alive to the end
  uint64_t next_wr_id = 0;
  absl::Status failed;
  std::vector<std::vector<uint8_t>> pending(sockets);  // bytes a waiting socket did not take

  auto feed = [&](size_t k) {
    while (failed.ok() && !pending[k].empty() && !rx.waiting(k)) {
      absl::StatusOr<tcp::ReceiveState::Consumed> c = rx.Consume(k, pending[k]);
      if (!c.ok()) {
        failed = c.status();
        return;
      }
      if (c->bytes > pending[k].size()) __builtin_trap();
      pending[k].erase(pending[k].begin(), pending[k].begin() + c->bytes);
      if (c->event == tcp::ReceiveState::Event::kPartsResumed) {
        for (size_t r : rx.resumed()) {
          if (r == 0 || r >= sockets) __builtin_trap();
        }
      }
      if (c->bytes == 0 && c->event == tcp::ReceiveState::Event::kNone) {
        if (!rx.waiting(k)) __builtin_trap();  // took nothing without a reason
        return;
      }
    }
  };
  auto feed_all = [&] {
    for (size_t k = 0; k < sockets; ++k) feed(k);
  };

  while (!in.done() && failed.ok()) {
    switch (in.U8() % 5) {
      case 0: {
        const size_t k = in.U8() % sockets;
        const size_t n = std::min<size_t>(in.U8(), in.size - in.at);
        pending[k].insert(pending[k].end(), in.data + in.at, in.data + in.at + n);
        in.at += n;
        feed(k);
        feed_all();
        break;
      }
      case 1: {
        std::vector<uint8_t>& b = buffers.emplace_back(in.U16() % 4096);
        if (absl::Status s = rx.PostRecv({b.data(), b.size()}, next_wr_id++); !s.ok()) failed = s;
        break;
      }
      case 2: {
        const size_t k = in.U8() % sockets;
        absl::Span<uint8_t> window = rx.PayloadWindow(k);
        if (!pending[k].empty()) break;  // the device places bytes only with nothing buffered
        const size_t n = std::min<size_t>(window.size(), in.U8());
        if (n == 0) break;
        std::memset(window.data(), 0xab, n);
        if (absl::Status s = rx.Placed(k, n); !s.ok()) failed = s;
        feed_all();
        break;
      }
      case 3: {
        absl::StatusOr<tcp::ReceiveState::Event> e = rx.Readmit();
        if (!e.ok()) failed = e.status();
        feed_all();
        break;
      }
      case 4: {
        const size_t k = in.U8() % sockets;
        tcp::FrameHeader h;
        h.type = static_cast<tcp::FrameType>(1 + in.U8() % 6);
        h.flags = in.U8() % 4;
        h.length = in.U16() % 512;
        h.a = in.U8() % 4;
        h.b = in.U16() % 512;
        if (h.type == tcp::FrameType::kWriteAck || h.type == tcp::FrameType::kClose) h.length = 0;
        uint8_t bytes[tcp::kFrameHeaderSize];
        tcp::EncodeFrameHeader(h, bytes);
        pending[k].insert(pending[k].end(), bytes, bytes + sizeof bytes);
        feed(k);
        feed_all();
        break;
      }
    }
    rx.TakeAcksOwed();
    rx.TakeRoomFreed();
  }
  if (!failed.ok()) {
    // A failed state takes nothing more and keeps its error.
    const uint8_t junk[tcp::kFrameHeaderSize] = {};
    if (rx.Consume(0, junk).ok()) __builtin_trap();
    if (!rx.PayloadWindow(0).empty()) __builtin_trap();
  }
  rx.Fail(failed.ok() ? absl::UnavailableError("fuzz: end of input") : failed);
  // Every receive completes at most once.
  absl::flat_hash_map<uint64_t, int> seen;
  pt::Completion c[64];
  for (size_t n; (n = cq.Poll(absl::MakeSpan(c))) > 0;) {
    for (size_t i = 0; i < n; ++i) {
      if (c[i].opcode != pt::Opcode::kRecv) continue;
      if (c[i].wr_id >= next_wr_id || ++seen[c[i].wr_id] > 1) __builtin_trap();
    }
  }
  return 0;
}
