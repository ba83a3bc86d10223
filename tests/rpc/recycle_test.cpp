// Recycled per-call objects (libs/rpc/src/recycle.hpp): the free list stays bounded, a recycled
// object comes back looking new, and a Channel whose call states are reused after a deadline or a
// cancel never hands a late response of an earlier call to the call that reuses its state.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "channel_impl.hpp"
#include "kinds.plexus.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/server.hpp"
#include "recycle.hpp"
#include "test_server.hpp"

namespace pr = plexus::rpc;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Empty;
using plexus::rpctest::Inner;
using plexus::rpctest::Kinds;

namespace {

struct Thing {
  std::vector<int> data;  // keeps its capacity across uses
  int uses = 0;           // what a call left behind: Recycle() clears it
  void Recycle() {
    data.clear();
    uses = 0;
  }
};

// Hold parks the call; Release answers every parked call with id = request id + 1.
class ParkingService : public Kinds::Service {
 public:
  absl::Status Echo(pr::ServerContext&, const AllKinds& req, AllKinds* resp) override {
    *resp = req;
    return absl::OkStatus();
  }
  void HoldAsync(pr::ServerCall<Inner, Inner> call) override {
    std::lock_guard<std::mutex> lock(mu);
    held.push_back(std::move(call));
  }
  absl::Status Fail(pr::ServerContext&, const Inner&, Empty*) override { return absl::OkStatus(); }
  size_t Held() {
    std::lock_guard<std::mutex> lock(mu);
    return held.size();
  }
  // In arrival order: an earlier call's late response leaves before the next call's.
  void ReleaseAll() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& c : held) {
      c.response()->id = c.request().id + 1;
      c.Finish(absl::OkStatus());
    }
    held.clear();
  }
  std::mutex mu;
  std::vector<pr::ServerCall<Inner, Inner>> held;
};

pr::CallOptions Within(absl::Duration timeout) {
  pr::CallOptions o;
  o.timeout = timeout;
  return o;
}

void WaitHeld(ParkingService& s, size_t n) {
  for (int i = 0; i < 1000 && s.Held() < n; ++i) absl::SleepFor(absl::Milliseconds(2));
  REQUIRE(s.Held() == n);
}

}  // namespace

TEST_CASE("the recycler keeps at most its bound and hands objects back looking new",
          "[rpc][recycle]") {
  auto pool = std::make_shared<pr::internal::Recycler<Thing>>(3);
  std::vector<std::shared_ptr<Thing>> out;
  for (int i = 0; i < 10; ++i) {
    out.push_back(pool->Take());
    out.back()->data.assign(100, i);
    out.back()->uses = 1;
  }
  CHECK(pool->idle() == 0);
  out.clear();  // ten come back: three are kept, seven freed
  CHECK(pool->idle() == 3);
  auto again = pool->Take();
  CHECK(pool->reused() == 1);
  CHECK(again->uses == 0);
  CHECK(again->data.empty());
  CHECK(again->data.capacity() >= 100);  // the point of recycling
  // A handed-out object outlives the recycler's last other owner.
  pool.reset();
  again->uses = 2;
  again.reset();
}

// Server calls use shared_from_this: a recycled one keeps a weak reference to its last control
// block, and with it that block's deleter. The recycler must still go when its owner lets go.
struct SelfThing : std::enable_shared_from_this<SelfThing> {
  void Recycle() {}
};

TEST_CASE("a recycler is freed with its owner, idle objects included", "[rpc][recycle]") {
  std::weak_ptr<pr::internal::Recycler<SelfThing>> watch;
  {
    auto pool = std::make_shared<pr::internal::Recycler<SelfThing>>(4);
    watch = pool;
    auto a = pool->Take();
    CHECK(a->shared_from_this() == a);
    a.reset();
    CHECK(pool->idle() == 1);
  }
  CHECK(watch.expired());  // it held itself through the idle object's deleter before
}

TEST_CASE("a call state reused after a deadline or a cancel never takes a stale response",
          "[rpc][recycle]") {
  auto device = plexus::rpctest::LoopbackTcp();
  plexus::rpctest::TestServer<ParkingService> server(device, "");
  auto ch = pr::Channel::Connect(device, server.server->address(), {&Kinds::Descriptor()},
                                 {.max_in_flight = 4});
  REQUIRE(ch.ok());
  Kinds::Stub stub(*ch);
  const uint64_t reused_before = pr::Channel::Impl::Of(**ch).call_states->reused();
  constexpr int kRounds = 20;
  for (int i = 0; i < kRounds; ++i) {
    {
      // Call A ends without its response: deadline (even rounds) or cancel (odd rounds).
      Inner a{"a", i, {}, nullptr};
      if (i % 2 == 0) {
        auto r = stub.HoldSync(a, Within(absl::Milliseconds(20)));
        REQUIRE_FALSE(r.ok());
        CHECK(r.status().code() == absl::StatusCode::kDeadlineExceeded);
      } else {
        auto pending = stub.Hold(a);
        WaitHeld(server.impl, 1);
        pending.Cancel();
        auto r = pending.Get();
        REQUIRE_FALSE(r.ok());
        CHECK(r.status().code() == absl::StatusCode::kCancelled);
      }
    }  // A's state goes back to the channel's free list; call B takes it.
    Inner b{"b", 1000 + i, {}, nullptr};
    auto pending = stub.Hold(b, Within(absl::Seconds(10)));
    WaitHeld(server.impl, 2);
    server.impl.ReleaseAll();  // A's late response (A's call id) first, then B's
    auto r = pending.Get();
    REQUIRE(r.ok());
    CHECK((*r)->id == 1000 + i + 1);  // B's own response, never A's (id i + 1)
  }
  // Every round reused a state (A's, for B; B's, for the next A).
  CHECK(pr::Channel::Impl::Of(**ch).call_states->reused() - reused_before >= kRounds);
  // The channel keeps working on recycled states.
  AllKinds req;
  req.i32 = 77;
  auto ok = stub.EchoSync(req, Within(absl::Seconds(10)));
  REQUIRE(ok.ok());
  CHECK((*ok)->i32 == 77);
}
