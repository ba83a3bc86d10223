// Live upgrade of the engine chain (mRPC's decompose/restore): each shipped policy is replaced by
// a new version over and over while several threads call through it, on inproc and tcp
// (127.0.0.1). Asserted: exact call counts (none lost or run twice), each thread's calls reach
// the server once and in order, and the state (metrics counters, rate-limit tokens, ACL counters)
// continues across versions. Also: refused upgrades keep the old version, and reconfiguration.
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "catch2/catch.hpp"
#include "kinds.plexus.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/policies.hpp"
#include "plexus/rpc/server.hpp"
#include "support/skip.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Empty;
using plexus::rpctest::Inner;
using plexus::rpctest::Kinds;

namespace {

constexpr int kThreads = 4;
constexpr int kCallsPerThread = 250;
const char kEcho[] = "plexus.rpctest.Kinds/Echo";

// Records every request's text ("thread:seq") in arrival order.
class RecordingImpl : public Kinds::Service {
 public:
  absl::Status Echo(pr::ServerContext&, const AllKinds& req, AllKinds* resp) override {
    std::lock_guard<std::mutex> lock(mu);
    texts.emplace_back(req.text);
    resp->i32 = req.i32;
    return absl::OkStatus();
  }
  void HoldAsync(pr::ServerCall<Inner, Inner> call) override { call.Finish(absl::OkStatus()); }
  absl::Status Fail(pr::ServerContext&, const Inner&, Empty*) override { return absl::OkStatus(); }
  std::mutex mu;
  std::vector<std::string> texts;
};

struct Pair {
  explicit Pair(pt::Backend backend) {
    std::string why;
    if (!pt::Device::Available(backend, &why)) {
      plexus::testing::SkipTest(
          absl::StrCat(std::string(pt::BackendName(backend)), " unavailable: ", why));
    }
    device = *pt::Device::Create({.backend = backend});
    server = std::move(*pr::Server::Create(device, {}));
    REQUIRE(server->Register(&impl).ok());
    REQUIRE(server->Start().ok());
    auto c = pr::Channel::Connect(device, server->address(), {&Kinds::Descriptor()});
    REQUIRE(c.ok());
    channel = *c;
  }
  ~Pair() {
    channel.reset();
    if (server) server->Shutdown();
  }
  std::shared_ptr<pt::Device> device;
  RecordingImpl impl;
  std::unique_ptr<pr::Server> server;
  std::shared_ptr<pr::Channel> channel;
};

// The next version of the metrics engine: a subclass that says so (and adopts v1's state).
class MetricsV2 : public pr::MetricsPolicy {
 public:
  using MetricsPolicy::MetricsPolicy;
  int version() const override { return 2; }
};

struct LoadResult {
  int ok = 0;
  std::map<absl::StatusCode, int> errors;
};

// kThreads threads, each making kCallsPerThread blocking calls with text "t:seq" (every tenth
// "evil"), while `swap` runs in a loop on this thread until they are done. Returns the swaps.
// The threads hold their second half of calls until two swaps have happened, so that the load
// spans at least two upgrades however fast the calls are (inproc, mostly refused).
template <typename Swap>
int RunWithSwaps(Pair& f, LoadResult* result, Swap swap) {
  std::atomic<int> running{kThreads};
  std::atomic<int> swapped{0};
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Kinds::Stub stub(f.channel);
      for (int i = 0; i < kCallsPerThread; ++i) {
        if (i == kCallsPerThread / 2) {
          while (swapped.load() < 2) std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        AllKinds req;
        std::string text = i % 10 == 9 ? "evil" : absl::StrCat(t, ":", i);
        req.text = text;
        req.i32 = i;
        auto r = stub.EchoSync(req, {.timeout = absl::Seconds(20)});
        std::lock_guard<std::mutex> lock(mu);
        if (r.ok()) {
          ++result->ok;
        } else {
          ++result->errors[r.status().code()];
        }
      }
      --running;
    });
  }
  int swaps = 0;
  while (running.load() > 0) {
    swap(swaps);
    swapped.store(++swaps);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (auto& t : threads) t.join();
  return swaps;
}

