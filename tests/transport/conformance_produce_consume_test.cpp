// Produced sends and consumed receives (Connection::PostSendProduced, PostRecvConsumed), checked
// for every backend and progress mode: interoperable with ordinary messages, every byte once in
// order, in bounded pieces, and errors that fail the operation and the connection, never a hang
// or a partial message delivered as whole.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "conformance_support.hpp"
#include "plexus/transport/device.hpp"

namespace pt = plexus::transport;
using namespace plexus::transport::conformance;  // NOLINT

namespace {

// What a producer or consumer saw: the offsets must be contiguous from 0, each call non-empty
// and at most kMaxProduceConsumeBytes.
struct Tracker {
  std::mutex mu;
  size_t next = 0;
  size_t calls = 0;
  size_t max_piece = 0;
  bool in_order = true;

  void Saw(size_t offset, size_t n) {
    std::lock_guard<std::mutex> lock(mu);
    if (offset != next || n == 0) in_order = false;
    next = offset + n;
    ++calls;
    max_piece = std::max(max_piece, n);
  }
  void Check(size_t length) {
    std::lock_guard<std::mutex> lock(mu);
    CHECK(in_order);
    CHECK(next == length);
    CHECK(max_piece <= pt::kMaxProduceConsumeBytes);
    if (length == 0) CHECK(calls == 0);
  }
};

// Produces `src`; fails (DataLoss) the call that reaches `fail_at`.
pt::Producer ProduceFrom(const std::vector<uint8_t>* src, std::shared_ptr<Tracker> t,
                         std::optional<size_t> fail_at = std::nullopt) {
  return [src, t, fail_at](size_t offset, absl::Span<uint8_t> out) -> absl::Status {
    t->Saw(offset, out.size());
    if (fail_at && offset + out.size() > *fail_at) {
      return absl::DataLossError("the test's producer gave up");
    }
    std::memcpy(out.data(), src->data() + offset, out.size());
    return absl::OkStatus();
  };
}

// Consumes into `dst` (sized by the caller); fails (DataLoss) the call that reaches `fail_at`.
pt::Consumer ConsumeInto(std::vector<uint8_t>* dst, std::shared_ptr<Tracker> t,
                         std::optional<size_t> fail_at = std::nullopt) {
  return [dst, t, fail_at](size_t offset, absl::Span<const uint8_t> in) -> absl::Status {
    t->Saw(offset, in.size());
    if (fail_at && offset + in.size() > *fail_at) {
      return absl::DataLossError("the test's consumer gave up");
    }
    if (offset + in.size() > dst->size()) return absl::OutOfRangeError("beyond the message");
    std::memcpy(dst->data() + offset, in.data(), in.size());
    return absl::OkStatus();
  };
}

}  // namespace

TEST_CASE("produced sends and consumed receives interoperate with ordinary messages",
          "[conformance][produce]") {
  const Config config = GENERATE(from_range(Configs()));
  const size_t size = GENERATE(size_t{0}, size_t{1}, size_t{4095}, (size_t{1} << 20) + 7);
  SECTION(config.name) {
    INFO("message size " << size);
    Pair p = MakePair(config);
    // 0: ordinary -> consumed, 1: produced -> ordinary, 2: produced -> consumed, 3: ordinary.
    std::vector<std::vector<uint8_t>> sent;
    for (uint32_t i = 0; i < 4; ++i) sent.push_back(Pattern(i == 3 ? 100 : size, 7 + i));
    std::vector<std::vector<uint8_t>> got(4, std::vector<uint8_t>(size + 100));
    std::vector<std::shared_ptr<Tracker>> produced(4), consumed(4);
    for (auto& t : produced) t = std::make_shared<Tracker>();
    for (auto& t : consumed) t = std::make_shared<Tracker>();
    const auto post_recv = [&](int i) {
      if (i == 0 || i == 2) {
        REQUIRE(p.b->PostRecvConsumed(got[i].size(), ConsumeInto(&got[i], consumed[i]), i).ok());
      } else {
        REQUIRE(p.b->PostRecv({got[i].data(), got[i].size()}, i).ok());
      }
    };
    // Receives 0 and 1 are posted before the sends (streamed), 2 and 3 after (held first).
    post_recv(0);
    post_recv(1);
    REQUIRE(p.a->PostSend(pt::ConstBuffer{sent[0].data(), sent[0].size()}, 100).ok());
    REQUIRE(p.a->PostSendProduced(size, ProduceFrom(&sent[1], produced[1]), 101).ok());
    REQUIRE(p.a->PostSendProduced(size, ProduceFrom(&sent[2], produced[2]), 102).ok());
    REQUIRE(p.a->PostSend(pt::ConstBuffer{sent[3].data(), sent[3].size()}, 103).ok());
    post_recv(2);
    post_recv(3);
    std::vector<pt::Completion> ca, cb;
    Collect(p, 4, 4, &ca, &cb);
    for (int i = 0; i < 4; ++i) {
      INFO("message " << i);
      REQUIRE(ca[i].status.ok());
      CHECK(ca[i].opcode == pt::Opcode::kSend);
      CHECK(ca[i].wr_id == 100u + i);
      CHECK(ca[i].bytes == sent[i].size());
      REQUIRE(cb[i].status.ok());
      CHECK(cb[i].opcode == pt::Opcode::kRecv);
      REQUIRE(cb[i].wr_id == static_cast<uint64_t>(i));
      REQUIRE(cb[i].bytes == sent[i].size());
      REQUIRE(std::memcmp(got[i].data(), sent[i].data(), sent[i].size()) == 0);
    }
    produced[1]->Check(size);
    produced[2]->Check(size);
    consumed[0]->Check(size);
    consumed[2]->Check(size);
  }
}

