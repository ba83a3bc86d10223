// The tcp backend's socket-free protocol decisions (src/tcp/protocol.*): stripe layout and what
// a received header asks for; and, through real sockets, striped operations so short that some
// sockets' parts are empty.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "connected_pair.hpp"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"
#include "tcp/protocol.hpp"
#include "tcp_frames.hpp"

namespace pt = plexus::transport;
namespace tcp = plexus::transport::internal::tcp;
using plexus::testing::Header;

namespace {

std::string Error(const absl::StatusOr<tcp::HeaderPlan>& plan) {
  REQUIRE_FALSE(plan.ok());
  CHECK(absl::IsDataLoss(plan.status()));
  return std::string(plan.status().message());
}

}  // namespace

TEST_CASE("tcp protocol: stripe parts tile the operation, the last ones may be empty", "[tcp]") {
  struct Case {
    uint64_t length;
    size_t sockets;
    std::vector<std::pair<uint64_t, uint64_t>> parts;
  };
  const std::vector<Case> cases = {
      {8, 4, {{0, 2}, {2, 2}, {4, 2}, {6, 2}}},
      {9, 4, {{0, 3}, {3, 3}, {6, 3}, {9, 0}}},
      {5, 4, {{0, 2}, {2, 2}, {4, 1}, {5, 0}}},
      {1, 3, {{0, 1}, {1, 0}, {1, 0}}},
      {0, 2, {{0, 0}, {0, 0}}},
      {uint64_t{1} << 34,
       3,
       {{0, 5726623062}, {5726623062, 5726623062}, {11453246124, 5726623060}}},
  };
  for (const Case& c : cases) {
    INFO(c.length << " bytes over " << c.sockets << " sockets");
    for (size_t k = 0; k < c.sockets; ++k) {
      const tcp::StripeRange r = tcp::StripePart(c.length, c.sockets, k);
      CHECK(r.offset == c.parts[k].first);
      CHECK(r.length == c.parts[k].second);
    }
  }
}

TEST_CASE("tcp protocol: headers are planned by type and socket", "[tcp]") {
  using tcp::FrameType;
  using tcp::HeaderAction;
  SECTION("operations on the control socket") {
    auto m = tcp::PlanHeader(Header(FrameType::kMessage, 100), 0, 1, 0, 0);
    REQUIRE(m.ok());
    CHECK(m->action == HeaderAction::kOperation);
    CHECK_FALSE(m->is_write);
    CHECK_FALSE(m->striped);
    CHECK(m->first_bytes == 100);
    auto w = tcp::PlanHeader(Header(FrameType::kWrite, 7, 1, 2), 0, 2, 0, 0);
    REQUIRE(w.ok());
    CHECK(w->is_write);
    CHECK(w->first_bytes == 7);
    auto head =
        tcp::PlanHeader(Header(FrameType::kStripeHead, 9, 0, 0, tcp::kFlagWrite), 0, 4, 0, 0);
    REQUIRE(head.ok());
    CHECK(head->striped);
    CHECK(head->is_write);
    CHECK(head->first_bytes == 3);
  }
  SECTION("acks and closes") {
    auto ack = tcp::PlanHeader(Header(FrameType::kWriteAck, 0, 3), 0, 1, 3, 0);
    REQUIRE(ack.ok());
    CHECK(ack->action == HeaderAction::kAck);
    CHECK(ack->acked == 3);
    CHECK(Error(tcp::PlanHeader(Header(FrameType::kWriteAck, 0, 4), 0, 1, 3, 0)) ==
          "ack for writes never sent");
    auto close = tcp::PlanHeader(Header(FrameType::kClose), 0, 2, 0, 0);
    REQUIRE(close.ok());
    CHECK(close->action == HeaderAction::kClose);
  }
  SECTION("frames on the wrong socket") {
    CHECK(Error(tcp::PlanHeader(Header(FrameType::kClose), 1, 2, 0, 0)) ==
          "close on a data socket");
    CHECK(Error(tcp::PlanHeader(Header(FrameType::kWriteAck), 1, 2, 0, 0)) ==
          "ack on a data socket");
    CHECK(Error(tcp::PlanHeader(Header(FrameType::kMessage, 1), 1, 2, 0, 0)) ==
          "frame: operation head on a data socket");
    CHECK(Error(tcp::PlanHeader(Header(FrameType::kStripePart, 1), 0, 2, 0, 0)) ==
          "stripe part on the control socket");
    CHECK(Error(tcp::PlanHeader(Header(FrameType::kStripeHead, 10), 0, 1, 0, 0)) ==
          "striped frame on a single-socket connection");
  }
  SECTION("stripe parts") {
    auto part = tcp::PlanHeader(Header(FrameType::kStripePart, 2, 5, 2), 1, 4, 0, 5);
    REQUIRE(part.ok());
    CHECK(part->action == HeaderAction::kStripePart);
    CHECK(Error(tcp::PlanHeader(Header(FrameType::kStripePart, 2, 6, 2), 1, 4, 0, 5)) ==
          "stripe part out of order");
    CHECK(tcp::PartMatches(Header(FrameType::kStripePart, 3, 0, 3), 1, 4, 9));
    CHECK(tcp::PartMatches(Header(FrameType::kStripePart, 0, 0, 9), 3, 4, 9));  // empty part
    CHECK_FALSE(tcp::PartMatches(Header(FrameType::kStripePart, 3, 0, 4), 1, 4, 9));
    CHECK_FALSE(tcp::PartMatches(Header(FrameType::kStripePart, 2, 0, 3), 1, 4, 9));
    CHECK_FALSE(tcp::PartMatches(Header(FrameType::kStripePart, 3, 0, 0), 0, 4, 9));
    CHECK_FALSE(tcp::PartMatches(Header(FrameType::kStripePart, 0, 0, 9), 4, 4, 9));
  }
}

