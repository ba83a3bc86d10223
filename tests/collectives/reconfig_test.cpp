// Live reconfiguration (docs/collectives_operations.md, "Live reconfiguration"): ranks as threads
// over inproc and shm, with the watchers' steps delayed per rank by a test hook, requests from
// non-zero ranks, concurrent requests, requests while asynchronous calls are queued, an idle
// rank; every rank must switch at the same collective, and every result must be bit-identical
// to a run that used that collective's configuration from the start. Plus the admin endpoint,
// driven over its wire.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "communicator_impl.hpp"
#include "nlohmann/json.hpp"
#include "plexus/base/admin.hpp"
#include "plexus/base/status.hpp"
#include "plexus/collectives/admin.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/collectives/reconfiguration.hpp"
#include "ranks.hpp"
#include "reconfig.hpp"
#include "reconfig_support.hpp"
#include "support/child_process.hpp"
#include "support/loopback.hpp"

namespace pc = plexus::collectives;
namespace pt = plexus::transport;
namespace pi = plexus::collectives::internal;
namespace admin = plexus::base::admin;
using pc::DataType;
using pc::ReduceOp;
using pc::reconfigtest::HookGuard;
using pc::reconfigtest::kCount;
using pc::reconfigtest::Operand;
using pc::reconfigtest::Options;
using pc::testing::RunRanks;

namespace {

constexpr int kRanks = 4;
constexpr int kCalls = 10;

using Outputs = std::vector<std::vector<std::vector<float>>>;  // [rank][call][element]

// Every rank's allreduce results for calls 0..calls-1 with `order` fixed from creation.
Outputs Reference(pt::Backend backend, const std::vector<int>& order, int calls) {
  Outputs out(kRanks, std::vector<std::vector<float>>(calls));
  pc::CommunicatorOptions o = Options(backend);
  o.ring_order = order;
  auto results = RunRanks(kRanks, o, [&](int rank, pc::Communicator& comm) -> std::string {
    for (int i = 0; i < calls; ++i) {
      std::vector<float> in = Operand(rank, i);
      out[rank][i].resize(kCount);
      absl::Status s =
          comm.AllReduce(in.data(), out[rank][i].data(), kCount, DataType::kF32, ReduceOp::kSum);
      if (!s.ok()) return std::string(s.message());
    }
    return "";
  });
  for (const auto& r : results) REQUIRE(r == "");
  return out;
}

// What one rank saw after each call: the configuration that call ran with.
struct Seen {
  uint64_t epoch = 0;
  uint64_t since = 0;
  std::vector<int> order;
  bool operator==(const Seen& o) const {
    return epoch == o.epoch && since == o.since && order == o.order;
  }
};

std::string Describe(const std::vector<Seen>& seen) {
  std::string out;
  for (const Seen& s : seen) {
    absl::StrAppend(&out, "(e", s.epoch, "@", s.since, " [", absl::StrJoin(s.order, ","), "]) ");
  }
  return out;
}

// Call `i` of `rank`: an allreduce of its operand, its output and the configuration it ran with
// appended to `outputs` and `seen`.
absl::Status RecordedAllReduce(pc::Communicator& comm, int rank, int i,
                               std::vector<std::vector<float>>& outputs, std::vector<Seen>& seen) {
  std::vector<float> in = Operand(rank, i);
  std::vector<float> out(kCount);
  PLEXUS_RETURN_IF_ERROR(
      comm.AllReduce(in.data(), out.data(), kCount, DataType::kF32, ReduceOp::kSum));
  outputs.push_back(std::move(out));
  const pc::ActiveConfiguration c = comm.configuration();
  seen.push_back({c.epoch, c.since_sequence, c.ring_order});
  return absl::OkStatus();
}

const std::vector<int> kIdentity = {0, 1, 2, 3};
const std::vector<int> kOrderB = {3, 1, 0, 2};
const std::vector<int> kOrderC = {2, 0, 3, 1};

pt::Backend BackendOf(const std::string& name) {
  return name == "shm" ? pt::Backend::kShm : pt::Backend::kInproc;
}

}  // namespace

