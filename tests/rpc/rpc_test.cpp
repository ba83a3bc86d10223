// Channel/Server over inproc, shm and tcp: unary calls, metadata, status codes, deadlines,
// cancellation, schema mismatch, window backpressure, peer going away, metrics policy.
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "kinds.plexus.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/server.hpp"
#include "support/skip.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Empty;
using plexus::rpctest::Inner;
using plexus::rpctest::Kinds;

namespace {

class KindsImpl : public Kinds::Service {
 public:
  absl::Status Echo(pr::ServerContext& ctx, const AllKinds& req, AllKinds* resp) override {
    *resp = req;  // views into the request, which lives until the response is sent
    for (const auto& [k, v] : ctx.metadata()) {
      ctx.AddResponseMetadata("echo-" + std::string(k), std::string(v));
    }
    return absl::OkStatus();
  }
  void HoldAsync(pr::ServerCall<Inner, Inner> call) override {
    std::lock_guard<std::mutex> lock(mu);
    held.push_back(call);
  }
  absl::Status Fail(pr::ServerContext&, const Inner& req, Empty*) override {
    return absl::Status(static_cast<absl::StatusCode>(req.id),
                        "failed on purpose: " + std::string(req.name));
  }
  void ReleaseAll() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& c : held) {
      c.response()->id = c.request().id + 1;
      c.Finish(absl::OkStatus());
    }
    held.clear();
  }
  size_t HeldCount() {
    std::lock_guard<std::mutex> lock(mu);
    return held.size();
  }
  std::mutex mu;
  std::vector<pr::ServerCall<Inner, Inner>> held;
};

struct Fixture {
  explicit Fixture(pt::Backend backend, size_t window = 8) {
    std::string why;
    if (!pt::Device::Available(backend, &why)) {
      // The local transports exist on every Linux machine; where one does not, say so as a skip.
      plexus::testing::SkipTest(
          absl::StrCat(std::string(pt::BackendName(backend)), " unavailable: ", why));
    }
    auto d = pt::Device::Create({.backend = backend});
    REQUIRE(d.ok());
    device = *d;
    auto s = pr::Server::Create(device, {.max_in_flight_per_connection = window});
    REQUIRE(s.ok());
    server = std::move(*s);
    REQUIRE(server->Register(&impl).ok());
    REQUIRE(server->Start().ok());
    auto c = pr::Channel::Connect(device, server->address(), {&Kinds::Descriptor()},
                                  {.max_in_flight = window});
    REQUIRE(c.ok());
    channel = *c;
  }
  ~Fixture() {
    impl.ReleaseAll();
    channel.reset();
    if (server) server->Shutdown();
  }
  std::shared_ptr<pt::Device> device;
  KindsImpl impl;
  std::unique_ptr<pr::Server> server;
  std::shared_ptr<pr::Channel> channel;
};

}  // namespace

TEST_CASE("unary calls with metadata and status on every local transport", "[rpc]") {
  for (pt::Backend backend : {pt::Backend::kInproc, pt::Backend::kShm, pt::Backend::kTcp}) {
    DYNAMIC_SECTION(pt::BackendName(backend)) {
      Fixture f(backend);
      if (!f.channel) continue;
      Kinds::Stub stub(f.channel);
      std::string text(100000, 'z');
      std::vector<int32_t> ints{1, 2, 3};
      AllKinds req;
      req.text = text;
      req.i64 = -5;
      req.ints = pr::Repeated<int32_t>(ints.data(), ints.size());
      auto r = stub.EchoSync(req, {.timeout = absl::Seconds(10), .metadata = {{"user", "ann"}}});
      REQUIRE(r.ok());
      CHECK((*r)->text == text);
      CHECK((*r)->i64 == -5);
      CHECK((*r)->ints.size() == 3);
      REQUIRE(r->metadata().size() == 1);
      CHECK(r->metadata()[0].first == "echo-user");
      CHECK(r->metadata()[0].second == "ann");

      // Every gRPC status code comes back as sent.
      for (int code = 1; code <= 16; ++code) {
        Inner in{"x", code, {}, nullptr};
        auto fr = stub.FailSync(in, {.timeout = absl::Seconds(10)});
        REQUIRE_FALSE(fr.ok());
        CHECK(static_cast<int>(fr.status().code()) == code);
        CHECK(std::string(fr.status().message()) == "failed on purpose: x");
      }

      // Callback form.
      std::atomic<int> got{0};
      std::atomic<bool> done{false};
      stub.Echo(req, {}, [&](absl::StatusOr<pr::Reply<AllKinds>> cr) {
        got = cr.ok() ? static_cast<int>((*cr)->ints.size()) : -1;
        done = true;
      });
      for (int i = 0; i < 1000 && !done; ++i) absl::SleepFor(absl::Milliseconds(5));
      CHECK(got == 3);
    }
  }
}

TEST_CASE("deadline, cancellation and late responses", "[rpc]") {
  Fixture f(pt::Backend::kInproc);
  Kinds::Stub stub(f.channel);
  Inner in{"h", 1, {}, nullptr};
  const absl::Time t0 = absl::Now();
  auto r = stub.HoldSync(in, {.timeout = absl::Milliseconds(200)});
  const absl::Duration took = absl::Now() - t0;
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(took >= absl::Milliseconds(200));
  CHECK(took <= absl::Milliseconds(200) * 1.25 + absl::Milliseconds(500));

  auto pending = stub.Hold(in);
  for (int i = 0; i < 200 && f.impl.HeldCount() < 2; ++i) absl::SleepFor(absl::Milliseconds(5));
  pending.Cancel();
  auto cr = pending.Get();
  REQUIRE_FALSE(cr.ok());
  CHECK(cr.status().code() == absl::StatusCode::kCancelled);
  // The held calls' late responses are dropped; the channel keeps working.
  f.impl.ReleaseAll();
  AllKinds req;
  req.i32 = 77;
  auto ok = stub.EchoSync(req, {.timeout = absl::Seconds(10)});
  REQUIRE(ok.ok());
  CHECK((*ok)->i32 == 77);
}

