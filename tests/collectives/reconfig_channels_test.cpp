// Live change of the channel count, and the connections a live change keeps
// (docs/collectives.md, "Changing the transport or the channels"): 1 -> 4 -> 2 channels under a
// stream of allreduces with delayed requests from different ranks, results bit-identical to a
// run that never changed, the connections of the channels kept the same objects; a transport
// change of some pairs (two declared hosts, tcp -> tcp/per_peer) that leaves the others'
// connections alone, with a Send/Recv of an unchanged pair straddling it; invalid counts; a rank
// that never reaches the landing collective.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "communicator_impl.hpp"
#include "plexus/base/status.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/collectives/reconfiguration.hpp"
#include "plexus/collectives/trace.hpp"
#include "ranks.hpp"
#include "reconfig.hpp"
#include "reconfig_support.hpp"
#include "support/loopback.hpp"

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
using pc::testing::RunRanksWith;

namespace {

pi::CommunicatorImpl& Impl(pc::Communicator& comm) {
  return dynamic_cast<pi::CommunicatorImpl&>(comm);
}

// The ids of a communicator's connections, per channel and rank (0 for this rank).
std::vector<std::vector<uint64_t>> ConnectionIds(pc::Communicator& comm) {
  const std::vector<const pt::Connection*> all = Impl(comm).connections();
  const int peers = comm.size() - 1;
  std::vector<std::vector<uint64_t>> out;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i % peers == 0) out.emplace_back();
    out.back().push_back(all[i]->id());
  }
  return out;
}

// "" when `comm` runs `channels` channels by every report: the active configuration, options()
// and its connections ((n - 1) per channel).
std::string CheckChannels(pc::Communicator& comm, int channels) {
  const pc::ActiveConfiguration c = comm.configuration();
  if (c.channels != channels || c.connected_channels != channels ||
      comm.options().channels != channels) {
    return absl::StrCat("configuration reports ", c.channels, " channel(s) (", c.connected_channels,
                        " connected, options ", comm.options().channels, "), expected ", channels);
  }
  const size_t conns = Impl(comm).connections().size();
  if (conns != static_cast<size_t>(comm.size() - 1) * channels) {
    return absl::StrCat(conns, " connections, expected ", (comm.size() - 1) * channels);
  }
  return "";
}

pc::Reconfiguration Channels(int n) {
  pc::Reconfiguration change;
  change.channels = n;
  return change;
}

// A stream of 24 KiB ring allreduces (a barrier every third call: the mailbox path where there
// is one) in which rank `first` asks for 4 channels and then the last rank for 2; `ref`, when
// given, receives the results of the same calls without any change.
struct ChannelRun {
  std::vector<std::vector<std::vector<float>>> outputs;
  std::vector<std::vector<uint64_t>> landings;
  std::vector<std::string> results;
};

