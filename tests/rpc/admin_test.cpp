// The rpc admin commands over the generic endpoint: list, engines, attach, configure, upgrade
// under load and detach of a Server's and a Channel's chains, with exact call counts; refused
// requests (token, unknown target or kind, bad configuration) change nothing.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "kinds.plexus.hpp"
#include "nlohmann/json.hpp"
#include "plexus/base/net.hpp"
#include "plexus/rpc/admin.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/policies.hpp"
#include "plexus/rpc/server.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
namespace admin = plexus::base::admin;
using Json = nlohmann::json;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Empty;
using plexus::rpctest::Inner;
using plexus::rpctest::Kinds;

namespace {

class Impl : public Kinds::Service {
 public:
  absl::Status Echo(pr::ServerContext&, const AllKinds& req, AllKinds* resp) override {
    ++calls;
    *resp = req;
    return absl::OkStatus();
  }
  void HoldAsync(pr::ServerCall<Inner, Inner> call) override { call.Finish(absl::OkStatus()); }
  absl::Status Fail(pr::ServerContext&, const Inner&, Empty*) override { return absl::OkStatus(); }
  std::atomic<int> calls{0};
};

struct Fixture {
  Fixture() {
    device = *pt::Device::Create({.backend = pt::Backend::kInproc});
    server = std::move(*pr::Server::Create(device, {}));
    REQUIRE(server->Register(&impl).ok());
    REQUIRE(server->Start().ok());
    channel = *pr::Channel::Connect(device, server->address(), {&Kinds::Descriptor()});
    endpoint = std::move(*admin::AdminServer::Start({.token = "tok"}));
    rpc_admin = std::make_unique<pr::RpcAdmin>(endpoint.get());
    REQUIRE(rpc_admin->AddServer("kv", server.get(), {&Kinds::Descriptor()}).ok());
    REQUIRE(rpc_admin->AddChannel("client", channel, {&Kinds::Descriptor()}).ok());
  }
  ~Fixture() {
    rpc_admin.reset();
    channel.reset();
    server->Shutdown();
  }
  absl::StatusOr<Json> Call(std::string command, std::map<std::string, std::string> args,
                            std::string token = "tok") {
    auto r = admin::AdminCall(endpoint->address(), {token, command, args});
    if (!r.ok()) return r.status();
    return Json::parse(*r);
  }
  int EchoMany(int n) {
    Kinds::Stub stub(channel);
    int ok = 0;
    for (int i = 0; i < n; ++i) {
      AllKinds req;
      req.text = i % 4 == 3 ? "evil" : "fine";
      if (stub.EchoSync(req, {.timeout = absl::Seconds(10)}).ok()) ++ok;
    }
    return ok;
  }
  std::shared_ptr<pt::Device> device;
  Impl impl;
  std::unique_ptr<pr::Server> server;
  std::shared_ptr<pr::Channel> channel;
  std::unique_ptr<admin::AdminServer> endpoint;
  std::unique_ptr<pr::RpcAdmin> rpc_admin;
};

}  // namespace