TEST_CASE("live reconfiguration: delayed, reordered requests from a non-zero rank", "[reconfig]") {
  const std::string backend_name = GENERATE("inproc", "shm");
  const pt::Backend backend = BackendOf(backend_name);
  const Outputs ref_a = Reference(backend, kIdentity, kCalls + 1);
  const Outputs ref_b = Reference(backend, kOrderB, kCalls + 1);
  // The test can fail: the two orders give different bits somewhere.
  bool differ = false;
  for (int i = 0; i <= kCalls && !differ; ++i) differ = ref_a[0][i] != ref_b[0][i];
  REQUIRE(differ);

  // Which rank learns of the request late, and which publishes its count late, varies.
  const int scenario = GENERATE(0, 1, 2);
  INFO("backend " << backend_name << ", scenario " << scenario);
  std::map<std::pair<int, pi::ReconfigStep>, int> delays;
  int request_at = 3;
  int idle_rank = -1;
  switch (scenario) {
    case 0:
      delays[{0, pi::ReconfigStep::kSeen}] = 30;
      delays[{2, pi::ReconfigStep::kFrozen}] = 40;
      delays[{3, pi::ReconfigStep::kDecided}] = 20;
      break;
    case 1:
      delays[{1, pi::ReconfigStep::kFrozen}] = 50;  // the requester itself publishes last
      delays[{3, pi::ReconfigStep::kSeen}] = 10;
      request_at = 0;
      break;
    default:
      delays[{2, pi::ReconfigStep::kSeen}] = 60;
      request_at = 0;
      idle_rank = 3;  // issues nothing for 150 ms
      break;
  }
  HookGuard hook(delays);

  std::vector<std::vector<Seen>> seen(kRanks);
  std::vector<std::vector<std::vector<float>>> outputs(kRanks);
  std::vector<uint64_t> landing(kRanks, 0);
  auto results =
      RunRanks(kRanks, Options(backend), [&](int rank, pc::Communicator& comm) -> std::string {
        if (rank == idle_rank) std::this_thread::sleep_for(std::chrono::milliseconds(150));
        auto one = [&](int i) {
          return RecordedAllReduce(comm, rank, i, outputs[rank], seen[rank]);
        };
        int i = 0;
        for (; i < kCalls; ++i) {
          if (rank == 1 && i == request_at) {
            pc::Reconfiguration change;
            change.ring_order = kOrderB;
            auto epoch = comm.RequestReconfiguration(change);
            if (!epoch.ok()) return std::string(epoch.status().message());
            if (*epoch != 1) return absl::StrCat("first epoch is ", *epoch);
          }
          if (absl::Status s = one(i); !s.ok()) return std::string(s.message());
        }
        auto lands = comm.AwaitReconfiguration(1, absl::Seconds(10));
        if (!lands.ok()) return std::string(lands.status().message());
        landing[rank] = *lands;
        // Every rank knows the same landing sequence: run up to it, the same number of calls.
        while (comm.collective_sequence() <= *lands) {
          if (absl::Status s = one(i++); !s.ok()) return std::string(s.message());
        }
        return std::string();
      });
  for (const auto& r : results) REQUIRE(r == "");
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r << " saw " << Describe(seen[r]));
    CHECK(landing[r] == landing[0]);
    CHECK(seen[r] == seen[0]);
    REQUIRE(outputs[r].size() == seen[r].size());
    for (size_t i = 0; i < seen[r].size(); ++i) {
      INFO("call " << i);
      const bool after = i >= landing[0];
      CHECK(seen[r][i].epoch == (after ? 1u : 0u));
      CHECK(seen[r][i].order == (after ? kOrderB : kIdentity));
      if (after) CHECK(seen[r][i].since == landing[0]);
      CHECK(outputs[r][i] == (after ? ref_b : ref_a)[r][i]);
    }
  }
}