ChannelRun RunChannelChanges(int n, pc::CommunicatorOptions o, bool change, int first) {
  ChannelRun run;
  run.outputs.resize(n);
  run.landings.resize(n);
  constexpr int kStream = 4;
  run.results = RunRanks(n, o, [&](int rank, pc::Communicator& comm) -> std::string {
    int i = 0;
    auto one = [&]() -> absl::Status {
      std::vector<float> in = Operand(rank, i++), out(kCount);
      PLEXUS_RETURN_IF_ERROR(
          comm.AllReduce(in.data(), out.data(), kCount, DataType::kF32, ReduceOp::kSum));
      run.outputs[rank].push_back(std::move(out));
      if (i % 3 == 0) PLEXUS_RETURN_IF_ERROR(comm.Barrier());
      return absl::OkStatus();
    };
    if (!change) {
      for (int k = 0; k < 24; ++k) {
        if (absl::Status s = one(); !s.ok()) return std::string(s.message());
      }
      return "";
    }
    std::string err = CheckChannels(comm, 1);
    if (!err.empty()) return "at creation: " + err;
    const auto created = ConnectionIds(comm);
    const uint64_t opened_at_creation = Impl(comm).connections_opened();
    auto run_past = [&](uint64_t epoch) -> std::string {
      auto lands = comm.AwaitReconfiguration(epoch, absl::Seconds(20));
      if (!lands.ok()) return std::string(lands.status().message());
      run.landings[rank].push_back(*lands);
      while (comm.collective_sequence() <= *lands) {
        if (absl::Status s = one(); !s.ok()) return std::string(s.message());
      }
      return "";
    };
    for (int k = 0; k < kStream; ++k) {
      if (rank == first && k == 1) {
        auto e = comm.RequestReconfiguration(Channels(4));
        if (!e.ok() || *e != 1) return "request 4: " + e.status().ToString();
      }
      if (absl::Status s = one(); !s.ok()) return std::string(s.message());
    }
    if (err = run_past(1); !err.empty()) return err;
    if (err = CheckChannels(comm, 4); !err.empty()) return "after 1 -> 4: " + err;
    const auto grown = ConnectionIds(comm);
    if (grown[0] != created[0]) return "1 -> 4 replaced channel 0's connections";
    const uint64_t made = Impl(comm).connections_opened() - opened_at_creation;
    if (made != static_cast<uint64_t>(3 * (n - 1))) {
      return absl::StrCat("1 -> 4 made ", made, " connections, expected ", 3 * (n - 1));
    }
    for (int k = 0; k < kStream; ++k) {
      if (rank == n - 1 && k == 2) {
        auto e = comm.RequestReconfiguration(Channels(2));
        if (!e.ok() || *e != 2) return "request 2: " + e.status().ToString();
      }
      if (absl::Status s = one(); !s.ok()) return std::string(s.message());
    }
    if (err = run_past(2); !err.empty()) return err;
    if (err = CheckChannels(comm, 2); !err.empty()) return "after 4 -> 2: " + err;
    const auto shrunk = ConnectionIds(comm);
    if (shrunk[0] != grown[0] || shrunk[1] != grown[1]) {
      return "4 -> 2 replaced the connections of channels 0 and 1";
    }
    if (Impl(comm).connections_opened() != opened_at_creation + made) {
      return "4 -> 2 made connections";
    }
    for (int k = 0; k < 2; ++k) {
      if (absl::Status s = one(); !s.ok()) return std::string(s.message());
    }
    return "";
  });
  return run;
}

}  // namespace

TEST_CASE("live reconfiguration: channels 1 -> 4 -> 2 under a stream of allreduces",
          "[reconfig][channels]") {
  struct Case {
    int n;
    pt::Backend backend;
  };
  const Case c = GENERATE(Case{2, pt::Backend::kInproc}, Case{2, pt::Backend::kTcp},
                          Case{3, pt::Backend::kShm}, Case{4, pt::Backend::kInproc},
                          Case{4, pt::Backend::kShm});
  const int scenario = GENERATE(0, 1);
  const int n = c.n;
  INFO(n << " ranks over " << pt::BackendName(c.backend) << ", scenario " << scenario);
  pc::CommunicatorOptions o = Options(c.backend);
  o.transport_policy = pc::TransportPolicy::kUniform;
  o.channels = 1;
  if (c.backend == pt::Backend::kTcp) o.device.local_address = "127.0.0.1";
  const ChannelRun ref = RunChannelChanges(n, o, false, 0);
  for (const auto& r : ref.results) REQUIRE(r == "");
  // Who learns late and who publishes late differs per scenario, and so does the first
  // requester.
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
  const ChannelRun run = RunChannelChanges(n, o, true, scenario == 0 ? 1 : 0);
  for (const auto& r : run.results) REQUIRE(r == "");
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(run.landings[r].size() == 2);
    CHECK(run.landings[r] == run.landings[0]);
    REQUIRE(run.outputs[r].size() <= ref.outputs[r].size());
    CHECK(run.outputs[r].size() == run.outputs[0].size());
    for (size_t i = 0; i < run.outputs[r].size(); ++i) {
      INFO("call " << i);
      CHECK(run.outputs[r][i] == ref.outputs[r][i]);
    }
  }
}

