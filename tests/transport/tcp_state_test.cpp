// The tcp backend's socket-free protocol state (src/tcp/send_state.*, src/tcp/receive_state.*),
// driven without sockets: byte streams split at every boundary, striped operations whose parts
// arrive before and after their heads, acks and written frames in every order, and malformed
// frames, each of which must end the connection with its exact error.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/transport/completion.hpp"
#include "tcp/frame.hpp"
#include "tcp/receive_state.hpp"
#include "tcp/send_state.hpp"
#include "tcp_frames.hpp"
#include "tcp_state_harness.hpp"

namespace pt = plexus::transport;
namespace pi = plexus::transport::internal;
namespace tcp = plexus::transport::internal::tcp;
using plexus::testing::Header;

using namespace plexus::testing::tcp_state;  // NOLINT

namespace {

// A message of 5 bytes, a write of 4 bytes with an immediate, an empty message and a message of
// 40 bytes, on one socket.
Bytes MixedStream() {
  Bytes s;
  Append(s, Header(tcp::FrameType::kMessage, 5), Pattern(5, 1));
  Append(s, Header(tcp::FrameType::kWrite, 4, kRegion, 10, tcp::kFlagImmediate, 99), Pattern(4, 2));
  Append(s, Header(tcp::FrameType::kMessage, 0));
  Append(s, Header(tcp::FrameType::kMessage, 40), Pattern(40, 3));
  return s;
}

void CheckMixedStream(Harness& h, const std::vector<Bytes>& got) {
  REQUIRE(h.error.ok());
  const std::vector<pt::Completion> c = h.Completions();
  REQUIRE(c.size() == 4);
  CHECK(c[0].opcode == pt::Opcode::kRecv);
  CHECK(c[0].wr_id == 1);
  CHECK(c[0].bytes == 5);
  CHECK(c[1].opcode == pt::Opcode::kRemoteWrite);
  CHECK(c[1].bytes == 4);
  CHECK(c[1].has_immediate);
  CHECK(c[1].immediate == 99);
  CHECK(c[2].wr_id == 2);
  CHECK(c[2].bytes == 0);
  CHECK(c[3].wr_id == 3);
  CHECK(c[3].bytes == 40);
  for (const pt::Completion& x : c) CHECK(x.status.ok());
  CHECK(Bytes(got[0].begin(), got[0].begin() + 5) == Pattern(5, 1));
  CHECK(Bytes(got[2].begin(), got[2].begin() + 40) == Pattern(40, 3));
  CHECK(Bytes(h.region.begin() + 10, h.region.begin() + 14) == Pattern(4, 2));
  CHECK(h.region[9] == 0);
  CHECK(h.region[14] == 0);
  CHECK(h.rx.TakeAcksOwed() == 1);
  CHECK(h.rx.TakeAcksOwed() == 0);
  CHECK(h.rx.incoming_operations() == 0);
  CHECK_FALSE(h.rx.mid_frame(0));
}

std::string ErrorOf(Harness& h) {
  REQUIRE_FALSE(h.error.ok());
  return std::string(h.error.message());
}

}  // namespace

TEST_CASE("tcp receive state: a stream split at every boundary arrives whole", "[tcp]") {
  const Bytes stream = MixedStream();
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    INFO("cut at " << cut << " of " << stream.size());
    Harness h(1);
    std::vector<Bytes> got(3, Bytes(64, 0xee));
    for (uint64_t i = 0; i < 3; ++i) REQUIRE(h.rx.PostRecv({got[i].data(), 64}, i + 1).ok());
    h.Feed(0, Bytes(stream.begin(), stream.begin() + cut));
    CHECK(h.rx.mid_frame(0) == (cut != 0 && cut != 32 + 5 && cut != 2 * 32 + 9 &&
                                cut != 3 * 32 + 9 && cut != stream.size()));
    h.Feed(0, Bytes(stream.begin() + cut, stream.end()));
    CheckMixedStream(h, got);
  }
  SECTION("one byte at a time") {
    Harness h(1);
    std::vector<Bytes> got(3, Bytes(64, 0xee));
    for (uint64_t i = 0; i < 3; ++i) REQUIRE(h.rx.PostRecv({got[i].data(), 64}, i + 1).ok());
    for (uint8_t b : stream) h.Feed(0, Bytes{b});
    CheckMixedStream(h, got);
  }
  SECTION("messages before their receives are held, then delivered in order") {
    Harness h(1);
    h.Feed(0, stream);
    REQUIRE(h.error.ok());
    // The write completes at once; the messages wait for receives (held, in arrival order).
    std::vector<pt::Completion> c = h.Completions();
    REQUIRE(c.size() == 0);
    std::vector<Bytes> got(3, Bytes(64, 0xee));
    for (uint64_t i = 0; i < 3; ++i) REQUIRE(h.rx.PostRecv({got[i].data(), 64}, i + 1).ok());
    CheckMixedStream(h, got);
  }
}

