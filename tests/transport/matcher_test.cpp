// The receive matcher every backend shares (libs/transport/src/matcher.*), without any wire:
// posted-receive and held-message FIFOs, "too long", the caps on held bytes and what a failure
// keeps.
#include <stdlib.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "matcher.hpp"

namespace pt = plexus::transport;
using plexus::transport::HoldBudget;
using plexus::transport::kHeldMessageOverhead;
using plexus::transport::Matcher;
using plexus::transport::MatcherConfig;

namespace {

struct Done {
  uint64_t wr_id;
  absl::Status status;
  size_t bytes;
};

struct Fixture {
  explicit Fixture(size_t cap = 1 << 20, std::shared_ptr<HoldBudget> device = nullptr,
                   bool eager = true, size_t spare = 0, bool stream_consumers = true)
      : matcher(MatcherConfig{.backend = "test",
                              .peer = "peer-7",
                              .connection_cap = cap,
                              .device = std::move(device),
                              .max_spare_bytes = spare,
                              .deliver_eagerly = eager,
                              .stream_consumers = stream_consumers},
                [this](uint64_t wr_id, absl::Status status, size_t bytes) {
                  done.push_back({wr_id, std::move(status), bytes});
                }) {}

  // Admits a message of `bytes` bytes of value `fill` and places it whole.
  Matcher::Admission Arrive(size_t bytes, uint8_t fill) {
    Matcher::Slot slot;
    absl::StatusOr<Matcher::Admission> a = matcher.Admit(bytes, &slot);
    REQUIRE(a.ok());
    if (*a == Matcher::Admission::kAdmitted) {
      if (bytes > 0) std::memset(slot.dest, fill, bytes);
      REQUIRE(matcher.Placed(slot).ok());
    }
    return *a;
  }

  std::vector<Done> done;
  Matcher matcher;
};

pt::MutableBuffer Buf(std::vector<uint8_t>& v) { return {v.data(), v.size()}; }

// A consumer that appends what it is given to `out`, checking that the offsets are contiguous
// and the pieces bounded; it fails (DataLoss) the call that reaches `fail_at`.
struct Sink {
  std::vector<uint8_t> out;
  size_t calls = 0;
  size_t max_piece = 0;
  bool in_order = true;
  size_t fail_at = SIZE_MAX;

  pt::Consumer Consumer() {
    return [this](size_t offset, absl::Span<const uint8_t> in) -> absl::Status {
      ++calls;
      max_piece = std::max(max_piece, in.size());
      if (offset != out.size() || in.empty()) in_order = false;
      if (offset + in.size() > fail_at) return absl::DataLossError("sink is full");
      out.insert(out.end(), in.begin(), in.end());
      return absl::OkStatus();
    };
  }
};

std::vector<uint8_t> Bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + i / 251);
  return v;
}

}  // namespace

TEST_CASE("matcher: a posted receive takes the next message directly", "[matcher]") {
  Fixture f;
  std::vector<uint8_t> out(100);
  REQUIRE(f.matcher.PostRecv(Buf(out), 5).ok());
  Matcher::Slot slot;
  auto a = f.matcher.Admit(40, &slot);
  REQUIRE(a.ok());
  CHECK(*a == Matcher::Admission::kAdmitted);
  CHECK_FALSE(slot.held);
  CHECK(slot.dest == out.data());
  CHECK(f.done.empty());
  REQUIRE(f.matcher.Placed(slot).ok());
  REQUIRE(f.done.size() == 1);
  CHECK(f.done[0].wr_id == 5);
  CHECK(f.done[0].bytes == 40);
  CHECK(f.matcher.held_bytes() == 0);
}

TEST_CASE("matcher: early messages are held and delivered in order", "[matcher]") {
  Fixture f;
  for (uint8_t i = 0; i < 5; ++i) REQUIRE(f.Arrive(10 + i, i + 1) == Matcher::Admission::kAdmitted);
  CHECK(f.matcher.held_messages() == 5);
  CHECK(f.matcher.held_bytes() == (10 + 11 + 12 + 13 + 14) + 5 * kHeldMessageOverhead);
  std::vector<std::vector<uint8_t>> out(5, std::vector<uint8_t>(64));
  for (uint64_t i = 0; i < 5; ++i) REQUIRE(f.matcher.PostRecv(Buf(out[i]), i).ok());
  REQUIRE(f.done.size() == 5);
  for (uint64_t i = 0; i < 5; ++i) {
    CHECK(f.done[i].wr_id == i);
    CHECK(f.done[i].bytes == 10 + i);
    CHECK(out[i][0] == i + 1);
    CHECK(out[i][9 + i] == i + 1);
    CHECK(out[i][10 + i] == 0);
  }
  CHECK(f.matcher.held_bytes() == 0);
  CHECK(f.matcher.held_messages() == 0);
}