TEST_CASE("live reconfiguration: a transport change keeps the connections of unchanged pairs",
          "[reconfig][channels][transport]") {
  // Ranks 0 and 1 on host-a, 2 and 3 on host-b, created on tcp (uniform, 2 channels); the change
  // to tcp/per_peer moves the pairs within a host to shm and leaves the four across hosts on
  // tcp: their connections must be the very same, and only 2 connections (1 peer x 2 channels)
  // are made per rank. Back to tcp (uniform) makes 2 again.
  constexpr int kRanks = 4;
  auto options_of = [](int rank) {
    pc::CommunicatorOptions o = Options(pt::Backend::kTcp);
    o.transport_policy = pc::TransportPolicy::kUniform;
    o.device.local_address = "127.0.0.1";
    o.host_id = rank < 2 ? "host-a" : "host-b";
    return o;
  };
  std::vector<std::vector<std::vector<float>>> ref(kRanks), outputs(kRanks);
  auto calls = [&](int rank, pc::Communicator& comm, int from, int count,
                   std::vector<std::vector<float>>& into) -> std::string {
    for (int i = from; i < from + count; ++i) {
      std::vector<float> in = Operand(rank, i), out(kCount);
      absl::Status s =
          comm.AllReduce(in.data(), out.data(), kCount, DataType::kF32, ReduceOp::kSum);
      if (!s.ok()) return std::string(s.message());
      into.push_back(std::move(out));
    }
    return "";
  };
  {
    auto results = RunRanksWith(kRanks, options_of, [&](int rank, pc::Communicator& comm) {
      return calls(rank, comm, 0, 9, ref[rank]);
    });
    for (const auto& r : results) REQUIRE(r == "");
  }
  auto same_host = [](int a, int b) { return (a < 2) == (b < 2); };
  auto results =
      RunRanksWith(kRanks, options_of, [&](int rank, pc::Communicator& comm) -> std::string {
        pi::CommunicatorImpl& impl = Impl(comm);
        const int partner = rank ^ 1;  // the other rank of this host
        std::string err = calls(rank, comm, 0, 3, outputs[rank]);
        if (!err.empty()) return err;
        const auto before = ConnectionIds(comm);
        const uint64_t opened = impl.connections_opened();
        // A Send from rank 0 to rank 2 before the change whose Recv runs after it: that pair
        // keeps its connections, so it may straddle the change.
        int32_t token = 40 + rank;
        if (rank == 0) {
          if (absl::Status s = comm.Send(&token, 1, DataType::kI32, 2); !s.ok()) {
            return "send: " + std::string(s.message());
          }
        }
        if (rank == 1) {
          pc::Reconfiguration change;
          change.transport = pc::TransportChoice{pt::Backend::kTcp, pc::TransportPolicy::kPerPeer};
          if (auto e = comm.RequestReconfiguration(change); !e.ok()) {
            return std::string(e.status().message());
          }
        }
        auto lands = comm.AwaitReconfiguration(1, absl::Seconds(20));
        if (!lands.ok()) return std::string(lands.status().message());
        const int done = static_cast<int>(comm.collective_sequence());
        if (*lands != static_cast<uint64_t>(done)) return "the change lands later than expected";
        if (err = calls(rank, comm, done, 3, outputs[rank]); !err.empty()) return err;
        if (rank == 2) {
          int32_t got = 0;
          if (absl::Status s = comm.Recv(&got, 1, DataType::kI32, 0); !s.ok()) {
            return "recv across the change: " + std::string(s.message());
          }
          if (got != 40) return absl::StrCat("received ", got, ", expected 40");
        }
        for (int r = 0; r < kRanks; ++r) {
          if (r == rank) continue;
          const pt::Backend want = same_host(rank, r) ? pt::Backend::kShm : pt::Backend::kTcp;
          if (comm.peer_backend(r) != want || comm.configuration().peer_backends.at(r) != want) {
            return absl::StrCat("rank ", r, " is reached over ",
                                std::string(pt::BackendName(comm.peer_backend(r))));
          }
        }
        const auto after = ConnectionIds(comm);
        if (after.size() != before.size()) return "the channel count changed";
        for (size_t c = 0; c < after.size(); ++c) {
          for (int r = 0, k = 0; r < kRanks; ++r) {
            if (r == rank) continue;
            const bool same = after[c][k] == before[c][k];
            if (same != !same_host(rank, r)) {
              return absl::StrCat("channel ", c, " to rank ", r, ": connection ",
                                  same ? "kept" : "replaced", " (", before[c][k], " -> ",
                                  after[c][k], ")");
            }
            ++k;
          }
        }
        if (impl.connections_opened() != opened + 2) {
          return absl::StrCat("made ", impl.connections_opened() - opened,
                              " connections, expected 2 (to rank ", partner, ")");
        }
        // Back to tcp everywhere (asked by rank 2): again only the pair within a host reconnects.
        if (rank == 2) {
          pc::Reconfiguration change;
          change.transport = pc::TransportChoice{pt::Backend::kTcp, pc::TransportPolicy::kUniform};
          if (auto e = comm.RequestReconfiguration(change); !e.ok()) {
            return std::string(e.status().message());
          }
        }
        auto back = comm.AwaitReconfiguration(2, absl::Seconds(20));
        if (!back.ok()) return std::string(back.status().message());
        const int at = static_cast<int>(outputs[rank].size());
        if (err = calls(rank, comm, at, 9 - at, outputs[rank]); !err.empty()) return err;
        if (comm.configuration().epoch != 2) return "the change back did not land";
        for (int r = 0; r < kRanks; ++r) {
          if (r != rank && comm.peer_backend(r) != pt::Backend::kTcp) return "not back on tcp";
        }
        if (ConnectionIds(comm)[0][rank < 2 ? 1 : 0] != after[0][rank < 2 ? 1 : 0]) {
          return "the change back replaced a connection across hosts";
        }
        if (impl.connections_opened() != opened + 4) return "the change back made other than 2";
        return "";
      });
  for (const auto& r : results) REQUIRE(r == "");
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    REQUIRE(outputs[r].size() == ref[r].size());
    for (size_t i = 0; i < outputs[r].size(); ++i) {
      INFO("call " << i);
      CHECK(outputs[r][i] == ref[r][i]);
    }
  }
}