TEST_CASE("tcp receive state: payloads read straight into the window", "[tcp]") {
  Harness h(1);
  Bytes got(100, 0);
  REQUIRE(h.rx.PostRecv({got.data(), got.size()}, 5).ok());
  Bytes header;
  Append(header, Header(tcp::FrameType::kMessage, 100));
  h.Feed(0, header);
  absl::Span<uint8_t> window = h.rx.PayloadWindow(0);
  REQUIRE(window.size() == 100);
  CHECK(window.data() == got.data());
  const Bytes payload = Pattern(100, 9);
  std::memcpy(window.data(), payload.data(), 60);
  REQUIRE(h.rx.Placed(0, 60).ok());
  window = h.rx.PayloadWindow(0);
  REQUIRE(window.size() == 40);
  CHECK(window.data() == got.data() + 60);
  CHECK(h.rx.Placed(0, 41).code() == absl::StatusCode::kInternal);  // beyond the window
  std::memcpy(window.data(), payload.data() + 60, 40);
  REQUIRE(h.rx.Placed(0, 40).ok());
  CHECK(h.rx.PayloadWindow(0).empty());
  const std::vector<pt::Completion> c = h.Completions();
  REQUIRE(c.size() == 1);
  CHECK(c[0].wr_id == 5);
  CHECK(c[0].bytes == 100);
  CHECK(got == payload);
}

TEST_CASE("tcp receive state: striped operations, parts before and after their heads", "[tcp]") {
  // Socket 0: the head of a 10-byte message (stripe 0, part 0 = 4 bytes), then the head of a
  // 7-byte write (stripe 1, part 0 = 3 bytes). Sockets 1 and 2: their parts of both stripes.
  const Bytes message = Pattern(10, 40), write = Pattern(7, 80);
  std::vector<Bytes> streams(3);
  Append(streams[0], Header(tcp::FrameType::kStripeHead, 10),
         Bytes(message.begin(), message.begin() + 4));
  Append(
      streams[0],
      Header(tcp::FrameType::kStripeHead, 7, kRegion, 20, tcp::kFlagWrite | tcp::kFlagImmediate, 5),
      Bytes(write.begin(), write.begin() + 3));
  Append(streams[1], Header(tcp::FrameType::kStripePart, 4, 0, 4),
         Bytes(message.begin() + 4, message.begin() + 8));
  Append(streams[1], Header(tcp::FrameType::kStripePart, 3, 1, 3),
         Bytes(write.begin() + 3, write.begin() + 6));
  Append(streams[2], Header(tcp::FrameType::kStripePart, 2, 0, 8),
         Bytes(message.begin() + 8, message.end()));
  Append(streams[2], Header(tcp::FrameType::kStripePart, 1, 1, 6),
         Bytes(write.begin() + 6, write.end()));
  std::vector<size_t> order = {0, 1, 2};
  do {
    INFO("sockets fed in the order " << order[0] << order[1] << order[2]);
    Harness h(3);
    Bytes got(16, 0);
    REQUIRE(h.rx.PostRecv({got.data(), got.size()}, 11).ok());
    std::vector<Event> events;
    for (size_t k : order) {
      for (Event e : h.Feed(k, streams[k])) events.push_back(e);
    }
    REQUIRE(h.error.ok());
    // Parts that came first parked until their head let them go.
    const bool parts_first = order[0] != 0;
    CHECK((std::count(events.begin(), events.end(), Event::kPartsResumed) > 0) == parts_first);
    const std::vector<pt::Completion> c = h.Completions();
    REQUIRE(c.size() == 2);
    CHECK(c[0].opcode == pt::Opcode::kRecv);
    CHECK(c[0].wr_id == 11);
    CHECK(c[0].bytes == 10);
    CHECK(c[1].opcode == pt::Opcode::kRemoteWrite);
    CHECK(c[1].immediate == 5);
    CHECK(c[1].bytes == 7);
    CHECK(Bytes(got.begin(), got.begin() + 10) == message);
    CHECK(Bytes(h.region.begin() + 20, h.region.begin() + 27) == write);
    CHECK(h.rx.TakeAcksOwed() == 1);
    for (size_t k = 0; k < 3; ++k) CHECK_FALSE(h.rx.mid_frame(k));
  } while (std::next_permutation(order.begin(), order.end()));
}