TEST_CASE("schema mismatch rejects the connection naming the service and both hashes", "[rpc]") {
  Fixture f(pt::Backend::kInproc);
  pr::ServiceDesc other = Kinds::Descriptor();
  other.schema_hash = 0x1234;
  auto c = pr::Channel::Connect(f.device, f.server->address(), {&other});
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == absl::StatusCode::kFailedPrecondition);
  char mine[32];
  std::snprintf(mine, sizeof mine, "%016llx", static_cast<unsigned long long>(Kinds::kSchemaHash));
  CHECK(std::string(c.status().message()) ==
        "rpc handshake with " + f.server->address() +
            " refused: service plexus.rpctest.Kinds: schema hash mismatch: client "
            "0x0000000000001234, server 0x" +
            mine + " (regenerate both sides from the same .proto)");
}

TEST_CASE("a full window blocks the next call until its deadline", "[rpc]") {
  Fixture f(pt::Backend::kInproc, /*window=*/4);
  Kinds::Stub stub(f.channel);
  std::vector<Inner> reqs(5, Inner{"w", 1, {}, nullptr});
  std::vector<pr::PendingCall<Inner>> calls;
  for (int i = 0; i < 4; ++i) calls.push_back(stub.Hold(reqs[i]));
  for (int i = 0; i < 400 && f.impl.HeldCount() < 4; ++i) absl::SleepFor(absl::Milliseconds(5));
  CHECK(f.impl.HeldCount() == 4);
  auto blocked = stub.HoldSync(reqs[4], {.timeout = absl::Milliseconds(100)});
  REQUIRE_FALSE(blocked.ok());
  CHECK(blocked.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(blocked.status().message())
            .find("waited for a window slot (4 calls in flight)") != std::string::npos);
  f.impl.ReleaseAll();
  for (auto& c : calls) {
    auto r = c.Get();
    REQUIRE(r.ok());
    CHECK((*r)->id == 2);
  }
}

TEST_CASE("the server going away fails outstanding calls with UNAVAILABLE", "[rpc]") {
  for (pt::Backend backend : {pt::Backend::kInproc, pt::Backend::kTcp}) {
    DYNAMIC_SECTION(pt::BackendName(backend)) {
      Fixture f(backend);
      Kinds::Stub stub(f.channel);
      Inner in{"d", 1, {}, nullptr};
      auto pending = stub.Hold(in, {.timeout = absl::Seconds(5)});
      for (int i = 0; i < 400 && f.impl.HeldCount() < 1; ++i) absl::SleepFor(absl::Milliseconds(5));
      const absl::Time t0 = absl::Now();
      f.server->Shutdown();
      auto r = pending.Get();
      REQUIRE_FALSE(r.ok());
      CHECK(r.status().code() == absl::StatusCode::kUnavailable);
      CHECK(absl::Now() - t0 < absl::Seconds(5));
      auto after = stub.HoldSync(in, {.timeout = absl::Seconds(1)});
      CHECK(after.status().code() == absl::StatusCode::kUnavailable);
    }
  }
}

TEST_CASE("engine chain: attach, detach and the metrics policy", "[rpc][engines]") {
  Fixture f(pt::Backend::kInproc);
  auto& chain = f.channel->engines();
  CHECK(chain.Names() == std::vector<std::string>{"frontend", "marshal", "transport"});
  auto metrics = std::make_shared<pr::MetricsPolicy>();
  REQUIRE(chain.Attach(metrics, "frontend").ok());
  CHECK(chain.Attach(std::make_shared<pr::MetricsPolicy>(), "frontend").code() ==
        absl::StatusCode::kAlreadyExists);
  CHECK(chain.Attach(std::make_shared<pr::MetricsPolicy>("m2"), "marshal").code() ==
        absl::StatusCode::kInvalidArgument);
  REQUIRE(chain.Attach(std::make_shared<pr::MetricsPolicy>("m2"), "metrics").ok());
  CHECK(chain.Names() ==
        std::vector<std::string>{"frontend", "metrics", "m2", "marshal", "transport"});
  Kinds::Stub stub(f.channel);
  AllKinds req;
  for (int i = 0; i < 3; ++i) REQUIRE(stub.EchoSync(req).ok());
  Inner in{"x", 5, {}, nullptr};
  CHECK_FALSE(stub.FailSync(in).ok());
  auto m = metrics->Get();
  REQUIRE(m.count("plexus.rpctest.Kinds/Echo"));
  CHECK(m["plexus.rpctest.Kinds/Echo"].calls == 3);
  CHECK(m["plexus.rpctest.Kinds/Echo"].errors == 0);
  CHECK(m["plexus.rpctest.Kinds/Fail"].errors == 1);
  CHECK(m["plexus.rpctest.Kinds/Echo"].request_bytes > 0);
  CHECK(metrics->ToJson().find("\"plexus.rpctest.Kinds/Echo\":{\"calls\":3,") != std::string::npos);
  auto detached = chain.Detach("metrics");
  REQUIRE(detached.ok());
  CHECK(detached->get() == metrics.get());
  REQUIRE(stub.EchoSync(req).ok());
  CHECK(metrics->Get()["plexus.rpctest.Kinds/Echo"].calls == 3);
}
