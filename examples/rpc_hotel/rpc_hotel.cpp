// The hotel chain over plexus::rpc, in one process over tcp on 127.0.0.1: a frontend that asks
// search for the hotels near a point and then profile for their descriptions; three profile
// replicas behind one Daronpon-balanced channel (replica 2 is slower); a closed-loop load
// generator; an admin endpoint for plexus-rpc-ctl.
//
//   rpc-hotel --seconds 60                  # prints the admin address and token, then serves;
//                                           # attach policies by hand with plexus-rpc-ctl
//   rpc-hotel --ctl build/tools/rpc/plexus-rpc-ctl   # the scripted run CTest does: an ACL and a
//                                           # rate limit attached while the load runs, checked
#include <spawn.h>
#include <sys/wait.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hotel.plexus.hpp"
#include "plexus/base/admin.hpp"
#include "plexus/rpc/admin.hpp"
#include "plexus/rpc/policies.hpp"

extern char** environ;

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
namespace ph = plexus::hotel;
namespace admin = plexus::base::admin;

namespace {

constexpr int kHotels = 80;
constexpr const char* kCustomers[] = {"alice", "bob", "carol", "mallory"};
constexpr int kMallory = 3;

// The catalogue: stable strings the services' responses view without copying.
struct Catalogue {
  Catalogue() {
    for (int i = 0; i < kHotels; ++i) {
      ids[i] = absl::StrCat("h", i);
      names[i] = absl::StrCat("Hotel ", i);
      phones[i] = absl::StrFormat("+1-555-%04d", 1000 + i);
      descriptions[i] = absl::StrCat("A quiet place, ", i % 7 + 1, " stars of comfort.");
      streets[i] = absl::StrCat(100 + i, " Main Street");
      points[i] = {37.7f + 0.01f * static_cast<float>(i % 10), -122.4f + 0.01f * (i / 10.0f)};
      addresses[i] = {streets[i], "San Francisco", &points[i]};
      hotels[i] = {ids[i], names[i], phones[i], descriptions[i], &addresses[i]};
    }
  }
  std::array<std::string, kHotels> ids, names, phones, descriptions, streets;
  std::array<ph::Point, kHotels> points;
  std::array<ph::Address, kHotels> addresses;
  std::array<ph::Hotel, kHotels> hotels;
};
const Catalogue& Hotels() {
  static const Catalogue c;
  return c;
}

void Spin(absl::Duration d) {
  const absl::Time until = absl::Now() + d;
  while (absl::Now() < until) {
  }
}

class SearchImpl : public ph::Search::Service {
 public:
  absl::Status Nearby(pr::ServerContext& ctx, const ph::NearbyRequest& req,
                      ph::NearbyResponse* resp) override {
    const uint32_t limit = std::min<uint32_t>(req.limit == 0 ? 5 : req.limit, 10);
    const int first = req.at ? static_cast<int>(req.at->lat * 100) % kHotels : 0;
    auto* ids = static_cast<std::string_view*>(
        ctx.Allocate(sizeof(std::string_view) * limit, alignof(std::string_view)));
    for (uint32_t k = 0; k < limit; ++k) {
      new (&ids[k]) std::string_view(Hotels().ids[(first + k) % kHotels]);
    }
    resp->hotel_ids = pr::Repeated<std::string_view>(ids, limit);
    return absl::OkStatus();
  }
};

class ProfileImpl : public ph::Profile::Service {
 public:
  ProfileImpl(uint32_t replica, absl::Duration cost) : replica_(replica), cost_(cost) {}
  absl::Status GetProfiles(pr::ServerContext& ctx, const ph::ProfileRequest& req,
                           ph::ProfileResponse* resp) override {
    ++calls;
    Spin(cost_);
    auto* hotels = static_cast<ph::Hotel*>(
        ctx.Allocate(sizeof(ph::Hotel) * req.hotel_ids.size(), alignof(ph::Hotel)));
    size_t n = 0;
    for (std::string_view id : req.hotel_ids) {
      int i = -1;
      if (id.size() > 1 && id[0] == 'h') i = std::atoi(std::string(id.substr(1)).c_str());
      if (i < 0 || i >= kHotels)
        return absl::NotFoundError(absl::StrCat("no hotel ", std::string(id)));
      new (&hotels[n++]) ph::Hotel(Hotels().hotels[i]);
    }
    resp->hotels = pr::Repeated<ph::Hotel>(hotels, n);
    resp->replica = replica_;
    return absl::OkStatus();
  }
  std::atomic<uint64_t> calls{0};

