// The rate-limit and content-ACL policies: exact token-bucket counts on a fake clock, per-method
// and per-connection buckets, fail and wait modes, ACL matching on typed fields (nested, enum,
// optional), configuration errors naming the rule, and the private copy a client-side content
// policy checks (what is sent is what was checked).
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
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
      received.push_back(
          {std::string(req.text), req.i32, req.inner ? std::string(req.inner->name) : "",
           std::string(reinterpret_cast<const char*>(req.blob.data()), req.blob.size()),
           req.names.empty() ? "" : std::string(req.names[0]), req.ints.empty() ? 0 : req.ints[0]});
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
  struct Received {
    std::string text;
    int32_t i32;
    std::string inner_name, blob, name0;
    int32_t int0;
  };
  std::vector<Received> received;
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

TEST_CASE("rate limit: threads sharing buckets take every token exactly once", "[rpc][policies]") {
  // A frozen clock: exactly `burst` calls of each bucket can ever pass, however the threads
  // interleave; two connections' buckets alternate, so the last-used bucket keeps changing hands
  // and a reconfiguration (same rate, same burst) settles every bucket while calls run.
  const absl::Time frozen = absl::FromUnixSeconds(1000);
  pr::RateLimitOptions o = Opts(1, 5000);
  o.clock = [frozen] { return frozen; };
  auto p = *pr::RateLimitPolicy::Create("shared", o);
  constexpr int kThreads = 4, kCalls = 4000;
  std::atomic<int> passed[2] = {0, 0};
  std::atomic<bool> reconfigure_failed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        const int conn = (i + t) % 2;
        if (p->OnRequest(Info(0, conn)).ok()) passed[conn].fetch_add(1);
        if (t == 0 && i % 500 == 0 && !p->Reconfigure(1, 5000).ok()) reconfigure_failed = true;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK_FALSE(reconfigure_failed.load());
  CHECK(passed[0].load() == 5000);
  CHECK(passed[1].load() == 5000);
  CHECK(p->admitted() == 10000);
  CHECK(p->rejected() == kThreads * kCalls - 10000);
  CHECK(p->DescribeJson().find("\"buckets\":2,") != std::string::npos);
}

TEST_CASE("rate limit: a high rate's leases never let the bucket and its threads exceed a burst",
          "[rpc][policies]") {
  // 10^6 calls/s, burst 1000: a call through the bucket also leases its thread 64 tokens while
  // the bucket keeps half its burst, and the thread spends them without the bucket. Thread A
  // calls once (its token and a lease of 64), then waits while this thread drains the bucket; a
  // second of refill is then capped at the burst less A's 64, and A still spends its 64 with the
  // bucket empty: 1000 in all after the refill, however the tokens were split.
  FakeClock clk;
  auto p = *pr::RateLimitPolicy::Create("lease", clk.With(Opts(1e6, 1000)));
  const pr::CallInfo c = Info(0);
  auto drain = [&] {
    int n = 0;
    while (p->OnRequest(c).ok()) ++n;
    return n;
  };
  std::atomic<int> phase{0};
  std::atomic<int> a_first{-1}, a_later{-1};
  std::thread a([&] {
    a_first = p->OnRequest(c).ok() ? 1 : 0;
    phase = 1;
    while (phase.load() != 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    int n = 0;
    while (p->OnRequest(c).ok()) ++n;
    a_later = n;
  });
  while (phase.load() != 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(a_first.load() == 1);
  const int first_drain = drain();
  CHECK(first_drain == 1000 - 1 - 64);  // what A's call and lease left in the bucket
  clk.now += absl::Seconds(1);          // 10^6 tokens' worth, capped
  const int second_drain = drain();
  CHECK(second_drain == 1000 - 64);
  phase = 2;
  a.join();
  CHECK(a_later.load() == 64);  // its lease, spent with the bucket empty
  CHECK(p->admitted() == static_cast<uint64_t>(1 + first_drain + second_drain + 64));
  CHECK(p->rejected() == 3);
}

TEST_CASE("rate limit: threads spending leases on a frozen clock admit exactly the burst",
          "[rpc][policies]") {
  // Each thread calls until refused; a thread is refused only once its own lease is spent and
  // the bucket is empty, so every token of the burst is spent exactly once.
  const absl::Time frozen = absl::FromUnixSeconds(1000);
  pr::RateLimitOptions o = Opts(1e7, 20000);
  o.clock = [frozen] { return frozen; };
  auto p = *pr::RateLimitPolicy::Create("leases", o);
  constexpr int kThreads = 4;
  std::atomic<int> passed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      const pr::CallInfo c = Info(0);
      while (p->OnRequest(c).ok()) passed.fetch_add(1);
    });
  }
  for (auto& th : threads) th.join();
  CHECK(passed.load() == 20000);
  CHECK(p->admitted() == 20000);
  CHECK(p->rejected() == kThreads);
}