TEST_CASE("live reconfiguration: concurrent requests apply in one order on every rank",
          "[reconfig]") {
  const std::string backend_name = GENERATE("inproc", "shm");
  const pt::Backend backend = BackendOf(backend_name);
  INFO("backend " << backend_name);
  std::map<std::vector<int>, Outputs> refs;
  for (const auto& order : {kIdentity, kOrderB, kOrderC}) {
    refs[order] = Reference(backend, order, kCalls + 2);
  }
  HookGuard hook({{{0, pi::ReconfigStep::kSeen}, 15}, {{3, pi::ReconfigStep::kFrozen}, 25}});
  std::vector<std::vector<Seen>> seen(kRanks);
  std::vector<std::vector<std::vector<float>>> outputs(kRanks);
  std::vector<pc::ActiveConfiguration> final_config(kRanks);
  auto results =
      RunRanks(kRanks, Options(backend), [&](int rank, pc::Communicator& comm) -> std::string {
        auto one = [&](int i) {
          return RecordedAllReduce(comm, rank, i, outputs[rank], seen[rank]);
        };
        int i = 0;
        for (; i < kCalls; ++i) {
          if ((rank == 0 || rank == 2) && i == 2) {
            pc::Reconfiguration change;
            change.ring_order = rank == 0 ? kOrderB : kOrderC;
            if (rank == 2) change.channels = 1;  // fewer channels: same bits (same ring order)
            auto epoch = comm.RequestReconfiguration(change);
            if (!epoch.ok()) return std::string(epoch.status().message());
          }
          if (absl::Status s = one(i); !s.ok()) return std::string(s.message());
        }
        auto lands = comm.AwaitReconfiguration(2, absl::Seconds(10));
        if (!lands.ok()) return std::string(lands.status().message());
        while (comm.collective_sequence() <= *lands) {
          if (absl::Status s = one(i++); !s.ok()) return std::string(s.message());
        }
        final_config[rank] = comm.configuration();
        return std::string();
      });
  for (const auto& r : results) REQUIRE(r == "");
  REQUIRE(final_config[0].epoch == 2);
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r << " saw " << Describe(seen[r]));
    CHECK(seen[r] == seen[0]);
    CHECK(final_config[r].ring_order == final_config[0].ring_order);
    CHECK(final_config[r].channels == final_config[0].channels);
    CHECK(final_config[r].since_sequence == final_config[0].since_sequence);
    for (size_t i = 0; i < seen[r].size(); ++i) {
      INFO("call " << i);
      CHECK(outputs[r][i] == refs.at(seen[r][i].order)[r][i]);
    }
  }
}

TEST_CASE("live reconfiguration: calls queued before the request finish with the old order",
          "[reconfig]") {
  const std::string backend_name = GENERATE("inproc", "shm");
  const pt::Backend backend = BackendOf(backend_name);
  INFO("backend " << backend_name);
  const Outputs ref_a = Reference(backend, kIdentity, 2 * kCalls + 1);
  const Outputs ref_b = Reference(backend, kOrderB, 2 * kCalls + 1);
  HookGuard hook({{{2, pi::ReconfigStep::kFrozen}, 20}});
  std::vector<std::vector<std::vector<float>>> outputs(kRanks);
  std::vector<uint64_t> landing(kRanks, 0);
  auto results =
      RunRanks(kRanks, Options(backend), [&](int rank, pc::Communicator& comm) -> std::string {
        std::vector<std::vector<float>> in(2 * kCalls + 1), out(2 * kCalls + 1);
        std::vector<std::shared_ptr<pc::Work>> works;
        uint64_t epoch = 1;
        for (int i = 0; i < kCalls; ++i) {
          in[i] = Operand(rank, i);
          out[i].resize(kCount);
          works.push_back(comm.AllReduceAsync(in[i].data(), out[i].data(), kCount, DataType::kF32,
                                              ReduceOp::kSum));
        }
        if (rank == 3) {
          pc::Reconfiguration change;
          change.ring_order = kOrderB;
          auto e = comm.RequestReconfiguration(change);
          if (!e.ok()) return std::string(e.status().message());
          epoch = *e;
        }
        int i = kCalls;
        for (; i < 2 * kCalls; ++i) {
          in[i] = Operand(rank, i);
          out[i].resize(kCount);
          works.push_back(comm.AllReduceAsync(in[i].data(), out[i].data(), kCount, DataType::kF32,
                                              ReduceOp::kSum));
        }
        for (auto& w : works) {
          if (absl::Status s = w->Wait(absl::Seconds(30)); !s.ok()) return std::string(s.message());
        }
        auto lands = comm.AwaitReconfiguration(epoch, absl::Seconds(10));
        if (!lands.ok()) return std::string(lands.status().message());
        landing[rank] = *lands;
        // The requester had issued kCalls calls: they all run with the old order.
        if (rank == 3 && *lands < kCalls) return absl::StrCat("landed on ", *lands, " < ", kCalls);
        while (comm.collective_sequence() <= *lands) {
          in[i] = Operand(rank, i);
          out[i].resize(kCount);
          if (absl::Status s = comm.AllReduce(in[i].data(), out[i].data(), kCount, DataType::kF32,
                                              ReduceOp::kSum);
              !s.ok()) {
            return std::string(s.message());
          }
          ++i;
        }
        out.resize(i);
        outputs[rank] = std::move(out);
        return std::string();
      });
  for (const auto& r : results) REQUIRE(r == "");
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r << ", landing " << landing[0]);
    CHECK(landing[r] == landing[0]);
    for (size_t i = 0; i < outputs[r].size(); ++i) {
      INFO("call " << i);
      CHECK(outputs[r][i] == (i >= landing[0] ? ref_b : ref_a)[r][i]);
    }
  }
}