// Every "t:seq" text reached the server exactly once and in each thread's order.
void CheckOncePerThreadInOrder(RecordingImpl& impl, int expected_per_thread) {
  std::lock_guard<std::mutex> lock(impl.mu);
  std::vector<int> last(kThreads, -1), count(kThreads, 0);
  for (const std::string& text : impl.texts) {
    if (text == "evil") continue;
    std::vector<std::string> parts = absl::StrSplit(text, ':');
    REQUIRE(parts.size() == 2);
    int t = 0, seq = 0;
    REQUIRE(absl::SimpleAtoi(parts[0], &t));
    REQUIRE(absl::SimpleAtoi(parts[1], &seq));
    CHECK(seq > last[t]);  // in order, never twice
    last[t] = seq;
    ++count[t];
  }
  for (int t = 0; t < kThreads; ++t) CHECK(count[t] == expected_per_thread);
}

uint64_t MetricsCalls(const pr::EngineChain& chain) {
  auto m = std::dynamic_pointer_cast<pr::MetricsPolicy>(chain.Find("metrics"));
  REQUIRE(m != nullptr);
  auto all = m->Get();
  return all.contains(kEcho) ? all[kEcho].calls : 0;
}

// The server counts a call when its response was sent, which may be just after the client got it.
void WaitForServerMetrics(const pr::EngineChain& chain, uint64_t want) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (MetricsCalls(chain) < want && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
}

}  // namespace

TEST_CASE("live upgrade: metrics replaced under load keep exact counts on both sides",
          "[rpc][upgrade]") {
  for (pt::Backend backend : {pt::Backend::kInproc, pt::Backend::kTcp}) {
    DYNAMIC_SECTION(pt::BackendName(backend)) {
      Pair f(backend);
      if (!f.server) continue;
      REQUIRE(f.server->engines().Attach(std::make_shared<pr::MetricsPolicy>()).ok());
      REQUIRE(f.channel->engines().Attach(std::make_shared<pr::MetricsPolicy>()).ok());
      absl::Duration longest;
      LoadResult result;
      const int swaps = RunWithSwaps(f, &result, [&](int i) {
        std::shared_ptr<pr::Policy> next =
            i % 2 ? std::make_shared<pr::MetricsPolicy>() : std::make_shared<MetricsV2>();
        auto a = f.channel->engines().Upgrade("metrics", next);
        REQUIRE(a.ok());
        CHECK(a->pause >= a->drain);
        longest = std::max(longest, a->pause);
        next = i % 2 ? std::make_shared<MetricsV2>() : std::make_shared<pr::MetricsPolicy>();
        auto b = f.server->engines().Upgrade("metrics", next);
        REQUIRE(b.ok());
      });
      INFO("swaps " << swaps << ", longest pause " << absl::FormatDuration(longest));
      CHECK(swaps >= 2);
      constexpr int kTotal = kThreads * kCallsPerThread;
      CHECK(result.ok == kTotal);
      CHECK(result.errors.empty());
      CHECK(MetricsCalls(f.channel->engines()) == kTotal);
      WaitForServerMetrics(f.server->engines(), kTotal);
      CHECK(MetricsCalls(f.server->engines()) == kTotal);
      CheckOncePerThreadInOrder(f.impl, kCallsPerThread - kCallsPerThread / 10);
      // The latency histogram moved with the counters.
      auto m = std::dynamic_pointer_cast<pr::MetricsPolicy>(f.channel->engines().Find("metrics"));
      uint64_t in_buckets = 0;
      const auto metrics = m->Get();  // a copy: the loop must not run over a destroyed temporary
      for (uint64_t c : metrics.at(kEcho).latency_us) in_buckets += c;
      CHECK(in_buckets == kTotal);
    }
  }
}

TEST_CASE("live upgrade: the rate limiter's tokens carry over, no fresh burst per version",
          "[rpc][upgrade]") {
  // A frozen clock: exactly `burst` calls can ever pass, however many versions come and go. A new
  // version that started with a full bucket (no Restore) would admit `burst` more per swap.
  for (pt::Backend backend : {pt::Backend::kInproc, pt::Backend::kTcp}) {
    DYNAMIC_SECTION(pt::BackendName(backend)) {
      Pair f(backend);
      if (!f.server) continue;
      const absl::Time frozen = absl::FromUnixSeconds(1000);
      auto make = [&] {
        pr::RateLimitOptions o;
        o.rate = 1;
        o.burst = 40;
        o.clock = [frozen] { return frozen; };
        return *pr::RateLimitPolicy::Create("rl", o);
      };
      REQUIRE(f.channel->engines().Attach(make()).ok());
      REQUIRE(f.server->engines().Attach(make()).ok());
      LoadResult result;
      const int swaps = RunWithSwaps(f, &result, [&](int) {
        REQUIRE(f.channel->engines().Upgrade("rl", make()).ok());
        REQUIRE(f.server->engines().Upgrade("rl", make()).ok());
      });
      INFO("swaps " << swaps);
      CHECK(swaps >= 2);
      constexpr int kTotal = kThreads * kCallsPerThread;
      // The client's limiter admits 40 of 1000; the server's (per connection) admits all 40.
      CHECK(result.ok == 40);
      CHECK(result.errors[absl::StatusCode::kResourceExhausted] == kTotal - 40);
      auto rl = std::dynamic_pointer_cast<pr::RateLimitPolicy>(f.channel->engines().Find("rl"));
      CHECK(rl->admitted() == 40);
      CHECK(rl->rejected() == kTotal - 40);
      auto srl = std::dynamic_pointer_cast<pr::RateLimitPolicy>(f.server->engines().Find("rl"));
      CHECK(srl->admitted() == 40);
      CHECK(srl->rejected() == 0);
      std::lock_guard<std::mutex> lock(f.impl.mu);
      CHECK(f.impl.texts.size() == 40);
    }
  }
}