TEST_CASE("rpc admin: list, attach, configure, metrics, detach", "[rpc][admin]") {
  Fixture f;
  REQUIRE(f.EchoMany(1) == 1);  // the connection is established and seen
  auto list = f.Call("list", {});
  REQUIRE(list.ok());
  REQUIRE(list->size() == 2);
  CHECK((*list)[0]["name"] == "client");
  CHECK((*list)[0]["role"] == "channel");
  CHECK((*list)[1]["name"] == "kv");
  CHECK((*list)[1]["role"] == "server");
  CHECK((*list)[1]["connections"].size() == 1);
  CHECK((*list)[1]["engines"] == Json({"frontend", "marshal", "transport"}));

  // An ACL and a rate limit on the server, a metrics engine on both sides.
  auto acl = f.Call("attach", {{"target", "kv"},
                               {"kind", "acl"},
                               {"name", "acl"},
                               {"config", R"({"rules":[{"name":"no-evil","method":)"
                                          R"("plexus.rpctest.Kinds/Echo","field":"text",)"
                                          R"("deny":["evil"]}]})"}});
  REQUIRE(acl.ok());
  auto rl = f.Call("attach", {{"target", "kv"},
                              {"kind", "rate_limit"},
                              {"name", "rl"},
                              {"after", "acl"},
                              {"config", R"({"rate": 0.001, "burst": 5})"}});
  REQUIRE(rl.ok());
  CHECK((*rl)["engines"] == Json({"frontend", "acl", "rl", "marshal", "transport"}));
  REQUIRE(f.Call("attach",
                 {{"target", "kv"}, {"kind", "metrics"}, {"name", "metrics"}, {"after", "rl"}})
              .ok());
  REQUIRE(f.Call("attach", {{"target", "client"}, {"kind", "metrics"}, {"name", "metrics"}}).ok());
  // 12 calls: 3 denied by the acl (never reach the limiter), 5 of the other 9 admitted.
  CHECK(f.EchoMany(12) == 5);
  CHECK(f.impl.calls == 1 + 5);
  auto engines = f.Call("engines", {{"target", "kv"}});
  REQUIRE(engines.ok());
  REQUIRE(engines->size() == 6);
  CHECK((*engines)[3]["name"] == "metrics");
  CHECK((*engines)[1]["state"] == Json({{"rules", 1}, {"checked", 12}, {"denied", 3}}));
  CHECK((*engines)[2]["state"]["admitted"] == 5);
  CHECK((*engines)[2]["state"]["rejected"] == 4);

  // Lift the limit in place: the next 4 non-evil calls pass.
  auto conf =
      f.Call("configure", {{"target", "kv"}, {"name", "rl"}, {"config", R"({"rate":"inf"})"}});
  REQUIRE(conf.ok());
  CHECK((*conf)["engine"]["state"]["rate"] == "inf");
  CHECK(f.EchoMany(4) == 3);

  auto metrics = f.Call("metrics", {{"target", "client"}});
  REQUIRE(metrics.ok());
  CHECK((*metrics)["client"]["metrics"]["plexus.rpctest.Kinds/Echo"]["calls"] == 16);
  CHECK((*metrics)["client"]["metrics"]["plexus.rpctest.Kinds/Echo"]["errors"] == 8);

  auto det = f.Call("detach", {{"target", "kv"}, {"name", "acl"}});
  REQUIRE(det.ok());
  CHECK((*det)["detached"]["kind"] == "acl");
  CHECK(f.EchoMany(4) == 4);
}

TEST_CASE("rpc admin: upgrade under load loses no call and keeps the counters",
          "[rpc][admin][upgrade]") {
  Fixture f;
  REQUIRE(f.Call("attach", {{"target", "kv"}, {"kind", "metrics"}, {"name", "metrics"}}).ok());
  REQUIRE(f.Call("attach", {{"target", "client"}, {"kind", "rate_limit"}, {"name", "rl"}}).ok());
  constexpr int kThreads = 3, kCalls = 200;
  std::atomic<int> ok{0}, running{kThreads};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      Kinds::Stub stub(f.channel);
      AllKinds req;
      for (int i = 0; i < kCalls; ++i) {
        if (stub.EchoSync(req, {.timeout = absl::Seconds(10)}).ok()) ++ok;
      }
      --running;
    });
  }
  int upgrades = 0;
  while (running > 0) {
    auto a = f.Call("upgrade", {{"target", "kv"}, {"name", "metrics"}});
    REQUIRE(a.ok());
    CHECK((*a)["from_version"] == 1);
    auto b =
        f.Call("upgrade", {{"target", "client"}, {"name", "rl"}, {"config", R"({"rate":"inf"})"}});
    REQUIRE(b.ok());
    ++upgrades;
  }
  for (auto& t : threads) t.join();
  INFO("upgrades " << upgrades);
  CHECK(upgrades >= 1);
  CHECK(ok == kThreads * kCalls);
  CHECK(f.impl.calls == kThreads * kCalls);
  auto rl = std::dynamic_pointer_cast<pr::RateLimitPolicy>(f.channel->engines().Find("rl"));
  CHECK(rl->admitted() == kThreads * kCalls);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  uint64_t counted = 0;
  while (absl::Now() < give_up) {
    auto m = std::dynamic_pointer_cast<pr::MetricsPolicy>(f.server->engines().Find("metrics"));
    counted = m->Get()["plexus.rpctest.Kinds/Echo"].calls;
    if (counted == kThreads * kCalls) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  CHECK(counted == kThreads * kCalls);
}