TEST_CASE("tcp receive state: a part waiting for a later head stays parked", "[tcp]") {
  Harness h(2);
  Bytes part;
  Append(part, Header(tcp::FrameType::kStripePart, 1, 0, 1), Bytes{42});
  h.Feed(1, part);
  REQUIRE(h.error.ok());
  CHECK(h.rx.phase(1) == tcp::ReceiveState::Phase::kParked);
  CHECK(h.rx.waiting(1));
  CHECK_FALSE(h.rx.stalled(1));  // the connection is not paused: it is read for hang-ups
  CHECK(h.rx.mid_frame(1));
  CHECK(h.pending[1].size() == 1);  // the header was taken, its payload not yet
}

TEST_CASE("tcp send state: completions in posting order, whatever order frames and acks come",
          "[tcp]") {
  pt::CompletionQueue cq;
  tcp::SendState send(&cq, 3, 1, size_t{1} << 20);
  auto op = [](pt::Opcode opcode, uint64_t wr_id) {
    auto o = std::make_shared<tcp::OutOp>();
    o->opcode = opcode;
    o->wr_id = wr_id;
    o->bytes = wr_id * 10;
    return o;
  };
  auto write_a = op(pt::Opcode::kWrite, 1), send_b = op(pt::Opcode::kSend, 2),
       write_c = op(pt::Opcode::kWrite, 3);
  for (const auto& o : {write_a, send_b, write_c}) {
    const tcp::FramePlans frames = send.Start(
        o,
        Header(o->opcode == pt::Opcode::kWrite ? tcp::FrameType::kWrite : tcp::FrameType::kMessage,
               o->bytes));
    REQUIRE(frames.size() == 1);
    CHECK(frames[0].socket == 0);
    CHECK(frames[0].payload.length == o->bytes);
  }
  CHECK(send.writes_awaiting_ack() == 2);
  auto drain = [&] {
    std::vector<uint64_t> ids;
    pt::Completion c[8];
    const size_t n = cq.Poll(absl::MakeSpan(c));
    for (size_t i = 0; i < n; ++i) {
      CHECK(c[i].status.ok());
      CHECK(c[i].bytes == c[i].wr_id * 10);
      ids.push_back(c[i].wr_id);
    }
    return ids;
  };
  send.FrameWritten(*send_b);  // written first, completes after write_a
  CHECK(drain().empty());
  REQUIRE(send.Acked(1).ok());  // the ack of write_a arrives before write_a counts as written
  CHECK(drain().empty());
  send.FrameWritten(*write_a);
  CHECK(drain() == std::vector<uint64_t>{1, 2});
  send.FrameWritten(*write_c);
  CHECK(drain().empty());
  CHECK(send.outstanding() == 1);
  CHECK(send.Acked(2).code() == absl::StatusCode::kFailedPrecondition);  // one awaits
  REQUIRE(send.Acked(1).ok());
  CHECK(drain() == std::vector<uint64_t>{3});
  CHECK(send.idle());
  send.FrameWritten(*write_c);  // a frame reported twice changes nothing
  CHECK(drain().empty());
}