TEST_CASE("live upgrade: the acl replaced under load denies exactly the denied calls",
          "[rpc][upgrade]") {
  for (pt::Backend backend : {pt::Backend::kInproc, pt::Backend::kTcp}) {
    DYNAMIC_SECTION(pt::BackendName(backend)) {
      Pair f(backend);
      if (!f.server) continue;
      auto make = [](const std::string& deny) {
        return *pr::AclPolicy::Create("acl", {&Kinds::Descriptor()},
                                      {{"no-evil", kEcho, "text", {deny}}});
      };
      // The client's acl denies nothing that is sent ("never"); the server's denies "evil".
      REQUIRE(f.channel->engines().Attach(make("never")).ok());
      REQUIRE(f.server->engines().Attach(make("evil")).ok());
      LoadResult result;
      const int swaps = RunWithSwaps(f, &result, [&](int) {
        REQUIRE(f.channel->engines().Upgrade("acl", make("never")).ok());
        REQUIRE(f.server->engines().Upgrade("acl", make("evil")).ok());
      });
      INFO("swaps " << swaps);
      CHECK(swaps >= 2);
      constexpr int kTotal = kThreads * kCallsPerThread;
      constexpr int kDenied = kTotal / 10;
      CHECK(result.ok == kTotal - kDenied);
      CHECK(result.errors[absl::StatusCode::kPermissionDenied] == kDenied);
      CHECK(result.errors.size() == 1);
      auto acl = std::dynamic_pointer_cast<pr::AclPolicy>(f.server->engines().Find("acl"));
      CHECK(acl->checked() == kTotal);
      CHECK(acl->denied() == kDenied);
      auto cacl = std::dynamic_pointer_cast<pr::AclPolicy>(f.channel->engines().Find("acl"));
      CHECK(cacl->checked() == kTotal);
      CHECK(cacl->denied() == 0);
      CheckOncePerThreadInOrder(f.impl, kCallsPerThread - kCallsPerThread / 10);
    }
  }
}

TEST_CASE("live upgrade: attach and detach under load lose no call", "[rpc][upgrade]") {
  Pair f(pt::Backend::kInproc);
  LoadResult result;
  auto metrics = std::make_shared<pr::MetricsPolicy>();
  REQUIRE(f.server->engines().Attach(metrics).ok());
  RunWithSwaps(f, &result, [&](int i) {
    if (i % 2 == 0) {
      REQUIRE(f.channel->engines().Attach(std::make_shared<pr::MetricsPolicy>("m2")).ok());
    } else {
      REQUIRE(f.channel->engines().Detach("m2").ok());
    }
  });
  constexpr int kTotal = kThreads * kCallsPerThread;
  CHECK(result.ok == kTotal);
  CheckOncePerThreadInOrder(f.impl, kCallsPerThread - kCallsPerThread / 10);
}