TEST_CASE(
    "live reconfiguration: ranks running one collective under different epochs fail, naming both",
    "[reconfig]") {
  // The test hook breaks the barrier on purpose: rank 1 applies the change one collective late,
  // so collective S runs under epoch 1 on rank 0 and epoch 0 on rank 1. The plan path (a 24 KiB
  // ring allreduce: CallHeader::epoch) and the mailbox path (a barrier over inproc's
  // mailboxes: MailHeader::epoch) must both refuse it rather than mix the two configurations.
  const std::string path = GENERATE("plan", "mailbox");
  INFO("path " << path);
  pi::SetReconfigLandingTestHook(
      [](int rank, uint64_t, uint64_t sequence) { return rank == 1 ? sequence + 1 : sequence; });
  struct Unhook {
    ~Unhook() { pi::SetReconfigLandingTestHook(nullptr); }
  } unhook;
  pc::CommunicatorOptions o = Options(pt::Backend::kInproc);
  o.timeout = absl::Seconds(5);
  auto results = RunRanks(2, o, [&](int rank, pc::Communicator& comm) -> std::string {
    if (rank == 0) {
      pc::Reconfiguration change;
      change.ring_order = std::vector<int>{1, 0};
      if (auto e = comm.RequestReconfiguration(change); !e.ok()) {
        return "request: " + std::string(e.status().message());
      }
    }
    auto lands = comm.AwaitReconfiguration(1, absl::Seconds(10));
    if (!lands.ok()) return "await: " + std::string(lands.status().message());
    std::vector<float> in = Operand(rank, 0), out(kCount);
    while (comm.collective_sequence() <= *lands + 2) {
      absl::Status s = path == "plan" ? comm.AllReduce(in.data(), out.data(), kCount,
                                                       DataType::kF32, ReduceOp::kSum)
                                      : comm.Barrier();
      if (!s.ok()) return std::string(s.message());
    }
    return "no error";
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << results[r]);
    CHECK(results[r].find("configuration epoch mismatch") != std::string::npos);
    CHECK(results[r].find("under epoch 1") != std::string::npos);
    CHECK(results[r].find("under epoch 0") != std::string::npos);
  }
}

