// One transport per peer: 4 ranks as threads declaring two hosts (CommunicatorOptions::host_id),
// two ranks each. Ranks of one host talk over shm, the others over tcp (127.0.0.1); the results
// of AllReduce and AllToAll are exact; the uniform policy (option or environment) puts every
// pair on device.backend.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "peer_transport.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/collectives/reconfiguration.hpp"
#include "ranks.hpp"

namespace pc = plexus::collectives;
namespace pt = plexus::transport;

namespace {

constexpr int kRanks = 4;

pc::CommunicatorOptions TcpOptions() {
  pc::CommunicatorOptions o;
  o.device.backend = pt::Backend::kTcp;
  o.device.local_address = "127.0.0.1";
  o.timeout = absl::Seconds(20);
  o.connect_timeout = absl::Seconds(20);
  return o;
}

// AllReduce and AllToAll (small: one message per peer; large: many chunks), checked exactly;
// "" when right.
std::string ExactCalls(int rank, pc::Communicator& comm) {
  for (size_t count : {size_t{5}, size_t{70000}}) {
    std::vector<int32_t> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(i % 1000) * (rank + 1);
    absl::Status s =
        comm.AllReduce(v.data(), v.data(), count, pc::DataType::kI32, pc::ReduceOp::kSum);
    if (!s.ok()) return "allreduce: " + std::string(s.message());
    for (size_t i = 0; i < count; ++i) {
      if (v[i] != static_cast<int32_t>(i % 1000) * 10) {
        return "allreduce element " + std::to_string(i) + " = " + std::to_string(v[i]);
      }
    }
    std::vector<int64_t> send(count * kRanks), recv(count * kRanks, -1);
    for (int to = 0; to < kRanks; ++to) {
      for (size_t i = 0; i < count; ++i)
        send[to * count + i] = rank * 1000000 + to * 1000 + i % 1000;
    }
    s = comm.AllToAll(send.data(), recv.data(), count, pc::DataType::kI64);
    if (!s.ok()) return "alltoall: " + std::string(s.message());
    for (int from = 0; from < kRanks; ++from) {
      for (size_t i = 0; i < count; ++i) {
        const int64_t want = from * 1000000 + rank * 1000 + static_cast<int64_t>(i % 1000);
        if (recv[from * count + i] != want) {
          return "alltoall from " + std::to_string(from) + " element " + std::to_string(i);
        }
      }
    }
  }
  return std::string();
}

// Ranks 0 and 1 on host-a, 2 and 3 on host-b; records what each rank reports per peer, then
// runs ExactCalls.
std::vector<std::string> RunTwoHosts(pc::CommunicatorOptions base,
                                     std::vector<std::vector<pt::Backend>>* seen) {
  seen->assign(kRanks, {});
  return pc::testing::RunRanksWith(
      kRanks,
      [&](int rank) {
        pc::CommunicatorOptions o = base;
        o.host_id = rank < 2 ? "host-a" : "host-b";
        return o;
      },
      [&](int rank, pc::Communicator& comm) -> std::string {
        for (int p = 0; p < kRanks; ++p) (*seen)[rank].push_back(comm.peer_backend(p));
        return ExactCalls(rank, comm);
      });
}

// Every rank succeeded, and `seen[r][p]` (the backend rank r reached rank p over) is shm
// between ranks of one declared host (ranks 0-1 and 2-3) and tcp across.
void CheckShmWithinHosts(const std::vector<std::string>& results,
                         const std::vector<std::vector<pt::Backend>>& seen) {
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    REQUIRE(results[r] == "");
    for (int p = 0; p < kRanks; ++p) {
      INFO("peer " << p);
      if (p == r) continue;
      const bool same_host = (r < 2) == (p < 2);
      CHECK(seen[r][p] == (same_host ? pt::Backend::kShm : pt::Backend::kTcp));
    }
  }
}

}  // namespace

TEST_CASE("per peer: shm within a declared host, tcp across", "[collectives][transport]") {
  std::vector<std::vector<pt::Backend>> seen;
  auto results = RunTwoHosts(TcpOptions(), &seen);
  CheckShmWithinHosts(results, seen);
}

TEST_CASE("the uniform policy puts every pair on device.backend", "[collectives][transport]") {
  pc::CommunicatorOptions o = TcpOptions();
  const bool from_env = GENERATE(false, true);
  INFO((from_env ? "PLEXUS_COLL_TRANSPORT_POLICY=uniform" : "transport_policy = kUniform"));
  if (from_env) {
    setenv("PLEXUS_COLL_TRANSPORT_POLICY", "uniform", 1);
  } else {
    o.transport_policy = pc::TransportPolicy::kUniform;
  }
  std::vector<std::vector<pt::Backend>> seen;
  auto results = RunTwoHosts(o, &seen);
  unsetenv("PLEXUS_COLL_TRANSPORT_POLICY");
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    REQUIRE(results[r] == "");
    for (int p = 0; p < kRanks; ++p) {
      if (p != r) CHECK(seen[r][p] == pt::Backend::kTcp);
    }
  }
}

