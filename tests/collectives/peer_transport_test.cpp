// One transport per peer: 4 ranks as threads declaring two hosts (CommunicatorOptions::host_id),
// two ranks each. Ranks of one host talk over shm, the others over tcp (127.0.0.1); the results
// of AllReduce and AllToAll are exact; the uniform policy (option or environment) puts every
// pair on device.backend.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "peer_transport.hpp"
#include "plexus/collectives/communicator.hpp"
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

// Ranks 0 and 1 on host-a, 2 and 3 on host-b; records what each rank reports per peer, then
// checks AllReduce and AllToAll (small: one message per peer; large: many chunks) exactly.
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
      });
}

}  // namespace

TEST_CASE("per peer: shm within a declared host, tcp across", "[collectives][transport]") {
  std::vector<std::vector<pt::Backend>> seen;
  auto results = RunTwoHosts(TcpOptions(), &seen);
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