 private:
  uint32_t replica_;
  absl::Duration cost_;
};

// The frontend: Nearby then GetProfiles, asynchronously (the callbacks run on the channels'
// threads, so the frontend's dispatcher never blocks on a downstream call).
class FrontendImpl : public ph::Frontend::Service {
 public:
  FrontendImpl(std::shared_ptr<pr::Channel> search, std::shared_ptr<pr::Channel> profile)
      : search_(std::move(search)), profile_(std::move(profile)) {}

  void SearchHotelsAsync(pr::ServerCall<ph::SearchRequest, ph::SearchResponse> call) override {
    pr::ServerContext& ctx = call.context();
    // The downstream requests live in the call's memory until the response is sent.
    auto* nearby = new (ctx.Allocate(sizeof(ph::NearbyRequest), alignof(ph::NearbyRequest)))
        ph::NearbyRequest();
    nearby->at = call.request().at;
    nearby->in_date = call.request().in_date;
    nearby->out_date = call.request().out_date;
    nearby->limit = 5;
    const absl::Duration budget = std::max(ctx.deadline() - absl::Now(), absl::Milliseconds(1));
    pr::CallOptions options{.timeout = std::min(budget, absl::Seconds(5))};
    search_.Nearby(*nearby, options, [this, call, options](auto found) mutable {
      if (!found.ok()) {
        call.Finish(found.status());
        return;
      }
      pr::ServerContext& ctx = call.context();
      auto* profiles = new (ctx.Allocate(sizeof(ph::ProfileRequest), alignof(ph::ProfileRequest)))
          ph::ProfileRequest();
      // Copy the ids out of the search reply (it is released when this callback returns).
      const auto& ids = (*found)->hotel_ids;
      auto* kept = static_cast<std::string_view*>(
          ctx.Allocate(sizeof(std::string_view) * ids.size(), alignof(std::string_view)));
      for (size_t i = 0; i < ids.size(); ++i)
        new (&kept[i]) std::string_view(ctx.CopyString(ids[i]));
      profiles->hotel_ids = pr::Repeated<std::string_view>(kept, ids.size());
      profiles->locale = call.request().locale;
      profile_.GetProfiles(*profiles, options, [call](auto got) mutable {
        if (!got.ok()) {
          call.Finish(got.status());
          return;
        }
        // The profiles view the catalogue, which outlives every call: a shallow copy suffices.
        pr::ServerContext& ctx = call.context();
        const auto& hotels = (*got)->hotels;
        auto* out = static_cast<ph::Hotel*>(
            ctx.Allocate(sizeof(ph::Hotel) * hotels.size(), alignof(ph::Hotel)));
        for (size_t i = 0; i < hotels.size(); ++i) {
          const int h = std::atoi(std::string(hotels[i].id.substr(1)).c_str());
          new (&out[i]) ph::Hotel(Hotels().hotels[h]);
        }
        call.response()->hotels = pr::Repeated<ph::Hotel>(out, hotels.size());
        call.response()->profile_replica = (*got)->replica;
        call.Finish(absl::OkStatus());
      });
    });
  }

