// The tcp backend's produced sends and consumed receives without sockets: a produced send is
// made in bounded chunks, two ahead, each into the staging half the socket took whole, and a
// consumed receive is read through a bounded window handed to the consumer chunk by chunk;
// callback errors come back annotated to end the connection.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "plexus/transport/completion.hpp"
#include "tcp/frame.hpp"
#include "tcp/receive_state.hpp"
#include "tcp/send_state.hpp"
#include "tcp_frames.hpp"
#include "tcp_state_harness.hpp"

using plexus::testing::Header;
using namespace plexus::testing::tcp_state;  // NOLINT

namespace {

constexpr size_t kChunk = pt::kMaxProduceConsumeBytes;

// The calls a producer or consumer got: (offset, size).
struct Calls {
  std::vector<std::pair<size_t, size_t>> seen;
  size_t fail_from = SIZE_MAX;  // calls covering this offset fail (DataLoss)
};

pt::Producer ProduceFrom(const Bytes* src, Calls* calls) {
  return [src, calls](size_t offset, absl::Span<uint8_t> out) -> absl::Status {
    calls->seen.emplace_back(offset, out.size());
    if (offset + out.size() > calls->fail_from) return absl::DataLossError("no more input");
    std::memcpy(out.data(), src->data() + offset, out.size());
    return absl::OkStatus();
  };
}

pt::Consumer ConsumeInto(Bytes* dst, Calls* calls) {
  return [dst, calls](size_t offset, absl::Span<const uint8_t> in) -> absl::Status {
    calls->seen.emplace_back(offset, in.size());
    if (offset + in.size() > calls->fail_from) return absl::DataLossError("no more room");
    std::memcpy(dst->data() + offset, in.data(), in.size());
    return absl::OkStatus();
  };
}

}  // namespace

TEST_CASE("tcp frame queue: a produced send is made two chunks ahead as the socket takes it",
          "[tcp][produce]") {
  pt::CompletionQueue cq;
  tcp::SendState send(&cq, 3, 1, size_t{1} << 20);
  const size_t length = 2 * kChunk + 100;
  const Bytes message = Pattern(length, 5);
  Calls calls;
  auto op = std::make_shared<tcp::OutOp>();
  op->wr_id = 4;
  op->bytes = length;
  op->producer = ProduceFrom(&message, &calls);
  REQUIRE(send.Start(op, Header(tcp::FrameType::kMessage, length)).size() == 1);
  tcp::FrameQueue q;
  q.Push(Header(tcp::FrameType::kMessage, length), {}, op);
  q.Push(Header(tcp::FrameType::kWriteAck, 0, 2), {}, nullptr);
  CHECK(calls.seen.empty());  // nothing is produced before the socket can take it

  // Two chunks, one per half of the staging: the second is made while the kernel drains the
  // first.
  REQUIRE(q.Produce().ok());
  REQUIRE(calls.seen.size() == 2);
  CHECK(calls.seen[0] == std::make_pair(size_t{0}, kChunk));
  CHECK(calls.seen[1] == std::make_pair(kChunk, kChunk));
  iovec iov[8];
  REQUIRE(q.Gather(iov, 8) == 3);  // the header and both chunks; the ack waits behind the rest
  const uint8_t* staging = static_cast<const uint8_t*>(iov[1].iov_base);
  CHECK(iov[1].iov_len == kChunk);
  CHECK(std::memcmp(staging, message.data(), kChunk) == 0);
  CHECK(iov[2].iov_base == staging + kChunk);
  CHECK(std::memcmp(iov[2].iov_base, message.data() + kChunk, kChunk) == 0);

  q.Advance(tcp::kFrameHeaderSize + 1000, send);
  REQUIRE(q.Produce().ok());
  CHECK(calls.seen.size() == 2);  // the first chunk is not all written: its half is not free
  REQUIRE(q.Gather(iov, 8) == 2);
  CHECK(iov[0].iov_base == staging + 1000);
  CHECK(iov[0].iov_len == kChunk - 1000);
  CHECK(iov[1].iov_base == staging + kChunk);

  q.Advance(kChunk - 1000, send);
  REQUIRE(q.Produce().ok());
  REQUIRE(calls.seen.size() == 3);  // the first half is free: the last 100 bytes go there
  CHECK(calls.seen[2] == std::make_pair(2 * kChunk, size_t{100}));
  REQUIRE(q.Gather(iov, 8) == 3);  // the second chunk, the last 100 bytes, the ack's header
  CHECK(iov[0].iov_base == staging + kChunk);
  CHECK(iov[1].iov_base == staging);  // the same staging memory, reused
  CHECK(iov[1].iov_len == 100);
  CHECK(std::memcmp(staging, message.data() + 2 * kChunk, 100) == 0);
  CHECK(op->staging.size() <= 2 * kChunk);

  pt::Completion c;
  q.Advance(kChunk, send);
  CHECK(cq.Poll(absl::MakeSpan(&c, 1)) == 0);
  q.Advance(100, send);
  REQUIRE(cq.Poll(absl::MakeSpan(&c, 1)) == 1);
  CHECK(c.wr_id == 4);
  CHECK(c.status.ok());
  CHECK(c.bytes == length);
  CHECK(op->producer == nullptr);  // destroyed once the send completed
  q.Advance(tcp::kFrameHeaderSize, send);
  CHECK(q.empty());
  CHECK(calls.seen.size() == 3);
}