TEST_CASE("live reconfiguration: invalid requests, one rank, destruction mid-round", "[reconfig]") {
  auto results = RunRanks(
      2, Options(pt::Backend::kInproc), [&](int rank, pc::Communicator& comm) -> std::string {
        auto expect_invalid = [&](const pc::Reconfiguration& c, const char* what) -> std::string {
          auto e = comm.RequestReconfiguration(c);
          if (e.ok() || e.status().code() != absl::StatusCode::kInvalidArgument) {
            return absl::StrCat(what, ": ", e.ok() ? "accepted" : e.status().ToString());
          }
          return "";
        };
        std::string err = expect_invalid({}, "empty");
        pc::Reconfiguration bad_order;
        bad_order.ring_order = std::vector<int>{0, 0};
        if (err.empty()) err = expect_invalid(bad_order, "not a permutation");
        pc::Reconfiguration short_order;
        short_order.ring_order = std::vector<int>{0};
        if (err.empty()) err = expect_invalid(short_order, "wrong size");
        pc::Reconfiguration too_many;
        too_many.channels = pc::kMaxChannels + 1;
        if (err.empty()) err = expect_invalid(too_many, "more channels than kMaxChannels");
        pc::Reconfiguration zero;
        zero.channels = 0;
        if (err.empty()) err = expect_invalid(zero, "0 channels");
        if (!err.empty()) return err;
        // A request just before destruction: the destructor neither hangs nor fails.
        if (rank == 0) {
          pc::Reconfiguration c;
          c.ring_order = std::vector<int>{1, 0};
          auto e = comm.RequestReconfiguration(c);
          if (!e.ok()) return std::string(e.status().message());
        }
        return std::string();
      });
  for (const auto& r : results) CHECK(r == "");

  // One rank: the change lands on the next collective.
  auto single =
      RunRanks(1, Options(pt::Backend::kInproc), [&](int, pc::Communicator& comm) -> std::string {
        pc::Reconfiguration c;
        c.algorithms = pc::AlgorithmOverrides::Parse("allreduce:tree").value();
        c.channels = 1;
        int x = 1, y = 0;
        if (!comm.AllReduce(&x, &y, 1, DataType::kI32, ReduceOp::kSum).ok()) return "first call";
        auto e = comm.RequestReconfiguration(c);
        if (!e.ok()) return std::string(e.status().message());
        auto lands = comm.AwaitReconfiguration(*e, absl::Seconds(1));
        if (!lands.ok() || *lands != 1) return "landing";
        if (comm.configuration().epoch != 0) return "applied early";
        if (!comm.AllReduce(&x, &y, 1, DataType::kI32, ReduceOp::kSum).ok() || y != 1)
          return "call";
        const pc::ActiveConfiguration a = comm.configuration();
        if (a.epoch != 1 || a.since_sequence != 1 || a.channels != 1 ||
            a.algorithms.Get(pc::CollectiveKind::kAllReduce) != pc::Algorithm::kTree) {
          return "not applied";
        }
        return "";
      });
  CHECK(single[0] == "");
}