// 64 MiB: far above shm's threshold for cross-memory attach, which a produced send never uses
// and an ordinary send into a consumed receive does (pulled a chunk at a time).
TEST_CASE("64 MiB produced and consumed messages stay in bounded pieces",
          "[conformance][produce]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    constexpr size_t kSize = size_t{64} << 20;
    const std::vector<uint8_t> sent = Pattern(kSize, 64);
    std::vector<uint8_t> got(kSize), got_ordinary(kSize);
    auto produced = std::make_shared<Tracker>();
    auto consumed = std::make_shared<Tracker>();
    auto consumed_ordinary = std::make_shared<Tracker>();
    REQUIRE(p.b->PostRecvConsumed(kSize, ConsumeInto(&got, consumed), 1).ok());
    REQUIRE(p.b->PostRecvConsumed(kSize, ConsumeInto(&got_ordinary, consumed_ordinary), 2).ok());
    REQUIRE(p.a->PostSendProduced(kSize, ProduceFrom(&sent, produced), 10).ok());
    REQUIRE(p.a->PostSend(pt::ConstBuffer{sent.data(), sent.size()}, 11).ok());
    std::vector<pt::Completion> ca, cb;
    Collect(p, 2, 2, &ca, &cb);
    for (int i = 0; i < 2; ++i) {
      REQUIRE(ca[i].status.ok());
      CHECK(ca[i].wr_id == 10u + i);
      REQUIRE(cb[i].status.ok());
      CHECK(cb[i].wr_id == 1u + i);
      CHECK(cb[i].bytes == kSize);
    }
    CHECK(got == sent);
    CHECK(got_ordinary == sent);
    produced->Check(kSize);
    consumed->Check(kSize);
    consumed_ordinary->Check(kSize);
  }
}

TEST_CASE("a producer error fails the send and the connection, never delivers part of it",
          "[conformance][produce]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    constexpr size_t kSize = (size_t{1} << 20) + 7;
    const std::vector<uint8_t> sent = Pattern(kSize, 3);
    std::vector<uint8_t> got(kSize);
    auto produced = std::make_shared<Tracker>();
    REQUIRE(p.b->PostRecv({got.data(), got.size()}, 1).ok());
    REQUIRE(p.a->PostSendProduced(kSize, ProduceFrom(&sent, produced, 300 << 10), 2).ok());
    std::vector<pt::Completion> ca, cb;
    Collect(p, 1, 1, &ca, &cb);
    INFO("send: " << ca[0].status.ToString() << "; receive: " << cb[0].status.ToString());
    CHECK(ca[0].status.code() == absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(ca[0].status.message(), "producing bytes ["));
    CHECK(absl::StrContains(ca[0].status.message(), "the test's producer gave up"));
    CHECK_FALSE(cb[0].status.ok());
    CHECK(cb[0].bytes == 0);
    CHECK_FALSE(p.a->status().ok());
    CHECK_FALSE(p.b->status().ok());  // the peer sees the connection fail
  }
}

TEST_CASE("a consumer error fails the receive and the connection", "[conformance][produce]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    constexpr size_t kSize = (size_t{1} << 20) + 7;
    const std::vector<uint8_t> sent = Pattern(kSize, 4);
    std::vector<uint8_t> got(kSize);
    auto consumed = std::make_shared<Tracker>();
    REQUIRE(p.b->PostRecvConsumed(kSize, ConsumeInto(&got, consumed, 300 << 10), 1).ok());
    REQUIRE(p.a->PostSend(pt::ConstBuffer{sent.data(), sent.size()}, 2).ok());
    std::vector<pt::Completion> ca, cb;
    Collect(p, 1, 1, &ca, &cb);
    INFO("receive: " << cb[0].status.ToString());
    CHECK(cb[0].status.code() == absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(cb[0].status.message(), "consuming bytes ["));
    CHECK(cb[0].bytes == 0);
    CHECK_FALSE(p.b->status().ok());
  }
}

TEST_CASE("a consumed receive shorter than the message fails it", "[conformance][produce]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    const std::vector<uint8_t> sent = Pattern(5000, 5);
    std::vector<uint8_t> got(4000);
    auto consumed = std::make_shared<Tracker>();
    REQUIRE(p.b->PostRecvConsumed(got.size(), ConsumeInto(&got, consumed), 1).ok());
    REQUIRE(p.a->PostSend(pt::ConstBuffer{sent.data(), sent.size()}, 2).ok());
    std::vector<pt::Completion> ca, cb;
    Collect(p, 0, 1, &ca, &cb);
    CHECK(cb[0].status.code() == absl::StatusCode::kResourceExhausted);
    CHECK(consumed->calls == 0);
  }
}