TEST_CASE("rpc admin: refused requests change nothing", "[rpc][admin]") {
  Fixture f;
  auto before = f.server->engines().Names();
  auto bad_token = f.Call("attach", {{"target", "kv"}, {"kind", "metrics"}, {"name", "m"}}, "x");
  CHECK(bad_token.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(f.Call("attach", {{"target", "nope"}, {"kind", "metrics"}, {"name", "m"}}).status() ==
        absl::NotFoundError("no rpc server or channel named 'nope' (known: client, kv)"));
  CHECK(
      f.Call("attach", {{"target", "kv"}, {"kind", "magic"}, {"name", "m"}}).status() ==
      absl::NotFoundError(
          "no policy kind 'magic' (built in: metrics, rate_limit, acl, balance, admission, qos)"));
  CHECK(f.Call("attach", {{"target", "kv"},
                          {"kind", "rate_limit"},
                          {"name", "rl"},
                          {"config", R"({"rate": 5, "scope": "planet"})"}})
            .status() ==
        absl::InvalidArgumentError(
            "rate_limit 'rl' configuration.scope: expected \"connection\" or \"method\""));
  CHECK(f.Call("attach", {{"target", "kv"},
                          {"kind", "acl"},
                          {"name", "acl"},
                          {"config", R"({"rules":[{"name":"r","method":"x/y","field":"f",)"
                                     R"("deny":[1]}]})"}})
            .status() ==
        absl::InvalidArgumentError("acl 'acl' configuration.rules[0].deny[0]: expected a string"));
  CHECK(f.Call("attach", {{"target", "kv"}, {"kind", "metrics"}, {"name", "m"}, {"colour", "red"}})
            .status() ==
        absl::InvalidArgumentError("admin command 'attach': unknown argument 'colour' (expected: "
                                   "target, kind, name, after, config)"));
  CHECK(f.Call("detach", {{"target", "kv"}}).status() ==
        absl::InvalidArgumentError("admin command 'detach': missing argument 'name'"));
  CHECK(f.Call("upgrade", {{"target", "kv"}, {"name", "ghost"}}).status() ==
        absl::NotFoundError("no engine named 'ghost' to upgrade on 'kv'"));
  CHECK(f.server->engines().Names() == before);
  CHECK(f.EchoMany(2) == 2);
}

#ifdef PLEXUS_RPC_CTL
namespace {
// Runs plexus-rpc-ctl with `args`; its stdout and exit status.
std::pair<std::string, int> Ctl(const std::string& args) {
  const std::string cmd = std::string(PLEXUS_RPC_CTL) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}
}  // namespace

TEST_CASE("plexus-rpc-ctl drives the endpoint and prints tables", "[rpc][admin]") {
  Fixture f;
  REQUIRE(f.EchoMany(1) == 1);
  const std::string at = "--timeout 10 --address " + f.endpoint->address() + " --token tok ";
  auto [attached, rc1] =
      Ctl(at + "attach kv rl --kind rate_limit --config '{\"rate\": \"inf\", \"burst\": 3}'");
  CHECK(rc1 == 0);
  CHECK(attached == "attached rl on kv; chain: frontend -> rl -> marshal -> transport\n");
  CHECK(f.EchoMany(2) == 2);
  auto [list, rc2] = Ctl(at + "list");
  CHECK(rc2 == 0);
  CHECK(list.find("NAME    ROLE     ADDRESS") == 0);
  CHECK(list.find("kv      server   ") != std::string::npos);
  CHECK(list.find("frontend -> rl -> marshal -> transport") != std::string::npos);
  auto [up, rc3] = Ctl(at + "upgrade kv rl --config '{\"rate\": 5, \"burst\": 2}'");
  CHECK(rc3 == 0);
  CHECK(up.find("upgraded rl on kv: rate_limit v1, calls held ") == 0);
  INFO(up);
  // The two calls before the upgrade: counted by the new version too.
  CHECK(up.find(R"(state: {"admitted":2,"buckets":1,"burst":2,"over_limit":"fail","rate":5,)") !=
        std::string::npos);
  auto [engines, rc4] = Ctl(at + "engines kv --json");
  CHECK(rc4 == 0);
  CHECK(Json::parse(engines)[1]["state"]["rate"] == 5);
  // Reconfigured in place, then upgraded without a configuration: the running one is kept, and
  // the answer says so (it used to fall back to the defaults, an unlimited rate).
  auto [conf, rc6] = Ctl(at + "configure kv rl --config '{\"rate\": 7}'");
  CHECK(rc6 == 0);
  auto [kept, rc7] = Ctl(at + "upgrade kv rl");
  INFO(kept);
  CHECK(rc7 == 0);
  CHECK(kept.find(R"(configuration (kept): {"burst":2,"rate":7})") != std::string::npos);
  auto [after, rc8] = Ctl(at + "engines kv --json");
  CHECK(rc8 == 0);
  CHECK(Json::parse(after)[1]["state"]["rate"] == 7);
  CHECK(Json::parse(after)[1]["state"]["burst"] == 2);
  auto [denied, rc5] =
      Ctl("--timeout 10 --address " + f.endpoint->address() + " --token nope detach kv rl");
  CHECK(rc5 == 1);
  CHECK(denied ==
        "plexus-rpc-ctl: admin request: wrong or missing token (see the "
        "endpoint's token setting)\n");
  CHECK(f.server->engines().Names().size() == 4);
}

TEST_CASE("plexus-rpc-ctl attaches, configures and detaches the global QoS engine live",
          "[rpc][admin][qos]") {
  Fixture f;
  REQUIRE(f.EchoMany(1) == 1);
  const std::string at = "--timeout 10 --address " + f.endpoint->address() + " --token tok ";
  auto [attached, rc1] = Ctl(
      at + "attach kv qos --kind qos --config '{\"small_bytes\": 4096, \"max_concurrent\": 2}'");
  CHECK(rc1 == 0);
  CHECK(attached == "attached qos on kv; chain: frontend -> qos -> marshal -> transport\n");
  CHECK(f.EchoMany(3) == 3);
  CHECK(f.server->qos().latency == 3);  // small requests: latency class, through the queue
  auto [conf, rc2] = Ctl(at + "configure kv qos --config '{\"small_bytes\": 0}'");
  CHECK(rc2 == 0);
  CHECK(f.EchoMany(2) == 2);
  CHECK(f.server->qos().bulk == 2);
  auto [engines, rc3] = Ctl(at + "engines kv --json");
  CHECK(rc3 == 0);
  INFO(engines);
  CHECK(Json::parse(engines)[1]["state"]["latency_calls"] == 3);
  CHECK(Json::parse(engines)[1]["state"]["bulk_calls"] == 2);
  CHECK(Json::parse(engines)[1]["state"]["max_concurrent"] == 2);
  auto [det, rc4] = Ctl(at + "detach kv qos");
  CHECK(rc4 == 0);
  CHECK(f.EchoMany(2) == 2);
  CHECK(f.server->qos().bulk + f.server->qos().latency == 5);  // detached: straight to handlers
}

TEST_CASE("plexus-rpc-ctl attaches the QoS engine to a channel: the client's reorder point",
          "[rpc][admin][qos]") {
  Fixture f;
  const std::string at = "--timeout 10 --address " + f.endpoint->address() + " --token tok ";
  auto [attached, rc1] = Ctl(at +
                             "attach client qos --kind qos --config '{\"small_bytes\": 4096, "
                             "\"max_in_flight\": 8}'");
  CHECK(rc1 == 0);
  CHECK(attached == "attached qos on client; chain: frontend -> qos -> marshal -> transport\n");
  CHECK(f.EchoMany(3) == 3);
  CHECK(f.channel->qos().latency == 3);  // small requests: latency class, through the queue
  CHECK(f.server->qos().latency == 0);   // the server has no engine
  auto [engines, rc2] = Ctl(at + "engines client --json");
  CHECK(rc2 == 0);
  INFO(engines);
  CHECK(Json::parse(engines)[1]["state"]["latency_calls"] == 3);
  CHECK(Json::parse(engines)[1]["state"]["max_in_flight"] == 8);
  auto [det, rc3] = Ctl(at + "detach client qos");
  CHECK(rc3 == 0);
  CHECK(f.EchoMany(2) == 2);
  CHECK(f.channel->qos().latency == 3);  // detached: straight to the connection
}
#endif

TEST_CASE("rpc admin: silent connections do not hold up a valid request", "[rpc][admin]") {
  Fixture f;
  auto sa = plexus::base::net::ResolveFirst(f.endpoint->address(), "admin endpoint");
  REQUIRE(sa.ok());
  // Ten clients connect and never send a byte (no token needed to do this).
  std::vector<int> silent;
  for (int i = 0; i < 10; ++i) {
    bool retry = false;
    auto fd = plexus::base::net::ConnectTcp(*sa, absl::Now() + absl::Seconds(5), &retry);
    REQUIRE(fd.ok());
    silent.push_back(*fd);
  }
  absl::SleepFor(absl::Milliseconds(50));  // the endpoint has accepted them
  const absl::Time t0 = absl::Now();
  auto r = admin::AdminCall(f.endpoint->address(), {"tok", "list", {}}, absl::Seconds(3));
  const absl::Duration took = absl::Now() - t0;
  INFO("list took " << absl::FormatDuration(took) << ": " << r.status());
  REQUIRE(r.ok());
  CHECK(took < absl::Seconds(1));
  // The silent ones are still dropped after the request timeout (2 s): each sees the close.
  for (int fd : silent) {
    char byte;
    const absl::Status st =
        plexus::base::net::RecvAll(fd, &byte, 1, absl::Now() + absl::Seconds(4));
    CHECK(st.code() == absl::StatusCode::kUnavailable);
    ::close(fd);
  }
}

TEST_CASE("rpc admin: at the connection limit the oldest silent client makes room",
          "[rpc][admin]") {
  auto endpoint = admin::AdminServer::Start({.token = "tok", .max_connections = 4});
  REQUIRE(endpoint.ok());
  (*endpoint)->Handle("ping", "", [](const admin::AdminRequest&) -> absl::StatusOr<std::string> {
    return std::string("\"pong\"");
  });
  auto sa = plexus::base::net::ResolveFirst((*endpoint)->address(), "admin endpoint");
  REQUIRE(sa.ok());
  std::vector<int> silent;
  for (int i = 0; i < 8; ++i) {
    bool retry = false;
    auto fd = plexus::base::net::ConnectTcp(*sa, absl::Now() + absl::Seconds(5), &retry);
    REQUIRE(fd.ok());
    silent.push_back(*fd);
  }
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time t0 = absl::Now();
  auto r = admin::AdminCall((*endpoint)->address(), {"tok", "ping", {}}, absl::Seconds(3));
  INFO(r.status());
  REQUIRE(r.ok());
  CHECK(*r == "\"pong\"");
  CHECK(absl::Now() - t0 < absl::Seconds(1));
  // The first four were dropped to make room for the later ones: they see the close at once.
  for (int i = 0; i < 4; ++i) {
    char byte;
    CHECK(plexus::base::net::RecvAll(silent[static_cast<size_t>(i)], &byte, 1,
                                     absl::Now() + absl::Milliseconds(500))
              .code() == absl::StatusCode::kUnavailable);
  }
  for (int fd : silent) ::close(fd);
}