TEST_CASE("rate limit on its own clock: a burst, then tokens at the rate as time passes",
          "[rpc][policies]") {
  auto p = *pr::RateLimitPolicy::Create("real", Opts(200, 4));  // one token per 5 ms
  const pr::CallInfo c = Info(0);
  for (int i = 0; i < 4; ++i) CHECK(p->OnRequest(c).ok());
  CHECK(p->OnRequest(c).code() == absl::StatusCode::kResourceExhausted);
  // 100 ms on the wall clock: 20 tokens' worth, capped at the burst of 4.
  const absl::Time t0 = absl::Now();
  absl::SleepFor(absl::Milliseconds(100));
  int admitted = 0;
  while (p->OnRequest(c).ok()) ++admitted;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  CHECK(admitted >= 4);
  CHECK(admitted <= 4 + static_cast<int>(seconds * 200) + 1);
  // Drained: the next token comes about 5 ms later, not at once.
  CHECK(p->OnRequest(c).code() == absl::StatusCode::kResourceExhausted);
  absl::SleepFor(absl::Milliseconds(12));
  CHECK(p->OnRequest(c).ok());
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

namespace {

// Records the start each call showed it; declares the bits it is given.
class StartRecorder : public pr::Policy {
 public:
  explicit StartRecorder(std::string name, uint32_t hooks)
      : name_(std::move(name)), hooks_(hooks) {}
  std::string name() const override { return name_; }
  uint32_t hooks() const override { return hooks_; }
  absl::Status OnRequest(const pr::CallInfo& call) override {
    std::lock_guard<std::mutex> lock(mu);
    starts.push_back(call.start);
    return absl::OkStatus();
  }
  std::mutex mu;
  std::vector<absl::Time> starts;

 private:
  const std::string name_;
  const uint32_t hooks_;
};

}  // namespace

TEST_CASE(
    "a channel reads the clock for a call only when an engine reads its start or it has a "
    "deadline",
    "[rpc][policies]") {
  Pair f;
  auto blind = std::make_shared<StartRecorder>("blind", pr::kHookRequest);
  REQUIRE(f.channel->engines().Attach(blind).ok());
  Kinds::Stub stub(f.channel);
  AllKinds req;
  REQUIRE(stub.EchoSync(req).ok());
  const absl::Time before = absl::Now();
  REQUIRE(stub.EchoSync(req, TenSeconds()).ok());  // the deadline needs the start
  auto reader = std::make_shared<StartRecorder>("reader", pr::kHookRequest | pr::kReadsStart);
  REQUIRE(f.channel->engines().Attach(reader, "blind").ok());
  REQUIRE(stub.EchoSync(req).ok());  // an engine reads it: every engine sees it
  const absl::Time after = absl::Now();
  REQUIRE(blind->starts.size() == 3);
  CHECK(blind->starts[0] == absl::Time());
  CHECK(blind->starts[1] >= before);
  CHECK(blind->starts[1] <= after);
  CHECK(blind->starts[2] >= blind->starts[1]);
  CHECK(blind->starts[2] <= after);
  REQUIRE(reader->starts.size() == 1);
  CHECK(reader->starts[0] == blind->starts[2]);
}

TEST_CASE("metrics counts a call without a start but keeps it out of the latency histogram",
          "[rpc][policies]") {
  pr::MetricsPolicy metrics;
  const pr::ServiceDesc& svc = Kinds::Descriptor();
  pr::CallInfo call;
  call.service = &svc;
  call.method = &svc.methods[0];
  metrics.OnComplete(call, absl::OkStatus());  // no start: an engine upgraded in mid-call
  call.start = absl::Now() - absl::Microseconds(100);
  metrics.OnComplete(call, absl::OkStatus());
  const auto got = metrics.Get();
  REQUIRE(got.size() == 1);
  const pr::MetricsPolicy::MethodMetrics& m = got.begin()->second;
  CHECK(m.calls == 2);
  uint64_t in_histogram = 0;
  for (uint64_t c : m.latency_us) in_histogram += c;
  CHECK(in_histogram == 1);
  CHECK(m.QuantileUpperUs(1.0) >= 100);
  CHECK(m.QuantileUpperUs(1.0) < 1e6);
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

// The same guarantee for scalars and nested fields: the ACL's fields (a scalar, a string, a
// string in a nested message) are copied when it is reached; a field it does not read is still
// gathered from the application's memory (no copy), so the scribbler's change to it is sent.
class FieldScribbler : public pr::Policy {
 public:
  FieldScribbler(AllKinds* req, char* inner_name, uint8_t* blob)
      : req_(req), inner_name_(inner_name), blob_(blob) {}
  std::string name() const override { return "scribbler"; }
  absl::Status OnRequest(const pr::CallInfo&) override {
    req_->i32 = 666;
    std::memcpy(inner_name_, "root", 4);
    std::memcpy(blob_, "BLOB", 4);
    return absl::OkStatus();
  }
  AllKinds* req_;
  char* inner_name_;
  uint8_t* blob_;
};

namespace {

// An ACL on Kinds/Echo over a string, a scalar and a nested string: text "evil", i32 666 and
// inner.name "root" are denied.
std::shared_ptr<pr::AclPolicy> ThreeFieldAcl() {
  auto acl =
      pr::AclPolicy::Create("acl", {&Kinds::Descriptor()},
                            {{"no-evil", "plexus.rpctest.Kinds/Echo", "text", {"evil"}},
                             {"no-666", "plexus.rpctest.Kinds/Echo", "i32", {"666"}},
                             {"no-root", "plexus.rpctest.Kinds/Echo", "inner.name", {"root"}}});
  REQUIRE(acl.ok());
  return *acl;
}

}  // namespace

TEST_CASE("acl on a channel: scalar and nested fields are checked on the copy that is sent",
          "[rpc][policies]") {
  Pair f;
  auto acl = ThreeFieldAcl();
  char text[] = "good";
  char inner_name[] = "leaf";
  uint8_t blob[] = {'b', 'l', 'o', 'b'};
  Inner inner;
  inner.name = std::string_view(inner_name, 4);
  AllKinds req;
  req.text = std::string_view(text, 4);
  req.i32 = 1;
  req.inner = &inner;
  req.blob = pr::Bytes(blob, 4);
  REQUIRE(f.channel->engines().Attach(acl).ok());
  REQUIRE(f.channel->engines()
              .Attach(std::make_shared<FieldScribbler>(&req, inner_name, blob), "acl")
              .ok());
  Kinds::Stub stub(f.channel);
  auto r = stub.EchoSync(req, TenSeconds());
  REQUIRE(r.ok());
  CHECK(req.i32 == 666);  // the application's memory changed after the check...
  CHECK(std::string(inner_name) == "root");
  std::lock_guard<std::mutex> lock(f.impl.mu);
  REQUIRE(f.impl.received.size() == 1);
  const auto& got = f.impl.received[0];
  CHECK(got.i32 == 1);  // ...but the checked values were sent
  CHECK(got.inner_name == "leaf");
  CHECK(got.text == "good");
  CHECK(got.blob == "BLOB");  // not a field of the ACL: sent from the application's memory
  CHECK(acl->denied() == 0);
}

// A second content policy reading the field the first one checked reads (and re-copies) the
// private copy, not the application's memory, changed in between: what the first checked is
// what the server gets.
class TextScribbler : public pr::Policy {
 public:
  explicit TextScribbler(char* text) : text_(text) {}
  std::string name() const override { return "scribbler"; }
  absl::Status OnRequest(const pr::CallInfo&) override {
    std::memcpy(text_, "evil", 4);
    return absl::OkStatus();
  }
  char* text_;
};

TEST_CASE("acl on a channel: a later content policy on the same field keeps the checked bytes",
          "[rpc][policies]") {
  Pair f;
  auto acl = ThreeFieldAcl();
  auto second =
      *pr::AclPolicy::Create("acl2", {&Kinds::Descriptor()},
                             {{"no-worse", "plexus.rpctest.Kinds/Echo", "text", {"worse"}}});
  char text[] = "good";
  AllKinds req;
  req.text = std::string_view(text, 4);
  REQUIRE(f.channel->engines().Attach(acl).ok());
  REQUIRE(f.channel->engines().Attach(std::make_shared<TextScribbler>(text), "acl").ok());
  REQUIRE(f.channel->engines().Attach(second, "scribbler").ok());
  Kinds::Stub stub(f.channel);
  REQUIRE(stub.EchoSync(req, TenSeconds()).ok());
  CHECK(std::string(text) == "evil");  // the application's memory changed after the check...
  std::lock_guard<std::mutex> lock(f.impl.mu);
  REQUIRE(f.impl.received.size() == 1);
  CHECK(f.impl.received[0].text == "good");  // ...but the checked bytes were sent
  CHECK(acl->checked() == 1);
  CHECK(second->checked() == 1);
}

namespace {

const pr::FieldDesc* EchoField(std::string_view name) {
  const pr::MessageDesc* m = Kinds::Descriptor().methods[0].request();
  for (size_t i = 0; i < m->field_count; ++i) {
    if (name == m->fields[i].name) return &m->fields[i];
  }
  FAIL("AllKinds has no field " << name);
  return nullptr;
}

// A content policy that reads the fields it is given (by path) and counts how often the chain
// asked it which fields it reads.
class PathReader : public pr::Policy {
 public:
  PathReader(std::vector<std::vector<const pr::FieldDesc*>> paths, int version)
      : paths_(std::move(paths)), version_(version) {}
  std::string name() const override { return "reader"; }
  std::string kind() const override { return "reader"; }
  int version() const override { return version_; }
  uint32_t hooks() const override { return pr::kHookRequest; }
  bool inspects_content() const override { return true; }
  bool ContentFields(const pr::MethodDesc&,
                     absl::FunctionRef<void(pr::FieldPath)> read) const override {
    ++asked;
    for (const auto& p : paths_) read(pr::FieldPath(p.data(), p.size()));
    return true;
  }
  mutable std::atomic<int> asked{0};

 private:
  std::vector<std::vector<const pr::FieldDesc*>> paths_;
  int version_;
};

// Writes "evil" over the application's text and "BLOB" over its blob.
class TextBlobScribbler : public pr::Policy {
 public:
  TextBlobScribbler(char* text, uint8_t* blob) : text_(text), blob_(blob) {}
  std::string name() const override { return "scribbler"; }
  absl::Status OnRequest(const pr::CallInfo&) override {
    std::memcpy(text_, "evil", 4);
    std::memcpy(blob_, "BLOB", 4);
    return absl::OkStatus();
  }
  char* text_;
  uint8_t* blob_;
};

}  // namespace

TEST_CASE("a channel asks a content policy for its fields once per method, again after an upgrade",
          "[rpc][policies]") {
  Pair f;
  char text[] = "good";
  uint8_t blob[] = {'b', 'l', 'o', 'b'};
  auto reader = std::make_shared<PathReader>(
      std::vector<std::vector<const pr::FieldDesc*>>{{EchoField("text")}}, 1);
  REQUIRE(f.channel->engines().Attach(reader).ok());
  REQUIRE(
      f.channel->engines().Attach(std::make_shared<TextBlobScribbler>(text, blob), "reader").ok());
  Kinds::Stub stub(f.channel);
  auto call = [&] {
    std::memcpy(text, "good", 4);
    std::memcpy(blob, "blob", 4);
    AllKinds req;
    req.text = std::string_view(text, 4);
    req.blob = pr::Bytes(blob, 4);
    REQUIRE(stub.EchoSync(req, TenSeconds()).ok());
    std::lock_guard<std::mutex> lock(f.impl.mu);
    const auto got = f.impl.received.back();
    return got.text + "/" + got.blob;
  };
  for (int i = 0; i < 3; ++i) CHECK(call() == "good/BLOB");  // text private, blob not
  CHECK(reader->asked == 1);
  // Version 2 reads the blob instead: the plan of version 1 is not used for it.
  auto next = std::make_shared<PathReader>(
      std::vector<std::vector<const pr::FieldDesc*>>{{EchoField("blob")}}, 2);
  REQUIRE(f.channel->engines().Upgrade("reader", next).ok());
  for (int i = 0; i < 3; ++i) CHECK(call() == "evil/blob");
  CHECK(next->asked == 1);
  CHECK(reader->asked == 1);
}

// Calls from several threads while the content policy is upgraded again and again: each version
// is asked for its fields at most once (its plan is made once, by whichever call comes first, and
// the previous version's is dropped at the swap), and every call passes.
TEST_CASE("content plans under upgrades while threads call: each version asked at most once",
          "[rpc][policies]") {
  Pair f;
  std::vector<std::shared_ptr<PathReader>> versions;
  versions.push_back(std::make_shared<PathReader>(
      std::vector<std::vector<const pr::FieldDesc*>>{{EchoField("text")}}, 1));
  REQUIRE(f.channel->engines().Attach(versions.back()).ok());
  Kinds::Stub stub(f.channel);
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      while (!stop.load()) {
        AllKinds req;
        req.text = "good";
        req.blob = pr::Bytes(reinterpret_cast<const uint8_t*>("blob"), 4);
        if (stub.EchoSync(req, TenSeconds()).ok()) {
          ++ok;
        } else {
          ++failed;
        }
      }
    });
  }
  for (int v = 2; v <= 40; ++v) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    versions.push_back(std::make_shared<PathReader>(
        std::vector<std::vector<const pr::FieldDesc*>>{{EchoField(v % 2 ? "text" : "blob")}}, v));
    REQUIRE(f.channel->engines().Upgrade("reader", versions.back()).ok());
  }
  // Some calls on the last version (bounded: a loaded machine may be slow, not stuck).
  const int after = ok.load() + 8;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ok.load() < after && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;
  for (auto& c : callers) c.join();
  CHECK(failed.load() == 0);
  CHECK(ok.load() > 0);
  int asked = 0;
  for (const auto& v : versions) {
    CHECK(v->asked.load() <= 1);
    asked += v->asked.load();
  }
  CHECK(asked >= 2);                          // calls ran on more than one version
  CHECK(versions.back()->asked.load() == 1);  // the last one served the last calls
}

