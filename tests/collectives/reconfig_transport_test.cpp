// Live reconfiguration of the transport (docs/collectives_operations.md, "Live reconfiguration"):
// tcp -> shm -> tcp under a stream of allreduces with delayed requests from different ranks,
// results bit-identical to a run that stayed on tcp and the backend of every pair checked; a rank
// that never reaches the landing collective, and a Send/Recv pair straddling the change.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "communicator_impl.hpp"
#include "plexus/base/status.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/collectives/reconfiguration.hpp"
#include "ranks.hpp"
#include "reconfig.hpp"
#include "reconfig_support.hpp"

namespace pc = plexus::collectives;
namespace pt = plexus::transport;
namespace pi = plexus::collectives::internal;
using pc::DataType;
using pc::ReduceOp;
using pc::reconfigtest::CheckSendAcrossLandingRefused;
using pc::reconfigtest::HookGuard;
using pc::reconfigtest::kCount;
using pc::reconfigtest::LandWithSilentRankOne;
using pc::reconfigtest::Operand;
using pc::reconfigtest::Options;
using pc::reconfigtest::SendAcrossLanding;
using pc::testing::RunRanks;

namespace {

// The connections of a communicator: how many, and whether each is shm (only shm and inproc
// connections have a mailbox; these tests choose between shm and tcp).
struct Links {
  size_t count = 0;
  size_t shm = 0;
};
Links LinksOf(pc::Communicator& comm) {
  Links out;
  auto* impl = dynamic_cast<pi::CommunicatorImpl*>(&comm);
  if (impl == nullptr) return out;
  for (const pt::Connection* c : impl->connections()) {
    ++out.count;
    if (const_cast<pt::Connection*>(c)->mailbox() != nullptr) ++out.shm;
  }
  return out;
}

// Every peer of `comm` reached over `backend`, by every report: peer_backend(), the active
// configuration, and the connections themselves. "" when so.
std::string CheckBackend(pc::Communicator& comm, pt::Backend backend) {
  const pc::ActiveConfiguration c = comm.configuration();
  const std::string name(pt::BackendName(backend));
  if (c.transport.backend != backend) {
    return absl::StrCat("configuration().transport is ", pc::TransportChoiceText(c.transport),
                        ", expected ", name);
  }
  for (int r = 0; r < comm.size(); ++r) {
    if (r == comm.rank()) continue;
    if (comm.peer_backend(r) != backend || c.peer_backends.at(r) != backend) {
      return absl::StrCat("rank ", r, " is reached over ",
                          std::string(pt::BackendName(comm.peer_backend(r))), ", expected ", name);
    }
  }
  const Links links = LinksOf(comm);
  const size_t expected = static_cast<size_t>(comm.size() - 1) * comm.options().channels;
  const size_t shm = backend == pt::Backend::kShm ? expected : 0;
  if (links.count != expected || links.shm != shm) {
    return absl::StrCat(links.count, " connections (", links.shm, " shm), expected ", expected,
                        " over ", name);
  }
  return "";
}

pc::CommunicatorOptions TcpOptions() {
  pc::CommunicatorOptions o = Options(pt::Backend::kTcp);
  o.transport_policy = pc::TransportPolicy::kUniform;
  return o;
}

// Rank 0 asks for a change to shm (epoch 1); every rank waits until it is decided and gets the
// sequence of the collective it lands on.
absl::StatusOr<uint64_t> ToShmFromRankZero(int rank, pc::Communicator& comm) {
  if (rank == 0) {
    pc::Reconfiguration change;
    change.transport = pc::TransportChoice{pt::Backend::kShm, pc::TransportPolicy::kUniform};
    PLEXUS_RETURN_IF_ERROR(comm.RequestReconfiguration(change).status());
  }
  return comm.AwaitReconfiguration(1, absl::Seconds(10));
}

}  // namespace

