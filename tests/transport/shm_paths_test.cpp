// The shm backend's choice of path per message: the ring, or a pull by cross-memory attach
// (a two-way exchange, a lone one-way message, a consumed receive).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"
#include "shm/stats.hpp"
#include "shm_support.hpp"
#include "support/completion.hpp"

namespace pt = plexus::transport;
namespace shm = plexus::transport::internal::shm;
using namespace plexus::transport::shm_test;  // NOLINT: test helpers
using plexus::testing::Next;

TEST_CASE("shm: a mid-size send is pulled by cross-memory attach only in a two-way exchange",
          "[shm]") {
  SetCma(true);  // default thresholds: 2 MiB, and 128 KiB in an exchange
  LocalPair p = MakeLocalPair();
  constexpr size_t kSize = size_t{512} << 10;
  std::vector<uint8_t> src(kSize), got(kSize), back(kSize);
  Fill(src.data(), kSize, 5);
  auto stats = [&] {
    auto s = shm::GetConnectionStats(*p.ca);
    REQUIRE(s.ok());
    return *s;
  };
  if (!stats().peer_can_pull) {
    WARN("cross-memory attach is not permitted here: nothing to check");
    return;
  }
  // Sends `src` from a to b and checks what b got; returns the bytes a sent by cross-memory
  // attach meanwhile.
  auto send = [&](uint64_t wr) {
    const size_t before = stats().cma_bytes_sent;
    std::fill(got.begin(), got.end(), 0);
    REQUIRE(p.cb->PostRecv({got.data(), kSize}, wr).ok());
    REQUIRE(p.ca->PostSend(pt::ConstBuffer{src.data(), kSize}, wr).ok());
    const pt::Completion sent = Next(*p.cqa);
    CHECK(sent.status.ok());
    CHECK(sent.wr_id == wr);
    const pt::Completion c = Next(*p.cqb);
    REQUIRE(c.status.ok());
    CHECK(c.bytes == kSize);
    CHECK(got == src);
    return stats().cma_bytes_sent - before;
  };
  SECTION("one way: through the ring") { CHECK(send(1) == 0); }
  SECTION("a small receive posted by the sender: through the ring") {
    uint8_t ack = 0;
    REQUIRE(p.ca->PostRecv({&ack, 1}, 7).ok());
    CHECK(send(2) == 0);
    const uint8_t one = 1;
    REQUIRE(p.cb->PostSend(pt::ConstBuffer{&one, 1}, 8).ok());
    CHECK(Next(*p.cqb).status.ok());
    const pt::Completion c = Next(*p.cqa);
    CHECK(c.status.ok());
    CHECK(c.wr_id == 7u);
  }
  SECTION("the sender's own receive of the same size posted: pulled") {
    REQUIRE(p.ca->PostRecv({back.data(), kSize}, 9).ok());
    CHECK(send(3) == kSize);
    REQUIRE(p.cb->PostSend(pt::ConstBuffer{got.data(), kSize}, 10).ok());
    CHECK(Next(*p.cqb).status.ok());
    const pt::Completion c = Next(*p.cqa);
    CHECK(c.status.ok());
    CHECK(c.wr_id == 9u);
    CHECK(back == src);
  }
}