TEST_CASE("a content policy naming a field no private copy can hold fails its calls, naming it",
          "[rpc][policies]") {
  Pair f;
  Kinds::Stub stub(f.channel);
  auto expect = [&](std::vector<const pr::FieldDesc*> path, std::string_view why) {
    REQUIRE(f.channel->engines()
                .Attach(std::make_shared<PathReader>(
                    std::vector<std::vector<const pr::FieldDesc*>>{std::move(path)}, 1))
                .ok());
    for (int i = 0; i < 2; ++i) {  // the plan's error, on every call
      auto r = stub.EchoSync(AllKinds(), TenSeconds());
      CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK_THAT(std::string(r.status().message()), Catch::Contains(std::string(why)));
    }
    REQUIRE(f.channel->engines().Detach("reader").ok());
  };
  expect({EchoField("names")},
         "engine 'reader' names a field of plexus.rpctest.AllKinds that a "
         "private copy cannot hold: field names is repeated");
  expect({EchoField("inner")}, "field inner is a message");
  expect({EchoField("text"), EchoField("i32")}, "the path goes through text, not a message field");
  expect({}, "an empty field path");
  CHECK(f.impl.calls.load() == 0);
}

// Another application thread flips the request's checked fields between an allowed and a denied
// value while calls are made: a call is denied or the server gets an allowed value, never a
// denied one (whatever the interleaving: the check and the send read the same private bytes).
TEST_CASE("acl on a channel: a thread flipping the request never gets a denied value through",
          "[rpc][policies]") {
  Pair f;
  auto acl = ThreeFieldAcl();
  REQUIRE(f.channel->engines().Attach(acl).ok());
  alignas(4) char text[4];
  alignas(4) char inner_name[4];
  std::memcpy(text, "good", 4);
  std::memcpy(inner_name, "leaf", 4);
  Inner inner;
  inner.name = std::string_view(inner_name, 4);
  AllKinds req;
  req.text = std::string_view(text, 4);
  req.inner = &inner;
  req.i32 = 1;
  auto word = [](const char* s) {
    uint32_t w;
    std::memcpy(&w, s, 4);
    return w;
  };
  const uint32_t good = word("good"), evil = word("evil"), leaf = word("leaf"), root = word("root");
  std::atomic<bool> stop{false};
  std::thread flipper([&] {
    for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(text))
          .store(i % 2 ? evil : good, std::memory_order_relaxed);
      std::atomic_ref<int32_t>(req.i32).store(i % 3 ? 1 : 666, std::memory_order_relaxed);
      std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(inner_name))
          .store(i % 5 ? leaf : root, std::memory_order_relaxed);
      if (i % 64 == 0) std::this_thread::yield();
    }
  });
  Kinds::Stub stub(f.channel);
  int passed = 0, denied = 0, other = 0;
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while ((passed < 50 || denied < 50) && absl::Now() < until) {
    auto r = stub.EchoSync(req, TenSeconds());
    if (r.ok()) {
      ++passed;
    } else if (r.status().code() == absl::StatusCode::kPermissionDenied) {
      ++denied;
    } else {
      ++other;
    }
  }
  stop = true;
  flipper.join();
  CHECK(other == 0);
  CHECK(passed > 0);  // both outcomes happened: the race was exercised
  CHECK(denied > 0);
  std::lock_guard<std::mutex> lock(f.impl.mu);
  CHECK(f.impl.received.size() == static_cast<size_t>(passed));
  for (const auto& got : f.impl.received) {
    CHECK(got.text != "evil");
    CHECK(got.i32 != 666);
    CHECK(got.inner_name != "root");
  }
  CHECK(acl->denied() == static_cast<uint64_t>(denied));
}

