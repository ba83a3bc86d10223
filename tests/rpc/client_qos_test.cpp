// Global QoS on the client: a "qos" engine in a Channel's chain sends its calls through the
// reorder point of the channel's transport Device. While the window is full, calls wait there
// without blocking their callers and leave latency class first (the server's rule: weighted share,
// aging), across the device's channels; deadlines and cancellation work while queued, and nothing
// is lost or sent twice across attach, upgrade and detach. The tests assert the order in which
// the server's parked handler received the calls (window 1), never timing.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "holding_service.hpp"
#include "kinds.plexus.hpp"
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

// The server has no engine of its own.
struct Setup : plexus::rpctest::OrderedHoldServer {
  // A channel with a window of `window` calls and a qos engine configured by `json`.
  std::shared_ptr<pr::Channel> Connect(size_t window, const char* json = nullptr) {
    auto c = pr::Channel::Connect(device, server->address(), {&Kinds::Descriptor()},
                                  {.max_in_flight = window});
    REQUIRE(c.ok());
    if (json != nullptr) {
      auto q = pr::QosPolicy::Create("qos", {});
      REQUIRE(q.ok());
      REQUIRE((*q)->Configure(json).ok());
      REQUIRE((*c)->engines().Attach(*q).ok());
    }
    return *c;
  }
  void WaitQueued(const pr::Channel& ch, size_t n) {
    plexus::rpctest::WaitUntil([&] { return ch.qos().queued == n; }, "calls queued at the client");
  }
};

pr::CallOptions Class(const char* cls, absl::Duration timeout = absl::Seconds(20)) {
  return {.timeout = timeout, .metadata = {{"plexus-qos", cls}}};
}

// Holds of ids `ids` from `stub`, each of class `cls`; the requests live in `reqs`.
struct Calls {
  std::vector<std::unique_ptr<Inner>> reqs;
  std::vector<pr::PendingCall<Inner>> pending;
  void Start(Kinds::Stub& stub, std::vector<int> ids, const char* cls) {
    for (int id : ids) {
      reqs.push_back(std::make_unique<Inner>());
      reqs.back()->id = id;
      pending.push_back(stub.Hold(*reqs.back(), Class(cls)));
    }
  }
  void ExpectAllOk() {
    for (auto& p : pending) CHECK(p.Get().ok());
  }
};

std::vector<int> Range(int from, int to) {
  std::vector<int> v;
  for (int i = from; i <= to; ++i) v.push_back(i);
  return v;
}

}  // namespace

TEST_CASE("client qos: with a full window, latency calls leave before queued bulk calls",
          "[rpc][qos][client]") {
  Setup s;
  auto ch = s.Connect(1, R"({"max_wait_ms": 3600000})");
  Kinds::Stub stub(ch);
  Calls calls;
  calls.Start(stub, {0}, "bulk");  // parked at the server: the window (1) is full
  s.WaitHeld(1);
  calls.Start(stub, Range(1, 20), "bulk");  // the callers are not blocked: the calls queue
  s.WaitQueued(*ch, 20);
  calls.Start(stub, Range(100, 104), "latency");
  s.WaitQueued(*ch, 25);
  s.ReleaseInTurn(26);
  calls.ExpectAllOk();
  std::vector<int> want = {0, 100, 101, 102, 103, 104};
  for (int i = 1; i <= 20; ++i) want.push_back(i);
  CHECK(s.impl.Order() == want);
  const pr::QosStats st = ch->qos();
  CHECK(st.latency == 5);
  CHECK(st.bulk == 21);
  CHECK(st.queued == 0);
  CHECK(st.max_queued == 25);
}

TEST_CASE("client qos: the weighted share and aging let bulk calls through", "[rpc][qos][client]") {
  SECTION("latency_burst 2: one bulk call after every two latency calls") {
    Setup s;
    auto ch = s.Connect(1, R"({"latency_burst": 2, "max_wait_ms": 3600000})");
    Kinds::Stub stub(ch);
    Calls calls;
    calls.Start(stub, {0}, "bulk");
    s.WaitHeld(1);
    calls.Start(stub, Range(1, 3), "bulk");
    calls.Start(stub, Range(100, 105), "latency");
    s.WaitQueued(*ch, 9);
    s.ReleaseInTurn(10);
    calls.ExpectAllOk();
    CHECK(s.impl.Order() == std::vector<int>{0, 100, 101, 1, 102, 103, 2, 104, 105, 3});
    CHECK(ch->qos().shared == 2);
  }
  SECTION("max_wait 300 ms: bulk calls that waited longer send one bulk call first") {
    Setup s;
    auto ch = s.Connect(1, R"({"latency_burst": 100, "max_wait_ms": 300})");
    Kinds::Stub stub(ch);
    Calls calls;
    calls.Start(stub, {0}, "bulk");
    s.WaitHeld(1);
    calls.Start(stub, Range(1, 3), "bulk");
    absl::SleepFor(absl::Milliseconds(600));
    calls.Start(stub, Range(100, 102), "latency");
    s.WaitQueued(*ch, 6);
    s.ReleaseInTurn(7);
    calls.ExpectAllOk();
    CHECK(s.impl.Order() == std::vector<int>{0, 1, 100, 101, 102, 2, 3});
    CHECK(ch->qos().aged == 1);
  }
}