TEST_CASE("matcher: a receive claims a held message still arriving", "[matcher]") {
  Fixture f;
  Matcher::Slot slot;
  REQUIRE(f.matcher.Admit(8, &slot).ok());
  REQUIRE(slot.held);
  std::vector<uint8_t> out(8);
  REQUIRE(f.matcher.PostRecv(Buf(out), 1).ok());
  CHECK(f.done.empty());  // not whole yet
  // A second message arrives while the receive posted after it waits: it is held too, so that
  // the order stays.
  std::vector<uint8_t> out2(8);
  REQUIRE(f.matcher.PostRecv(Buf(out2), 2).ok());
  Matcher::Slot direct;
  REQUIRE(f.matcher.Admit(3, &direct).ok());
  CHECK_FALSE(direct.held);  // every held message has a receive: the next one goes direct
  CHECK(direct.wr_id == 2);
  std::memset(slot.dest, 0x5a, 8);
  REQUIRE(f.matcher.Placed(slot).ok());
  REQUIRE(f.matcher.Placed(direct).ok());
  REQUIRE(f.done.size() == 2);
  CHECK(f.done[0].wr_id == 1);
  CHECK(out[7] == 0x5a);
  CHECK(f.done[1].wr_id == 2);
}

TEST_CASE("matcher: not eager, held messages wait for DeliverOldest", "[matcher]") {
  Fixture f(1 << 20, nullptr, /*eager=*/false);
  REQUIRE(f.Arrive(4, 9) == Matcher::Admission::kAdmitted);
  std::vector<uint8_t> out(4);
  REQUIRE(f.matcher.PostRecv(Buf(out), 3).ok());
  CHECK(f.done.empty());
  CHECK(f.matcher.DeliverOldest());
  REQUIRE(f.done.size() == 1);
  CHECK(out[3] == 9);
  CHECK_FALSE(f.matcher.DeliverOldest());
}

TEST_CASE("matcher: a message longer than its receive fails it, one wording", "[matcher]") {
  SECTION("the receive was posted first") {
    Fixture f;
    std::vector<uint8_t> out(10);
    REQUIRE(f.matcher.PostRecv(Buf(out), 4).ok());
    Matcher::Slot slot;
    auto a = f.matcher.Admit(11, &slot);
    REQUIRE(absl::IsResourceExhausted(a.status()));
    CHECK(a.status().message() ==
          "test: message of 11 bytes from peer-7 is longer than the posted receive of 10 bytes "
          "(wr_id 4); the connection is closed");
    REQUIRE(f.done.size() == 1);
    CHECK(f.done[0].wr_id == 4);
    CHECK(f.done[0].status == a.status());
  }
  SECTION("the message was held first") {
    Fixture f;
    REQUIRE(f.Arrive(11, 1) == Matcher::Admission::kAdmitted);
    std::vector<uint8_t> out(10);
    const absl::Status s = f.matcher.PostRecv(Buf(out), 4);
    REQUIRE(absl::IsResourceExhausted(s));
    CHECK(s.message() ==
          "test: message of 11 bytes from peer-7 is longer than the posted receive of 10 bytes "
          "(wr_id 4); the connection is closed");
    REQUIRE(f.done.size() == 1);
    CHECK(f.done[0].status == s);
    CHECK(f.matcher.held_messages() == 0);  // consumed by the failed receive
  }
}

TEST_CASE("matcher: the connection cap makes the backend wait, then admits", "[matcher]") {
  const size_t cap = 4 * (1000 + kHeldMessageOverhead);
  Fixture f(cap);
  for (int i = 0; i < 4; ++i) REQUIRE(f.Arrive(1000, 1) == Matcher::Admission::kAdmitted);
  CHECK(f.matcher.held_bytes() == cap);
  CHECK(f.Arrive(1000, 1) == Matcher::Admission::kWait);
  CHECK(f.Arrive(1, 1) == Matcher::Admission::kWait);
  CHECK(f.matcher.held_messages() == 4);
  std::vector<uint8_t> out(1000);
  REQUIRE(f.matcher.PostRecv(Buf(out), 0).ok());  // delivers one: room for one more
  CHECK(f.Arrive(1000, 2) == Matcher::Admission::kAdmitted);
  CHECK(f.matcher.held_bytes() == cap);
}