TEST_CASE("live reconfiguration: invalid channel counts are refused", "[reconfig][channels]") {
  auto results =
      RunRanks(2, Options(pt::Backend::kInproc), [&](int, pc::Communicator& comm) -> std::string {
        for (int bad : {0, -1, pc::kMaxChannels + 1}) {
          auto e = comm.RequestReconfiguration(Channels(bad));
          if (e.ok()) return absl::StrCat(bad, " channels accepted");
          const std::string text(e.status().message());
          if (e.status().code() != absl::StatusCode::kInvalidArgument ||
              text.find("channels must be 1 to 64") == std::string::npos ||
              text.find(absl::StrCat("got ", bad)) == std::string::npos) {
            return absl::StrCat(bad, " channels: ", e.status().ToString());
          }
        }
        // The most is accepted: kMaxChannels of inproc connections.
        if (comm.rank() == 0) {
          if (auto e = comm.RequestReconfiguration(Channels(pc::kMaxChannels)); !e.ok()) {
            return std::string(e.status().message());
          }
        }
        auto lands = comm.AwaitReconfiguration(1, absl::Seconds(10));
        if (!lands.ok()) return std::string(lands.status().message());
        int x = comm.rank() + 1, y = 0;
        if (!comm.AllReduce(&x, &y, 1, DataType::kI32, ReduceOp::kSum).ok() || y != 3) {
          return std::string("allreduce over 64 channels");
        }
        return CheckChannels(comm, pc::kMaxChannels);
      });
  for (const auto& r : results) CHECK(r == "");
}

