// Global QoS on a Server: calls of all connections pass one reorder point in front of the
// handlers; latency-class calls overtake queued bulk ones, the weighted share and aging keep bulk
// calls moving, and nothing is lost or run twice across attach, upgrade and detach. The tests
// assert the order in which the handler received the calls (a parked HoldAsync handler and a
// concurrency of 1), never timing.
#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "holding_service.hpp"
#include "kinds.plexus.hpp"
#include "plexus/rpc/admin.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/qos.hpp"
#include "plexus/rpc/server.hpp"
#include "test_server.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Inner;
using plexus::rpctest::Kinds;
using plexus::rpctest::OrderedHold;

namespace {

struct Setup : plexus::rpctest::OrderedHoldServer {
  // Connect without the assertion, for threads (Catch2 assertions are not thread-safe).
  absl::StatusOr<std::shared_ptr<pr::Channel>> TryConnect() {
    return pr::Channel::Connect(device, server->address(), {&Kinds::Descriptor()});
  }
  std::shared_ptr<pr::Channel> Connect() {
    auto c = TryConnect();
    REQUIRE(c.ok());
    return *c;
  }
  void WaitQueued(size_t n) {
    plexus::rpctest::WaitUntil([&] { return server->qos().queued == n; }, "queued calls");
  }
};

pr::CallOptions Class(const char* cls) {
  return {.timeout = absl::Seconds(20), .metadata = {{"plexus-qos", cls}}};
}

// One held bulk call from `bulk`, then `nb` more bulk calls (ids 1..nb), then `nl` latency calls
// from `lat` (ids 100..), each wait ending when the server has them (queued or parked).
struct Flood {
  Flood(Setup& s, Kinds::Stub& bulk, Kinds::Stub& lat, int nb, int nl, bool queued,
        absl::Duration pause = absl::ZeroDuration())
      : reqs(1 + nb + nl) {
    for (int i = 0; i <= nb; ++i) reqs[i].id = i;
    for (int i = 0; i < nl; ++i) reqs[1 + nb + i].id = 100 + i;
    calls.push_back(bulk.Hold(reqs[0], Class("bulk")));
    s.WaitHeld(1);
    for (int i = 1; i <= nb; ++i) calls.push_back(bulk.Hold(reqs[i], Class("bulk")));
    // The bulk calls are at the server (queued, or parked with the policy off) before the first
    // latency call leaves: the arrival order is known.
    if (queued) {
      s.WaitQueued(nb);
    } else {
      s.WaitHeld(1 + nb);
    }
    absl::SleepFor(pause);
    for (int i = 0; i < nl; ++i) calls.push_back(lat.Hold(reqs[1 + nb + i], Class("latency")));
    if (queued) {
      s.WaitQueued(nb + nl);
    } else {
      s.WaitHeld(1 + nb + nl);
    }
  }
  void CheckAllOk() {
    for (auto& c : calls) CHECK(c.Get().ok());
  }
  std::vector<Inner> reqs;
  std::vector<pr::PendingCall<Inner>> calls;
};

std::shared_ptr<pr::QosPolicy> Qos(pr::QosSchedule schedule) {
  auto q = pr::QosPolicy::Create("qos", {.schedule = schedule});
  REQUIRE(q.ok());
  return *q;
}

}  // namespace

TEST_CASE("qos: latency calls of another connection overtake a bulk flood; off: arrival order",
          "[rpc][qos]") {
  Setup s;
  auto a = s.Connect();
  auto b = s.Connect();
  Kinds::Stub bulk(a), lat(b);
  SECTION("policy off: every call reaches the handler in arrival order") {
    Flood f(s, bulk, lat, 20, 5, /*queued=*/false);
    std::vector<int> want;
    for (int i = 0; i <= 20; ++i) want.push_back(i);
    for (int i = 0; i < 5; ++i) want.push_back(100 + i);
    CHECK(s.impl.Order() == want);
    s.impl.Release();
    f.CheckAllOk();
  }
  SECTION("policy on (1 handler at a time): the latency calls go right after the running one") {
    REQUIRE(
        s.server->engines().Attach(Qos({.max_concurrent = 1, .max_wait = absl::Hours(1)})).ok());
    Flood f(s, bulk, lat, 20, 5, /*queued=*/true);
    s.ReleaseInTurn(26);
    std::vector<int> want = {0, 100, 101, 102, 103, 104};
    for (int i = 1; i <= 20; ++i) want.push_back(i);
    CHECK(s.impl.Order() == want);
    f.CheckAllOk();
    const auto st = s.server->qos();
    CHECK(st.latency == 5);
    CHECK(st.bulk == 21);
    CHECK(st.max_queued == 25);
    auto q = std::dynamic_pointer_cast<pr::QosPolicy>(s.server->engines().Find("qos"));
    CHECK(q->latency_calls() == 5);
    CHECK(q->bulk_calls() == 21);
  }
}

