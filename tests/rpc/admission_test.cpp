// Admission control: calls beyond N outstanding per connection or per method fail at once with
// RESOURCE_EXHAUSTED, on a Server's chain and on a Channel's; the count carries over a live
// upgrade and a reconfiguration.
#include <memory>
#include <mutex>
#include <vector>

#include "catch2/catch.hpp"
#include "holding_service.hpp"
#include "kinds.plexus.hpp"
#include "plexus/rpc/admin.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/policies.hpp"
#include "plexus/rpc/server.hpp"
#include "test_server.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Empty;
using plexus::rpctest::Inner;
using plexus::rpctest::Kinds;

namespace {

using HoldImpl = plexus::rpctest::HoldingService;

// An inproc server that answers its parked calls before it shuts down.
struct Setup : plexus::rpctest::TestServer<HoldImpl> {
  Setup() : TestServer(*pt::Device::Create({.backend = pt::Backend::kInproc}), "") {}
  ~Setup() { impl.Release(); }
  std::shared_ptr<pr::Channel> Connect() {
    auto c = pr::Channel::Connect(device, server->address(), {&Kinds::Descriptor()});
    REQUIRE(c.ok());
    return *c;
  }
  // Waits until the server holds n calls (at most 5 s).
  void WaitHeld(size_t n) {
    for (int i = 0; i < 5000 && impl.Held() < n; ++i) absl::SleepFor(absl::Milliseconds(1));
    REQUIRE(impl.Held() == n);
  }
};

}  // namespace

TEST_CASE("admission: a server refuses calls beyond N outstanding per connection",
          "[rpc][admission]") {
  Setup s;
  auto adm = pr::AdmissionPolicy::Create("adm", {.max_outstanding = 2});
  REQUIRE(adm.ok());
  REQUIRE(s.server->engines().Attach(*adm).ok());
  auto a = s.Connect();
  auto b = s.Connect();
  Kinds::Stub sa(a), sb(b);
  std::vector<Inner> reqs(4);
  auto h1 = sa.Hold(reqs[0], {.timeout = absl::Seconds(10)});
  auto h2 = sa.Hold(reqs[1], {.timeout = absl::Seconds(10)});
  s.WaitHeld(2);
  auto refused = sa.HoldSync(reqs[2], {.timeout = absl::Seconds(10)});
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(refused.status().message()).find("admission 'adm'") != std::string::npos);
  CHECK(std::string(refused.status().message()).find("(limit 2)") != std::string::npos);
  // Another connection has its own count.
  auto h3 = sb.Hold(reqs[3], {.timeout = absl::Seconds(10)});
  s.WaitHeld(3);
  CHECK((*adm)->admitted() == 3);
  CHECK((*adm)->refused() == 1);
  // One answered: connection a has room for one more.
  s.impl.ReleaseOne();
  CHECK(h1.Get().ok());
  auto h4 = sa.Hold(reqs[2], {.timeout = absl::Seconds(10)});
  s.WaitHeld(3);
  CHECK((*adm)->refused() == 1);

  // Live upgrade: the new version recounts the calls in flight (2 on a), so a is still full.
  auto next = pr::AdmissionPolicy::Create("adm", {.max_outstanding = 2});
  REQUIRE(s.server->engines().Upgrade("adm", *next).ok());
  CHECK(sa.HoldSync(reqs[0], {.timeout = absl::Seconds(10)}).status().code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK((*next)->refused() == 2);
  CHECK((*next)->admitted() == 4);
  // A higher limit by configuration admits one more.
  REQUIRE(s.server->engines().Configure("adm", R"({"max_outstanding": 3})").ok());
  auto h5 = sa.Hold(reqs[0], {.timeout = absl::Seconds(10)});
  s.WaitHeld(4);
  CHECK(s.server->engines().Configure("adm", R"({"max_outstanding": 0})").status().code() ==
        absl::StatusCode::kInvalidArgument);
  while (s.impl.Held() > 0) s.impl.ReleaseOne();
  for (auto* h : {&h2, &h3, &h4, &h5}) CHECK(h->Get().ok());
}