TEST_CASE("a chain's snapshots follow attach and detach, also from the empty chain",
          "[rpc][upgrade]") {
  pr::EngineChain chain;
  const pr::EngineChain::Snapshot none = chain.snapshot();
  REQUIRE(none != nullptr);
  CHECK(none->empty());
  auto metrics = std::make_shared<pr::MetricsPolicy>();
  REQUIRE(chain.Attach(metrics).ok());
  CHECK(none->empty());  // taken before the attach: a call that started before runs without it
  pr::EngineChain::Snapshot one = chain.snapshot();
  REQUIRE(one->size() == 1);
  CHECK(one->at(0)->policy() == metrics);
  // Another thread's first snapshot after the attach (its own empty chain was never taken).
  size_t seen = 0;
  std::thread([&] { seen = chain.snapshot()->size(); }).join();
  CHECK(seen == 1);
  auto detached = chain.Detach("metrics");
  REQUIRE(detached.ok());
  CHECK(chain.snapshot()->empty());
  CHECK(one->size() == 1);  // a call that started before still runs through it
  std::thread([&] { seen = chain.snapshot()->size(); }).join();
  CHECK(seen == 0);
  // Once the calls that started before are done, nothing in the chain holds the detached engine
  // (no thread keeps a copy of the chain it left).
  one.reset();
  CHECK(metrics.use_count() == 2);  // `metrics` and what Detach returned
  // Empty again, then not: the thread's empty chain is not handed out once an engine is there.
  REQUIRE(chain.Attach(std::make_shared<pr::MetricsPolicy>("m2")).ok());
  CHECK(chain.snapshot()->size() == 1);
  CHECK(chain.Names() == std::vector<std::string>{"frontend", "m2", "marshal", "transport"});
}

TEST_CASE("threads take whole snapshots while engines are attached and detached",
          "[rpc][upgrade]") {
  pr::EngineChain chain;
  auto a = std::make_shared<pr::MetricsPolicy>("a");
  auto b = std::make_shared<pr::MetricsPolicy>("b");
  REQUIRE(chain.Attach(a).ok());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> taken{0}, torn{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      while (!stop.load()) {
        const pr::EngineChain::Snapshot s = chain.snapshot();
        // Always "a", then "b" when attached: never a chain half-changed.
        const bool whole = !s->empty() && s->at(0)->policy() == a &&
                           (s->size() == 1 || (s->size() == 2 && s->at(1)->policy() == b));
        torn.fetch_add(whole ? 0 : 1);
        taken.fetch_add(1);
      }
    });
  }
  // At least 200 changes, and until the readers took a good number of snapshots among them.
  for (int i = 0; i < 200 || (taken.load() < 1000 && i < 100000); ++i) {
    REQUIRE(chain.Attach(b, "a").ok());
    REQUIRE(chain.Detach("b").ok());
  }
  stop = true;
  for (auto& t : readers) t.join();
  CHECK(taken.load() > 0);
  CHECK(torn.load() == 0);
  CHECK(b.use_count() == 1);  // no thread's copy of the chain kept it
}

TEST_CASE("live upgrade: a refused restore keeps the old version and its state", "[rpc][upgrade]") {
  pr::EngineChain chain;
  auto metrics = std::make_shared<pr::MetricsPolicy>();
  REQUIRE(chain.Attach(metrics).ok());
  pr::CallInfo call;
  call.service = &Kinds::Descriptor();
  call.method = &Kinds::Descriptor().methods[0];
  call.start = absl::Now();
  chain.snapshot()->at(0)->OnComplete(call, absl::OkStatus());

  // Another kind under the same name cannot adopt a metrics state.
  auto rl = *pr::RateLimitPolicy::Create("metrics", pr::RateLimitOptions());
  auto refused = chain.Upgrade("metrics", rl);
  REQUIRE(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(refused.status().message()) ==
        "upgrade of engine 'metrics': restore (the old version stays): engine 'metrics' "
        "(rate_limit v1) cannot adopt the state of a 'metrics' engine");
  CHECK(chain.Find("metrics") == metrics);
  chain.snapshot()->at(0)->OnComplete(call, absl::OkStatus());
  CHECK(metrics->Get()[kEcho].calls == 2);

  CHECK(chain.Upgrade("nope", std::make_shared<pr::MetricsPolicy>("nope")).status().code() ==
        absl::StatusCode::kNotFound);
  auto renamed = chain.Upgrade("metrics", std::make_shared<pr::MetricsPolicy>("other"));
  CHECK(std::string(renamed.status().message()) ==
        "upgrade of engine 'metrics': the new version is named 'other' (an upgrade keeps the "
        "name)");

  // A good upgrade: the snapshot taken before still reaches the new version.
  auto before = chain.snapshot();
  auto v2 = std::make_shared<MetricsV2>();
  REQUIRE(chain.Upgrade("metrics", v2).ok());
  before->at(0)->OnComplete(call, absl::OkStatus());
  CHECK(v2->Get()[kEcho].calls == 3);
  CHECK(metrics->Get()[kEcho].calls == 2);  // the old version is frozen
  CHECK(chain.Find("metrics")->version() == 2);
}

