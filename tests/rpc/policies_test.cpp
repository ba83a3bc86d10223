// The rate-limit and content-ACL policies: exact token-bucket counts on a fake clock, per-method
// and per-connection buckets, fail and wait modes, ACL matching on typed fields (nested, enum,
// optional), configuration errors naming the rule, and the private copy a client-side content
// policy checks (what is sent is what was checked).
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "kinds.plexus.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/policies.hpp"
#include "plexus/rpc/server.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Color;
using plexus::rpctest::Empty;
using plexus::rpctest::Inner;
using plexus::rpctest::Kinds;

namespace {

class EchoImpl : public Kinds::Service {
 public:
  absl::Status Echo(pr::ServerContext&, const AllKinds& req, AllKinds* resp) override {
    ++calls;
    {
      std::lock_guard<std::mutex> lock(mu);
      texts.emplace_back(req.text);
    }
    *resp = req;
    return absl::OkStatus();
  }
  void HoldAsync(pr::ServerCall<Inner, Inner> call) override {
    ++calls;
    call.Finish(absl::OkStatus());
  }
  absl::Status Fail(pr::ServerContext&, const Inner&, Empty*) override { return absl::OkStatus(); }
  std::atomic<int> calls{0};
  std::mutex mu;
  std::vector<std::string> texts;
};

struct Pair {
  Pair() {
    pt::DeviceOptions o;
    o.backend = pt::Backend::kInproc;
    device = *pt::Device::Create(o);
    server = std::move(*pr::Server::Create(device, pr::ServerOptions()));
    REQUIRE(server->Register(&impl).ok());
    REQUIRE(server->Start().ok());
    auto c = pr::Channel::Connect(device, server->address(), {&Kinds::Descriptor()});
    REQUIRE(c.ok());
    channel = *c;
  }
  ~Pair() {
    channel.reset();
    server->Shutdown();
  }
  std::shared_ptr<pt::Device> device;
  EchoImpl impl;
  std::unique_ptr<pr::Server> server;
  std::shared_ptr<pr::Channel> channel;
};

struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1000);
  std::vector<absl::Duration> slept;
  pr::RateLimitOptions With(pr::RateLimitOptions o) {
    o.clock = [this] { return now; };
    o.sleep = [this](absl::Duration d) {
      slept.push_back(d);
      now += d;
    };
    return o;
  }
};

using Scope = pr::RateLimitOptions::Scope;
using OverLimit = pr::RateLimitOptions::OverLimit;
pr::RateLimitOptions Opts(double rate, double burst, Scope scope = Scope::kConnection,
                          OverLimit over = OverLimit::kFail) {
  pr::RateLimitOptions o;
  o.rate = rate;
  o.burst = burst;
  o.scope = scope;
  o.over_limit = over;
  return o;
}

pr::CallOptions TenSeconds() {
  pr::CallOptions o;
  o.timeout = absl::Seconds(10);
  return o;
}

pr::CallInfo Info(int method, uint64_t connection = 0) {
  pr::CallInfo c;
  c.service = &Kinds::Descriptor();
  c.method = &Kinds::Descriptor().methods[method];
  c.connection_id = connection;
  return c;
}

}  // namespace

TEST_CASE("rate limit: token bucket counts on a fake clock", "[rpc][policies]") {
  FakeClock clk;
  auto rl = pr::RateLimitPolicy::Create("rl", clk.With(Opts(10, 3)));
  REQUIRE(rl.ok());
  auto& p = **rl;
  const pr::CallInfo c = Info(0);
  for (int i = 0; i < 3; ++i) CHECK(p.OnRequest(c).ok());
  absl::Status over = p.OnRequest(c);
  CHECK(over.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(over.message()) ==
        "rate limit 'rl': plexus.rpctest.Kinds/Echo is over 10 calls/s (burst 3) on connection 0");
  clk.now += absl::Milliseconds(100);  // one token
  CHECK(p.OnRequest(c).ok());
  CHECK(!p.OnRequest(c).ok());
  clk.now += absl::Seconds(10);  // refills to the burst, not beyond
  for (int i = 0; i < 3; ++i) CHECK(p.OnRequest(c).ok());
  CHECK(!p.OnRequest(c).ok());
  CHECK(p.admitted() == 7);
  CHECK(p.rejected() == 3);
  CHECK(clk.slept.empty());
}