TEST_CASE("client qos: the runtime's channels share one reorder point (max_in_flight)",
          "[rpc][qos][client]") {
  Setup s;
  // Two channels on one device, each with its own window of 4; at most 1 call of the two in flight.
  const char* json = R"({"max_in_flight": 1, "max_wait_ms": 3600000})";
  auto bulk_ch = s.Connect(4, json);
  auto lat_ch = s.Connect(4, json);
  Kinds::Stub bulk(bulk_ch), lat(lat_ch);
  Calls calls;
  calls.Start(bulk, {0}, "bulk");
  s.WaitHeld(1);
  calls.Start(bulk, Range(1, 3), "bulk");
  calls.Start(lat, Range(100, 101), "latency");  // its own window is free, the runtime's is not
  s.WaitQueued(*bulk_ch, 5);
  CHECK(lat_ch->qos().queued == 5);  // the same reorder point
  s.ReleaseInTurn(6);
  calls.ExpectAllOk();
  CHECK(s.impl.Order() == std::vector<int>{0, 100, 101, 1, 2, 3});
}

TEST_CASE("client qos: deadlines and cancellation while queued", "[rpc][qos][client]") {
  Setup s;
  auto ch = s.Connect(1, R"({"max_wait_ms": 3600000})");
  Kinds::Stub stub(ch);
  Calls calls;
  calls.Start(stub, {0}, "bulk");
  s.WaitHeld(1);
  Inner late_req, cancelled_req, next_req;
  late_req.id = 1;
  cancelled_req.id = 2;
  next_req.id = 3;
  const absl::Time t0 = absl::Now();
  auto late = stub.Hold(late_req, Class("latency", absl::Milliseconds(200)));
  auto cancelled = stub.Hold(cancelled_req, Class("latency"));
  auto next = stub.Hold(next_req, Class("bulk"));
  s.WaitQueued(*ch, 3);
  cancelled.Cancel();
  auto c = cancelled.Get();
  CHECK(c.status().code() == absl::StatusCode::kCancelled);
  CHECK(absl::Now() - t0 < absl::Milliseconds(200));  // at once, not at some deadline
  auto l = late.Get();
  const absl::Duration waited = absl::Now() - t0;
  CHECK(l.status().code() == absl::StatusCode::kDeadlineExceeded);
  INFO(l.status().message());
  CHECK(std::string(l.status().message()).find("in the QoS queue") != std::string::npos);
  CHECK(waited >= absl::Milliseconds(200));
  CHECK(waited < absl::Seconds(5));
  CHECK(ch->qos().queued == 1);
  s.ReleaseInTurn(2);
  calls.ExpectAllOk();
  CHECK(next.Get().ok());
  CHECK(s.impl.Order() == std::vector<int>{0, 3});  // neither of the two reached the server
}

TEST_CASE("client qos: closing the channel fails its queued calls", "[rpc][qos][client]") {
  Setup s;
  auto ch = s.Connect(1, "{}");
  Kinds::Stub stub(ch);
  Calls calls;
  calls.Start(stub, {0}, "bulk");
  s.WaitHeld(1);
  calls.Start(stub, Range(1, 3), "bulk");
  s.WaitQueued(*ch, 3);
  ch->Close();
  for (auto& p : calls.pending) CHECK(!p.Get().ok());
  CHECK(s.impl.Order() == std::vector<int>{0});
}

TEST_CASE("client qos: attach, upgrade, configure and detach under load lose no call",
          "[rpc][qos][client]") {
  Setup s;
  auto ch = s.Connect(2);
  Kinds::Stub stub(ch);
  constexpr int kThreads = 4, kCalls = 150;
  std::atomic<int> ok{0}, failed{0}, callbacks{0};
  // Per thread: the first call whose callback did not run exactly once in time, checked after
  // the join (Catch2 assertions are not thread-safe).
  std::vector<std::string> not_once(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        AllKinds req;
        req.i32 = t * 1000 + i;
        pr::CallOptions o = Class(i % 3 == 0 ? "latency" : "bulk");
        if (i % 2 == 0) {
          auto r = stub.EchoSync(req, o);
          (r.ok() ? ok : failed).fetch_add(1);
        } else {
          // Shared with the callback, which may still run after this thread gave up on it.
          auto done = std::make_shared<std::atomic<int>>(0);
          stub.Echo(req, o, [&, done](absl::StatusOr<pr::Reply<AllKinds>> r) {
            (r.ok() ? ok : failed).fetch_add(1);
            callbacks.fetch_add(1);
            done->fetch_add(1);
          });
          for (int k = 0; k < 20000 && done->load() == 0; ++k)
            absl::SleepFor(absl::Microseconds(100));
          if (const int runs = done->load(); runs != 1) {
            not_once[t] = absl::StrCat("call ", i, ": callback ran ", runs, " times");
            return;
          }
        }
      }
    });
  }
  for (int round = 0; round < 6; ++round) {
    auto q = pr::QosPolicy::Create("qos", {.small_bytes = 64});
    REQUIRE(q.ok());
    REQUIRE(ch->engines().Attach(*q).ok());
    absl::SleepFor(absl::Milliseconds(10));
    auto q2 = pr::QosPolicy::Create("qos", {.small_bytes = 1 << 20});
    REQUIRE(ch->engines().Upgrade("qos", *q2).ok());
    REQUIRE(ch->engines().Configure("qos", R"({"latency_burst": 1})").ok());
    absl::SleepFor(absl::Milliseconds(10));
    REQUIRE(ch->engines().Detach("qos").ok());
    absl::SleepFor(absl::Milliseconds(5));
  }
  for (auto& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t << ": " << not_once[t]);
    REQUIRE(not_once[t].empty());
  }
  CHECK(failed.load() == 0);
  CHECK(ok.load() == kThreads * kCalls);
  CHECK(callbacks.load() == kThreads * kCalls / 2);
  CHECK(s.impl.echoes.load() == kThreads * kCalls);  // each sent exactly once
  CHECK(ch->qos().queued == 0);
}