TEST_CASE("matcher: a flood of empty messages is bounded too", "[matcher]") {
  Fixture f(100 * kHeldMessageOverhead);
  int admitted = 0;
  while (f.Arrive(0, 0) == Matcher::Admission::kAdmitted) ++admitted;
  CHECK(admitted == 100);
}

TEST_CASE("matcher: a message larger than a cap fails before any allocation", "[matcher]") {
  auto device = std::make_shared<HoldBudget>(size_t{8} << 20);
  SECTION("connection cap") {
    Fixture f(size_t{4} << 20, device);
    Matcher::Slot slot;
    auto a = f.matcher.Admit(size_t{16} << 30, &slot);  // would not be allocatable anyway
    REQUIRE(absl::IsResourceExhausted(a.status()));
    CHECK(a.status().message() ==
          "test: peer peer-7 sent a message of 17179869184 bytes while no receive is posted; "
          "holding it would exceed the connection's cap of 4194304 bytes for held messages "
          "(raise DeviceOptions::max_held_bytes_per_connection or "
          "PLEXUS_MAX_HELD_BYTES_PER_CONNECTION, or post the receive before the peer sends)");
    CHECK(device->used() == 0);
  }
  SECTION("device cap") {
    Fixture f(size_t{64} << 20, device);
    Matcher::Slot slot;
    auto a = f.matcher.Admit(size_t{9} << 20, &slot);
    REQUIRE(absl::IsResourceExhausted(a.status()));
    CHECK(std::string(a.status().message()).find("device's cap of 8388608 bytes") !=
          std::string::npos);
    CHECK(std::string(a.status().message()).find("max_held_bytes_per_device") != std::string::npos);
  }
  SECTION("with a receive posted the caps do not apply: it goes direct") {
    Fixture f(size_t{4} << 20, device);
    std::vector<uint8_t> out(size_t{5} << 20);
    REQUIRE(f.matcher.PostRecv(Buf(out), 1).ok());
    Matcher::Slot slot;
    auto a = f.matcher.Admit(out.size(), &slot);
    REQUIRE(a.ok());
    CHECK_FALSE(slot.held);
  }
}

TEST_CASE("matcher: connections share the device cap", "[matcher]") {
  const size_t unit = 1000 + kHeldMessageOverhead;
  auto device = std::make_shared<HoldBudget>(3 * unit);
  Fixture a(10 * unit, device), b(10 * unit, device);
  REQUIRE(a.Arrive(1000, 1) == Matcher::Admission::kAdmitted);
  REQUIRE(a.Arrive(1000, 1) == Matcher::Admission::kAdmitted);
  REQUIRE(b.Arrive(1000, 1) == Matcher::Admission::kAdmitted);
  CHECK(device->used() == 3 * unit);
  CHECK(b.Arrive(1000, 1) == Matcher::Admission::kWait);
  std::vector<uint8_t> out(1000);
  REQUIRE(a.matcher.PostRecv(Buf(out), 0).ok());
  CHECK(device->used() == 2 * unit);
  CHECK(b.Arrive(1000, 1) == Matcher::Admission::kAdmitted);
  {
    Fixture c(10 * unit, device);  // a connection that goes away returns what it held
    CHECK(c.Arrive(1, 1) == Matcher::Admission::kWait);
  }
  a.matcher.Fail(absl::CancelledError("closed"), /*keep_whole=*/false);
  CHECK(device->used() == 2 * unit);  // b's two
}

TEST_CASE("matcher: spare buffers are reused and count against the cap", "[matcher]") {
  const size_t cap = 3 * (4096 + kHeldMessageOverhead);
  Fixture f(cap, nullptr, /*eager=*/true, /*spare=*/8192);
  std::vector<uint8_t> out(4096);
  REQUIRE(f.Arrive(4096, 1) == Matcher::Admission::kAdmitted);
  REQUIRE(f.matcher.PostRecv(Buf(out), 0).ok());
  CHECK(f.matcher.held_bytes() == 4096);  // the spare
  // Three messages fit (the first one reuses the spare), then nothing.
  for (int i = 0; i < 3; ++i) REQUIRE(f.Arrive(4096, 2) == Matcher::Admission::kAdmitted);
  CHECK(f.matcher.held_bytes() == cap);
  CHECK(f.Arrive(1, 1) == Matcher::Admission::kWait);
}

