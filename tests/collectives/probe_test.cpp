// The latency prober with 4 ranks as threads (inproc, and tcp on 127.0.0.1), a silent rank
// (bounded, the error names the pair), and its order plugged into a communicator.
#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "plexus/base/host.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/collectives/probe.hpp"
#include "plexus/netmodel/reorder.hpp"
#include "plexus/transport/device.hpp"
#include "plexus/transport/mesh.hpp"
#include "plexus/transport/store.hpp"
#include "support/loopback.hpp"

namespace pc = plexus::collectives;
namespace pn = plexus::netmodel;
namespace pt = plexus::transport;

namespace {

// Runs body(rank, rendezvous) on n threads sharing a loopback store.
std::vector<std::string> OnRanks(int n,
                                 const std::function<std::string(int, pt::Rendezvous&)>& body) {
  const plexus::testing::LoopbackStore loopback = plexus::testing::StartLoopbackStore();
  std::vector<std::string> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto rdv = pt::Rendezvous::Create(r, n, loopback.store);
      if (!rdv.ok()) {
        results[r] = "rendezvous: " + std::string(rdv.status().message());
        return;
      }
      results[r] = body(r, *rdv);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

std::string CheckMatrix(const pn::CostMatrix& m, int n) {
  if (m.n != n) return "n is " + std::to_string(m.n);
  if (auto s = m.Validate(); !s.ok()) return std::string(s.message());
  for (int i = 0; i < n; ++i) {
    if (m.labels[i] != plexus::base::HostName()) return "label " + m.labels[i];
    for (int j = 0; j < n; ++j) {
      if (m.latency(i, j) != m.latency(j, i)) return "not symmetric";
      // Loopback round trips between threads: well under 50 ms even on a loaded machine.
      if (i != j && !(m.latency(i, j) < 50'000))
        return "latency " + std::to_string(m.latency(i, j));
    }
  }
  return "";
}

void ProbeWith(pt::Backend backend, const std::string& local_address) {
  const int n = 4;
  std::vector<pn::CostMatrix> matrices(n);
  std::vector<std::vector<int>> progress(n);
  auto results = OnRanks(n, [&](int r, pt::Rendezvous& rdv) -> std::string {
    pc::ProbeOptions o;
    o.backend = backend;
    o.local_address = local_address;
    o.probes = 30;
    o.warmup = 5;
    o.progress = [&, r](int round, int rounds) {
      progress[r].push_back(round);
      progress[r].push_back(rounds);
    };
    auto m = pc::ProbeLatency(rdv, o);
    if (!m.ok()) return std::string(m.status().message());
    matrices[r] = *m;
    return CheckMatrix(*m, n);
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(results[r] == "");
    // Three rounds of two disjoint pairs for four ranks.
    CHECK(progress[r] == std::vector<int>{1, 3, 2, 3, 3, 3});
    // Every rank holds the same matrix.
    CHECK(matrices[r].latency_us == matrices[0].latency_us);
  }
}

}  // namespace

TEST_CASE("probe: 4 ranks over inproc", "[probe]") { ProbeWith(pt::Backend::kInproc, ""); }

TEST_CASE("probe: 4 ranks over tcp on 127.0.0.1", "[probe]") {
  ProbeWith(pt::Backend::kTcp, "127.0.0.1");
}

TEST_CASE("probe: a silent rank fails its partner within the timeout, naming the pair", "[probe]") {
  const int n = 4;
  const absl::Duration timeout = absl::Seconds(1);
  std::vector<double> seconds(n, 0);
  auto results = OnRanks(n, [&](int r, pt::Rendezvous& rdv) -> std::string {
    if (r == 3) {
      // Joins the probe's mesh, then never answers.
      pt::DeviceOptions d;
      d.backend = pt::Backend::kInproc;
      auto device = pt::Device::Create(d);
      if (!device.ok()) return std::string(device.status().message());
      auto cq = (*device)->CreateCompletionQueue();
      auto mesh = pt::ConnectFullMesh(rdv, **device, cq.get(), "plexus/probe", timeout);
      if (!mesh.ok()) return std::string(mesh.status().message());
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      return "silent";
    }
    pc::ProbeOptions o;
    o.backend = pt::Backend::kInproc;
    o.probes = 10;
    o.warmup = 0;
    o.timeout = timeout;
    const auto start = std::chrono::steady_clock::now();
    auto m = pc::ProbeLatency(rdv, o);
    seconds[r] = plexus::testing::SecondsSince(start);
    if (m.ok()) return "ok";
    return std::string(absl::StatusCodeToString(m.status().code())) + ": " +
           std::string(m.status().message());
  });
  // Round 1 pairs (0, 3) and (1, 2): rank 0 waits for rank 3's first echo.
  INFO(results[0]);
  CHECK(results[0].rfind("DEADLINE_EXCEEDED: latency probe round 1/3, pair (rank 0, rank 3): "
                         "rank 0 waiting for rank 3",
                         0) == 0);
  CHECK(seconds[0] <= 1.25 * 1 + 0.5);
  // The others fail too (their partner gave up, or rank 3 is silent), none succeeds or hangs.
  for (int r = 1; r < 3; ++r) {
    INFO("rank " << r << ": " << results[r]);
    CHECK(results[r] != "ok");
    CHECK(results[r].find("latency probe") != std::string::npos);
    CHECK(seconds[r] <= 3 * (1.25 * 1 + 0.5));
  }
}

TEST_CASE("probe: the chosen order plugs into a communicator", "[probe]") {
  const int n = 4;
  std::vector<std::vector<int>> used(n);
  std::vector<std::vector<int>> chosen(n);
  auto results = OnRanks(n, [&](int r, pt::Rendezvous& rdv) -> std::string {
    pc::ProbeOptions o;
    o.backend = pt::Backend::kInproc;
    o.probes = 10;
    o.warmup = 2;
    auto m = pc::ProbeLatency(rdv, o);
    if (!m.ok()) return std::string(m.status().message());
    // Every rank computes the same order from the same matrix and seed.
    auto order = pn::Reorder(*m, {});
    if (!order.ok()) return std::string(order.status().message());
    chosen[r] = order->order;
    pc::CommunicatorOptions options;
    options.device.backend = pt::Backend::kInproc;
    options.ring_order = order->order;
    auto comm = pc::Communicator::Create(rdv, options);
    if (!comm.ok()) return std::string(comm.status().message());
    used[r] = (*comm)->ring_order();
    std::vector<float> v(1000, static_cast<float>(r + 1));
    if (auto s = (*comm)->AllReduce(v.data(), v.data(), v.size(), pc::DataType::kF32,
                                    pc::ReduceOp::kSum);
        !s.ok()) {
      return std::string(s.message());
    }
    for (float x : v) {
      if (x != 10) return "allreduce gave " + std::to_string(x);
    }
    return "";
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(results[r] == "");
    CHECK(used[r] == chosen[0]);
  }
}