TEST_CASE("tcp: striped operations shorter than the socket count arrive", "[tcp]") {
  // With 4 sockets and no stripe threshold, a message of 5 bytes leaves socket 3 an empty
  // part. Before, that socket got no part at all and its next part looked out of order.
  pt::DeviceOptions o;
  o.backend = pt::Backend::kTcp;
  o.local_address = "127.0.0.1";
  o.tcp.sockets_per_connection = 4;
  o.tcp.stripe_threshold = 0;
  o.op_timeout = absl::Seconds(10);
  pt::testing::ConnectedPair pair = pt::testing::ConnectPair(o);
  std::vector<uint8_t> region(64, 0);
  auto mr = pair.b->Register(region.data(), region.size());
  REQUIRE(mr.ok());
  constexpr int kCount = 24;
  std::vector<std::vector<uint8_t>> sent(kCount), got(kCount, std::vector<uint8_t>(32, 0xff));
  for (int i = 0; i < kCount; ++i) {
    sent[i].assign(i, static_cast<uint8_t>(i));  // 0..23 bytes
    REQUIRE(pair.in->PostRecv({got[i].data(), got[i].size()}, i).ok());
  }
  for (int i = 0; i < kCount; ++i) {
    REQUIRE(pair.out->PostSend(pt::ConstBuffer{sent[i].data(), sent[i].size()}, i).ok());
  }
  // A 3-byte striped write too: parts 2 and 3 are empty.
  const uint8_t three[3] = {7, 8, 9};
  auto local = pair.a->Register(const_cast<uint8_t*>(three), 3);
  REQUIRE(local.ok());
  REQUIRE(pair.out->PostWrite(**local, 0, 3, (*mr)->handle(), 10, 42u, 100).ok());
  for (int i = 0; i < kCount; ++i) {
    auto c = pair.cq_b->Wait(absl::Seconds(10));
    REQUIRE(c.ok());
    INFO(c->status.ToString());
    REQUIRE(c->status.ok());
    CHECK(c->wr_id == static_cast<uint64_t>(i));
    CHECK(c->bytes == static_cast<size_t>(i));
    CHECK(std::equal(sent[i].begin(), sent[i].end(), got[i].begin()));
  }
  auto remote = pair.cq_b->Wait(absl::Seconds(10));
  REQUIRE(remote.ok());
  REQUIRE(remote->status.ok());
  CHECK(remote->opcode == pt::Opcode::kRemoteWrite);
  CHECK(remote->immediate == 42u);
  CHECK(region[10] == 7);
  CHECK(region[12] == 9);
  CHECK(region[13] == 0);
  int sends = 0;
  while (sends < kCount + 1) {
    auto c = pair.cq_a->Wait(absl::Seconds(10));
    REQUIRE(c.ok());
    REQUIRE(c->status.ok());
    ++sends;
  }
}