TEST_CASE("matcher: a failure keeps whole messages deliverable, drops the rest", "[matcher]") {
  Fixture f;
  REQUIRE(f.Arrive(5, 1) == Matcher::Admission::kAdmitted);
  REQUIRE(f.Arrive(6, 2) == Matcher::Admission::kAdmitted);
  Matcher::Slot partial;
  REQUIRE(f.matcher.Admit(7, &partial).ok());  // never completes
  const absl::Status why = absl::UnavailableError("peer died");
  f.matcher.Fail(why, /*keep_whole=*/true);
  CHECK(f.done.empty());
  CHECK(f.matcher.held_messages() == 2);
  CHECK(f.matcher.held_bytes() == 11 + 2 * kHeldMessageOverhead);
  std::vector<uint8_t> out(16);
  REQUIRE(f.matcher.PostRecv(Buf(out), 1).ok());
  REQUIRE(f.matcher.PostRecv(Buf(out), 2).ok());
  CHECK(f.matcher.PostRecv(Buf(out), 3) == why);  // nothing left: the connection's error
  REQUIRE(f.done.size() == 2);
  CHECK(f.done[1].bytes == 6);
  CHECK(out[5] == 2);
  CHECK(f.matcher.held_bytes() == 0);
}

TEST_CASE("matcher: a failure completes waiting receives in posting order", "[matcher]") {
  Fixture f;
  Matcher::Slot partial;
  REQUIRE(f.matcher.Admit(7, &partial).ok());
  std::vector<uint8_t> out(16);
  REQUIRE(f.matcher.PostRecv(Buf(out), 1).ok());  // claims the partial message
  REQUIRE(f.matcher.PostRecv(Buf(out), 2).ok());  // waits
  f.matcher.Fail(absl::CancelledError("closed locally"), /*keep_whole=*/false);
  REQUIRE(f.done.size() == 2);
  CHECK(f.done[0].wr_id == 1);
  CHECK(absl::IsCancelled(f.done[0].status));
  CHECK(f.done[1].wr_id == 2);
  CHECK(f.matcher.held_bytes() == 0);
}

TEST_CASE("matcher: caps come from the option, else the environment, else the default",
          "[matcher]") {
  pt::DeviceOptions o;
  ::unsetenv("PLEXUS_MAX_HELD_BYTES_PER_CONNECTION");
  ::unsetenv("PLEXUS_MAX_HELD_BYTES_PER_DEVICE");
  auto limits = plexus::transport::internal::ResolveHoldLimits(o);
  REQUIRE(limits.ok());
  CHECK(limits->per_connection == size_t{256} << 20);
  CHECK(limits->per_device == size_t{1} << 30);
  ::setenv("PLEXUS_MAX_HELD_BYTES_PER_CONNECTION", "64M", 1);
  ::setenv("PLEXUS_MAX_HELD_BYTES_PER_DEVICE", "2G", 1);
  limits = plexus::transport::internal::ResolveHoldLimits(o);
  REQUIRE(limits.ok());
  CHECK(limits->per_connection == size_t{64} << 20);
  CHECK(limits->per_device == size_t{2} << 30);
  o.max_held_bytes_per_connection = 12345;
  limits = plexus::transport::internal::ResolveHoldLimits(o);
  REQUIRE(limits.ok());
  CHECK(limits->per_connection == 12345);
  CHECK(limits->per_device == size_t{2} << 30);
  ::setenv("PLEXUS_MAX_HELD_BYTES_PER_DEVICE", "lots", 1);
  limits = plexus::transport::internal::ResolveHoldLimits(o);
  CHECK(absl::IsInvalidArgument(limits.status()));
  CHECK(std::string(limits.status().message()).find("PLEXUS_MAX_HELD_BYTES_PER_DEVICE") !=
        std::string::npos);
  ::unsetenv("PLEXUS_MAX_HELD_BYTES_PER_CONNECTION");
  ::unsetenv("PLEXUS_MAX_HELD_BYTES_PER_DEVICE");
}