TEST_CASE("admission: per method, other methods pass", "[rpc][admission]") {
  Setup s;
  auto adm = pr::MakePolicy("admission", "adm", R"({"max_outstanding": 1, "scope": "method"})",
                            {&Kinds::Descriptor()});
  REQUIRE(adm.ok());
  REQUIRE(s.server->engines().Attach(*adm).ok());
  auto a = s.Connect();
  auto b = s.Connect();
  Kinds::Stub sa(a), sb(b);
  Inner r1, r2;
  auto h1 = sa.Hold(r1, {.timeout = absl::Seconds(10)});
  s.WaitHeld(1);
  // The method's one slot is taken, whichever connection asks.
  CHECK(sb.HoldSync(r2, {.timeout = absl::Seconds(10)}).status().code() ==
        absl::StatusCode::kResourceExhausted);
  AllKinds e;
  CHECK(sb.EchoSync(e, {.timeout = absl::Seconds(10)}).ok());
  s.impl.ReleaseOne();
  CHECK(h1.Get().ok());
  CHECK(sb.HoldSync(r2, {.timeout = absl::Milliseconds(100)}).status().code() ==
        absl::StatusCode::kDeadlineExceeded);  // admitted (and held past its deadline)
  auto bad = pr::MakePolicy("admission", "x", R"({"max_outstanding": 1, "scope": "rack"})", {});
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("admission: on a channel, refused before anything is sent", "[rpc][admission]") {
  Setup s;
  auto a = s.Connect();
  auto adm = pr::AdmissionPolicy::Create("adm", {.max_outstanding = 1});
  REQUIRE(a->engines().Attach(*adm).ok());
  Kinds::Stub sa(a);
  Inner r1, r2;
  auto h1 = sa.Hold(r1, {.timeout = absl::Seconds(10)});
  s.WaitHeld(1);
  CHECK(sa.HoldSync(r2, {.timeout = absl::Seconds(10)}).status().code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(s.impl.Held() == 1);  // the refused call never reached the server
  s.impl.ReleaseOne();
  CHECK(h1.Get().ok());
  CHECK((*adm)->outstanding(0) == 0);
}

TEST_CASE("admission: a call whose client died frees its slot when its handler finishes",
          "[rpc][admission]") {
  // Before the fix, a response dropped with its dead connection never reached OnComplete, so the
  // slot stayed taken for ever and the next client was refused.
  Setup s;
  auto adm = pr::AdmissionPolicy::Create(
      "adm", {.scope = pr::AdmissionOptions::Scope::kMethod, .max_outstanding = 1});
  REQUIRE(s.server->engines().Attach(*adm).ok());
  Inner r1, r2;
  {
    auto a = s.Connect();
    Kinds::Stub sa(a);
    auto h1 = sa.Hold(r1, {.timeout = absl::Seconds(10)});
    s.WaitHeld(1);
    a->Close();
    CHECK(h1.Get().status().code() == absl::StatusCode::kCancelled);
  }
  // Wait until the server dropped the connection, then the handler answers the orphaned call.
  const absl::Time until = absl::Now() + absl::Seconds(20);  // a loaded machine's reaper is slow
  while (!s.server->Connections().empty() && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  REQUIRE(s.server->Connections().empty());
  s.impl.ReleaseOne();
  CHECK((*adm)->outstanding(pr::AdmissionPolicy::MethodKey(
            {.service = &Kinds::Descriptor(), .method = &Kinds::Descriptor().methods[1]})) == 0);
  auto b = s.Connect();
  Kinds::Stub sb(b);
  auto h2 = sb.Hold(r2, {.timeout = absl::Seconds(10)});
  s.WaitHeld(1);
  CHECK((*adm)->refused() == 0);
  s.impl.ReleaseOne();
  CHECK(h2.Get().ok());
}