TEST_CASE("admin endpoint: coll-list and coll-reconfigure over the wire", "[reconfig][admin]") {
  auto server = admin::AdminServer::Start({.token = "s3cret"});
  REQUIRE(server.ok());
  pc::CollectivesAdmin coll_admin(server->get());
  const std::string address = (*server)->address();
  std::mutex mu;
  std::string list_json;
  auto results = RunRanks(
      kRanks, Options(pt::Backend::kInproc), [&](int rank, pc::Communicator& comm) -> std::string {
        const std::string name = absl::StrCat("job/r", rank);
        if (absl::Status s = coll_admin.Add(name, &comm); !s.ok()) return std::string(s.message());
        std::string err;
        auto call = [&](std::string command, std::map<std::string, std::string> args,
                        std::string token = "s3cret") {
          admin::AdminRequest req;
          req.token = std::move(token);
          req.command = std::move(command);
          req.args = std::move(args);
          return admin::AdminCall(address, req, absl::Seconds(5));
        };
        if (comm.Barrier().ok() && rank == 1) {
          // Errors travel back with their codes; nothing is requested.
          auto wrong_token = call("coll-list", {}, "nope");
          auto unknown = call("coll-reconfigure", {{"name", "job/r9"}, {"ring_order", "0,1,2,3"}});
          auto bad = call("coll-reconfigure", {{"name", "job/r1"}, {"ring_order", "0,1,1,3"}});
          auto bad_arg = call("coll-reconfigure", {{"name", "job/r1"}, {"order", "0,1,2,3"}});
          auto bad_transport =
              call("coll-reconfigure", {{"name", "job/r1"}, {"transport", "carrier-pigeon"}});
          if (bad_transport.ok() ||
              bad_transport.status().code() != absl::StatusCode::kInvalidArgument) {
            return std::string("an unknown transport was accepted");
          }
          if (wrong_token.ok() || unknown.ok() ||
              unknown.status().code() != absl::StatusCode::kNotFound || bad.ok() ||
              bad.status().code() != absl::StatusCode::kInvalidArgument || bad_arg.ok()) {
            return std::string("an invalid admin request was accepted");
          }
          auto reply = call("coll-reconfigure", {{"name", "job/r1"},
                                                 {"ring_order", "3,1,0,2"},
                                                 {"algorithms", "allreduce:ring,broadcast:tree"}});
          if (!reply.ok()) return std::string(reply.status().message());
          auto j = nlohmann::json::parse(*reply);
          if (j["epoch"] != 1) return "epoch " + j.dump();
        }
        auto lands = comm.AwaitReconfiguration(1, absl::Seconds(10));
        if (!lands.ok()) return std::string(lands.status().message());
        while (comm.collective_sequence() <= *lands) {
          if (absl::Status s = comm.Barrier(); !s.ok()) return std::string(s.message());
        }
        if (comm.configuration().ring_order != kOrderB) return std::string("order not applied");
        if (!comm.Barrier().ok()) return std::string("barrier");
        if (rank == 0) {
          auto reply = call("coll-list", {});
          if (!reply.ok()) return std::string(reply.status().message());
          std::lock_guard<std::mutex> lock(mu);
          list_json = *reply;
        }
        if (!comm.Barrier().ok()) return std::string("barrier");
#ifdef PLEXUS_RPC_CTL
        // The operator's CLI: its generic subcommand reaches the collectives' commands too.
        if (rank == 2) {
          plexus::testing::Child bad({PLEXUS_RPC_CTL, "--address", address, "--token", "s3cret",
                                      "call", "coll-reconfigure", "name=job/r2", "channels=65"},
                                     absl::Seconds(30));
          if (bad.Wait() == 0) return std::string("plexus-rpc-ctl accepted 65 channels");
          plexus::testing::Child ctl(
              {PLEXUS_RPC_CTL, "--address", address, "--token", "s3cret", "call",
               "coll-reconfigure", "name=job/r2", "ring_order=0,1,2,3", "channels=1"},
              absl::Seconds(30));
          if (int code = ctl.Wait(); code != 0) return absl::StrCat("plexus-rpc-ctl exited ", code);
        }
        auto lands2 = comm.AwaitReconfiguration(2, absl::Seconds(10));
        if (!lands2.ok()) return std::string(lands2.status().message());
        while (comm.collective_sequence() <= *lands2) {
          if (absl::Status s = comm.Barrier(); !s.ok()) return std::string(s.message());
        }
        const pc::ActiveConfiguration after = comm.configuration();
        if (after.ring_order != kIdentity || after.channels != 1 || after.epoch != 2) {
          return std::string("the CLI's change was not applied");
        }
#endif
        coll_admin.Remove(name);
        return err;
      });
  for (const auto& r : results) REQUIRE(r == "");
  const auto list = nlohmann::json::parse(list_json);
  REQUIRE(list.size() == kRanks);
  for (int r = 0; r < kRanks; ++r) {
    const auto& c = list[r];
    INFO(c.dump());
    CHECK(c["name"] == absl::StrCat("job/r", r));
    CHECK(c["rank"] == r);
    CHECK(c["size"] == kRanks);
    CHECK(c["ring_order"] == kOrderB);
    CHECK(c["epoch"] == 1);
    CHECK(c["since_sequence"] == list[0]["since_sequence"]);
    CHECK(c["algorithms"]["allreduce"] == "ring");
    CHECK(c["algorithms"]["broadcast"] == "tree");
    CHECK(c["channels"] == 2);
    CHECK(c["transport"] == "inproc/per_peer");
    CHECK(c["peer_backends"].size() == kRanks);
    CHECK(c["health"] == "ok");
  }
}

