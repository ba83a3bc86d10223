// The tcp backend's per-socket choices (src/tcp/sockets.*): which connections take the loopback
// path, and the congestion control they get (DeviceOptions::tcp.loopback_congestion_control), on
// raw sockets and through a device's connections; the caller-mode lone socket that leaves the
// epoll set while its driver blocks in recv(); small sends written inside PostSend, also when a
// full socket buffer takes only part of one (src/tcp/core.cpp).
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "connected_pair.hpp"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"
#include "tcp/sockets.hpp"

namespace pt = plexus::transport;
namespace tcp = plexus::transport::internal::tcp;

namespace {

// A connected pair of IPv4 sockets over 127.0.0.1 (client, server side); -1s when the machine
// has no IPv4 loopback.
struct LoopbackPair {
  int client = -1;
  int server = -1;
  LoopbackPair() {
    const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(listener >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof a;
    REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(listen(listener, 1) == 0);
    REQUIRE(getsockname(listener, reinterpret_cast<sockaddr*>(&a), &length) == 0);
    client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(client >= 0);
    REQUIRE(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    server = accept(listener, nullptr, nullptr);
    REQUIRE(server >= 0);
    close(listener);
  }
  ~LoopbackPair() {
    if (client >= 0) close(client);
    if (server >= 0) close(server);
  }
};

std::string CongestionControl(int fd) {
  char name[32] = {0};
  socklen_t length = sizeof name - 1;
  REQUIRE(getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &length) == 0);
  return std::string(name);
}

}  // namespace

TEST_CASE("tcp sockets: both ends of a 127.0.0.1 connection are on the loopback path", "[tcp]") {
  LoopbackPair pair;
  CHECK(tcp::IsLoopbackPath(pair.client));
  CHECK(tcp::IsLoopbackPath(pair.server));
  // Not connected: no peer, so not known to be local.
  const int lone = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(lone >= 0);
  CHECK_FALSE(tcp::IsLoopbackPath(lone));
  close(lone);
  CHECK_FALSE(tcp::IsLoopbackPath(-1));
}

TEST_CASE("tcp sockets: congestion control is set, or refused with what to do", "[tcp]") {
  LoopbackPair pair;
  // Reno is built into every kernel and always allowed without privileges.
  REQUIRE(tcp::SetCongestionControl(pair.client, "reno", "127.0.0.1:1").ok());
  CHECK(CongestionControl(pair.client) == "reno");
  const std::string before = CongestionControl(pair.server);
  const absl::Status refused = tcp::SetCongestionControl(pair.server, "no-such-cc", "127.0.0.1:2");
  REQUIRE(absl::IsInvalidArgument(refused));
  const std::string message(refused.message());
  CHECK(message.find("127.0.0.1:2") != std::string::npos);
  CHECK(message.find("loopback_congestion_control 'no-such-cc'") != std::string::npos);
  CHECK(message.find("net.ipv4.tcp_allowed_congestion_control") != std::string::npos);
  CHECK(CongestionControl(pair.server) == before);  // unchanged
}

TEST_CASE("tcp: loopback connections get loopback_congestion_control, a refused one fails",
          "[tcp]") {
  pt::DeviceOptions o;
  o.backend = pt::Backend::kTcp;
  o.local_address = "127.0.0.1";
  o.connect_timeout = absl::Seconds(10);
  SECTION("the default (reno) carries messages") {
    pt::testing::ConnectedPair pair = pt::testing::ConnectPair(o);
    std::string got(5, '\0');
    REQUIRE(pair.in->PostRecv({got.data(), got.size()}, 1).ok());
    REQUIRE(pair.out->PostSend(pt::ConstBuffer{"hello", 5}, 2).ok());
    auto c = pair.cq_b->Wait(absl::Seconds(10));
    REQUIRE(c.ok());
    REQUIRE(c->status.ok());
    CHECK(got == "hello");
  }
  SECTION("a name the kernel refuses fails the connecting side with the option's name") {
    pt::DeviceOptions bad = o;
    bad.tcp.loopback_congestion_control = "no-such-cc";
    auto a = pt::Device::Create(bad);
    auto b = pt::Device::Create(o);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    auto cq_a = (*a)->CreateCompletionQueue();
    auto listener = (*b)->Listen("");
    REQUIRE(listener.ok());
    auto out = (*a)->Connect((*listener)->address(), cq_a.get());
    REQUIRE_FALSE(out.ok());
    CHECK(absl::IsInvalidArgument(out.status()));
    CHECK(std::string(out.status().message()).find("no-such-cc") != std::string::npos);
  }
}

namespace {

// The next completion of `opcode` on `cq` (others, such as send completions, are skipped);
// REQUIREs one, successful, within 10 s. No spinning: in caller mode the wait blocks in the
// device at once, as a waiter whose peer shares its CPU does.
pt::Completion NextOf(pt::CompletionQueue& cq, pt::Opcode opcode) {
  while (true) {
    auto c = cq.Wait(absl::Seconds(10), absl::ZeroDuration());
    REQUIRE(c.ok());
    REQUIRE(c->status.ok());
    if (c->opcode == opcode) return *std::move(c);
  }
}

// One message from `from` to `to` and back, each side blocking in its queue's Wait.
void RoundTrip(pt::testing::ConnectedPair& p, uint32_t value) {
  uint32_t got_b = 0, got_a = 0;
  REQUIRE(p.in->PostRecv({&got_b, sizeof got_b}, 1).ok());
  REQUIRE(p.out->PostRecv({&got_a, sizeof got_a}, 2).ok());
  REQUIRE(p.out->PostSend(pt::ConstBuffer{&value, sizeof value}, 3).ok());
  NextOf(*p.cq_b, pt::Opcode::kRecv);
  REQUIRE(got_b == value);
  REQUIRE(p.in->PostSend(pt::ConstBuffer{&got_b, sizeof got_b}, 4).ok());
  NextOf(*p.cq_a, pt::Opcode::kRecv);
  REQUIRE(got_a == value);
}

}  // namespace

TEST_CASE(
    "tcp caller mode: a lone socket out of the epoll set for blocking receives still "
    "delivers through epoll waits and beside a new connection",
    "[tcp]") {
  pt::DeviceOptions o;
  o.backend = pt::Backend::kTcp;
  o.local_address = "127.0.0.1";
  o.progress = pt::ProgressMode::kCaller;
  pt::testing::ConnectedPair p = pt::testing::ConnectPair(o);
  // Blocking waits on a lone connection drive it with recv() alone; a run of them takes its
  // socket out of the epoll set (kLoneStreakOutOfEpoll, src/tcp/core.cpp).
  for (uint32_t i = 0; i < 64; ++i) RoundTrip(p, i);

  SECTION("a short wait (an epoll wait) sees a message sent meanwhile") {
    uint32_t got = 0;
    const uint32_t value = 0xfeed;
    REQUIRE(p.in->PostRecv({&got, sizeof got}, 5).ok());
    REQUIRE(p.out->PostSend(pt::ConstBuffer{&value, sizeof value}, 6).ok());
    // Device::Progress with less than the lone socket's tick waits in epoll only (no direct
    // read, unlike a zero wait): it sees the bytes only once the socket is back in the set.
    bool delivered = false;
    for (int i = 0; i < 2000 && !delivered; ++i) {
      p.b->Progress(absl::Milliseconds(1));
      delivered = p.cq_b->size() > 0;
    }
    REQUIRE(delivered);
    CHECK(NextOf(*p.cq_b, pt::Opcode::kRecv).bytes == sizeof value);
    CHECK(got == value);
    for (uint32_t i = 0; i < 64; ++i) RoundTrip(p, 100 + i);  // and it leaves again
  }
  SECTION("a second connection to the same device works beside it, both ways") {
    auto second = p.a->Connect(p.listener->address(), p.cq_a.get());
    REQUIRE(second.ok());
    auto accepted = p.listener->Accept(p.cq_b.get(), absl::Seconds(10));
    REQUIRE(accepted.ok());
    for (uint32_t i = 0; i < 8; ++i) {
      RoundTrip(p, 200 + i);
      uint32_t got = 0, value = 300 + i;
      REQUIRE((*accepted)->PostRecv({&got, sizeof got}, 7).ok());
      REQUIRE((*second)->PostSend(pt::ConstBuffer{&value, sizeof value}, 8).ok());
      const pt::Completion c = NextOf(*p.cq_b, pt::Opcode::kRecv);
      CHECK(c.connection_id == (*accepted)->id());
      CHECK(got == value);
    }
  }
}

TEST_CASE("tcp: small sends past a full socket buffer arrive whole, in order, each completed once",
          "[tcp]") {
  // PostSend writes a small message at once when nothing is queued; once the socket buffers are
  // full, one is written in part (TcpCore::TrySendAtOnce) and the rest queue behind it. Every byte
  // must still arrive in order.
  pt::DeviceOptions o;
  o.backend = pt::Backend::kTcp;
  o.local_address = "127.0.0.1";
  // The receiver reads only while this thread waits on it (caller mode): until then its socket
  // buffer fills, then the sender's.
  pt::DeviceOptions receiver = o;
  receiver.progress = pt::ProgressMode::kCaller;
  pt::testing::ConnectedPair p = pt::testing::ConnectPair(o, receiver);
  constexpr uint32_t kMessages = 40000;  // ~20 MB: past loopback's socket buffers
  auto size_of = [](uint32_t i) { return size_t{4} + (i * 7919u) % 997u; };
  std::vector<std::vector<uint8_t>> sent(kMessages);
  for (uint32_t i = 0; i < kMessages; ++i) {
    sent[i].assign(size_of(i), static_cast<uint8_t>(i * 31u));
    std::memcpy(sent[i].data(), &i, sizeof i);
    // Two pieces, as an rpc frame's head and body are: the fast path gathers them.
    const size_t half = sent[i].size() / 2;
    const pt::ConstBuffer parts[2] = {{sent[i].data(), half},
                                      {sent[i].data() + half, sent[i].size() - half}};
    REQUIRE(p.out->PostSend(absl::MakeConstSpan(parts), i).ok());
  }
  std::vector<uint8_t> got(1024);
  for (uint32_t i = 0; i < kMessages; ++i) {
    REQUIRE(p.in->PostRecv({got.data(), got.size()}, i).ok());
    auto c = p.cq_b->Wait(absl::Seconds(10));
    REQUIRE(c.ok());
    REQUIRE(c->status.ok());
    REQUIRE(c->wr_id == i);
    REQUIRE(c->bytes == sent[i].size());
    REQUIRE(std::memcmp(got.data(), sent[i].data(), sent[i].size()) == 0);
  }
  // The sender's completions: one per send, in order.
  for (uint32_t i = 0; i < kMessages; ++i) {
    auto c = p.cq_a->Wait(absl::Seconds(10));
    REQUIRE(c.ok());
    REQUIRE(c->status.ok());
    REQUIRE(c->opcode == pt::Opcode::kSend);
    REQUIRE(c->wr_id == i);
  }
  CHECK(p.cq_a->size() == 0);
}