TEST_CASE("shm: a lone send is pulled from lone_cma_threshold; sends queued behind it use the ring",
          "[shm]") {
  SetCma(true);
  // Caller-driven devices: nothing moves between the two sends below but the posting thread, so
  // the first is still unacknowledged when the second is posted. (With progress threads the peer
  // could take the first's descriptor and the sender reap its acknowledgement in between, when
  // the posting thread is preempted, and the second would be lone as well.)
  pt::DeviceOptions options = Options(pt::ProgressMode::kCaller);
  options.shm.lone_cma_threshold = size_t{256} << 10;
  LocalPair p = MakeLocalPair(options);
  auto pulled = [&] {
    auto s = shm::GetConnectionStats(*p.ca);
    REQUIRE(s.ok());
    return s->cma_bytes_sent;
  };
  {
    auto s = shm::GetConnectionStats(*p.ca);
    REQUIRE(s.ok());
    if (!s->peer_can_pull) {
      WARN("cross-memory attach is not permitted here: nothing to check");
      return;
    }
  }
  constexpr size_t kBig = size_t{512} << 10, kSmall = size_t{128} << 10;
  std::vector<uint8_t> first(kBig), second(kBig), small(kSmall);
  Fill(first.data(), kBig, 1);
  Fill(second.data(), kBig, 2);
  Fill(small.data(), kSmall, 3);
  std::vector<uint8_t> got1(kBig), got2(kBig), got3(kSmall);
  // Both large sends are posted before the peer posts a receive: the second finds the first
  // unacknowledged, and streams.
  REQUIRE(p.ca->PostSend(pt::ConstBuffer{first.data(), kBig}, 1).ok());
  REQUIRE(p.ca->PostSend(pt::ConstBuffer{second.data(), kBig}, 2).ok());
  REQUIRE(p.cb->PostRecv({got1.data(), kBig}, 11).ok());
  REQUIRE(p.cb->PostRecv({got2.data(), kBig}, 12).ok());
  for (int i = 0; i < 2; ++i) {
    const pt::Completion r = Next(*p.cqb);
    REQUIRE(r.status.ok());
    CHECK(r.bytes == kBig);
    CHECK(Next(*p.cqa).status.ok());
  }
  CHECK(got1 == first);
  CHECK(got2 == second);
  CHECK(pulled() == kBig);
  // Lone again, but below the threshold: the ring.
  REQUIRE(p.cb->PostRecv({got3.data(), kSmall}, 13).ok());
  REQUIRE(p.ca->PostSend(pt::ConstBuffer{small.data(), kSmall}, 3).ok());
  CHECK(Next(*p.cqb).status.ok());
  CHECK(Next(*p.cqa).status.ok());
  CHECK(got3 == small);
  CHECK(pulled() == kBig);
}

TEST_CASE("shm: a produced send streams through the ring, a consumed receive pulls in chunks",
          "[shm][produce]") {
  SetCma(true);
  LocalPair p = MakeLocalPair();
  constexpr size_t kSize = size_t{16} << 20;  // above the CMA threshold, 16 rings long
  std::vector<uint8_t> src(kSize), got(kSize), got_pulled(kSize);
  Fill(src.data(), kSize, 3);
  size_t max_piece = 0;
  const auto consume = [&max_piece](std::vector<uint8_t>* dst) -> pt::Consumer {
    return [dst, &max_piece](size_t offset, absl::Span<const uint8_t> in) {
      max_piece = std::max(max_piece, in.size());
      std::memcpy(dst->data() + offset, in.data(), in.size());
      return absl::OkStatus();
    };
  };
  REQUIRE(p.cb->PostRecvConsumed(kSize, consume(&got), 1).ok());
  REQUIRE(p.cb->PostRecvConsumed(kSize, consume(&got_pulled), 2).ok());
  REQUIRE(p.ca->PostSendProduced(
                  kSize,
                  [&](size_t offset, absl::Span<uint8_t> out) {
                    std::memcpy(out.data(), src.data() + offset, out.size());
                    return absl::OkStatus();
                  },
                  10)
              .ok());
  REQUIRE(p.ca->PostSend(pt::ConstBuffer{src.data(), kSize}, 11).ok());
  for (int i = 0; i < 2; ++i) {
    CHECK(Next(*p.cqa).status.ok());
    const pt::Completion c = Next(*p.cqb);
    REQUIRE(c.status.ok());
    CHECK(c.wr_id == 1u + i);
    CHECK(c.bytes == kSize);
  }
  CHECK(got == src);
  CHECK(got_pulled == src);
  CHECK(max_piece <= pt::kMaxProduceConsumeBytes);
  auto stats = shm::GetConnectionStats(*p.ca);
  REQUIRE(stats.ok());
  CHECK(stats->ring_bytes_sent >= kSize);                           // the produced one
  if (stats->peer_can_pull) CHECK(stats->cma_bytes_sent == kSize);  // the ordinary one only
}
