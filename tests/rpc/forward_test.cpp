// Server-side Daronpon forwarding (Server::ForwardTo), two replicas on tcp 127.0.0.1: a loaded
// replica sends a call one hop to its idle peer exactly when the peer's load + delta is below its
// own; a forwarded call is never forwarded again; the peer's response reaches the original
// client once; the peer's death fails the forwarded calls with UNAVAILABLE within their deadline
// and later calls are served locally.
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "catch2/catch.hpp"
#include "channel_impl.hpp"
#include "holding_service.hpp"
#include "kinds.plexus.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/server.hpp"
#include "test_server.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Inner;
using plexus::rpctest::Kinds;
using plexus::rpctest::OrderedHold;

namespace {

// A replica answers its parked calls before it shuts down.
struct Replica : plexus::rpctest::TestServer<OrderedHold> {
  explicit Replica(std::shared_ptr<pt::Device> device)
      : TestServer(std::move(device), "127.0.0.1:0") {}
  ~Replica() { impl.Release(); }
};

struct Pair {
  Pair() {
    device = *pt::Device::Create({.backend = pt::Backend::kTcp, .local_address = "127.0.0.1"});
    a = std::make_unique<Replica>(device);
    b = std::make_unique<Replica>(device);
  }
  void Link() {
    REQUIRE(a->server->ForwardTo({b->server->address()}).ok());
    REQUIRE(b->server->ForwardTo({a->server->address()}).ok());
  }
  std::shared_ptr<pr::Channel> ConnectA() {
    auto c = pr::Channel::Connect(device, a->server->address(), {&Kinds::Descriptor()});
    REQUIRE(c.ok());
    return *c;
  }
  void WaitHeld(size_t at_a, size_t at_b) {
    plexus::rpctest::WaitUntil([&] { return a->impl.Held() == at_a && b->impl.Held() == at_b; },
                               "held calls");
  }
  std::shared_ptr<pt::Device> device;
  std::unique_ptr<Replica> a, b;
};

// A Hold call flagged as forwarded, as a peer replica's forwarding sends it (the runtime's
// internal start: clients cannot set the flag).
pr::PendingCall<Inner> HoldForwarded(pr::Channel& ch, const Inner& req, absl::Duration timeout) {
  const pr::ServiceDesc& s = Kinds::Descriptor();
  const pr::MethodDesc* hold = nullptr;
  for (size_t i = 0; i < s.method_count; ++i) {
    if (s.methods[i].name == std::string_view("Hold")) hold = &s.methods[i];
  }
  REQUIRE(hold != nullptr);
  return pr::PendingCall<Inner>(pr::internal::CallAccess::Make(pr::Channel::Impl::Of(ch).StartOnce(
      ch, s, *hold, &req, {.timeout = timeout}, nullptr, /*forwarded=*/true)));
}

}  // namespace

TEST_CASE("forward: an overloaded replica forwards to an idle peer; replies arrive once",
          "[rpc][forward]") {
  Pair p;
  p.Link();
  auto ch = p.ConnectA();
  Kinds::Stub stub(ch);
  std::vector<Inner> reqs(10);
  std::vector<std::atomic<int>> replies(10);
  std::vector<std::atomic<int>> ok(10);
  for (int i = 0; i < 10; ++i) {
    reqs[i].id = i;
    stub.Hold(reqs[i], {.timeout = absl::Seconds(20)}, [&, i](absl::StatusOr<pr::Reply<Inner>> r) {
      ++replies[i];
      if (r.ok()) ++ok[i];
    });
    // One at a time: each decision sees the previous one's effect (A's count or B's estimate).
    plexus::rpctest::WaitUntil([&] { return p.a->impl.Held() + p.b->impl.Held() == size_t(i + 1); },
                               "arrival");
  }
  // Daronpon with delta 1 at A: forward when load(B) + 1 < load(A), where load(B) counts the
  // calls A forwarded there. 0 0 -> A, 0 1 -> A, 0 2 -> B, 1 2 -> A, 1 3 -> B, ...
  CHECK(p.a->impl.Order() == std::vector<int>{0, 1, 3, 5, 7, 9});
  CHECK(p.b->impl.Order() == std::vector<int>{2, 4, 6, 8});
  auto fa = p.a->server->forwarding();
  auto fb = p.b->server->forwarding();
  CHECK(fa.forwarded == 4);
  CHECK(fa.per_peer == std::vector<uint64_t>{4});
  CHECK(fa.local_load == 6);  // forwarded calls are not A's load
  CHECK(fb.received == 4);
  CHECK(fb.forwarded == 0);
  CHECK(fb.local_load == 4);

  // A synchronous call now goes to B too (4 + 1 < 6) and its response comes back intact.
  AllKinds req;
  req.text = "through the peer";
  std::vector<int32_t> ints = {3, 1, 4};
  req.ints = pr::Repeated<int32_t>(ints.data(), ints.size());
  auto echo = stub.EchoSync(req, {.timeout = absl::Seconds(20)});
  REQUIRE(echo.ok());
  CHECK((*echo)->text == "through the peer");
  REQUIRE((*echo)->ints.size() == 3);
  CHECK((*echo)->ints[2] == 4);
  CHECK(p.b->impl.echoes == 1);
  CHECK(p.a->impl.echoes == 0);
  CHECK(p.a->server->forwarding().forwarded == 5);

  p.b->impl.Release();
  p.a->impl.Release();
  plexus::rpctest::WaitUntil(
      [&] {
        for (auto& r : replies) {
          if (r.load() != 1) return false;
        }
        return true;
      },
      "every reply");
  absl::SleepFor(absl::Milliseconds(50));  // a duplicate would arrive by now
  for (int i = 0; i < 10; ++i) {
    CHECK(replies[i] == 1);
    CHECK(ok[i] == 1);
  }
}

