// What a server does against clients that hold connections without using them: a connection
// limit (refused in the handshake, with a clear error and a log line), idle connections closed
// after idle_timeout (never one with a call in flight), a trickled message or a missing handshake
// closed after frame_timeout. All on tcp 127.0.0.1.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "holding_service.hpp"
#include "kinds.plexus.hpp"
#include "plexus/base/log.hpp"
#include "plexus/base/net.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/server.hpp"
#include "raw_client.hpp"
#include "tcp/frame.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
namespace net = plexus::base::net;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Inner;
using plexus::rpctest::Kinds;

namespace {

// Collects the log lines while it lives.
struct LogCapture {
  LogCapture() {
    plexus::base::SetLogSink([this](plexus::base::LogLevel, std::string_view m) {
      std::lock_guard<std::mutex> lock(mu);
      lines.emplace_back(m);
    });
  }
  ~LogCapture() { plexus::base::SetLogSink(plexus::base::StderrLogSink()); }
  // Whether a line holds every one of `parts`.
  bool Has(std::initializer_list<std::string_view> parts) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& l : lines) {
      bool all = true;
      for (auto p : parts) all = all && l.find(p) != std::string::npos;
      if (all) return true;
    }
    return false;
  }
  std::mutex mu;
  std::vector<std::string> lines;
};

struct Served {
  explicit Served(pr::ServerOptions options) {
    device = plexus::rpctest::LoopbackTcp();
    auto s = pr::Server::Create(device, std::move(options));
    REQUIRE(s.ok());
    server = std::move(*s);
    REQUIRE(server->Register(&impl).ok());
    REQUIRE(server->Start().ok());
  }
  ~Served() {
    impl.Release();
    server->Shutdown();
  }
  std::shared_ptr<pt::Device> device;
  plexus::rpctest::HoldingService impl;
  std::unique_ptr<pr::Server> server;
};

// A bare tcp socket speaking the tcp backend's framing (tcp/frame.hpp), for a client that sends
// a message a byte at a time.
struct RawSocket {
  explicit RawSocket(const std::string& address) {
    auto sa = net::ResolveFirst(address, "server");
    REQUIRE(sa.ok());
    bool retry = false;
    auto f = net::ConnectTcp(*sa, absl::Now() + absl::Seconds(5), &retry);
    REQUIRE(f.ok());
    fd = *f;
    uint8_t hello[pt::internal::tcp::kHelloSize];
    pt::internal::tcp::EncodeHello({.socket_index = 0, .socket_count = 1, .token = 0x5eed}, hello);
    Send(hello, sizeof hello);
  }
  ~RawSocket() { ::close(fd); }
  void Send(const void* p, size_t n) {
    REQUIRE(net::SendAll(fd, p, n, absl::Now() + absl::Seconds(5)).ok());
  }
  // The tcp header of a message of `length` bytes.
  void SendHeader(size_t length) {
    pt::internal::tcp::FrameHeader h;
    h.type = pt::internal::tcp::FrameType::kMessage;
    h.length = length;
    uint8_t bytes[pt::internal::tcp::kFrameHeaderSize];
    pt::internal::tcp::EncodeFrameHeader(h, bytes);
    Send(bytes, sizeof bytes);
  }
  void SendMessage(const std::string& m) {
    SendHeader(m.size());
    Send(m.data(), m.size());
  }
  // Reads the next message whole.
  std::string ReadMessage() {
    uint8_t bytes[pt::internal::tcp::kFrameHeaderSize];
    REQUIRE(net::RecvAll(fd, bytes, sizeof bytes, absl::Now() + absl::Seconds(5)).ok());
    auto h = pt::internal::tcp::DecodeFrameHeader(bytes, 1 << 20);
    REQUIRE(h.ok());
    std::string m(h->length, '\0');
    REQUIRE(net::RecvAll(fd, m.data(), m.size(), absl::Now() + absl::Seconds(5)).ok());
    return m;
  }
  // Whether the server closed the connection (end of stream or reset; the bytes before, such as
  // the backend's close frame, are read and dropped).
  bool Closed() {
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 0) > 0) {
      char buf[256];
      const ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (r <= 0) return r == 0 || (errno != EAGAIN && errno != EINTR);
    }
    return false;
  }
  int fd = -1;
};

std::string Joined(const pr::internal::OutFrame& f) {
  std::string out;
  for (const auto& part : f.parts) out.append(static_cast<const char*>(part.data), part.size);
  return out;
}

}  // namespace