TEST_CASE("pair backends and policy names", "[collectives][transport]") {
  using pc::TransportPolicy;
  using plexus::collectives::internal::PairBackend;
  CHECK(PairBackend(TransportPolicy::kPerPeer, pt::Backend::kTcp, "a", "a") == pt::Backend::kShm);
  CHECK(PairBackend(TransportPolicy::kPerPeer, pt::Backend::kTcp, "a", "b") == pt::Backend::kTcp);
  CHECK(PairBackend(TransportPolicy::kPerPeer, pt::Backend::kVerbs, "a", "b") ==
        pt::Backend::kVerbs);
  CHECK(PairBackend(TransportPolicy::kPerPeer, pt::Backend::kShm, "a", "b") == pt::Backend::kTcp);
  CHECK(PairBackend(TransportPolicy::kPerPeer, pt::Backend::kInproc, "a", "b") ==
        pt::Backend::kInproc);
  CHECK(PairBackend(TransportPolicy::kUniform, pt::Backend::kTcp, "a", "a") == pt::Backend::kTcp);
  CHECK(*plexus::collectives::internal::ParseTransportPolicy("uniform") ==
        TransportPolicy::kUniform);
  CHECK(*plexus::collectives::internal::ParseTransportPolicy("per_peer") ==
        TransportPolicy::kPerPeer);
  CHECK(
      absl::IsInvalidArgument(plexus::collectives::internal::ParseTransportPolicy("shm").status()));
}

TEST_CASE("a host id with a separator is refused", "[collectives][transport]") {
  pc::CommunicatorOptions o = TcpOptions();
  o.host_id = "a|b";
  auto results = pc::testing::RunRanks(2, o, [](int, pc::Communicator&) { return std::string(); });
  for (const std::string& r : results) CHECK(r.find("contains '|'") != std::string::npos);
}

TEST_CASE("a live transport change to per peer and back: shm within a host, tcp across",
          "[collectives][transport][reconfig]") {
  pc::CommunicatorOptions base = TcpOptions();
  base.transport_policy = pc::TransportPolicy::kUniform;
  std::vector<std::vector<pt::Backend>> per_peer(kRanks), uniform(kRanks);
  auto results = pc::testing::RunRanksWith(
      kRanks,
      [&](int rank) {
        pc::CommunicatorOptions o = base;
        o.host_id = rank < 2 ? "host-a" : "host-b";
        return o;
      },
      [&](int rank, pc::Communicator& comm) -> std::string {
        // Asks for `choice` from rank `from`, runs barriers until it landed on every rank, then
        // the exact calls; `seen` gets every peer's backend.
        auto change = [&](int from, uint64_t epoch, pc::TransportChoice choice,
                          std::vector<pt::Backend>& seen) -> std::string {
          if (rank == from) {
            pc::Reconfiguration c;
            c.transport = choice;
            if (auto e = comm.RequestReconfiguration(c); !e.ok() || *e != epoch) {
              return "request: " +
                     (e.ok() ? std::to_string(*e) : std::string(e.status().message()));
            }
          }
          auto lands = comm.AwaitReconfiguration(epoch, absl::Seconds(20));
          if (!lands.ok()) return std::string(lands.status().message());
          while (comm.collective_sequence() <= *lands) {
            if (absl::Status s = comm.Barrier(); !s.ok()) return std::string(s.message());
          }
          for (int p = 0; p < kRanks; ++p) seen.push_back(comm.peer_backend(p));
          if (comm.configuration().transport != choice) return "configuration().transport";
          return ExactCalls(rank, comm);
        };
        std::string err = ExactCalls(rank, comm);
        if (err.empty()) {
          err = change(2, 1, {pt::Backend::kTcp, pc::TransportPolicy::kPerPeer}, per_peer[rank]);
        }
        if (err.empty()) {
          err = change(0, 2, {pt::Backend::kTcp, pc::TransportPolicy::kUniform}, uniform[rank]);
        }
        return err;
      });
  CheckShmWithinHosts(results, per_peer);
  for (int r = 0; r < kRanks; ++r) {
    for (int p = 0; p < kRanks; ++p) {
      INFO("rank " << r << " peer " << p);
      if (p != r) CHECK(uniform[r][p] == pt::Backend::kTcp);
    }
  }
}

TEST_CASE("a rank whose device does not open fails every rank at once, named",
          "[collectives][transport]") {
  pc::CommunicatorOptions o;
  o.device.backend = pt::Backend::kShm;
  o.connect_timeout = absl::Seconds(20);
  const auto start = std::chrono::steady_clock::now();
  auto results = pc::testing::RunRanksWith(
      2,
      [&](int rank) {
        pc::CommunicatorOptions mine = o;
        if (rank == 1) mine.device.shm.ring_bytes = size_t{1} << 40;  // refused by the device
        return mine;
      },
      [](int, pc::Communicator&) { return std::string("created"); });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << results[r]);
    CHECK(results[r].find("rank 1 could not open its connections") != std::string::npos);
    CHECK(results[r].find("shm.ring_bytes") != std::string::npos);
  }
  CHECK(seconds < 10);  // not connect_timeout
}

TEST_CASE("transport choices in text", "[collectives][transport]") {
  CHECK(pc::TransportChoiceText({pt::Backend::kShm, pc::TransportPolicy::kUniform}) == "shm");
  CHECK(pc::TransportChoiceText({pt::Backend::kTcp, pc::TransportPolicy::kPerPeer}) ==
        "tcp/per_peer");
  for (const char* text : {"shm", "tcp", "tcp/per_peer", "verbs/uniform", "inproc"}) {
    auto c = pc::ParseTransportChoice(text);
    REQUIRE(c.ok());
    auto again = pc::ParseTransportChoice(pc::TransportChoiceText(*c));
    REQUIRE(again.ok());
    CHECK(*again == *c);
  }
  CHECK(pc::ParseTransportChoice("tcp/uniform")->policy == pc::TransportPolicy::kUniform);
  CHECK(absl::IsInvalidArgument(pc::ParseTransportChoice("pigeon").status()));
  CHECK(absl::IsInvalidArgument(pc::ParseTransportChoice("tcp/sometimes").status()));
}
