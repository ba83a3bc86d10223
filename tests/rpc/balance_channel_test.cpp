// A Channel over 3 replicas (tcp 127.0.0.1) with its balancing engine: round robin spreads exact
// thirds; Daronpon redirects a call off its target exactly when another replica's load + delta is
// below the target's (the target's load learnt from its server's gossip); a dead replica is
// avoided and taken back once it is redialled; the engine is switched live.
#include <atomic>
#include <memory>
#include <vector>

#include "catch2/catch.hpp"
#include "holding_service.hpp"
#include "kinds.plexus.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/policies.hpp"
#include "plexus/rpc/server.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Empty;
using plexus::rpctest::Inner;
using plexus::rpctest::Kinds;

namespace {

using Impl = plexus::rpctest::HoldingService;

struct Replica {
  Replica(std::shared_ptr<pt::Device> device, std::string address) {
    server = std::move(*pr::Server::Create(device, {.address = std::move(address)}));
    REQUIRE(server->Register(&impl).ok());
    REQUIRE(server->Start().ok());
  }
  ~Replica() {
    impl.Release();
    server->Shutdown();
  }
  Impl impl;
  std::unique_ptr<pr::Server> server;
};

struct Three {
  explicit Three(std::string policy) {
    device = *pt::Device::Create({.backend = pt::Backend::kTcp, .local_address = "127.0.0.1"});
    for (int i = 0; i < 3; ++i) {
      replicas.push_back(std::make_unique<Replica>(device, "127.0.0.1:0"));
      addresses.push_back(replicas.back()->server->address());
    }
    auto c = pr::Channel::ConnectReplicas(device, addresses, {&Kinds::Descriptor()},
                                          {.reconnect_backoff = absl::Milliseconds(20),
                                           .max_reconnect_backoff = absl::Milliseconds(200),
                                           .balance = std::move(policy)});
    REQUIRE(c.ok());
    channel = *c;
    balance = std::dynamic_pointer_cast<pr::LoadBalancePolicy>(channel->engines().Find("balance"));
    REQUIRE(balance != nullptr);
  }
  ~Three() {
    channel.reset();
    replicas.clear();
  }
  // n sequential Echo calls; returns how many succeeded.
  int Echo(int n) {
    Kinds::Stub stub(channel);
    AllKinds req;
    int ok = 0;
    for (int i = 0; i < n; ++i) ok += stub.EchoSync(req, {.timeout = absl::Seconds(5)}).ok();
    return ok;
  }
  std::vector<int> Echoes() const {
    std::vector<int> v;
    for (const auto& r : replicas) v.push_back(r ? r->impl.echoes.load() : -1);
    return v;
  }
  std::shared_ptr<pt::Device> device;
  std::vector<std::unique_ptr<Replica>> replicas;
  std::vector<std::string> addresses;
  std::shared_ptr<pr::Channel> channel;
  std::shared_ptr<pr::LoadBalancePolicy> balance;
};

// Waits (at most 5 s) until the engine sees `load` for replica r.
bool SeesLoad(const pr::LoadBalancePolicy& lb, uint32_t r, uint32_t load) {
  for (int i = 0; i < 2500; ++i) {
    auto s = lb.stats();
    if (r < s.load.size() && s.load[r] == load) return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return false;
}

}  // namespace

TEST_CASE("balance: round robin sends each replica an exact third", "[rpc][balance]") {
  Three t("round_robin");
  REQUIRE(t.Echo(300) == 300);
  CHECK(t.Echoes() == std::vector<int>{100, 100, 100});
  CHECK(t.balance->stats().picks == std::vector<uint64_t>{100, 100, 100});
  CHECK(t.balance->stats().outstanding == std::vector<uint32_t>{0, 0, 0});
}

TEST_CASE("balance: po2 and daronpon on idle replicas spread every call", "[rpc][balance]") {
  for (const char* policy : {"po2", "daronpon"}) {
    Three t(policy);
    INFO(policy);
    REQUIRE(t.Echo(300) == 300);
    const auto e = t.Echoes();
    CHECK(e[0] + e[1] + e[2] == 300);
    // Daronpon's targets go in turn and idle replicas never trigger a redirect: exact thirds.
    if (std::string(policy) == "daronpon") {
      CHECK(e == std::vector<int>{100, 100, 100});
      CHECK(t.balance->stats().redirects == 0);
    } else {
      for (int n : e) CHECK(n > 50);
    }
  }
}

TEST_CASE("balance: daronpon redirects off a loaded replica exactly when load + delta is lower",
          "[rpc][balance]") {
  Three t("daronpon");
  // Reports never expire while the exact counts below are taken (a loaded machine may take more
  // than the default 100 ms for them).
  REQUIRE(t.channel->engines().Configure("balance", R"({"estimate_ttl_ms": 1e9})").ok());
  // Another client holds 4 calls on replica 0: its server's load crosses the gossip floor (4) and
  // it tells the balancing channel, which has no call of its own there.
  auto direct = pr::Channel::Connect(t.device, t.addresses[0], {&Kinds::Descriptor()});
  REQUIRE(direct.ok());
  Kinds::Stub other(*direct);
  std::vector<Inner> reqs(4);
  std::vector<pr::PendingCall<Inner>> held;
  for (auto& r : reqs) held.push_back(other.Hold(r, {.timeout = absl::Seconds(30)}));
  REQUIRE(SeesLoad(*t.balance, 0, 4));

  // delta 1: every call targeted at replica 0 (a third) goes elsewhere, once.
  REQUIRE(t.Echo(300) == 300);
  auto e = t.Echoes();
  CHECK(e[0] == 0);
  CHECK(e[1] + e[2] == 300);
  CHECK(t.balance->stats().redirects == 100);

  // delta 3: 0 + 3 < 4 still redirects; delta 4: 0 + 4 < 4 does not (replica 0 gets its third,
  // and the load its responses piggyback stays 4).
  REQUIRE(t.channel->engines().Configure("balance", R"({"delta": 3})").ok());
  REQUIRE(t.Echo(30) == 30);
  CHECK(t.Echoes()[0] == 0);
  CHECK(t.balance->stats().redirects == 110);
  REQUIRE(t.channel->engines().Configure("balance", R"({"delta": 4})").ok());
  REQUIRE(t.Echo(30) == 30);
  CHECK(t.Echoes()[0] == 10);
  CHECK(t.balance->stats().redirects == 110);
  CHECK(t.balance->stats().load[0] == 4);

  // The held calls end. The server's load falls 4 -> 0 and its trigger gossips once, "below
  // threshold", at 2 (half the level); later counts under the floor are silent, so the channel
  // holds 2 for replica 0 and, with delta 1, still redirects off it ...
  t.replicas[0]->impl.Release();
  for (auto& h : held) CHECK(h.Get().ok());
  REQUIRE(SeesLoad(*t.balance, 0, 2));
  REQUIRE(t.channel->engines().Configure("balance", R"({"delta": 1})").ok());
  REQUIRE(t.Echo(30) == 30);
  CHECK(t.Echoes()[0] == 10);
  CHECK(t.balance->stats().redirects == 120);
  // ... until the report is older than estimate_ttl: replica 0 gets its third again, and its
  // responses (load 0) keep the estimate fresh.
  REQUIRE(t.channel->engines().Configure("balance", R"({"estimate_ttl_ms": 20})").ok());
  REQUIRE(SeesLoad(*t.balance, 0, 0));
  REQUIRE(t.Echo(30) == 30);
  CHECK(t.Echoes()[0] == 20);
  CHECK(t.balance->stats().redirects == 120);
}

TEST_CASE("balance: a dead replica is avoided and taken back after it restarts",
          "[rpc][balance][reconnect]") {
  Three t("daronpon");
  REQUIRE(t.Echo(30) == 30);
  // A call held on replica 2 when it dies fails with Unavailable (never re-sent elsewhere).
  Kinds::Stub stub(t.channel);
  std::vector<Inner> reqs(3);
  std::vector<pr::PendingCall<Inner>> held;
  for (auto& r : reqs) held.push_back(stub.Hold(r, {.timeout = absl::Seconds(10)}));
  REQUIRE(t.Echo(3) == 3);  // the holds reached their servers (one each: targets in turn)
  {
    std::lock_guard<std::mutex> lock(t.replicas[2]->impl.mu);
    REQUIRE(t.replicas[2]->impl.held.size() == 1);
  }
  t.replicas[2]->server->Shutdown();
  // The channel sees the death (asynchronously) ...
  bool seen = false;
  for (int i = 0; i < 2500 && !seen; ++i) {
    seen = !t.channel->Replicas()[2].status.ok();
    if (!seen) absl::SleepFor(absl::Milliseconds(2));
  }
  REQUIRE(seen);
  CHECK(held[2].Get().status().code() == absl::StatusCode::kUnavailable);
  // ... and every later call goes to replicas 0 and 1, none failing.
  const auto before = t.Echoes();
  REQUIRE(t.Echo(60) == 60);
  auto after = t.Echoes();
  CHECK(after[2] == before[2]);
  CHECK(after[0] + after[1] == before[0] + before[1] + 60);
  t.replicas[0]->impl.Release();
  t.replicas[1]->impl.Release();
  CHECK(held[0].Get().ok());
  CHECK(held[1].Get().ok());

  // Replica 2 restarts on its address: redialled, it gets calls again.
  t.replicas[2].reset();
  t.replicas[2] = std::make_unique<Replica>(t.device, t.addresses[2]);
  bool back = false;
  for (int i = 0; i < 1000 && !back; ++i) {
    back = t.channel->Replicas()[2].status.ok();
    if (!back) absl::SleepFor(absl::Milliseconds(5));
  }
  REQUIRE(back);
  CHECK(t.channel->Replicas()[2].connections == 2);
  REQUIRE(t.Echo(30) == 30);
  CHECK(t.replicas[2]->impl.echoes.load() == 10);
}

TEST_CASE("balance: the engine is switched and upgraded live, carrying its counts",
          "[rpc][balance]") {
  Three t("round_robin");
  REQUIRE(t.Echo(30) == 30);
  REQUIRE(t.channel->engines().Configure("balance", R"({"policy": "daronpon"})").ok());
  CHECK(t.balance->options().policy == pr::BalancePolicy::kDaronpon);
  REQUIRE(t.Echo(30) == 30);
  CHECK(t.Echoes() == std::vector<int>{20, 20, 20});
  auto next = pr::LoadBalancePolicy::Create("balance", {.policy = pr::BalancePolicy::kPowerOfTwo});
  REQUIRE(next.ok());
  REQUIRE(t.channel->engines().Upgrade("balance", *next).ok());
  CHECK((*next)->stats().picks == std::vector<uint64_t>{20, 20, 20});
  REQUIRE(t.Echo(30) == 30);
  auto s = (*next)->stats();
  CHECK(s.picks[0] + s.picks[1] + s.picks[2] == 90);
  CHECK(s.outstanding == std::vector<uint32_t>{0, 0, 0});
  auto bad = t.channel->engines().Configure("balance", R"({"policy": "fastest"})");
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.status().message()).find("round_robin") != std::string::npos);
}

TEST_CASE("balance: a replica refusing the handshake fails the connect, naming it",
          "[rpc][balance]") {
  auto device = *pt::Device::Create({.backend = pt::Backend::kTcp, .local_address = "127.0.0.1"});
  Replica good(device, "127.0.0.1:0");
  // A server with no service: the handshake is refused with NotFound.
  auto empty = std::move(*pr::Server::Create(device, {}));
  REQUIRE(empty->Start().ok());
  auto c = pr::Channel::ConnectReplicas(device, {good.server->address(), empty->address()},
                                        {&Kinds::Descriptor()});
  CHECK(c.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(c.status().message()).find("replica 1") != std::string::npos);
  empty->Shutdown();
}