// A content policy that does not name its fields (Policy::ContentFields's default) reads a
// private copy of the whole request: every string, bytes, repeated and nested field.
class ReadsEverything : public pr::Policy {
 public:
  std::string name() const override { return "reads-everything"; }
  bool inspects_content() const override { return true; }
  absl::Status OnRequest(const pr::CallInfo& call) override {
    const auto& req = *static_cast<const AllKinds*>(call.request);
    seen = std::string(req.names[0]);
    return absl::OkStatus();
  }
  std::string seen;
};

class EverythingScribbler : public pr::Policy {
 public:
  EverythingScribbler(char* text, char* name0, uint8_t* blob, int32_t* ints, char* inner_name)
      : text_(text), name0_(name0), blob_(blob), ints_(ints), inner_name_(inner_name) {}
  std::string name() const override { return "scribbler"; }
  absl::Status OnRequest(const pr::CallInfo&) override {
    std::memcpy(text_, "evil", 4);
    std::memcpy(name0_, "EVIL", 4);
    std::memcpy(blob_, "BLOB", 4);
    ints_[0] = 666;
    std::memcpy(inner_name_, "root", 4);
    return absl::OkStatus();
  }
  char *text_, *name0_;
  uint8_t* blob_;
  int32_t* ints_;
  char* inner_name_;
};