TEST_CASE("rate limit: per-method and per-connection buckets", "[rpc][policies]") {
  FakeClock clk;
  auto per_method = *pr::RateLimitPolicy::Create("m", clk.With(Opts(1, 2, Scope::kMethod)));
  // Two connections share a method's bucket; two methods do not.
  CHECK(per_method->OnRequest(Info(0, 1)).ok());
  CHECK(per_method->OnRequest(Info(0, 2)).ok());
  CHECK(per_method->OnRequest(Info(0, 1)).code() == absl::StatusCode::kResourceExhausted);
  CHECK(per_method->OnRequest(Info(1, 1)).ok());
  CHECK(per_method->OnRequest(Info(1, 2)).ok());
  CHECK(per_method->rejected() == 1);

  auto per_conn = *pr::RateLimitPolicy::Create("c", clk.With(Opts(1, 2)));
  // Two methods share a connection's bucket; two connections do not.
  CHECK(per_conn->OnRequest(Info(0, 1)).ok());
  CHECK(per_conn->OnRequest(Info(1, 1)).ok());
  CHECK(per_conn->OnRequest(Info(2, 1)).code() == absl::StatusCode::kResourceExhausted);
  CHECK(per_conn->OnRequest(Info(0, 2)).ok());
  CHECK(per_conn->OnRequest(Info(0, 2)).ok());
  CHECK(per_conn->admitted() == 4);
  CHECK(per_conn->rejected() == 1);
}

TEST_CASE("rate limit: wait mode reserves tokens and respects the deadline", "[rpc][policies]") {
  FakeClock clk;
  auto p = *pr::RateLimitPolicy::Create(
      "w", clk.With(Opts(10, 1, Scope::kConnection, OverLimit::kWait)));
  pr::CallInfo c = Info(0);
  CHECK(p->OnRequest(c).ok());
  CHECK(clk.slept.empty());
  CHECK(p->OnRequest(c).ok());  // waits one token's time
  REQUIRE(clk.slept.size() == 1);
  CHECK(clk.slept[0] == absl::Milliseconds(100));
  c.deadline = clk.now + absl::Milliseconds(50);  // the next token is 100 ms away
  absl::Status late = p->OnRequest(c);
  CHECK(late.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(late.message()).find("would wait 100ms for a token") != std::string::npos);
  CHECK(clk.slept.size() == 1);
  c.deadline = clk.now + absl::Milliseconds(100);  // exactly enough
  CHECK(p->OnRequest(c).ok());
  CHECK(clk.slept.size() == 2);
  CHECK(clk.slept[1] == absl::Milliseconds(100));
  CHECK(p->admitted() == 3);
  CHECK(p->rejected() == 1);
}