TEST_CASE("tcp send state: striped frames cover the operation, one part per socket", "[tcp]") {
  pt::CompletionQueue cq;
  tcp::SendState send(&cq, 3, 4, 8);
  auto small = std::make_shared<tcp::OutOp>();
  CHECK(send.Start(small, Header(tcp::FrameType::kMessage, 7)).size() == 1);  // under threshold
  for (uint64_t stripe = 0; stripe < 2; ++stripe) {
    auto op = std::make_shared<tcp::OutOp>();
    op->opcode = pt::Opcode::kWrite;
    const tcp::FramePlans f = send.Start(op, Header(tcp::FrameType::kWrite, 9, kRegion, 100));
    REQUIRE(f.size() == 4);
    CHECK(op->frames_left == 4);
    CHECK(f[0].header.type == tcp::FrameType::kStripeHead);
    CHECK(f[0].header.flags == tcp::kFlagWrite);
    CHECK(f[0].header.length == 9);
    CHECK(f[0].header.b == 100);
    const uint64_t offsets[] = {0, 3, 6, 9}, lengths[] = {3, 3, 3, 0};
    for (size_t k = 0; k < 4; ++k) {
      CHECK(f[k].socket == k);
      CHECK(f[k].payload.offset == offsets[k]);
      CHECK(f[k].payload.length == lengths[k]);
      if (k == 0) continue;
      CHECK(f[k].header.type == tcp::FrameType::kStripePart);
      CHECK(f[k].header.a == stripe);
      CHECK(f[k].header.b == offsets[k]);
      CHECK(f[k].header.length == lengths[k]);
    }
  }
}

TEST_CASE("tcp frame queue: gathers what is left and reports written frames", "[tcp]") {
  pt::CompletionQueue cq;
  tcp::SendState send(&cq, 3, 1, size_t{1} << 20);
  auto op = std::make_shared<tcp::OutOp>();
  op->wr_id = 4;
  op->bytes = 10;
  REQUIRE(send.Start(op, Header(tcp::FrameType::kMessage, 10)).size() == 1);
  Bytes a = Pattern(6, 1), b = Pattern(4, 2);
  tcp::FrameQueue q;
  q.Push(Header(tcp::FrameType::kMessage, 10), {{a.data(), 6}, {b.data(), 4}}, op);
  q.Push(Header(tcp::FrameType::kWriteAck, 0, 2), {}, nullptr);
  iovec iov[8];
  REQUIRE(q.Gather(iov, 8) == 4);  // header, a, b, the ack's header
  CHECK(iov[1].iov_base == a.data());
  q.Advance(tcp::kFrameHeaderSize + 2, send);
  REQUIRE(q.Gather(iov, 8) == 3);
  CHECK(iov[0].iov_base == a.data() + 2);
  CHECK(iov[0].iov_len == 4);
  REQUIRE(q.Gather(iov, 2) == 2);  // a's rest and b: the ack's header waits for the next call
  CHECK(iov[1].iov_base == b.data());
  pt::Completion c;
  CHECK(cq.Poll(absl::MakeSpan(&c, 1)) == 0);
  q.Advance(8, send);  // the rest of the message
  REQUIRE(cq.Poll(absl::MakeSpan(&c, 1)) == 1);
  CHECK(c.wr_id == 4);
  CHECK(q.size() == 1);
  q.Advance(tcp::kFrameHeaderSize, send);
  CHECK(q.empty());
  CHECK(q.Gather(iov, 8) == 0);
}

