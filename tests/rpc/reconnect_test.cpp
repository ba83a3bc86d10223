// A reconnecting Channel: a server destroyed and started again on the same tcp address is
// redialled; calls outstanding at the death fail with Unavailable and are never re-sent; calls
// during the outage fail with Unavailable within their deadline (or wait for the connection with
// wait_for_ready); calls succeed again once the server is back.
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "holding_service.hpp"
#include "kinds.plexus.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/server.hpp"
#include "test_server.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Empty;
using plexus::rpctest::Inner;
using plexus::rpctest::Kinds;

namespace {

using Impl = plexus::rpctest::HoldingService;

using Incarnation = plexus::rpctest::TestServer<Impl>;
using plexus::rpctest::LoopbackTcp;

// Calls Echo until one succeeds, at most `limit`; returns how long it took (or limit + 1 s).
absl::Duration EchoUntilOk(Kinds::Stub& stub, absl::Duration limit) {
  const absl::Time start = absl::Now();
  AllKinds req;
  while (absl::Now() - start < limit) {
    if (stub.EchoSync(req, {.timeout = absl::Seconds(1)}).ok()) return absl::Now() - start;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return limit + absl::Seconds(1);
}

const pr::ChannelOptions kFastRedial{.reconnect_backoff = absl::Milliseconds(20),
                                     .max_reconnect_backoff = absl::Milliseconds(200)};

}  // namespace

TEST_CASE("reconnect: a server restart on the same address is survived", "[rpc][reconnect]") {
  auto device = LoopbackTcp();
  auto first = std::make_unique<Incarnation>(device, "127.0.0.1:0");
  const std::string address = first->server->address();
  auto channel = pr::Channel::Connect(device, address, {&Kinds::Descriptor()}, kFastRedial);
  REQUIRE(channel.ok());
  Kinds::Stub stub(*channel);
  AllKinds req;
  req.text = "before";
  REQUIRE(stub.EchoSync(req, {.timeout = absl::Seconds(5)}).ok());
  Inner held_req;
  auto held = stub.Hold(held_req, {.timeout = absl::Seconds(5)});
  REQUIRE(stub.EchoSync(req, {.timeout = absl::Seconds(5)}).ok());  // Hold reached the server
  REQUIRE(first->impl.holds.load() == 1);

  const absl::Time died = absl::Now();
  first.reset();
  // Outstanding at the death: Unavailable, within its 5 s deadline.
  auto r = held.Get();
  CHECK(r.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::Now() - died < absl::Seconds(5));

  // During the outage: Unavailable (naming the address), well within the 2 s deadline.
  for (int i = 0; i < 3; ++i) {
    const absl::Time t0 = absl::Now();
    auto during = stub.EchoSync(req, {.timeout = absl::Seconds(2)});
    const absl::Duration took = absl::Now() - t0;
    CHECK(during.status().code() == absl::StatusCode::kUnavailable);
    CHECK(std::string(during.status().message()).find(address) != std::string::npos);
    CHECK(took < absl::Seconds(2));
    absl::SleepFor(absl::Milliseconds(30));
  }
  CHECK(!(*channel)->status().ok());

  // The server comes back on the same address: the channel redials within its backoff.
  auto second = std::make_unique<Incarnation>(device, address);
  const absl::Duration back = EchoUntilOk(stub, absl::Seconds(10));
  INFO("first successful call " << absl::FormatDuration(back) << " after the restart");
  CHECK(back <= absl::Seconds(10));
  for (int i = 0; i < 20; ++i) CHECK(stub.EchoSync(req, {.timeout = absl::Seconds(5)}).ok());
  CHECK((*channel)->status().ok());
  const auto replicas = (*channel)->Replicas();
  REQUIRE(replicas.size() == 1);
  CHECK(replicas[0].connections == 2);
  // Never re-sent: the held call (outstanding at the death) did not reach the new server.
  CHECK(second->impl.holds.load() == 0);
  CHECK(second->impl.echoes.load() >= 21);
}

TEST_CASE("reconnect: wait_for_ready waits for the connection within the deadline",
          "[rpc][reconnect]") {
  auto device = LoopbackTcp();
  auto first = std::make_unique<Incarnation>(device, "127.0.0.1:0");
  const std::string address = first->server->address();
  auto channel = pr::Channel::Connect(device, address, {&Kinds::Descriptor()}, kFastRedial);
  REQUIRE(channel.ok());
  Kinds::Stub stub(*channel);
  AllKinds req;
  REQUIRE(stub.EchoSync(req, {.timeout = absl::Seconds(5)}).ok());
  first.reset();
  // Wait until the channel saw the death (the closed socket reaches it asynchronously).
  for (int i = 0; i < 500 && (*channel)->status().ok(); ++i) absl::SleepFor(absl::Milliseconds(2));
  REQUIRE(!(*channel)->status().ok());

  // Down, and nobody restarts it within the deadline: DeadlineExceeded after about 300 ms.
  absl::Time t0 = absl::Now();
  auto late = stub.EchoSync(req, {.timeout = absl::Milliseconds(300), .wait_for_ready = true});
  absl::Duration took = absl::Now() - t0;
  CHECK(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(took >= absl::Milliseconds(290));
  CHECK(took <= absl::Milliseconds(300) * 1.25 + absl::Milliseconds(500));

  // Restarted 200 ms into the call's 10 s: the call waits, then succeeds.
  std::unique_ptr<Incarnation> second;
  std::thread restart([&] {
    absl::SleepFor(absl::Milliseconds(200));
    second = std::make_unique<Incarnation>(device, address);
  });
  t0 = absl::Now();
  auto waited = stub.EchoSync(req, {.timeout = absl::Seconds(10), .wait_for_ready = true});
  took = absl::Now() - t0;
  restart.join();
  CHECK(waited.ok());
  CHECK(took < absl::Seconds(10));
  CHECK(second->impl.echoes.load() == 1);
}

TEST_CASE("reconnect: off, a dead connection stays dead", "[rpc][reconnect]") {
  auto device = LoopbackTcp();
  auto first = std::make_unique<Incarnation>(device, "127.0.0.1:0");
  const std::string address = first->server->address();
  pr::ChannelOptions options = kFastRedial;
  options.reconnect = false;
  auto channel = pr::Channel::Connect(device, address, {&Kinds::Descriptor()}, options);
  REQUIRE(channel.ok());
  Kinds::Stub stub(*channel);
  AllKinds req;
  REQUIRE(stub.EchoSync(req, {.timeout = absl::Seconds(5)}).ok());
  first.reset();
  auto second = std::make_unique<Incarnation>(device, address);
  absl::SleepFor(absl::Milliseconds(300));  // 15 backoffs of a reconnecting channel
  auto r = stub.EchoSync(req, {.timeout = absl::Seconds(2)});
  CHECK(r.status().code() == absl::StatusCode::kUnavailable);
  CHECK(second->impl.echoes.load() == 0);
  CHECK((*channel)->Replicas()[0].connections == 1);
}

TEST_CASE("reconnect: options are checked", "[rpc][reconnect]") {
  auto device = LoopbackTcp();
  Incarnation one(device, "127.0.0.1:0");
  pr::ChannelOptions bad;
  bad.reconnect_backoff = absl::Seconds(2);
  bad.max_reconnect_backoff = absl::Seconds(1);
  auto channel = pr::Channel::Connect(device, one.server->address(), {&Kinds::Descriptor()}, bad);
  CHECK(channel.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(channel.status().message()).find("max_reconnect_backoff") != std::string::npos);
}