TEST_CASE("live reconfiguration: a channel change a rank never reaches fails within the timeout",
          "[reconfig][channels]") {
  pc::CommunicatorOptions o = Options(pt::Backend::kTcp);
  o.transport_policy = pc::TransportPolicy::kUniform;
  o.channels = 1;
  o.connect_timeout = absl::Seconds(1);
  o.timeout = absl::Seconds(3);
  std::vector<double> failed_after_s(2, 0);
  auto results = RunRanks(2, o, [&](int rank, pc::Communicator& comm) -> std::string {
    if (rank == 0) {
      if (auto e = comm.RequestReconfiguration(Channels(3)); !e.ok()) {
        return std::string(e.status().message());
      }
    }
    if (auto lands = comm.AwaitReconfiguration(1, absl::Seconds(10)); !lands.ok()) {
      return std::string(lands.status().message());
    }
    return LandWithSilentRankOne(rank, comm, failed_after_s);
  });
  INFO(results[0]);
  CHECK(results[1] == "");
  CHECK(results[0].find("changing the channels from 1 to 3") != std::string::npos);
  CHECK(results[0].find("rank 1") != std::string::npos);
  CHECK(failed_after_s[0] < 2.0);  // connect_timeout (1 s) and the store's answer
}

TEST_CASE("live reconfiguration: a Send and its Recv straddling a channel change are refused",
          "[reconfig][channels]") {
  pc::CommunicatorOptions o = Options(pt::Backend::kInproc);
  o.connect_timeout = absl::Seconds(5);
  auto results = RunRanks(2, o, [&](int rank, pc::Communicator& comm) -> std::string {
    if (rank == 0) {
      if (auto e = comm.RequestReconfiguration(Channels(3)); !e.ok()) {
        return std::string(e.status().message());
      }
    }
    auto lands = comm.AwaitReconfiguration(1, absl::Seconds(10));
    if (!lands.ok()) return std::string(lands.status().message());
    return SendAcrossLanding(rank, comm);
  });
  CheckSendAcrossLandingRefused(results);
}

TEST_CASE("live reconfiguration: channels change on a caller's device (thread progress)",
          "[reconfig][channels]") {
  // The caller's device decides its own completion queue (no driver of the communicator's):
  // the kept channel stays on it and the new ones join it.
  const plexus::testing::LoopbackStore loopback = plexus::testing::StartLoopbackStore();
  std::vector<std::string> results(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      results[rank] = [&]() -> std::string {
        auto rdv = pt::Rendezvous::Create(rank, 2, loopback.store);
        if (!rdv.ok()) return "rendezvous: " + std::string(rdv.status().message());
        pt::DeviceOptions d;
        d.backend = pt::Backend::kTcp;
        d.progress = pt::ProgressMode::kThread;
        d.local_address = "127.0.0.1";
        auto device = pt::Device::Create(d);
        if (!device.ok()) return "device: " + std::string(device.status().message());
        pc::CommunicatorOptions o;
        o.channels = 1;
        o.chunk_bytes = 4096;  // several chunks, striped over every channel
        o.timeout = absl::Seconds(20);
        auto comm =
            pc::Communicator::Create(*rdv, std::shared_ptr<pt::Device>(*std::move(device)), o);
        if (!comm.ok()) return "create: " + std::string(comm.status().message());
        pc::Communicator& c = **comm;
        const auto created = ConnectionIds(c);
        for (int want : {3, 1}) {
          if (rank == 0) {
            if (auto e = c.RequestReconfiguration(Channels(want)); !e.ok()) {
              return std::string(e.status().message());
            }
          }
          auto lands = c.AwaitReconfiguration(want == 3 ? 1 : 2, absl::Seconds(10));
          if (!lands.ok()) return std::string(lands.status().message());
          std::vector<int32_t> v(50000);
          for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i) * (rank + 1);
          if (absl::Status s =
                  c.AllReduce(v.data(), v.data(), v.size(), DataType::kI32, ReduceOp::kSum);
              !s.ok()) {
            return std::string(s.message());
          }
          for (size_t i = 0; i < v.size(); ++i) {
            if (v[i] != static_cast<int32_t>(i) * 3) return absl::StrCat("element ", i);
          }
          if (std::string err = CheckChannels(c, want); !err.empty()) return err;
          if (ConnectionIds(c)[0] != created[0]) return "channel 0 was replaced";
        }
        return "";
      }();
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& r : results) CHECK(r == "");
}