TEST_CASE("tcp send state: completed operations' records are reused, at most kSpareOps kept",
          "[tcp]") {
  pt::CompletionQueue cq;
  tcp::SendState send(&cq, 3, 1, size_t{1} << 20);
  tcp::FrameQueue q;
  const Bytes payload = Pattern(5, 1);
  const tcp::FrameHeader h = Header(tcp::FrameType::kMessage, payload.size());
  auto post = [&](uint64_t wr_id) {
    tcp::OutOp fields;
    fields.wr_id = wr_id;
    fields.bytes = payload.size();
    std::shared_ptr<tcp::OutOp> op = send.NewOp(std::move(fields));
    CHECK(op->wr_id == wr_id);  // a reused record starts from the fields alone
    CHECK(op->frames_left == 0);
    CHECK_FALSE(op->written);
    REQUIRE(send.Start(op, h).size() == 1);
    const tcp::OutOp* record = op.get();
    q.Push(h, {{const_cast<uint8_t*>(payload.data()), payload.size()}}, std::move(op));
    return record;
  };
  auto write_all = [&] {
    iovec iov[64];
    const int n = q.Gather(iov, 64);
    size_t bytes = 0;
    for (int i = 0; i < n; ++i) bytes += iov[i].iov_len;
    q.Advance(bytes, send);
    CHECK(q.empty());
  };
  auto completed = [&] {
    std::vector<uint64_t> ids;
    pt::Completion c;
    while (cq.Poll(absl::MakeSpan(&c, 1)) == 1) {
      CHECK(c.status.ok());
      CHECK(c.bytes == payload.size());
      ids.push_back(c.wr_id);
    }
    return ids;
  };
  // One operation at a time: the same record goes round, each completion with its own wr_id.
  const tcp::OutOp* first = post(1);
  write_all();
  CHECK(send.spare_ops() == 1);
  for (uint64_t id = 2; id <= 5; ++id) {
    CHECK(post(id) == first);
    CHECK(send.spare_ops() == 0);
    write_all();
    CHECK(send.spare_ops() == 1);
  }
  CHECK(completed() == std::vector<uint64_t>{1, 2, 3, 4, 5});
  // 20 in flight: 19 new records; when they complete only kSpareOps are kept.
  std::vector<uint64_t> ids;
  for (uint64_t id = 100; id < 120; ++id) {
    post(id);
    ids.push_back(id);
  }
  CHECK(send.spare_ops() == 0);
  write_all();
  CHECK(send.idle());
  CHECK(send.spare_ops() == tcp::SendState::kSpareOps);
  CHECK(completed() == ids);
  // A record that someone else still holds is not reused.
  tcp::OutOp fields;
  fields.wr_id = 7;
  fields.bytes = payload.size();
  std::shared_ptr<tcp::OutOp> held = send.NewOp(std::move(fields));
  REQUIRE(send.Start(held, h).size() == 1);
  q.Push(h, {{const_cast<uint8_t*>(payload.data()), payload.size()}}, held);
  write_all();
  CHECK(held->written);
  CHECK(send.spare_ops() == tcp::SendState::kSpareOps - 1);
  CHECK(completed() == std::vector<uint64_t>{7});
  CHECK(post(8) != held.get());
}

TEST_CASE("tcp frame queue: frames leave in order while it never drains, and after it did",
          "[tcp]") {
  // Push and write 1000 messages of distinct payloads keeping about 100 queued (the queue
  // never drains), then drain and refill; every byte must come out in posting order and every
  // send complete, in order.
  pt::CompletionQueue cq;
  tcp::SendState send(&cq, 3, 1, size_t{1} << 20);
  tcp::FrameQueue q;
  std::vector<Bytes> payloads;
  for (int i = 0; i < 1000; ++i) payloads.push_back(Pattern(5 + i % 7, static_cast<uint8_t>(i)));
  Bytes expected, written;
  size_t pushed = 0;
  auto push = [&] {
    auto op = std::make_shared<tcp::OutOp>();
    op->wr_id = pushed;
    op->bytes = payloads[pushed].size();
    const tcp::FrameHeader h = Header(tcp::FrameType::kMessage, op->bytes);
    REQUIRE(send.Start(op, h).size() == 1);
    q.Push(h, {{payloads[pushed].data(), payloads[pushed].size()}}, op);
    Append(expected, h, payloads[pushed]);
    ++pushed;
  };
  auto write_some = [&](size_t most) {  // what a socket taking `most` bytes would take
    iovec iov[16];
    const int n = q.Gather(iov, 16);
    size_t took = 0;
    for (int i = 0; i < n && took < most; ++i) {
      const size_t len = std::min(iov[i].iov_len, most - took);
      const auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
      written.insert(written.end(), p, p + len);
      took += len;
    }
    q.Advance(took, send);
  };
  while (pushed < 100) push();
  while (pushed < 600) {  // never drains: one frame in, about one out
    push();
    write_some(38);
    CHECK(q.size() >= 90);
  }
  while (!q.empty()) write_some(1000);
  while (pushed < 1000) {
    push();
    write_some(7);
  }
  while (!q.empty()) write_some(100);
  CHECK(written == expected);
  for (uint64_t i = 0; i < 1000; ++i) {
    pt::Completion c;
    REQUIRE(cq.Poll(absl::MakeSpan(&c, 1)) == 1);
    CHECK(c.wr_id == i);
  }
}