TEST_CASE("matcher: idle spare buffers of one connection never make another one wait",
          "[matcher]") {
  const size_t unit = 4096 + kHeldMessageOverhead;
  auto device = std::make_shared<HoldBudget>(2 * unit);
  Fixture a(4 * unit, device, /*eager=*/true, /*spare=*/2 * 4096);
  Fixture b(4 * unit, device);
  std::vector<uint8_t> out(4096);
  for (int i = 0; i < 2; ++i) {
    REQUIRE(a.Arrive(4096, 1) == Matcher::Admission::kAdmitted);
  }
  CHECK(b.Arrive(4096, 1) == Matcher::Admission::kWait);  // the device is full
  REQUIRE(a.matcher.PostRecv(Buf(out), 0).ok());
  REQUIRE(a.matcher.PostRecv(Buf(out), 1).ok());
  CHECK(a.matcher.held_bytes() == 2 * 4096);  // two spares, in a's own cap only
  CHECK(device->used() == 0);
  CHECK(b.Arrive(4096, 2) == Matcher::Admission::kAdmitted);
  CHECK(b.Arrive(4096, 2) == Matcher::Admission::kAdmitted);
  // a reuses a spare only when the device has room for it again.
  CHECK(a.Arrive(4096, 3) == Matcher::Admission::kWait);
  REQUIRE(b.matcher.PostRecv(Buf(out), 0).ok());
  CHECK(a.Arrive(4096, 3) == Matcher::Admission::kAdmitted);
  CHECK(a.matcher.held_bytes() == 2 * 4096 + kHeldMessageOverhead);
}

TEST_CASE("matcher: a consumed receive streams when the backend does, or takes the held copy",
          "[matcher][consume]") {
  const std::vector<uint8_t> message = Bytes((size_t{1} << 20) + 3);
  SECTION("streaming backend: the slot names the consumer, no buffer") {
    Fixture f(8 << 20);
    Sink sink;
    REQUIRE(f.matcher.PostRecvConsumed(message.size(), sink.Consumer(), 4).ok());
    Matcher::Slot slot;
    REQUIRE(f.matcher.Admit(message.size(), &slot).value() == Matcher::Admission::kAdmitted);
    CHECK_FALSE(slot.held);
    CHECK(slot.dest == nullptr);
    REQUIRE(slot.consumer != nullptr);
    REQUIRE((*slot.consumer)(0, absl::MakeConstSpan(message)).ok());  // the backend's part
    REQUIRE(f.matcher.Placed(slot).ok());
    REQUIRE(f.done.size() == 1);
    CHECK(f.done[0].wr_id == 4);
    CHECK(f.done[0].status.ok());
    CHECK(f.done[0].bytes == message.size());
    CHECK(sink.out == message);
  }
  SECTION("non-streaming backend: held whole, consumed in bounded pieces once placed") {
    Fixture f(8 << 20, nullptr, true, 0, /*stream_consumers=*/false);
    Sink sink;
    REQUIRE(f.matcher.PostRecvConsumed(message.size(), sink.Consumer(), 5).ok());
    Matcher::Slot slot;
    REQUIRE(f.matcher.Admit(message.size(), &slot).value() == Matcher::Admission::kAdmitted);
    CHECK(slot.held);
    REQUIRE(slot.dest != nullptr);
    CHECK_FALSE(f.matcher.has_posted_recv());
    CHECK_FALSE(f.matcher.PeekNext({}).has_value());  // claimed: nothing to peek at
    std::memcpy(slot.dest, message.data(), message.size());
    CHECK(sink.calls == 0);
    REQUIRE(f.matcher.Placed(slot).ok());
    REQUIRE(f.done.size() == 1);
    CHECK(f.done[0].wr_id == 5);
    CHECK(f.done[0].bytes == message.size());
    CHECK(sink.out == message);
    CHECK(sink.in_order);
    CHECK(sink.max_piece <= pt::kMaxProduceConsumeBytes);
    CHECK(sink.calls ==
          (message.size() + pt::kMaxProduceConsumeBytes - 1) / pt::kMaxProduceConsumeBytes);
    CHECK(f.matcher.held_messages() == 0);
  }
  SECTION("a message that arrived first is consumed when the receive is posted") {
    Fixture f(8 << 20);
    Matcher::Slot slot;
    REQUIRE(f.matcher.Admit(message.size(), &slot).value() == Matcher::Admission::kAdmitted);
    std::memcpy(slot.dest, message.data(), message.size());
    REQUIRE(f.matcher.Placed(slot).ok());
    Sink sink;
    REQUIRE(f.matcher.PostRecvConsumed(message.size(), sink.Consumer(), 6).ok());
    REQUIRE(f.done.size() == 1);
    CHECK(f.done[0].status.ok());
    CHECK(sink.out == message);
    CHECK(sink.max_piece <= pt::kMaxProduceConsumeBytes);
  }
  SECTION("an empty message completes without a call") {
    Fixture f(1 << 20, nullptr, true, 0, /*stream_consumers=*/false);
    Sink sink;
    REQUIRE(f.matcher.PostRecvConsumed(0, sink.Consumer(), 7).ok());
    REQUIRE(f.Arrive(0, 0) == Matcher::Admission::kAdmitted);
    REQUIRE(f.done.size() == 1);
    CHECK(f.done[0].status.ok());
    CHECK(sink.calls == 0);
  }
}

