// EtcdStore against a real etcd (Debian's etcd-server, started here on 127.0.0.1 with a private
// data directory and killed by PID at the end: tooling::EtcdServer), and the rendezvous over it
// (PLEXUS_STORE=etcd://...). Skips (77) when etcd is not installed.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "plexus/base/net.hpp"
#include "plexus/tooling/etcd.hpp"
#include "plexus/tooling/launch.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "plexus/transport/store.hpp"
#include "support/skip.hpp"

namespace pt = plexus::transport;

namespace {

// One etcd for the whole program (tooling::EtcdServer: private data directory, free ports).
plexus::tooling::EtcdServer& Server() {
  static std::unique_ptr<plexus::tooling::EtcdServer> server = [] {
    if (!plexus::tooling::EtcdServer::Installed()) {
      plexus::testing::SkipTest("etcd is not installed (apt-get install etcd-server)");
    }
    auto started = plexus::tooling::EtcdServer::Start(absl::Seconds(60));
    if (!started.ok()) {
      std::fprintf(stderr, "%s\n", started.status().ToString().c_str());
      std::abort();
    }
    return *std::move(started);
  }();
  return *server;
}

// Safe on any thread: Catch2's assertion macros are not, so threads report through statuses and
// the main thread asserts.
absl::StatusOr<std::unique_ptr<pt::EtcdStore>> TryConnect(const std::string& prefix,
                                                          absl::Duration ttl) {
  return pt::EtcdStore::Connect({.address = Server().address(), .prefix = prefix, .lease_ttl = ttl},
                                absl::Seconds(30));
}

// Main thread only.
std::unique_ptr<pt::EtcdStore> Connect(const std::string& prefix,
                                       absl::Duration ttl = absl::Seconds(10)) {
  auto store = TryConnect(prefix, ttl);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  return *std::move(store);
}

}  // namespace