namespace {

// A store that can be switched off: every call then fails as a vanished TCP store does.
class SwitchableStore : public pt::Store {
 public:
  explicit SwitchableStore(std::shared_ptr<pt::Store> inner) : inner_(std::move(inner)) {}
  void TurnOff() { off_.store(true); }
  absl::Status Set(std::string_view key, std::string_view value) override {
    if (off_.load()) return Gone();
    return inner_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override {
    if (off_.load()) return Gone();
    // Short slices, so that a watcher blocked here notices the switch soon.
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      auto v = inner_->Get(key, std::min(absl::Milliseconds(20), deadline - absl::Now()));
      if (off_.load()) return Gone();
      if (v.ok() || v.status().code() != absl::StatusCode::kDeadlineExceeded ||
          absl::Now() >= deadline) {
        return v;
      }
    }
  }
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override {
    if (off_.load()) return Gone();
    return inner_->Add(key, delta);
  }
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) override {
    if (off_.load()) return Gone();
    return inner_->Wait(keys, timeout);
  }
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override {
    if (off_.load()) return Gone();
    return inner_->Check(keys);
  }
  absl::StatusOr<bool> Delete(std::string_view key) override {
    if (off_.load()) return Gone();
    return inner_->Delete(key);
  }
  std::string description() const override { return "switchable " + inner_->description(); }

 private:
  static absl::Status Gone() { return absl::UnavailableError("lost the connection to the store"); }
  std::shared_ptr<pt::Store> inner_;
  std::atomic<bool> off_{false};
};

}  // namespace

TEST_CASE("live reconfiguration: a lost store turns reconfiguration off, not the collectives",
          "[reconfig]") {
  const plexus::testing::LoopbackStore loopback = plexus::testing::StartLoopbackStore();
  auto store = std::make_shared<SwitchableStore>(loopback.store);
  std::vector<std::string> results(2);
  std::vector<std::thread> threads;
  std::atomic<int> created{0};
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto rdv = pt::Rendezvous::Create(r, 2, store);
      if (!rdv.ok()) {
        results[r] = std::string(rdv.status().message());
        return;
      }
      auto comm = pc::Communicator::Create(*rdv, Options(pt::Backend::kInproc));
      if (!comm.ok()) {
        results[r] = std::string(comm.status().message());
        return;
      }
      if (++created == 2) store->TurnOff();
      while (created.load() < 2) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the watchers notice
      std::vector<float> in = Operand(r, 0), out(kCount);
      for (int i = 0; i < 3; ++i) {
        absl::Status s =
            (*comm)->AllReduce(in.data(), out.data(), kCount, DataType::kF32, ReduceOp::kSum);
        if (!s.ok()) {
          results[r] = absl::StrCat("allreduce after the store went: ", s.ToString());
          return;
        }
      }
      pc::Reconfiguration change;
      change.channels = 1;
      auto e = (*comm)->RequestReconfiguration(change);
      if (e.ok() || e.status().code() != absl::StatusCode::kUnavailable) {
        results[r] =
            absl::StrCat("request without a store: ", e.ok() ? "accepted" : e.status().ToString());
        return;
      }
      if (!(*comm)->health().ok()) results[r] = "broken";
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& r : results) CHECK(r == "");
}

TEST_CASE("live reconfiguration: PLEXUS_COLL_RECONFIG=0 turns it off", "[reconfig]") {
  ::setenv("PLEXUS_COLL_RECONFIG", "0", 1);
  auto results = RunRanks(2, Options(pt::Backend::kInproc), [&](int, pc::Communicator& comm) {
    pc::Reconfiguration change;
    change.channels = 1;
    auto e = comm.RequestReconfiguration(change);
    if (e.ok() || e.status().code() != absl::StatusCode::kFailedPrecondition) {
      return std::string("request accepted while off");
    }
    int x = 1, y = 0;
    absl::Status s = comm.AllReduce(&x, &y, 1, DataType::kI32, ReduceOp::kSum);
    return s.ok() && y == 2 ? std::string() : std::string("allreduce");
  });
  ::unsetenv("PLEXUS_COLL_RECONFIG");
  for (const auto& r : results) CHECK(r == "");
}