TEST_CASE("tcp receive state: malformed frames end the connection with their exact error",
          "[tcp]") {
  using tcp::FrameType;
  const std::string peer = kPeer;
  struct Case {
    const char* name;
    size_t sockets;
    std::vector<std::pair<size_t, Bytes>> feeds;  // socket, bytes
    std::string error;
    absl::StatusCode code = absl::StatusCode::kDataLoss;
    bool delivered = false;  // the posted receive got a message before the error
  };
  auto frame = [](const tcp::FrameHeader& h, Bytes payload = {}) {
    Bytes s;
    Append(s, h, payload);
    return s;
  };
  Bytes bad_check = frame(Header(FrameType::kMessage, 1));
  bad_check[2] ^= 0xff;
  Bytes unknown_type = frame(Header(FrameType::kMessage));
  unknown_type[0] = 9;
  std::vector<Case> cases = {
      {"bad check word",
       1,
       {{0, bad_check}},
       "tcp peer " + peer + " sent a malformed frame: bad check word"},
      {"unknown type",
       1,
       {{0, unknown_type}},
       "tcp peer " + peer + " sent a malformed frame: unknown type 9"},
      {"length over max_message_bytes",
       1,
       {{0, frame(Header(FrameType::kMessage, 4096))}},
       "tcp peer " + peer + " sent a malformed frame: length 4096 exceeds the limit of 1024 bytes"},
      {"write to an unknown region",
       1,
       {{0, frame(Header(FrameType::kWrite, 1, 8, 0), {1})}},
       "tcp peer " + peer + ": one-sided write to unknown region id 8 (not registered here)"},
      {"ack for writes never sent",
       1,
       {{0, frame(Header(FrameType::kWriteAck, 0, 1))}},
       "tcp peer " + peer + " sent a malformed ack for writes never sent"},
      {"stripe part on the control socket",
       2,
       {{0, frame(Header(FrameType::kStripePart, 1, 0, 0), {1})}},
       "tcp peer " + peer + " sent a malformed stripe part on the control socket"},
      {"stripe part out of order",
       2,
       {{1, frame(Header(FrameType::kStripePart, 1, 1, 1), {1})}},
       "tcp peer " + peer + " sent a malformed stripe part out of order"},
      {"stripe part with a bad range",
       2,
       {{1, frame(Header(FrameType::kStripePart, 2, 0, 1), {1, 2})},
        {0, frame(Header(FrameType::kStripeHead, 4), {1, 2})}},
       "tcp peer " + peer + " sent a stripe part with a bad range"},
      {"duplicate stripe part (for a finished op)",
       2,
       {{0, frame(Header(FrameType::kStripeHead, 2), {1})},
        {1, frame(Header(FrameType::kStripePart, 1, 0, 1), {2})},
        {1, frame(Header(FrameType::kStripePart, 1, 0, 1), {2})}},
       "tcp peer " + peer + " sent a malformed stripe part out of order",
       absl::StatusCode::kDataLoss,
       /*delivered=*/true},
      {"stripe head on a single socket",
       1,
       {{0, frame(Header(FrameType::kStripeHead, 4))}},
       "tcp peer " + peer + " sent a malformed striped frame on a single-socket connection"},
      {"operation head on a data socket",
       2,
       {{1, frame(Header(FrameType::kMessage, 1), {1})}},
       "tcp peer " + peer + " sent a malformed frame: operation head on a data socket"},
      {"message longer than its receive",
       1,
       {{0, frame(Header(FrameType::kMessage, 20), Bytes(20, 1))}},
       "tcp: message of 20 bytes from " + peer +
           " is longer than the posted receive of 8 bytes (wr_id 1); the connection is closed",
       absl::StatusCode::kResourceExhausted},
      {"the peer's deliberate close",
       1,
       {{0, frame(Header(FrameType::kClose))}},
       "tcp peer " + peer + " closed the connection",
       absl::StatusCode::kAborted},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    Harness h(c.sockets, size_t{1} << 20, /*max_message_bytes=*/1024);
    Bytes recv(8, 0);
    REQUIRE(h.rx.PostRecv({recv.data(), recv.size()}, 1).ok());
    for (const auto& [socket, bytes] : c.feeds) h.Feed(socket, bytes);
    CHECK(ErrorOf(h) == c.error);
    CHECK(h.error.code() == c.code);
    // The state stays failed: more bytes get the same error, never a crash.
    absl::StatusOr<tcp::ReceiveState::Consumed> again = h.rx.Consume(0, Bytes(40, 0));
    CHECK(again.status() == h.error);
    CHECK(h.rx.PayloadWindow(0).empty());
    h.rx.Fail(h.error);
    // The posted receive completes exactly once: with the message, or with the error.
    const std::vector<pt::Completion> done = h.Completions();
    REQUIRE(done.size() == 1);
    CHECK(done[0].wr_id == 1);
    CHECK(done[0].status == (c.delivered ? absl::OkStatus() : h.error));
  }
}