TEST_CASE("a content policy that names no fields reads a private copy of the whole request",
          "[rpc][policies]") {
  Pair f;
  char text[] = "good", name0[] = "name", inner_name[] = "leaf";
  uint8_t blob[] = {'b', 'l', 'o', 'b'};
  int32_t ints[] = {1, 2};
  std::string_view names[] = {std::string_view(name0, 4), "other"};
  Inner inner;
  inner.name = std::string_view(inner_name, 4);
  AllKinds req;
  req.text = std::string_view(text, 4);
  req.names = pr::Repeated<std::string_view>(names, 2);
  req.blob = pr::Bytes(blob, 4);
  req.ints = pr::Repeated<int32_t>(ints, 2);
  req.inner = &inner;
  auto reader = std::make_shared<ReadsEverything>();
  REQUIRE(f.channel->engines().Attach(reader).ok());
  REQUIRE(f.channel->engines()
              .Attach(std::make_shared<EverythingScribbler>(text, name0, blob, ints, inner_name),
                      reader->name())
              .ok());
  Kinds::Stub stub(f.channel);
  REQUIRE(stub.EchoSync(req, TenSeconds()).ok());
  CHECK(reader->seen == "name");
  CHECK(std::string(text) == "evil");
  std::lock_guard<std::mutex> lock(f.impl.mu);
  REQUIRE(f.impl.received.size() == 1);
  const auto& got = f.impl.received[0];
  CHECK(got.text == "good");
  CHECK(got.name0 == "name");
  CHECK(got.blob == "blob");
  CHECK(got.int0 == 1);
  CHECK(got.inner_name == "leaf");
}