TEST_CASE("matcher: a consumer error fails its receive and is reported once",
          "[matcher][consume]") {
  const std::vector<uint8_t> message = Bytes(600 << 10);
  Fixture f(8 << 20);
  Matcher::Slot slot;
  REQUIRE(f.matcher.Admit(message.size(), &slot).value() == Matcher::Admission::kAdmitted);
  std::memcpy(slot.dest, message.data(), message.size());
  REQUIRE(f.matcher.Placed(slot).ok());
  Sink sink;
  sink.fail_at = 300 << 10;
  const absl::Status s = f.matcher.PostRecvConsumed(message.size(), sink.Consumer(), 8);
  CHECK(absl::IsDataLoss(s));
  CHECK(std::string(s.message()).find("consuming bytes [262144, +262144) of a message of 614400") !=
        std::string::npos);
  CHECK(std::string(s.message()).find("sink is full") != std::string::npos);
  REQUIRE(f.done.size() == 1);
  CHECK(f.done[0].wr_id == 8);
  CHECK(f.done[0].status == s);
  CHECK(f.done[0].bytes == 0);
  CHECK(f.matcher.TakeConsumerError().ok());  // returned once, not again
}

TEST_CASE("matcher: a held consumed message cut off by a failure is not consumed",
          "[matcher][consume]") {
  Fixture f(1 << 20, nullptr, true, 0, /*stream_consumers=*/false);
  Sink sink;
  REQUIRE(f.matcher.PostRecvConsumed(4096, sink.Consumer(), 9).ok());
  Matcher::Slot slot;
  REQUIRE(f.matcher.Admit(4096, &slot).value() == Matcher::Admission::kAdmitted);
  f.matcher.Fail(absl::UnavailableError("peer died"), /*keep_whole=*/true);
  REQUIRE(f.done.size() == 1);
  CHECK(absl::IsUnavailable(f.done[0].status));
  CHECK(sink.calls == 0);
  CHECK(f.matcher.held_bytes() == 0);
}

TEST_CASE("matcher: a consumed receive shorter than the message fails it", "[matcher][consume]") {
  Fixture f(1 << 20, nullptr, true, 0, /*stream_consumers=*/false);
  Sink sink;
  REQUIRE(f.matcher.PostRecvConsumed(100, sink.Consumer(), 10).ok());
  Matcher::Slot slot;
  CHECK(absl::IsResourceExhausted(f.matcher.Admit(101, &slot).status()));
  REQUIRE(f.done.size() == 1);
  CHECK(f.done[0].wr_id == 10);
  CHECK(sink.calls == 0);
}

TEST_CASE("matcher: a consumed message a non-streaming backend cannot stage fails with why",
          "[matcher][consume]") {
  Fixture f(64 << 10, nullptr, true, 0, /*stream_consumers=*/false);
  Sink sink;
  REQUIRE(f.matcher.PostRecvConsumed(1 << 20, sink.Consumer(), 11).ok());
  Matcher::Slot slot;
  const absl::Status s = f.matcher.Admit(100 << 10, &slot).status();
  CHECK(absl::IsResourceExhausted(s));
  CHECK(std::string(s.message()).find("for a consumed receive, which this backend stages whole") !=
        std::string::npos);
  CHECK(f.matcher.has_posted_recv());  // still waiting: the connection's failure completes it
  f.matcher.Fail(s, /*keep_whole=*/false);
  REQUIRE(f.done.size() == 1);
  CHECK(f.done[0].wr_id == 11);
  CHECK(f.done[0].status == s);
  CHECK(sink.calls == 0);
}