TEST_CASE("tcp receive state: a message over the cap on held bytes pauses until room", "[tcp]") {
  // The cap holds one 600-byte message (plus its overhead), not two.
  Harness h(1, /*held_cap=*/1000);
  Bytes stream;
  Append(stream, Header(tcp::FrameType::kMessage, 600), Pattern(600, 1));
  Append(stream, Header(tcp::FrameType::kMessage, 600), Pattern(600, 2));
  const std::vector<Event> events = h.Feed(0, stream);
  REQUIRE(h.error.ok());
  CHECK(events == std::vector<Event>{Event::kPaused});
  CHECK(h.rx.paused());
  CHECK(h.rx.stalled(0));
  CHECK(h.pending[0].size() == 600);  // the second header was taken, not its payload
  CHECK_FALSE(h.rx.TakeRoomFreed());
  // Still no room: Readmit pauses again.
  absl::StatusOr<Event> again = h.rx.Readmit();
  REQUIRE(again.ok());
  CHECK(*again == Event::kPaused);
  Bytes first(600, 0), second(600, 0);
  REQUIRE(h.rx.PostRecv({first.data(), first.size()}, 1).ok());
  CHECK(h.rx.TakeRoomFreed());  // the held message was delivered
  absl::StatusOr<Event> readmitted = h.rx.Readmit();
  REQUIRE(readmitted.ok());
  CHECK(*readmitted == Event::kNone);
  CHECK_FALSE(h.rx.paused());
  h.Feed(0, {});
  REQUIRE(h.error.ok());
  REQUIRE(h.rx.PostRecv({second.data(), second.size()}, 2).ok());
  const std::vector<pt::Completion> c = h.Completions();
  REQUIRE(c.size() == 2);
  CHECK(c[0].wr_id == 1);
  CHECK(c[1].wr_id == 2);
  CHECK(first == Pattern(600, 1));
  CHECK(second == Pattern(600, 2));
}

TEST_CASE("tcp receive state: on failure whole messages stay, partial ones are dropped", "[tcp]") {
  Harness h(1);
  Bytes stream;
  Append(stream, Header(tcp::FrameType::kMessage, 3), {1, 2, 3});
  Append(stream, Header(tcp::FrameType::kMessage, 10), {4, 5});  // cut short
  h.Feed(0, stream);
  REQUIRE(h.error.ok());
  CHECK(h.rx.mid_frame(0));
  const absl::Status why = absl::UnavailableError("tcp peer went away");
  h.rx.Fail(why);
  CHECK_FALSE(h.rx.mid_frame(0));
  Bytes got(16, 0);
  REQUIRE(h.rx.PostRecv({got.data(), got.size()}, 1).ok());  // the whole message
  CHECK(h.rx.PostRecv({got.data(), got.size()}, 2) == why);  // nothing more
  const std::vector<pt::Completion> c = h.Completions();
  REQUIRE(c.size() == 1);
  CHECK(c[0].wr_id == 1);
  CHECK(c[0].bytes == 3);
  CHECK(c[0].status.ok());
  CHECK(h.rx.Consume(0, Bytes(4, 0)).status() == why);
}