TEST_CASE("live reconfiguration: calls queued before a channel change run on the old count",
          "[reconfig][channels]") {
  // 3 ranks, 1 channel, traced: six AllReduceAsync queued, rank 1 asks for 3 channels, six more
  // queued. The trace says how many channels each call's plan used: 1 before the landing
  // sequence (the requester's six at least), 3 from it on; results bit-identical to no change.
  const pt::Backend backend = GENERATE(pt::Backend::kInproc, pt::Backend::kShm);
  INFO(pt::BackendName(backend));
  constexpr int kRanks = 3, kQueued = 6;
  pc::CommunicatorOptions o = Options(backend);
  o.channels = 1;
  o.trace.enabled = true;
  const ChannelRun ref = RunChannelChanges(kRanks, o, false, 0);
  for (const auto& r : ref.results) REQUIRE(r == "");
  HookGuard hook({{{2, pi::ReconfigStep::kFrozen}, 20}});
  std::vector<std::vector<std::vector<float>>> outputs(kRanks);
  std::vector<uint64_t> landing(kRanks, 0);
  auto results = RunRanks(kRanks, o, [&](int rank, pc::Communicator& comm) -> std::string {
    std::vector<std::vector<float>> in(2 * kQueued), out(2 * kQueued);
    std::vector<std::shared_ptr<pc::Work>> works;
    auto queue = [&](int i) {
      in[i] = Operand(rank, i);
      out[i].resize(kCount);
      works.push_back(
          comm.AllReduceAsync(in[i].data(), out[i].data(), kCount, DataType::kF32, ReduceOp::kSum));
    };
    for (int i = 0; i < kQueued; ++i) queue(i);
    if (rank == 1) {
      if (auto e = comm.RequestReconfiguration(Channels(3)); !e.ok()) {
        return std::string(e.status().message());
      }
    }
    for (int i = kQueued; i < 2 * kQueued; ++i) queue(i);
    for (auto& w : works) {
      if (absl::Status s = w->Wait(absl::Seconds(30)); !s.ok()) return std::string(s.message());
    }
    auto lands = comm.AwaitReconfiguration(1, absl::Seconds(10));
    if (!lands.ok()) return std::string(lands.status().message());
    landing[rank] = *lands;
    if (rank == 1 && *lands < kQueued) return absl::StrCat("landed on ", *lands, " < ", kQueued);
    // A landing past the queued calls (a late rank's count): run up to it.
    for (int i = 2 * kQueued; comm.collective_sequence() <= *lands; ++i) {
      std::vector<float> a = Operand(rank, i), b(kCount);
      if (absl::Status s =
              comm.AllReduce(a.data(), b.data(), kCount, DataType::kF32, ReduceOp::kSum);
          !s.ok()) {
        return std::string(s.message());
      }
      out.push_back(std::move(b));
    }
    outputs[rank] = std::move(out);
    size_t traced = 0;
    for (const pc::TraceEvent& e : comm.Trace().events) {
      if (e.kind != pc::CollectiveKind::kAllReduce) continue;
      ++traced;
      const int want = e.sequence < *lands ? 1 : 3;
      if (e.channels != want) {
        return absl::StrCat("call ", e.sequence, " used ", e.channels, " channel(s), expected ",
                            want, " (landing ", *lands, ")");
      }
    }
    if (traced != outputs[rank].size()) return absl::StrCat(traced, " calls traced");
    return "";
  });
  for (const auto& r : results) REQUIRE(r == "");
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(landing[r] == landing[0]);
    REQUIRE(outputs[r].size() <= ref.outputs[r].size());
    for (size_t i = 0; i < outputs[r].size(); ++i) {
      INFO("call " << i);
      CHECK(outputs[r][i] == ref.outputs[r][i]);
    }
  }
}
