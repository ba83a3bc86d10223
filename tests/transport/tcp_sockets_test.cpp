// The tcp backend's per-socket choices (src/tcp/sockets.*): which connections take the loopback
// path, and the congestion control they get (DeviceOptions::loopback_congestion_control), on
// raw sockets and through a device's connections.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

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
    bad.loopback_congestion_control = "no-such-cc";
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