TEST_CASE("rate limit: infinite rate admits everything; bad settings are refused",
          "[rpc][policies]") {
  auto p = *pr::RateLimitPolicy::Create("inf", pr::RateLimitOptions());
  for (int i = 0; i < 1000; ++i) REQUIRE(p->OnRequest(Info(0)).ok());
  CHECK(p->admitted() == 1000);
  CHECK(pr::RateLimitPolicy::Create("z", Opts(0, 1)).status().message() ==
        "policy 'z': rate limit: rate must be > 0 calls/s (infinity: unlimited), not 0");
  CHECK(pr::RateLimitPolicy::Create("b", Opts(5, 0.5)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(p->Reconfigure(-1, 1).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(p->Reconfigure(1e-9, 1).ok());
  CHECK(p->OnRequest(Info(0)).ok());  // the bucket was full; now one token, then none
  CHECK(p->OnRequest(Info(0)).code() == absl::StatusCode::kResourceExhausted);
}

TEST_CASE("rate limit on a channel fails the calls over the limit before they are sent",
          "[rpc][policies]") {
  Pair f;
  auto rl = *pr::RateLimitPolicy::Create("rl", Opts(1e-6, 2));
  REQUIRE(f.channel->engines().Attach(rl).ok());
  Kinds::Stub stub(f.channel);
  AllKinds req;
  int ok = 0, exhausted = 0;
  for (int i = 0; i < 5; ++i) {
    auto r = stub.EchoSync(req, TenSeconds());
    if (r.ok()) ++ok;
    if (r.status().code() == absl::StatusCode::kResourceExhausted) ++exhausted;
  }
  CHECK(ok == 2);
  CHECK(exhausted == 3);
  CHECK(f.impl.calls.load() == 2);
}

TEST_CASE("acl: configuration errors name the rule", "[rpc][policies]") {
  const std::vector<const pr::ServiceDesc*> svc{&Kinds::Descriptor()};
  auto e1 = pr::AclPolicy::Create("a", svc, {{"r1", "plexus.rpctest.Kinds/Nope", "text", {}}});
  CHECK(e1.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(e1.status().message()) ==
        "acl 'a': rule 'r1': no method 'plexus.rpctest.Kinds/Nope' (known: "
        "plexus.rpctest.Kinds/Echo, plexus.rpctest.Kinds/Hold, plexus.rpctest.Kinds/Fail)");
  auto e2 =
      pr::AclPolicy::Create("a", svc, {{"r2", "plexus.rpctest.Kinds/Echo", "inner.nope", {}}});
  CHECK(std::string(e2.status().message()) ==
        "acl 'a': rule 'r2': plexus.rpctest.Inner has no field 'nope'");
  auto e3 = pr::AclPolicy::Create("a", svc, {{"r3", "plexus.rpctest.Kinds/Echo", "names", {}}});
  CHECK(e3.status().code() == absl::StatusCode::kInvalidArgument);
  auto e4 = pr::AclPolicy::Create("a", svc, {{"r4", "plexus.rpctest.Kinds/Echo", "i32", {"x"}}});
  CHECK(std::string(e4.status().message()) ==
        "acl 'a': rule 'r4': value 'x' is not a value of field i32");
}

TEST_CASE("acl: typed fields, nested and optional, on the server's chain", "[rpc][policies]") {
  Pair f;
  auto acl =
      pr::AclPolicy::Create("acl", {&Kinds::Descriptor()},
                            {{"no-evil", "plexus.rpctest.Kinds/Echo", "text", {"evil", "worse"}},
                             {"no-blue", "plexus.rpctest.Kinds/Echo", "color", {"7"}},
                             {"no-root", "plexus.rpctest.Kinds/Echo", "inner.name", {"root"}},
                             {"no-42", "plexus.rpctest.Kinds/Echo", "maybe_int", {"42"}}});
  REQUIRE(acl.ok());
  REQUIRE(f.server->engines().Attach(*acl).ok());
  Kinds::Stub stub(f.channel);
  auto run = [&](AllKinds req) { return stub.EchoSync(req, TenSeconds()); };
  AllKinds ok;
  ok.text = "fine";
  ok.color = Color::RED;
  CHECK(run(ok).ok());
  AllKinds evil = ok;
  evil.text = "worse";
  auto r = run(evil);
  CHECK(r.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(r.status().message()) ==
        "acl 'acl': rule 'no-evil' denies plexus.rpctest.Kinds/Echo: field text is 'worse'");
  AllKinds blue = ok;
  blue.color = Color::BLUE;
  CHECK(std::string(run(blue).status().message()) ==
        "acl 'acl': rule 'no-blue' denies plexus.rpctest.Kinds/Echo: field color is '7'");
  Inner root;
  root.name = "root";
  AllKinds nested = ok;
  nested.inner = &root;
  CHECK(run(nested).status().code() == absl::StatusCode::kPermissionDenied);
  AllKinds unset = ok;  // maybe_int unset: its default 0 is not compared
  CHECK(run(unset).ok());
  AllKinds set42 = ok;
  set42.maybe_int = 42;
  CHECK(run(set42).status().code() == absl::StatusCode::kPermissionDenied);
  CHECK((*acl)->checked() == 6);
  CHECK((*acl)->denied() == 4);
  CHECK(f.impl.calls.load() == 2);
}

// A policy after the ACL that scribbles on the application's request memory while the chain
// runs, as another application thread could between the check and the send.
class Scribbler : public pr::Policy {
 public:
  explicit Scribbler(char* app_text) : app_text_(app_text) {}
  std::string name() const override { return "scribbler"; }
  absl::Status OnRequest(const pr::CallInfo& call) override {
    std::memcpy(app_text_, "evil", 4);
    saw_private = call.request != nullptr && call.request != app_request;
    return absl::OkStatus();
  }
  char* app_text_;
  const void* app_request = nullptr;
  bool saw_private = false;
};

TEST_CASE("acl on a channel checks a private copy, and that copy is what is sent",
          "[rpc][policies]") {
  Pair f;
  auto acl = *pr::AclPolicy::Create("acl", {&Kinds::Descriptor()},
                                    {{"no-evil", "plexus.rpctest.Kinds/Echo", "text", {"evil"}}});
  char text[] = "good";
  auto scribbler = std::make_shared<Scribbler>(text);
  REQUIRE(f.channel->engines().Attach(acl).ok());
  REQUIRE(f.channel->engines().Attach(scribbler, "acl").ok());
  Kinds::Stub stub(f.channel);
  AllKinds req;
  req.text = std::string_view(text, 4);
  scribbler->app_request = &req;
  auto r = stub.EchoSync(req, TenSeconds());
  REQUIRE(r.ok());
  CHECK(std::string(text) == "evil");  // the application's memory changed after the check...
  CHECK((*r)->text == "good");         // ...but the checked bytes were sent
  CHECK(scribbler->saw_private);
  std::lock_guard<std::mutex> lock(f.impl.mu);
  CHECK(f.impl.texts == std::vector<std::string>{"good"});
  CHECK(acl->checked() == 1);
  CHECK(acl->denied() == 0);
}