TEST_CASE("acl: a rule with many values (hashed) and with few (compared in turn)",
          "[rpc][policies]") {
  Pair f;
  auto acl = *pr::AclPolicy::Create(
      "acl", {&Kinds::Descriptor()},
      {{"many", "plexus.rpctest.Kinds/Echo", "text", {"v0", "v1", "v2", "v3", "v4", "v5"}},
       {"few", "plexus.rpctest.Kinds/Echo", "i32", {"7", "-3"}}});
  REQUIRE(f.channel->engines().Attach(acl).ok());
  Kinds::Stub stub(f.channel);
  auto run = [&](std::string_view text, int32_t i32) {
    AllKinds req;
    req.text = text;
    req.i32 = i32;
    return stub.EchoSync(req, TenSeconds()).status().code();
  };
  CHECK(run("v4", 0) == absl::StatusCode::kPermissionDenied);
  CHECK(run("v0", 0) == absl::StatusCode::kPermissionDenied);
  CHECK(run("v9", 0) == absl::StatusCode::kOk);
  CHECK(run("v", 0) == absl::StatusCode::kOk);
  CHECK(run("ok", -3) == absl::StatusCode::kPermissionDenied);
  CHECK(run("ok", 3) == absl::StatusCode::kOk);
  CHECK(acl->denied() == 3);
  CHECK(f.impl.calls.load() == 3);
}