 private:
  ph::Search::Stub search_;
  ph::Profile::Stub profile_;
};

// What the load generator saw, per customer and status code.
struct Counters {
  std::array<std::array<std::atomic<uint64_t>, 17>, 4> by_code{};
  uint64_t Get(int customer, absl::StatusCode code) const {
    return by_code[customer][static_cast<int>(code)].load();
  }
  uint64_t Sum(absl::StatusCode code) const {
    uint64_t s = 0;
    for (int c = 0; c < 4; ++c) s += Get(c, code);
    return s;
  }
};
struct Snapshot {
  absl::Time at;
  std::array<std::array<uint64_t, 17>, 4> by_code{};
  uint64_t Get(int c, absl::StatusCode code) const { return by_code[c][static_cast<int>(code)]; }
  uint64_t Sum(absl::StatusCode code) const {
    uint64_t s = 0;
    for (int c = 0; c < 4; ++c) s += Get(c, code);
    return s;
  }
};
Snapshot Take(const Counters& c) {
  Snapshot s;
  s.at = absl::Now();
  for (int i = 0; i < 4; ++i) {
    for (int k = 0; k < 17; ++k) s.by_code[i][k] = c.by_code[i][k].load();
  }
  return s;
}

// Runs plexus-rpc-ctl with `args` against the endpoint; its output goes to ours.
int Ctl(const std::string& ctl, const std::string& address, const std::string& token,
        std::vector<std::string> args) {
  std::vector<std::string> argv{ctl, "--address", address, "--token", token, "--timeout", "5"};
  for (auto& a : args) argv.push_back(std::move(a));
  std::string line = "$ plexus-rpc-ctl";
  for (size_t i = 7; i < argv.size(); ++i) absl::StrAppend(&line, " ", argv[i]);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  std::vector<char*> raw;
  for (auto& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, ctl.c_str(), nullptr, nullptr, raw.data(), environ) != 0) {
    std::fprintf(stderr, "rpc-hotel: cannot run %s: %s\n", ctl.c_str(), std::strerror(errno));
    return -1;
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

template <typename T>
T Must(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "rpc-hotel: %s: %s\n", what, std::string(v.status().message()).c_str());
    std::exit(1);
  }
  return std::move(*v);
}
void Must(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "rpc-hotel: %s: %s\n", what, std::string(s.message()).c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "The hotel chain (frontend -> search, profile x3 balanced by Daronpon) under a load\n"
      "generator, with an admin endpoint for plexus-rpc-ctl. With --ctl it runs the scripted\n"
      "scenario (ACL, then rate limit, attached at run time, effects checked) and exits 0 when\n"
      "every check held.",
      "rpc-hotel");
  double seconds = 30;
  int clients = 4;
  double rate = 50;
  std::string ctl, token = "hotel-demo-token";
  app.add_option("--seconds", seconds, "how long the load runs without --ctl")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  app.add_option("--clients", clients, "load generator threads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--rate", rate, "the scripted rate limit, calls/s")
      ->check(CLI::Range(1.0, 1e6))
      ->capture_default_str();
  app.add_option("--ctl", ctl, "plexus-rpc-ctl: run the scripted scenario with it");
  app.add_option("--token", token, "the admin endpoint's token")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto device =
      Must(pt::Device::Create({.backend = pt::Backend::kTcp, .local_address = "127.0.0.1"}),
           "tcp device");
  auto serve = [&](pr::ServiceBase* service) {
    auto s = Must(pr::Server::Create(device), "server");
    Must(s->Register(service), "register");
    Must(s->Start(), "start");
    return s;
  };
  SearchImpl search;
  auto search_server = serve(&search);
  // Replica 2 costs three times as much: Daronpon sends it fewer calls.
  std::vector<std::unique_ptr<ProfileImpl>> profiles;
  std::vector<std::unique_ptr<pr::Server>> profile_servers;
  std::vector<std::string> profile_addresses;
  for (uint32_t r = 0; r < 3; ++r) {
    profiles.push_back(std::make_unique<ProfileImpl>(r, absl::Microseconds(r == 2 ? 600 : 200)));
    profile_servers.push_back(serve(profiles.back().get()));
    profile_addresses.push_back(profile_servers.back()->address());
  }
  auto to_search =
      Must(pr::Channel::Connect(device, search_server->address(), {&ph::Search::Descriptor()}),
           "channel to search");
  auto to_profile =
      Must(pr::Channel::ConnectReplicas(device, profile_addresses, {&ph::Profile::Descriptor()},
                                        {.balance = "daronpon"}),
           "channel to the profile replicas");
  FrontendImpl frontend(to_search, to_profile);
  auto frontend_server = serve(&frontend);

  // The operator's endpoint: every server and the frontend's two channels.
  auto endpoint =
      Must(admin::AdminServer::Start({.address = "127.0.0.1:0", .token = token}), "admin endpoint");
  pr::RpcAdmin rpc_admin(endpoint.get());
  Must(rpc_admin.AddServer("frontend", frontend_server.get(), {&ph::Frontend::Descriptor()}),
       "admin");
  Must(rpc_admin.AddServer("search", search_server.get(), {&ph::Search::Descriptor()}), "admin");
  for (uint32_t r = 0; r < 3; ++r) {
    Must(rpc_admin.AddServer(absl::StrCat("profile-", r), profile_servers[r].get(),
                             {&ph::Profile::Descriptor()}),
         "admin");
  }
  Must(rpc_admin.AddChannel("frontend-to-search", to_search, {&ph::Search::Descriptor()}), "admin");
  Must(rpc_admin.AddChannel("frontend-to-profile", to_profile, {&ph::Profile::Descriptor()}),
       "admin");
  Must(frontend_server->engines().Attach(std::make_shared<pr::MetricsPolicy>("metrics")),
       "metrics");
  std::printf("rpc-hotel: frontend %s, search %s, profile %s %s %s\n",
              frontend_server->address().c_str(), search_server->address().c_str(),
              profile_addresses[0].c_str(), profile_addresses[1].c_str(),
              profile_addresses[2].c_str());
  std::printf("rpc-hotel: admin endpoint PLEXUS_RPC_ADMIN=%s PLEXUS_RPC_ADMIN_TOKEN=%s\n",
              endpoint->address().c_str(), token.c_str());
  std::fflush(stdout);

  // The load generator: closed loop, each thread on its own connection, customers in turn.
  Counters counters;
  std::atomic<bool> stop{false};
  std::vector<std::thread> load;
  for (int t = 0; t < clients; ++t) {
    load.emplace_back([&, t] {
      auto ch =
          pr::Channel::Connect(device, frontend_server->address(), {&ph::Frontend::Descriptor()});
      if (!ch.ok()) return;
      ph::Frontend::Stub stub(*ch);
      for (uint64_t i = t; !stop.load(); i += clients) {
        const int customer = static_cast<int>(i % 4);
        ph::Point at{37.7f + 0.001f * static_cast<float>(i % 100), -122.4f};
        ph::SearchRequest req;
        req.customer = kCustomers[customer];
        req.at = &at;
        req.in_date = "2026-12-01";
        req.out_date = "2026-12-03";
        req.locale = "en";
        auto r = stub.SearchHotelsSync(req, {.timeout = absl::Seconds(5)});
        ++counters.by_code[customer][static_cast<int>(r.status().code())];
      }
    });
  }

  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    std::printf("  [%s] %s\n", ok ? "ok" : "FAILED", what.c_str());
    if (!ok) ++failures;
  };
  auto per_s = [](uint64_t n, absl::Duration d) {
    return static_cast<double>(n) / absl::ToDoubleSeconds(d);
  };
  if (ctl.empty()) {
    absl::SleepFor(absl::Seconds(seconds));
  } else {
    const std::string address = endpoint->address();
    auto run = [&](std::vector<std::string> args) {
      const int rc = Ctl(ctl, address, token, std::move(args));
      check(rc == 0, absl::StrCat("plexus-rpc-ctl exited with ", rc));
    };
    absl::SleepFor(absl::Seconds(1));
    Snapshot s0 = Take(counters);
    absl::SleepFor(absl::Seconds(1));
    Snapshot s1 = Take(counters);
    const double base =
        per_s(s1.Sum(absl::StatusCode::kOk) - s0.Sum(absl::StatusCode::kOk), s1.at - s0.at);
    std::printf("phase 1, no policy: %.0f calls/s ok, mallory ok %llu\n", base,
                static_cast<unsigned long long>(s1.Get(kMallory, absl::StatusCode::kOk)));
    check(s1.Sum(absl::StatusCode::kPermissionDenied) == 0, "no call denied before the ACL");
    run({"list"});

    // The ACL on the frontend's typed request: mallory's searches are denied from now on.
    run({"attach", "frontend", "acl", "--kind", "acl", "--config",
         R"({"rules": [{"name": "no-mallory", "method": "plexus.hotel.Frontend/SearchHotels",
             "field": "customer", "deny": ["mallory"]}]})"});
    absl::SleepFor(absl::Milliseconds(300));  // calls already past the ACL drain
    Snapshot s2 = Take(counters);
    absl::SleepFor(absl::Seconds(1));
    Snapshot s3 = Take(counters);
    const uint64_t mallory_ok =
        s3.Get(kMallory, absl::StatusCode::kOk) - s2.Get(kMallory, absl::StatusCode::kOk);
    const uint64_t mallory_denied = s3.Get(kMallory, absl::StatusCode::kPermissionDenied) -
                                    s2.Get(kMallory, absl::StatusCode::kPermissionDenied);
    const uint64_t others_ok = s3.Sum(absl::StatusCode::kOk) - s2.Sum(absl::StatusCode::kOk);
    std::printf("phase 2, ACL: mallory ok %llu, denied %llu; the others ok %llu\n",
                static_cast<unsigned long long>(mallory_ok),
                static_cast<unsigned long long>(mallory_denied),
                static_cast<unsigned long long>(others_ok));
    check(mallory_ok == 0, "no call of mallory succeeds under the ACL");
    check(mallory_denied > 0, "mallory's calls fail with PERMISSION_DENIED");
    check(
        s3.Sum(absl::StatusCode::kPermissionDenied) - s2.Sum(absl::StatusCode::kPermissionDenied) ==
            mallory_denied,
        "nobody else is denied");
    check(others_ok > 0, "the other customers' calls go on");

    // The rate limit: one bucket for the method across all connections.
    run({"attach", "frontend", "rl", "--kind", "rate_limit", "--config",
         absl::StrFormat(R"({"rate": %g, "burst": 5, "scope": "method"})", rate)});
    absl::SleepFor(absl::Milliseconds(300));
    Snapshot s4 = Take(counters);
    absl::SleepFor(absl::Seconds(2));
    Snapshot s5 = Take(counters);
    // The rate limit runs first (attached after "frontend", before the ACL): what it admits
    // either succeeds or is denied by the ACL.
    const uint64_t admitted = s5.Sum(absl::StatusCode::kOk) - s4.Sum(absl::StatusCode::kOk) +
                              s5.Sum(absl::StatusCode::kPermissionDenied) -
                              s4.Sum(absl::StatusCode::kPermissionDenied);
    const uint64_t exhausted =
        s5.Sum(absl::StatusCode::kResourceExhausted) - s4.Sum(absl::StatusCode::kResourceExhausted);
    const absl::Duration window = s5.at - s4.at;
    std::printf("phase 3, rate limit %g/s: %.1f calls/s admitted, %.0f/s RESOURCE_EXHAUSTED\n",
                rate, per_s(admitted, window), per_s(exhausted, window));
    // A token bucket admits at most burst + rate x time (+1 for a token refilled between the
    // snapshot and the call counted, and calls already past it when the window opened).
    check(static_cast<double>(admitted) <= 5 + rate * absl::ToDoubleSeconds(window) + clients + 1,
          absl::StrFormat("at most %g/s admitted", rate));
    check(exhausted > 0, "calls over the rate fail with RESOURCE_EXHAUSTED");
    run({"engines", "frontend"});
    run({"metrics", "frontend"});

    // Both detached: everyone's calls succeed again.
    run({"detach", "frontend", "rl"});
    run({"detach", "frontend", "acl"});
    absl::SleepFor(absl::Milliseconds(300));
    Snapshot s6 = Take(counters);
    absl::SleepFor(absl::Seconds(1));
    Snapshot s7 = Take(counters);
    check(s7.Get(kMallory, absl::StatusCode::kOk) > s6.Get(kMallory, absl::StatusCode::kOk),
          "mallory's calls succeed again after the detach");
    check(s7.Sum(absl::StatusCode::kResourceExhausted) ==
              s6.Sum(absl::StatusCode::kResourceExhausted),
          "no RESOURCE_EXHAUSTED after the detach");
    run({"engines", "frontend-to-profile"});
  }
  stop = true;
  for (auto& t : load) t.join();

  // Daronpon across the profile replicas.
  auto lb = std::dynamic_pointer_cast<pr::LoadBalancePolicy>(to_profile->engines().Find("balance"));
  const auto stats = lb->stats();
  std::printf("profile replicas (replica 2 is 3x slower): calls %llu %llu %llu, redirects %llu\n",
              static_cast<unsigned long long>(profiles[0]->calls.load()),
              static_cast<unsigned long long>(profiles[1]->calls.load()),
              static_cast<unsigned long long>(profiles[2]->calls.load()),
              static_cast<unsigned long long>(stats.redirects));
  const uint64_t other_errors = [&] {
    uint64_t n = 0;
    for (int k = 0; k < 17; ++k) {
      const auto code = static_cast<absl::StatusCode>(k);
      if (code != absl::StatusCode::kOk && code != absl::StatusCode::kPermissionDenied &&
          code != absl::StatusCode::kResourceExhausted) {
        n += counters.Sum(code);
      }
    }
    return n;
  }();
  std::printf("totals: ok %llu, PERMISSION_DENIED %llu, RESOURCE_EXHAUSTED %llu, other %llu\n",
              static_cast<unsigned long long>(counters.Sum(absl::StatusCode::kOk)),
              static_cast<unsigned long long>(counters.Sum(absl::StatusCode::kPermissionDenied)),
              static_cast<unsigned long long>(counters.Sum(absl::StatusCode::kResourceExhausted)),
              static_cast<unsigned long long>(other_errors));
  if (!ctl.empty()) {
    check(other_errors == 0, "no call failed with another code");
    for (int r = 0; r < 3; ++r) {
      check(profiles[r]->calls.load() > 0, absl::StrCat("profile replica ", r, " served calls"));
    }
    std::printf("rpc-hotel: %s\n", failures == 0 ? "every check held" : "CHECKS FAILED");
  }
  rpc_admin.Remove("frontend");
  frontend_server->Shutdown();
  return failures == 0 ? 0 : 1;
}