TEST_CASE("reconfigure: the rate limiter takes JSON; bad configurations change nothing",
          "[rpc][upgrade]") {
  pr::EngineChain chain;
  const absl::Time frozen = absl::FromUnixSeconds(1000);
  pr::RateLimitOptions o;
  o.rate = 1;
  o.burst = 2;
  o.clock = [frozen] { return frozen; };
  auto rl = *pr::RateLimitPolicy::Create("rl", o);
  REQUIRE(chain.Attach(rl).ok());
  REQUIRE(chain.Attach(std::make_shared<pr::MetricsPolicy>(), "rl").ok());
  CHECK(chain.Names() ==
        std::vector<std::string>{"frontend", "rl", "metrics", "marshal", "transport"});
  pr::CallInfo call;
  auto slot = chain.snapshot()->at(0);
  CHECK(slot->OnRequest(call).ok());
  CHECK(slot->OnRequest(call).ok());
  CHECK(!slot->OnRequest(call).ok());

  auto bad = [&](std::string_view json) {
    auto r = chain.Configure("rl", json);
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  CHECK(bad("not json") ==
        "rate limit 'rl' configuration: expected a JSON object such as {\"rate\": 100, "
        "\"burst\": 10}");
  CHECK(bad(R"({"rat": 5})") ==
        "rate limit 'rl' configuration.rat: unknown field (expected one of: rate, burst)");
  CHECK(bad(R"({"rate": -1})") ==
        "policy 'rl': rate limit: rate must be > 0 calls/s (infinity: unlimited), not -1");
  CHECK(bad(R"({"burst": "x"})") ==
        "rate limit 'rl' configuration.burst: expected a number, got string");
  CHECK(!slot->OnRequest(call).ok());  // unchanged: still empty at rate 1

  REQUIRE(chain.Configure("rl", R"({"rate": "inf"})").ok());
  CHECK(slot->OnRequest(call).ok());
  CHECK(rl->DescribeJson() ==
        R"({"rate":"inf","burst":2,"scope":"connection","over_limit":"fail","buckets":1,)"
        R"("admitted":3,"rejected":2})");
  CHECK(chain.Configure("metrics", "{}").status().code() == absl::StatusCode::kUnimplemented);
  CHECK(chain.Configure("nope", "{}").status().code() == absl::StatusCode::kNotFound);
}

namespace {

// Counts the hooks it is called for; declares the ones it is given.
class HookCounter : public pr::Policy {
 public:
  explicit HookCounter(uint32_t hooks) : hooks_(hooks) {}
  std::string name() const override { return "counter"; }
  std::string kind() const override { return "counter"; }
  uint32_t hooks() const override { return hooks_; }
  absl::Status OnRequest(const pr::CallInfo&) override {
    ++requests;
    return absl::OkStatus();
  }
  void OnComplete(const pr::CallInfo&, const absl::Status&) override { ++completes; }
  std::optional<pr::QosVerdict> Classify(const pr::CallInfo&) override {
    ++classifies;
    return std::nullopt;
  }
  std::atomic<int> requests{0}, completes{0}, classifies{0};

 private:
  const uint32_t hooks_;
};

}  // namespace

TEST_CASE("engines are called for the hooks they declare only, also across an upgrade",
          "[rpc][upgrade]") {
  pr::EngineChain chain;
  auto request_only = std::make_shared<HookCounter>(pr::kHookRequest);
  REQUIRE(chain.Attach(request_only).ok());
  const pr::EngineChain::Snapshot engines = chain.snapshot();
  pr::EngineSlot& slot = *(*engines)[0];
  const pr::CallInfo call;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(slot.OnRequest(call).ok());
    CHECK_FALSE(slot.Classify(call).has_value());
    slot.OnComplete(call, absl::OkStatus());
  }
  CHECK(request_only->requests == 3);
  CHECK(request_only->completes == 0);
  CHECK(request_only->classifies == 0);

  // The next version declares every hook: the calls that now complete reach it.
  auto every = std::make_shared<HookCounter>(pr::kAllHooks);
  REQUIRE(chain.Upgrade("counter", every).ok());
  slot.OnComplete(call, absl::OkStatus());
  (void)slot.Classify(call);
  CHECK(every->completes == 1);
  CHECK(every->classifies == 1);
  // And back: a version without them is skipped again.
  auto none = std::make_shared<HookCounter>(0);
  REQUIRE(chain.Upgrade("counter", none).ok());
  REQUIRE(slot.OnRequest(call).ok());
  slot.OnComplete(call, absl::OkStatus());
  CHECK(none->requests == 0);
  CHECK(none->completes == 0);
}
