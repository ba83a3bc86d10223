// A worker process killed (SIGKILL) after joining: the other workers' round fails with an error
// naming it, long before the round timeout, over tcp and shm.
#include <catch2/catch.hpp>

#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "plexus/aggregation/client.hpp"
#include "plexus/aggregation/service.hpp"
#include "plexus/tooling/launch.hpp"

namespace pa = plexus::aggregation;
namespace pt = plexus::tooling;

TEST_CASE("A killed worker process fails the round with an error naming it",
          "[aggregation][process]") {
  const auto backend = GENERATE(plexus::transport::Backend::kTcp, plexus::transport::Backend::kShm);
  pa::ServiceOptions so;
  so.backend = backend;
  so.cores = 2;
  so.round_timeout = absl::Seconds(60);
  so.op_timeout = absl::Seconds(5);
  auto service = pa::Service::Create(so).value();
  pa::NamespaceOptions no;
  no.workers = 3;
  no.chunk_bytes = 1024;
  const auto ns = service->CreateNamespace(no).value();
  const size_t n = 600;  // 3 chunks over both cores
  std::vector<std::unique_ptr<pa::Client>> clients;
  for (int w = 0; w < 2; ++w) {
    pa::ClientOptions co;
    co.backend = backend;
    co.addresses = service->addresses();
    co.ns = ns;
    co.worker = w;
    co.chunk_bytes = 1024;
    clients.push_back(pa::Client::Connect(co).value());
    std::vector<float> v(n, 0.0f);
    REQUIRE(clients.back()->Init(1, plexus::collectives::DataType::kF32, v.data(), n).ok());
  }
  // Worker 2 in its own process, killed by pid (through the launcher) once it has initialised.
  pt::LaunchOptions lo;
  lo.ranks = 1;
  lo.plexus_env = false;
  lo.output = pt::OutputMode::kCallback;
  lo.timeout = absl::Seconds(60);
  lo.argv = {AGGREGATION_PS_WORKER,
             std::string(plexus::transport::BackendName(backend)),
             absl::StrJoin(service->addresses(), ","),
             std::to_string(ns.id),
             std::to_string(ns.nonce),
             "2",
             std::to_string(n),
             "1024"};
  bool killed = false;
  lo.on_line = [&](pt::Launcher& l, int rank, pt::Stream, std::string_view line) {
    if (line == "ready") {
      killed = l.Signal(rank, SIGKILL);
    } else {
      std::fprintf(stderr, "[worker 2] %s\n", std::string(line).c_str());
    }
  };
  auto run = pt::Launch(std::move(lo));
  REQUIRE(run.ok());
  REQUIRE(killed);
  REQUIRE(run->ranks[0].signal == SIGKILL);

  const absl::Time start = absl::Now();
  std::vector<absl::Status> st(2);
  std::vector<std::thread> t;
  for (int w = 0; w < 2; ++w) {
    t.emplace_back([&, w] {
      std::vector<float> g(n, 1.0f), out(n);
      st[w] = clients[w]->PushPull(1, g.data(), out.data(), n);
    });
  }
  for (auto& th : t) th.join();
  for (int w = 0; w < 2; ++w) {
    INFO(st[w]);
    CHECK_FALSE(st[w].ok());
    CHECK(std::string(st[w].message()).find("worker 2") != std::string::npos);
  }
  // The connection's failure, not the 60 s round timeout: within the 5 s op_timeout + slack.
  CHECK(absl::Now() - start < absl::Seconds(5) * 1.25 + absl::Milliseconds(500));
}