TEST_CASE("qos: the weighted share and aging let bulk calls through", "[rpc][qos]") {
  Setup s;
  auto a = s.Connect();
  auto b = s.Connect();
  Kinds::Stub bulk(a), lat(b);
  SECTION("latency_burst 2: one bulk call after every two latency calls") {
    REQUIRE(s.server->engines()
                .Attach(Qos({.max_concurrent = 1, .latency_burst = 2, .max_wait = absl::Hours(1)}))
                .ok());
    Flood f(s, bulk, lat, 3, 6, /*queued=*/true);
    s.ReleaseInTurn(10);
    CHECK(s.impl.Order() == std::vector<int>{0, 100, 101, 1, 102, 103, 2, 104, 105, 3});
    CHECK(s.server->qos().shared == 2);  // the third bulk call went when no latency call waited
    f.CheckAllOk();
  }
  SECTION("max_wait 100 ms: bulk waiting 300 ms gets one call ahead of newer latency calls") {
    REQUIRE(
        s.server->engines()
            .Attach(Qos(
                {.max_concurrent = 1, .latency_burst = 1000, .max_wait = absl::Milliseconds(100)}))
            .ok());
    Flood f(s, bulk, lat, 3, 3, /*queued=*/true, absl::Milliseconds(300));
    s.ReleaseInTurn(7);
    // Bulk 1 goes first (its class waited 300 ms > 100 ms); then it was just served, so the
    // latency calls go, then the rest of the bulk calls.
    CHECK(s.impl.Order() == std::vector<int>{0, 1, 100, 101, 102, 2, 3});
    CHECK(s.server->qos().aged == 1);
    f.CheckAllOk();
  }
  SECTION("without aging (max_wait 1 h) the same calls are overtaken") {
    REQUIRE(
        s.server->engines()
            .Attach(Qos({.max_concurrent = 1, .latency_burst = 1000, .max_wait = absl::Hours(1)}))
            .ok());
    Flood f(s, bulk, lat, 3, 3, /*queued=*/true, absl::Milliseconds(300));
    s.ReleaseInTurn(7);
    CHECK(s.impl.Order() == std::vector<int>{0, 100, 101, 102, 1, 2, 3});
    CHECK(s.server->qos().aged == 0);
    f.CheckAllOk();
  }
}

TEST_CASE("qos: classification by method and size; configuration errors name the field",
          "[rpc][qos]") {
  Setup s;
  auto q = pr::QosPolicy::Create(
      "qos", {.latency_methods = {"plexus.rpctest.Kinds/Echo"}, .small_bytes = 0});
  REQUIRE(q.ok());
  REQUIRE(s.server->engines().Attach(*q).ok());
  auto a = s.Connect();
  Kinds::Stub stub(a);
  AllKinds req;
  req.text = "hello";
  REQUIRE(stub.EchoSync(req, {.timeout = absl::Seconds(10)}).ok());
  Inner in;
  REQUIRE(stub.FailSync(in, {.timeout = absl::Seconds(10)}).ok());
  CHECK((*q)->latency_calls() == 1);
  CHECK((*q)->bulk_calls() == 1);
  REQUIRE((*q)->Configure(R"({"small_bytes": 100000, "latency_methods": []})").ok());
  REQUIRE(stub.EchoSync(req, {.timeout = absl::Seconds(10)}).ok());
  CHECK((*q)->latency_calls() == 2);
  auto bad = (*q)->Configure(R"({"max_concurrent": 0})");
  CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.message()).find("max_concurrent") != std::string::npos);
  CHECK((*q)->Configure(R"({"speed": 1})").code() == absl::StatusCode::kInvalidArgument);
  auto made = pr::MakePolicy("qos", "q2", R"({"small_bytes": 64, "max_wait_ms": 5})", {});
  REQUIRE(made.ok());
  CHECK((*made)->kind() == "qos");
  CHECK((*made)->DescribeJson().find("\"small_bytes\":64") != std::string::npos);
}

TEST_CASE("qos: no call lost or run twice across attach, upgrade, reconfigure and detach",
          "[rpc][qos]") {
  Setup s;
  constexpr int kThreads = 4, kCalls = 150;
  std::atomic<int> ok{0}, failed{0};
  std::vector<absl::Status> connected(kThreads);  // each thread's, checked after the join
  std::vector<std::thread> threads;
  std::atomic<bool> go{false};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto ch = s.TryConnect();
      connected[t] = ch.status();
      if (!ch.ok()) return;
      Kinds::Stub stub(*ch);
      while (!go.load()) std::this_thread::yield();
      int last = -1;
      for (int i = 0; i < kCalls; ++i) {
        AllKinds req;
        req.i32 = i;
        auto r = stub.EchoSync(req, Class(t % 2 == 0 ? "latency" : "bulk"));
        if (r.ok() && (*r)->i32 == i && i == last + 1) {
          ++ok;
          last = i;
        } else {
          ++failed;
        }
      }
    });
  }
  go = true;
  for (int round = 0; round < 6; ++round) {
    absl::SleepFor(absl::Milliseconds(5));
    REQUIRE(s.server->engines().Attach(Qos({.max_concurrent = 2, .latency_burst = 3})).ok());
    absl::SleepFor(absl::Milliseconds(5));
    auto next = pr::MakePolicy("qos", "qos", R"({"max_concurrent": 1})", {});
    REQUIRE(next.ok());
    REQUIRE(s.server->engines().Upgrade("qos", *next).ok());
    REQUIRE(s.server->engines().Configure("qos", R"({"latency_burst": 1})").ok());
    absl::SleepFor(absl::Milliseconds(5));
    REQUIRE(s.server->engines().Detach("qos").ok());
  }
  for (auto& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t << ": " << connected[t]);
    REQUIRE(connected[t].ok());
  }
  CHECK(failed == 0);
  CHECK(ok == kThreads * kCalls);
  CHECK(s.impl.echoes == kThreads * kCalls);
  CHECK(s.server->qos().queued == 0);
}