TEST_CASE("tcp frame queue: an empty produced send calls nothing", "[tcp][produce]") {
  pt::CompletionQueue cq;
  tcp::SendState send(&cq, 3, 1, size_t{1} << 20);
  Calls calls;
  Bytes none;
  auto op = std::make_shared<tcp::OutOp>();
  op->wr_id = 6;
  op->producer = ProduceFrom(&none, &calls);
  REQUIRE(send.Start(op, Header(tcp::FrameType::kMessage, 0)).size() == 1);
  tcp::FrameQueue q;
  q.Push(Header(tcp::FrameType::kMessage, 0), {}, op);
  REQUIRE(q.Produce().ok());
  iovec iov[4];
  REQUIRE(q.Gather(iov, 4) == 1);
  q.Advance(tcp::kFrameHeaderSize, send);
  pt::Completion c;
  REQUIRE(cq.Poll(absl::MakeSpan(&c, 1)) == 1);
  CHECK(c.wr_id == 6);
  CHECK(calls.seen.empty());
}

TEST_CASE("tcp frame queue: a producer error comes back annotated", "[tcp][produce]") {
  pt::CompletionQueue cq;
  tcp::SendState send(&cq, 3, 1, size_t{1} << 20);
  const size_t length = 2 * kChunk + 100;
  const Bytes message = Pattern(length, 6);
  Calls calls;
  calls.fail_from = kChunk + 10;
  auto op = std::make_shared<tcp::OutOp>();
  op->wr_id = 4;
  op->bytes = length;
  op->producer = ProduceFrom(&message, &calls);
  REQUIRE(send.Start(op, Header(tcp::FrameType::kMessage, length)).size() == 1);
  tcp::FrameQueue q;
  q.Push(Header(tcp::FrameType::kMessage, length), {}, op);
  const absl::Status s = q.Produce();  // the first chunk, then the second fails
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(s.message()) ==
        "send (wr_id 4): producing bytes [262144, +262144) of a message of 524388 bytes: no "
        "more input");
}

TEST_CASE("tcp send state: a produced send is never striped", "[tcp][produce]") {
  pt::CompletionQueue cq;
  tcp::SendState send(&cq, 3, 4, /*stripe_threshold=*/0);
  auto op = std::make_shared<tcp::OutOp>();
  op->bytes = 1 << 20;
  op->producer = [](size_t, absl::Span<uint8_t>) { return absl::OkStatus(); };
  const tcp::FramePlans frames = send.Start(op, Header(tcp::FrameType::kMessage, 1 << 20));
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].socket == 0);
  CHECK(frames[0].header.type == tcp::FrameType::kMessage);
}

TEST_CASE("tcp receive state: a consumed receive reads through a bounded window",
          "[tcp][consume]") {
  const size_t length = 2 * kChunk + 100;
  Harness h(1, size_t{1} << 20, size_t{1} << 30);
  const Bytes message = Pattern(length, 7);
  Bytes got(length, 0);
  Calls calls;
  REQUIRE(h.rx.PostRecvConsumed(length, ConsumeInto(&got, &calls), 5).ok());
  Bytes header;
  Append(header, Header(tcp::FrameType::kMessage, length));
  h.Feed(0, header);
  REQUIRE(h.error.ok());
  absl::Span<uint8_t> window = h.rx.PayloadWindow(0);
  REQUIRE(window.size() == kChunk);
  uint8_t* const base = window.data();
  std::memcpy(window.data(), message.data(), 1000);
  REQUIRE(h.rx.Placed(0, 1000).ok());
  CHECK(calls.seen.empty());  // the chunk is not full yet
  window = h.rx.PayloadWindow(0);
  REQUIRE(window.size() == kChunk - 1000);
  CHECK(window.data() == base + 1000);
  std::memcpy(window.data(), message.data() + 1000, kChunk - 1000);
  REQUIRE(h.rx.Placed(0, kChunk - 1000).ok());
  REQUIRE(calls.seen.size() == 1);
  CHECK(calls.seen[0] == std::make_pair(size_t{0}, kChunk));
  window = h.rx.PayloadWindow(0);
  REQUIRE(window.size() == kChunk);
  CHECK(window.data() == base);  // the same chunk again
  // The rest arrives through the staged path (Consume), in one piece.
  h.Feed(0, Bytes(message.begin() + kChunk, message.end()));
  REQUIRE(h.error.ok());
  REQUIRE(calls.seen.size() == 3);
  CHECK(calls.seen[1] == std::make_pair(kChunk, kChunk));
  CHECK(calls.seen[2] == std::make_pair(2 * kChunk, size_t{100}));
  CHECK(got == message);
  const std::vector<pt::Completion> c = h.Completions();
  REQUIRE(c.size() == 1);
  CHECK(c[0].wr_id == 5);
  CHECK(c[0].status.ok());
  CHECK(c[0].bytes == length);
}

TEST_CASE("tcp receive state: a consumer error ends the connection and fails the receive",
          "[tcp][consume]") {
  const size_t length = kChunk + 10;
  Harness h(1, size_t{1} << 20, size_t{1} << 30);
  Bytes got(length, 0);
  Calls calls;
  calls.fail_from = 5;
  REQUIRE(h.rx.PostRecvConsumed(length, ConsumeInto(&got, &calls), 5).ok());
  Bytes stream;
  Append(stream, Header(tcp::FrameType::kMessage, length), Pattern(length, 8));
  h.Feed(0, stream);
  REQUIRE_FALSE(h.error.ok());
  CHECK(h.error.code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(h.error.message()) ==
        "tcp receive (wr_id 5) from 10.0.0.2:5000: consuming bytes [0, +262144) of a message of "
        "262154 bytes: no more room");
  CHECK(h.Completions().empty());  // the receive fails with the connection, not as whole
  h.rx.Fail(h.error);
  const std::vector<pt::Completion> c = h.Completions();
  REQUIRE(c.size() == 1);
  CHECK(c[0].wr_id == 5);
  CHECK(c[0].status == h.error);
  CHECK(c[0].bytes == 0);
}