TEST_CASE("acl: scalar fields compare as numbers of their type", "[rpc][policies]") {
  Pair f;
  auto acl = *pr::AclPolicy::Create("acl", {&Kinds::Descriptor()},
                                    {{"b", "plexus.rpctest.Kinds/Echo", "b", {"true"}},
                                     {"u32", "plexus.rpctest.Kinds/Echo", "u32", {"4000000000"}},
                                     {"i64", "plexus.rpctest.Kinds/Echo", "i64", {"-9000000000"}},
                                     {"u64",
                                      "plexus.rpctest.Kinds/Echo",
                                      "u64",
                                      {"1", "2", "3", "4", "5", "18446744073709551615"}},
                                     {"f", "plexus.rpctest.Kinds/Echo", "f", {"0.1"}},
                                     {"d", "plexus.rpctest.Kinds/Echo", "d", {"nan", "-0"}}});
  REQUIRE(f.channel->engines().Attach(acl).ok());
  Kinds::Stub stub(f.channel);
  auto run = [&](auto set) {
    AllKinds req;
    set(req);
    return stub.EchoSync(req, TenSeconds()).status();
  };
  const auto denied = absl::StatusCode::kPermissionDenied;
  const absl::Status u32 = run([](AllKinds& r) { r.u32 = 4000000000u; });
  CHECK(u32.code() == denied);
  CHECK(std::string(u32.message()).find("field u32 is '4000000000'") != std::string::npos);
  CHECK(run([](AllKinds& r) { r.b = true; }).code() == denied);
  CHECK(run([](AllKinds& r) { r.i64 = -9000000000; }).code() == denied);
  CHECK(run([](AllKinds& r) { r.i64 = 9000000000; }).ok());
  CHECK(run([](AllKinds& r) { r.u64 = 4; }).code() == denied);
  CHECK(run([](AllKinds& r) { r.u64 = UINT64_MAX; }).code() == denied);
  CHECK(run([](AllKinds& r) { r.u64 = 6; }).ok());
  CHECK(run([](AllKinds& r) { r.f = 0.1f; }).code() == denied);
  CHECK(run([](AllKinds& r) { r.f = 0.2f; }).ok());
  CHECK(run([](AllKinds& r) { r.d = std::nan(""); }).code() == denied);
  CHECK(run([](AllKinds& r) { r.d = -0.0; }).code() == denied);
  CHECK(run([](AllKinds& r) { r.d = 0.1; }).ok());
  // Every field at its default (false, 0, 0.0) is denied by none of the rules.
  CHECK(run([](AllKinds&) {}).ok());
  CHECK(acl->denied() == 8);
  CHECK(acl->checked() == 13);
}