TEST_CASE("etcd store: set, get, check, wait, delete, with errors that name the key") {
  auto store = Connect("basic/");
  CHECK(absl::StrContains(store->description(), Server().address()));
  REQUIRE(store->Set("a", std::string("bytes\0with zero", 15)).ok());
  auto a = store->Get("a", absl::Seconds(1));
  REQUIRE(a.ok());
  CHECK(*a == std::string("bytes\0with zero", 15));
  CHECK(*store->Check({"a"}) == true);
  CHECK(*store->Check({"a", "b"}) == false);
  // Get waits for a key set later, by another client.
  std::atomic<bool> seen{false};
  absl::Status writer = absl::UnknownError("the writer did not run");
  std::thread later([&seen, &writer] {
    absl::SleepFor(absl::Milliseconds(200));
    auto other = TryConnect("basic/", absl::Seconds(2));
    writer = other.status();
    if (writer.ok()) writer = (*other)->Set("b", "later");
    if (writer.ok()) writer = (*other)->Set("c", "");
    // Its lease (and keys) live until the reader saw them.
    const absl::Time until = absl::Now() + absl::Seconds(20);
    while (writer.ok() && !seen && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  });
  auto b = store->Get("b", absl::Seconds(10));
  const bool waited_all = store->Wait({"a", "b", "c"}, absl::Seconds(10)).ok();
  seen = true;
  later.join();
  INFO(writer.ToString());
  REQUIRE(writer.ok());
  REQUIRE(b.ok());
  CHECK(*b == "later");
  CHECK(waited_all);
  // Gone within the TTL (2 s) after their writer's store went, not at once: a peer may still be
  // reading them.
  const absl::Time gone_by = absl::Now() + absl::Seconds(8);
  while (*store->Check({"b"}) && absl::Now() < gone_by) absl::SleepFor(absl::Milliseconds(50));
  CHECK(*store->Check({"b"}) == false);
  auto missing = store->Get("nope", absl::Milliseconds(100));
  CHECK(absl::IsDeadlineExceeded(missing.status()));
  CHECK(absl::StrContains(missing.status().message(), "'nope'"));
  auto waited = store->Wait({"a", "x", "y"}, absl::Milliseconds(100));
  CHECK(absl::IsDeadlineExceeded(waited));
  CHECK(absl::StrContains(waited.message(), "x, y"));
  CHECK(*store->Delete("a") == true);
  CHECK(*store->Delete("a") == false);
  CHECK(absl::IsInvalidArgument(store->Set("", "v")));
  // Beyond etcd's request limit (1.5 MiB by default): etcd's own refusal, named.
  auto big = store->Set("big", std::string(size_t{2} << 20, 'x'));
  CHECK_FALSE(big.ok());
  INFO(big.ToString());
  CHECK(absl::StrContains(big.message(), "setting key 'big'"));
}

TEST_CASE("etcd store: counters are exact under concurrent adders in separate clients") {
  constexpr int kClients = 4, kAdds = 40;
  std::vector<std::vector<int64_t>> seen(kClients);
  std::vector<absl::Status> failed(kClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([c, &seen, &failed] {
      auto store = TryConnect("counter/", absl::Seconds(10));
      if (!store.ok()) {
        failed[c] = store.status();
        return;
      }
      for (int i = 0; i < kAdds; ++i) {
        auto v = (*store)->Add("n", 1);
        if (!v.ok()) {
          failed[c] = v.status();
          return;
        }
        seen[c].push_back(*v);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int c = 0; c < kClients; ++c) {
    INFO("client " << c << ": " << failed[c].ToString());
    REQUIRE(failed[c].ok());
  }
  std::set<int64_t> all;
  for (const auto& s : seen) all.insert(s.begin(), s.end());
  CHECK(all.size() == size_t{kClients * kAdds});  // every value handed out once
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == kClients * kAdds);
  auto store = Connect("counter/");
  CHECK(*store->Get("n", absl::Seconds(1)) == std::to_string(kClients * kAdds));
  CHECK(*store->Add("n", -kClients * kAdds) == 0);
  REQUIRE(store->Set("text", "abc").ok());
  CHECK(absl::IsInvalidArgument(store->Add("text", 1).status()));
}

TEST_CASE("etcd store: a killed process's keys expire with its lease") {
  Server();  // started before the fork
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(ready[0]);
    auto store = pt::EtcdStore::Connect(
        {.address = Server().address(), .prefix = "lease/", .lease_ttl = absl::Seconds(2)},
        absl::Seconds(10));
    if (!store.ok() || !(*store)->Set("child", "alive").ok()) _exit(1);
    char one = 1;
    if (write(ready[1], &one, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char got = 0;
  REQUIRE(read(ready[0], &got, 1) == 1);
  close(ready[0]);
  auto store = Connect("lease/");
  CHECK(*store->Check({"child"}) == true);
  // The lease is kept alive while the process lives (longer than its TTL).
  absl::SleepFor(absl::Seconds(3));
  CHECK(*store->Check({"child"}) == true);
  const absl::Time killed = absl::Now();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  while (*store->Check({"child"}) && absl::Now() - killed < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  INFO("gone after " << absl::FormatDuration(absl::Now() - killed));
  CHECK(*store->Check({"child"}) == false);
  CHECK(absl::Now() - killed < absl::Seconds(5));  // TTL 2 s (etcd may round up)
}

TEST_CASE("etcd store: jobs rendezvous through PLEXUS_STORE=etcd:// apart from each other") {
  const std::string url = absl::StrCat("etcd://", Server().address());
  constexpr int kRanks = 3;
  std::vector<std::string> results(2 * kRanks);
  std::vector<std::thread> threads;
  for (int job = 0; job < 2; ++job) {
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, job, r] {
        pt::Environment env{{"PLEXUS_RANK", std::to_string(r)},
                            {"PLEXUS_WORLD_SIZE", std::to_string(kRanks)},
                            {"PLEXUS_STORE", url},
                            {"PLEXUS_JOB_ID", absl::StrCat("etcd-job-", job)}};
        auto rdzv = pt::Rendezvous::FromEnv(env, absl::Seconds(30));
        if (!rdzv.ok()) {
          results[job * kRanks + r] = rdzv.status().ToString();
          return;
        }
        auto all = rdzv->AllGather("v", absl::StrCat("j", job, "r", r), absl::Seconds(30));
        results[job * kRanks + r] = all.ok() ? absl::StrJoin(*all, ",") : all.status().ToString();
        (void)rdzv->Barrier("end", absl::Seconds(30));
      });
    }
  }
  for (auto& t : threads) t.join();
  for (int job = 0; job < 2; ++job) {
    for (int r = 0; r < kRanks; ++r) {
      INFO("job " << job << " rank " << r);
      CHECK(results[job * kRanks + r] == absl::StrCat("j", job, "r0,j", job, "r1,j", job, "r2"));
    }
  }
  // Without a job id, jobs sharing the etcd could meet: refused, saying what to set.
  auto no_id = pt::ParseLaunchEnvironment(
      {{"PLEXUS_RANK", "0"}, {"PLEXUS_WORLD_SIZE", "2"}, {"PLEXUS_STORE", url}});
  CHECK(absl::IsInvalidArgument(no_id.status()));
  CHECK(absl::StrContains(no_id.status().message(), "PLEXUS_JOB_ID"));
  auto scheme = pt::ParseLaunchEnvironment(
      {{"PLEXUS_RANK", "0"}, {"PLEXUS_WORLD_SIZE", "2"}, {"PLEXUS_STORE", "redis://h:1"}});
  CHECK(absl::StrContains(scheme.status().message(), "etcd://host:port"));
  auto parsed = pt::ParseLaunchEnvironment({{"PLEXUS_RANK", "1"},
                                            {"PLEXUS_WORLD_SIZE", "2"},
                                            {"PLEXUS_STORE", url},
                                            {"PLEXUS_JOB_ID", "j"}});
  REQUIRE(parsed.ok());
  CHECK(parsed->store_kind == pt::StoreKind::kEtcd);
  CHECK(parsed->store_address == Server().address());
}

TEST_CASE("etcd store: no etcd at the address is reported within the timeout") {
  auto port = plexus::base::net::ReserveLoopbackPort();
  REQUIRE(port.ok());
  const absl::Time start = absl::Now();
  auto store =
      pt::EtcdStore::Connect({.address = absl::StrCat("127.0.0.1:", *port)}, absl::Seconds(1));
  CHECK_FALSE(store.ok());
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK(absl::StrContains(store.status().message(), absl::StrCat("127.0.0.1:", *port)));
}

// Only where plexus-run is built (PLEXUS_BUILD_TOOLS).
#ifdef PLEXUS_RUN
TEST_CASE("etcd store: ranks under plexus-run meet in the etcd PLEXUS_STORE names") {
  const std::string url = absl::StrCat("etcd://", Server().address());
  // Each rank meets the others through the store, exchanges a value with each over a mesh and
  // prints the store kind it used.
  plexus::tooling::LaunchOptions o;
  o.argv = {PLEXUS_RUN, "-n", "2", "--timeout", "60", PLEXUS_LAUNCH_PROBE};
  o.env = {{"PLEXUS_STORE", url}};
  o.plexus_env = false;
  o.output = plexus::tooling::OutputMode::kCaptured;
  o.timeout = absl::Seconds(90);
  auto run = plexus::tooling::Launch(std::move(o));
  REQUIRE(run.ok());
  const std::string out = run->ranks[0].out + run->ranks[0].err;
  INFO(out);
  CHECK(run->exit_code == 0);
  CHECK(absl::StrContains(out, "launch_probe rank 0 of 2 launcher plexus store etcd sum"));
  CHECK(absl::StrContains(out, "launch_probe rank 1 of 2 launcher plexus store etcd sum"));
  CHECK_FALSE(absl::StrContains(out, "WRONG"));
}
#endif  // PLEXUS_RUN