TEST_CASE("live reconfiguration: transport tcp -> shm -> tcp under a stream of allreduces",
          "[reconfig][transport]") {
  const int n = GENERATE(2, 3);
  const int scenario = GENERATE(0, 1);
  INFO(n << " ranks, scenario " << scenario);
  constexpr int kStream = 4;  // calls issued right after each request
  // The reference: the same calls on tcp from the start, no change.
  std::vector<std::vector<std::vector<float>>> ref(n);
  {
    auto results = RunRanks(n, TcpOptions(), [&](int rank, pc::Communicator& comm) {
      for (int i = 0; i < 40; ++i) {
        std::vector<float> in = Operand(rank, i), out(kCount);
        absl::Status s =
            comm.AllReduce(in.data(), out.data(), kCount, DataType::kF32, ReduceOp::kSum);
        if (!s.ok()) return std::string(s.message());
        ref[rank].push_back(std::move(out));
      }
      return std::string();
    });
    for (const auto& r : results) REQUIRE(r == "");
  }
  // Who learns late and who publishes late differs per scenario; the requests come from
  // different ranks (the second from the last rank, the first from rank 1 or rank 0).
  std::map<std::pair<int, pi::ReconfigStep>, int> delays;
  if (scenario == 0) {
    delays[{0, pi::ReconfigStep::kSeen}] = 30;
    delays[{n - 1, pi::ReconfigStep::kFrozen}] = 40;
    delays[{1, pi::ReconfigStep::kDecided}] = 20;
  } else {
    delays[{0, pi::ReconfigStep::kFrozen}] = 50;  // the first requester publishes last
    delays[{1, pi::ReconfigStep::kSeen}] = 25;
  }
  HookGuard hook(delays);
  const int first_requester = scenario == 0 ? 1 : 0;
  std::vector<std::vector<std::vector<float>>> outputs(n);
  std::vector<std::vector<uint64_t>> landings(n);
  std::vector<std::vector<std::string>> backends_seen(n);
  auto results = RunRanks(n, TcpOptions(), [&](int rank, pc::Communicator& comm) -> std::string {
    std::string err = CheckBackend(comm, pt::Backend::kTcp);
    if (!err.empty()) return "at creation: " + err;
    int i = 0;
    auto one = [&]() -> absl::Status {
      std::vector<float> in = Operand(rank, i++), out(kCount);
      PLEXUS_RETURN_IF_ERROR(
          comm.AllReduce(in.data(), out.data(), kCount, DataType::kF32, ReduceOp::kSum));
      outputs[rank].push_back(std::move(out));
      // A barrier now and then: over shm it takes the mailbox path (tcp has none).
      if (i % 3 == 0) PLEXUS_RETURN_IF_ERROR(comm.Barrier());
      return absl::OkStatus();
    };
    auto request = [&](pt::Backend backend, uint64_t expect_epoch) -> std::string {
      pc::Reconfiguration change;
      change.transport = pc::TransportChoice{backend, pc::TransportPolicy::kUniform};
      auto e = comm.RequestReconfiguration(change);
      if (!e.ok()) return std::string(e.status().message());
      return *e == expect_epoch ? "" : absl::StrCat("epoch ", *e);
    };
    // Runs calls until change `epoch` has landed on every rank (the same number of calls
    // everywhere: they all run up to the same landing sequence).
    auto run_past = [&](uint64_t epoch) -> std::string {
      auto lands = comm.AwaitReconfiguration(epoch, absl::Seconds(20));
      if (!lands.ok()) return std::string(lands.status().message());
      landings[rank].push_back(*lands);
      while (comm.collective_sequence() <= *lands) {
        if (absl::Status s = one(); !s.ok()) return std::string(s.message());
      }
      return "";
    };
    for (int k = 0; k < kStream; ++k) {
      if (rank == first_requester && k == 1) {
        if (err = request(pt::Backend::kShm, 1); !err.empty()) return err;
      }
      if (absl::Status s = one(); !s.ok()) return std::string(s.message());
    }
    if (err = run_past(1); !err.empty()) return err;
    if (err = CheckBackend(comm, pt::Backend::kShm); !err.empty())
      return "after tcp -> shm: " + err;
    for (int k = 0; k < kStream; ++k) {
      if (rank == n - 1 && k == 2) {
        if (err = request(pt::Backend::kTcp, 2); !err.empty()) return err;
      }
      if (absl::Status s = one(); !s.ok()) return std::string(s.message());
    }
    if (err = run_past(2); !err.empty()) return err;
    if (err = CheckBackend(comm, pt::Backend::kTcp); !err.empty())
      return "after shm -> tcp: " + err;
    for (int k = 0; k < 2; ++k) {
      if (absl::Status s = one(); !s.ok()) return std::string(s.message());
    }
    return "";
  });
  for (const auto& r : results) REQUIRE(r == "");
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(landings[r] == landings[0]);
    REQUIRE(outputs[r].size() <= ref[r].size());
    CHECK(outputs[r].size() == outputs[0].size());
    for (size_t i = 0; i < outputs[r].size(); ++i) {
      INFO("call " << i);
      CHECK(outputs[r][i] == ref[r][i]);
    }
  }
}

TEST_CASE("live reconfiguration: a transport change a rank never reaches fails within the timeout",
          "[reconfig][transport]") {
  pc::CommunicatorOptions o = TcpOptions();
  o.connect_timeout = absl::Seconds(1);
  o.timeout = absl::Seconds(3);
  std::vector<double> failed_after_s(2, 0);
  auto results = RunRanks(2, o, [&](int rank, pc::Communicator& comm) -> std::string {
    auto lands = ToShmFromRankZero(rank, comm);
    if (!lands.ok()) return std::string(lands.status().message());
    return LandWithSilentRankOne(rank, comm, failed_after_s);
  });
  INFO(results[0]);
  CHECK(results[1] == "");
  CHECK(results[0].find("changing the transport to shm") != std::string::npos);
  CHECK(results[0].find("rank 1") != std::string::npos);
  CHECK(failed_after_s[0] < 2.0);  // connect_timeout (1 s) and the store's answer
}

TEST_CASE("live reconfiguration: a Send and its Recv straddling a transport change are refused",
          "[reconfig][transport]") {
  pc::CommunicatorOptions o = TcpOptions();
  o.connect_timeout = absl::Seconds(5);
  auto results = RunRanks(2, o, [&](int rank, pc::Communicator& comm) -> std::string {
    auto lands = ToShmFromRankZero(rank, comm);
    if (!lands.ok()) return std::string(lands.status().message());
    if (*lands != comm.collective_sequence()) return "the change lands later than expected";
    return SendAcrossLanding(rank, comm);
  });
  CheckSendAcrossLandingRefused(results);
}