TEST_CASE("forward: a forwarded call is served where it lands, never forwarded again",
          "[rpc][forward]") {
  Pair p;
  auto ch = p.ConnectA();
  Kinds::Stub stub(ch);
  std::vector<Inner> reqs(5);
  for (int i = 0; i < 5; ++i) reqs[i].id = i;
  std::vector<pr::PendingCall<Inner>> calls;
  for (int i = 0; i < 3; ++i) calls.push_back(stub.Hold(reqs[i], {.timeout = absl::Seconds(20)}));
  p.WaitHeld(3, 0);
  p.Link();  // A: 3 calls being handled, B idle: 0 + 1 < 3
  // A call flagged as forwarded (as a peer would send it) stays at A.
  calls.push_back(HoldForwarded(*ch, reqs[3], absl::Seconds(20)));
  p.WaitHeld(4, 0);
  CHECK(p.a->server->forwarding().received == 1);
  CHECK(p.a->server->forwarding().forwarded == 0);
  // The same call unflagged goes to B, which gets it flagged and serves it (B's own view of A
  // does not matter: it may not forward it back).
  calls.push_back(stub.Hold(reqs[4], {.timeout = absl::Seconds(20)}));
  p.WaitHeld(4, 1);
  CHECK(p.a->server->forwarding().forwarded == 1);
  CHECK(p.b->server->forwarding().received == 1);
  CHECK(p.b->server->forwarding().forwarded == 0);
  CHECK(p.b->impl.Order() == std::vector<int>{4});
  p.a->impl.Release();
  p.b->impl.Release();
  for (auto& c : calls) CHECK(c.Get().ok());
}

TEST_CASE("forward: the peer's death fails forwarded calls with UNAVAILABLE within the deadline",
          "[rpc][forward]") {
  Pair p;
  REQUIRE(p.a->server
              ->ForwardTo({p.b->server->address()},
                          {.channel = {.reconnect_backoff = absl::Milliseconds(50)}})
              .ok());
  auto ch = p.ConnectA();
  Kinds::Stub stub(ch);
  std::vector<Inner> reqs(8);
  std::vector<pr::PendingCall<Inner>> calls;
  for (int i = 0; i < 5; ++i) {
    reqs[i].id = i;
    calls.push_back(stub.Hold(reqs[i], {.timeout = absl::Seconds(5)}));
    plexus::rpctest::WaitUntil([&] { return p.a->impl.Held() + p.b->impl.Held() == size_t(i + 1); },
                               "arrival");
  }
  p.WaitHeld(3, 2);  // 2 and 4 went to B
  const absl::Time t0 = absl::Now();
  p.b->server->Shutdown();
  for (int i : {2, 4}) {
    auto r = calls[i].Get();
    CHECK(r.status().code() == absl::StatusCode::kUnavailable);
  }
  CHECK(absl::Now() - t0 < absl::Seconds(4));
  // B is down: Daronpon still prefers it (its estimate is low) but A serves the calls itself.
  for (int i = 5; i < 8; ++i) {
    reqs[i].id = i;
    calls.push_back(stub.Hold(reqs[i], {.timeout = absl::Seconds(5)}));
  }
  p.WaitHeld(6, 2);
  CHECK(p.a->server->forwarding().forwarded == 2);
  CHECK(p.a->server->forwarding().peer_unusable >= 1);
  p.a->impl.Release();
  for (int i : {0, 1, 3, 5, 6, 7}) CHECK(calls[i].Get().ok());
}