TEST_CASE("server: a client over max_connections is refused with a clear error and a log line",
          "[rpc][limits]") {
  LogCapture log;
  pr::ServerOptions options;
  options.max_connections = 2;
  Served s(options);
  const pr::ChannelOptions once{.reconnect = false};
  auto a = pr::Channel::Connect(s.device, s.server->address(), {&Kinds::Descriptor()}, once);
  auto b = pr::Channel::Connect(s.device, s.server->address(), {&Kinds::Descriptor()}, once);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto c = pr::Channel::Connect(s.device, s.server->address(), {&Kinds::Descriptor()}, once);
  REQUIRE(!c.ok());
  INFO(c.status());
  CHECK(c.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(c.status().message(), "serves at most 2 connections"));
  CHECK(absl::StrContains(c.status().message(), "max_connections"));
  // The accepting thread writes the line after posting the connection's first receive, so the
  // refusal can reach the client first.
  plexus::rpctest::WaitUntil(
      [&] {
        return log.Has({"refusing the connection", "max_connections"});
      },
      "the refusal's log line");
  CHECK(s.server->Connections().size() == 2);

  // The admitted ones serve on; once one goes, a new client gets its place.
  Kinds::Stub stub(*b);
  CHECK(stub.EchoSync(AllKinds{}, {.timeout = absl::Seconds(5)}).ok());
  a->reset();
  absl::StatusOr<std::shared_ptr<pr::Channel>> d = absl::UnknownError("not tried");
  for (int i = 0; i < 50 && !d.ok(); ++i) {
    d = pr::Channel::Connect(s.device, s.server->address(), {&Kinds::Descriptor()}, once);
    if (!d.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  INFO(d.status());
  CHECK(d.ok());
}

TEST_CASE("server: idle connections close after idle_timeout, never one with a call in flight",
          "[rpc][limits]") {
  LogCapture log;
  pr::ServerOptions options;
  options.idle_timeout = absl::Milliseconds(300);
  Served s(options);
  auto cq = s.device->CreateCompletionQueue();
  auto idle = s.device->Connect(s.server->address(), cq.get());
  REQUIRE(idle.ok());
  std::vector<uint8_t> ack;
  REQUIRE(plexus::rpctest::RawHandshake(**idle, *cq, ack).ok());

  // A channel with a call parked in the handler for longer than the idle timeout.
  auto busy = pr::Channel::Connect(s.device, s.server->address(), {&Kinds::Descriptor()},
                                   {.reconnect = false});
  REQUIRE(busy.ok());
  Kinds::Stub stub(*busy);
  Inner req;
  auto held = stub.Hold(req, {.timeout = absl::Seconds(10)});
  plexus::rpctest::WaitUntil([&] { return s.impl.Held() == 1; }, "the call is parked");
  REQUIRE(s.server->Connections().size() == 2);

  const absl::Time t0 = absl::Now();
  plexus::rpctest::WaitUntil([&] { return s.server->Connections().size() == 1; },
                             "the idle connection is closed");
  const absl::Duration took = absl::Now() - t0;
  INFO("closed after " << absl::FormatDuration(took));
  CHECK(took < absl::Seconds(2));
  CHECK(log.Has({"closing the connection", "idle for", "idle_timeout"}));
  // The idle client sees its connection end.
  if ((*idle)->PostRecv({ack.data(), ack.size()}, 7).ok()) {
    auto end = cq->Wait(absl::Seconds(2));
    REQUIRE(end.ok());
    CHECK(!end->status.ok());
  }
  // The busy one is still there after several idle timeouts, and its call completes.
  absl::SleepFor(absl::Milliseconds(700));
  REQUIRE(s.server->Connections().size() == 1);
  s.impl.Release();
  CHECK(held.Get().ok());
  CHECK(stub.EchoSync(AllKinds{}, {.timeout = absl::Seconds(5)}).ok());
}

TEST_CASE("server: a trickled request and a missing handshake are closed after frame_timeout",
          "[rpc][limits]") {
  LogCapture log;
  pr::ServerOptions options;
  options.frame_timeout = absl::Milliseconds(500);
  Served s(options);
  RawSocket silent(s.server->address());  // never sends the rpc handshake

  RawSocket trickle(s.server->address());
  pr::internal::OutFrame hello;
  plexus::rpctest::BuildKindsHello(&hello);
  trickle.SendMessage(Joined(hello));
  const std::string answer = trickle.ReadMessage();
  const std::vector<uint8_t> ack(answer.begin(), answer.end());
  auto parsed = pr::internal::ParseFrame(ack);
  REQUIRE(parsed.ok());
  REQUIRE(parsed->header.status_code == 0);
  // A request of 64 bytes, sent one byte every 100 ms after its header.
  Inner req;
  pr::internal::EncodedMessage encoded;
  REQUIRE(
      pr::internal::EncodeMessage(*Kinds::Descriptor().methods[1].request(), &req, &encoded).ok());
  pr::internal::FrameHeader rh;
  rh.call_id = 1;
  rh.service_id = Kinds::Descriptor().id;
  rh.method_id = 1;
  pr::internal::OutFrame request;
  pr::internal::BuildFrame(rh, "", {}, &encoded, &request);
  const std::string bytes = Joined(request);
  trickle.SendHeader(bytes.size());
  const absl::Time t0 = absl::Now();
  size_t sent = 0;
  bool closed = false;
  while (!closed && absl::Now() - t0 < absl::Seconds(5)) {
    if (sent + 1 < bytes.size()) {  // never the last byte
      ::send(trickle.fd, bytes.data() + sent, 1, MSG_NOSIGNAL);
      ++sent;
    }
    absl::SleepFor(absl::Milliseconds(100));
    closed = trickle.Closed();
  }
  const absl::Duration took = absl::Now() - t0;
  INFO("trickled " << sent << " bytes; closed after " << absl::FormatDuration(took));
  CHECK(closed);
  CHECK(took >= absl::Milliseconds(400));
  CHECK(took < absl::Seconds(2));
  CHECK(log.Has({"closing the connection", "is not whole", "frame_timeout"}));
  // The silent one went in the same sweep or the next; the reaper closes one at a time.
  plexus::rpctest::WaitUntil([&] { return silent.Closed(); }, "the silent connection closed");
  CHECK(log.Has({"closing the connection", "sent no handshake", "frame_timeout"}));
  plexus::rpctest::WaitUntil([&] { return s.server->Connections().empty(); },
                             "both connections are gone");
}
