// Idempotent retry: a method the .proto marks idempotent (idempotency_level IDEMPOTENT or
// NO_SIDE_EFFECTS) is started again by a reconnecting Channel when its try fails with Unavailable
// (the server died with it), once the server is back, within the call's deadline; a method that
// is not marked never is.
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "catch2/catch.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/server.hpp"
#include "retry.plexus.hpp"
#include "test_server.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
using plexus::rpctest::retry::Req;
using plexus::rpctest::retry::Resp;
using plexus::rpctest::retry::Store;

namespace {

// Incarnation 1 parks every call (it dies with them); later ones answer at once.
class StoreImpl : public Store::Service {
 public:
  explicit StoreImpl(int incarnation) : incarnation_(incarnation) {}
  void GetAsync(pr::ServerCall<Req, Resp> call) override { Serve(std::move(call)); }
  void PutAsync(pr::ServerCall<Req, Resp> call) override { Serve(std::move(call)); }
  void AddAsync(pr::ServerCall<Req, Resp> call) override { Serve(std::move(call)); }
  std::atomic<int> calls{0};

 private:
  void Serve(pr::ServerCall<Req, Resp> call) {
    ++calls;
    if (incarnation_ == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      held_.push_back(std::move(call));
      return;
    }
    call.response()->id = call.request().id;
    call.response()->incarnation = incarnation_;
    call.Finish(absl::OkStatus());
  }
  int incarnation_;
  std::mutex mu_;
  std::vector<pr::ServerCall<Req, Resp>> held_;
};

using Incarnation = plexus::rpctest::TestServer<StoreImpl>;
using plexus::rpctest::LoopbackTcp;

pr::ChannelOptions FastRedial(bool retry) {
  pr::ChannelOptions o;
  o.reconnect_backoff = absl::Milliseconds(20);
  o.max_reconnect_backoff = absl::Milliseconds(100);
  o.retry_idempotent = retry;
  return o;
}

// Waits (5 s at most) until `incarnation` has received `n` calls.
void AwaitCalls(const Incarnation& incarnation, int n) {
  const absl::Time reached_by = absl::Now() + absl::Seconds(5);
  while (incarnation.impl.calls < n && absl::Now() < reached_by) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  REQUIRE(incarnation.impl.calls == n);
}

// A Get (id 1) parked on a first incarnation, which the test then kills.
struct GetOnDyingServer {
  GetOnDyingServer(std::shared_ptr<pt::Device> device, bool retry, absl::Duration timeout)
      : first(std::make_unique<Incarnation>(device, "127.0.0.1:0", 1)) {
    auto connected = pr::Channel::Connect(device, first->server->address(), {&Store::Descriptor()},
                                          FastRedial(retry));
    REQUIRE(connected.ok());
    channel = *connected;
    stub = std::make_unique<Store::Stub>(channel);
    get.emplace(stub->Get(req, {.timeout = timeout}));
    AwaitCalls(*first, 1);
  }
  std::unique_ptr<Incarnation> first;
  std::shared_ptr<pr::Channel> channel;
  std::unique_ptr<Store::Stub> stub;
  Req req{1};
  std::optional<pr::PendingCall<Resp>> get;
};

}  // namespace

TEST_CASE("protoc-gen-plexus reads idempotency_level", "[rpc][retry]") {
  const pr::ServiceDesc& d = Store::Descriptor();
  REQUIRE(d.method_count == 3);
  CHECK(d.methods[0].idempotent);        // Get: NO_SIDE_EFFECTS
  CHECK(d.methods[1].idempotent);        // Put: IDEMPOTENT
  CHECK_FALSE(d.methods[2].idempotent);  // Add
}

TEST_CASE("an idempotent call survives a server restart; others fail with Unavailable",
          "[rpc][retry]") {
  auto device = LoopbackTcp();
  auto first = std::make_unique<Incarnation>(device, "127.0.0.1:0", 1);
  const std::string address = first->server->address();
  auto ch = pr::Channel::Connect(device, address, {&Store::Descriptor()}, FastRedial(true));
  REQUIRE(ch.ok());
  Store::Stub stub(*ch);
  Req get_req{7}, put_req{8}, add_req{9};
  auto get = stub.Get(get_req, {.timeout = absl::Seconds(10)});
  auto put = stub.Put(put_req, {.timeout = absl::Seconds(10)});
  auto add = stub.Add(add_req, {.timeout = absl::Seconds(10)});
  AwaitCalls(*first, 3);

  first.reset();  // dies with the three calls
  auto a = add.Get();
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().code() == absl::StatusCode::kUnavailable);

  absl::SleepFor(absl::Milliseconds(100));  // an outage: the idempotent calls wait
  CHECK_FALSE(get.WaitFor(absl::ZeroDuration()));
  Incarnation second(device, address, 2);
  auto g = get.Get();
  REQUIRE(g.ok());
  CHECK((*g)->id == 7);
  CHECK((*g)->incarnation == 2);
  auto p = put.Get();
  REQUIRE(p.ok());
  CHECK((*p)->id == 8);
  CHECK((*p)->incarnation == 2);
  CHECK(second.impl.calls == 2);  // the two idempotent calls, once each; never Add
}

TEST_CASE("an idempotent retry ends at the deadline; retry_idempotent = false does not retry",
          "[rpc][retry]") {
  auto device = LoopbackTcp();
  SECTION("deadline") {
    GetOnDyingServer call(device, true, absl::Milliseconds(400));
    const absl::Time t0 = absl::Now();
    call.first.reset();  // nobody comes back
    auto g = call.get->Get();
    REQUIRE_FALSE(g.ok());
    CHECK(g.status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(absl::Now() - t0 < absl::Seconds(2));
  }
  SECTION("not retried") {
    GetOnDyingServer call(device, false, absl::Seconds(10));
    call.first.reset();
    auto g = call.get->Get();
    REQUIRE_FALSE(g.ok());
    CHECK(g.status().code() == absl::StatusCode::kUnavailable);
  }
  SECTION("cancelled while waiting for the connection") {
    GetOnDyingServer call(device, true, absl::Seconds(10));
    call.first.reset();
    absl::SleepFor(absl::Milliseconds(100));
    const absl::Time t0 = absl::Now();
    call.get->Cancel();
    auto g = call.get->Get();
    REQUIRE_FALSE(g.ok());
    CHECK(g.status().code() == absl::StatusCode::kCancelled);
    CHECK(absl::Now() - t0 < absl::Seconds(2));
  }
}
