// Rendezvous: every launcher's variables, the error cases, and AllGather/Barrier over real stores.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bootstrap/pmix_exchange.hpp"
#include "bootstrap_test_util.hpp"
#include "plexus/config.hpp"
#include "plexus/transport/join.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace pt = plexus::transport;
using plexus::testing::FreePort;
using plexus::testing::MakeTempDir;
using plexus::testing::OnThreads;
using plexus::testing::RemoveTree;

namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }

absl::Status ParseError(const pt::Environment& env) {
  auto config = pt::ParseLaunchEnvironment(env);
  return config.ok() ? absl::OkStatus() : config.status();
}

}  // namespace

TEST_CASE("plexus variables") {
  auto c = pt::ParseLaunchEnvironment({{"PLEXUS_RANK", "2"},
                                       {"PLEXUS_WORLD_SIZE", "4"},
                                       {"PLEXUS_LOCAL_RANK", "0"},
                                       {"PLEXUS_LOCAL_WORLD_SIZE", "2"},
                                       {"PLEXUS_STORE_ADDR", "10.1.2.3:29500"}});
  REQUIRE(c.ok());
  CHECK(c->launcher == pt::Launcher::kPlexus);
  CHECK(c->rank == 2);
  CHECK(c->world_size == 4);
  CHECK(c->local_rank == 0);
  CHECK(c->local_world_size == 2);
  CHECK(c->store_address == "10.1.2.3:29500");
  CHECK(c->store_path.empty());
  CHECK(c->source.find("PLEXUS_RANK=2") != std::string::npos);
  CHECK(c->source.find("PLEXUS_STORE_ADDR=10.1.2.3:29500") != std::string::npos);

  auto file = pt::ParseLaunchEnvironment(
      {{"PLEXUS_RANK", "0"}, {"PLEXUS_WORLD_SIZE", "2"}, {"PLEXUS_STORE_PATH", "/shared/job7"}});
  REQUIRE(file.ok());
  CHECK(file->store_path == "/shared/job7");
  CHECK(file->store_address.empty());
  CHECK(file->local_rank == -1);  // derived from host names later
}

TEST_CASE("torchrun variables") {
  auto c = pt::ParseLaunchEnvironment({{"RANK", "3"},
                                       {"WORLD_SIZE", "8"},
                                       {"LOCAL_RANK", "3"},
                                       {"LOCAL_WORLD_SIZE", "4"},
                                       {"MASTER_ADDR", "node0"},
                                       {"MASTER_PORT", "29400"}});
  REQUIRE(c.ok());
  CHECK(c->launcher == pt::Launcher::kTorchrun);
  CHECK(c->rank == 3);
  CHECK(c->world_size == 8);
  CHECK(c->local_rank == 3);
  CHECK(c->local_world_size == 4);
  CHECK(c->store_address == "node0:29400");
  CHECK(c->source.find("torchrun") != std::string::npos);

  auto v6 = pt::ParseLaunchEnvironment(
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "fe80::1"}, {"MASTER_PORT", "1234"}});
  REQUIRE(v6.ok());
  CHECK(v6->store_address == "[fe80::1]:1234");
  auto big_port = pt::ParseLaunchEnvironment(
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "70000"}});
  CHECK(absl::IsInvalidArgument(big_port.status()));
  CHECK(big_port.status().message().find("MASTER_PORT='70000' is not a port") != std::string::npos);

  // PLEXUS_STORE_ADDR overrides MASTER_ADDR/PORT (e.g. when torchrun's agent owns MASTER_PORT).
  auto overridden = pt::ParseLaunchEnvironment({{"RANK", "0"},
                                                {"WORLD_SIZE", "2"},
                                                {"MASTER_ADDR", "node0"},
                                                {"MASTER_PORT", "29400"},
                                                {"PLEXUS_STORE_ADDR", "node0:29555"}});
  REQUIRE(overridden.ok());
  CHECK(overridden->store_address == "node0:29555");
}

TEST_CASE("Open MPI variables") {
  auto c = pt::ParseLaunchEnvironment({{"OMPI_COMM_WORLD_RANK", "5"},
                                       {"OMPI_COMM_WORLD_SIZE", "6"},
                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                       {"PLEXUS_STORE_ADDR", "head:29500"},
                                       // mpirun inside a Slurm allocation: MPI wins.
                                       {"SLURM_PROCID", "0"},
                                       {"SLURM_NTASKS", "1"}});
  REQUIRE(c.ok());
  CHECK(c->launcher == pt::Launcher::kOpenMpi);
  CHECK(c->rank == 5);
  CHECK(c->world_size == 6);
  CHECK(c->local_rank == 1);
  CHECK(c->local_world_size == 2);

  auto no_store =
      pt::ParseLaunchEnvironment({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  REQUIRE(absl::IsInvalidArgument(no_store.status()));
  CHECK(Message(no_store.status()).find("PLEXUS_STORE_ADDR") != std::string::npos);
  CHECK(Message(no_store.status()).find("mpirun -x PLEXUS_STORE_ADDR") != std::string::npos);

  auto master = pt::ParseLaunchEnvironment({{"OMPI_COMM_WORLD_RANK", "1"},
                                            {"OMPI_COMM_WORLD_SIZE", "2"},
                                            {"MASTER_ADDR", "10.0.0.1"},
                                            {"MASTER_PORT", "29500"}});
  REQUIRE(master.ok());
  CHECK(master->store_address == "10.0.0.1:29500");
}

TEST_CASE("Slurm variables") {
  auto c = pt::ParseLaunchEnvironment({{"SLURM_PROCID", "7"},
                                       {"SLURM_NTASKS", "9"},
                                       {"SLURM_LOCALID", "0"},
                                       {"SLURM_NODEID", "3"},
                                       {"SLURM_TASKS_PER_NODE", "2(x3),3"},
                                       {"PLEXUS_STORE_ADDR", "node0:29500"}});
  REQUIRE(c.ok());
  CHECK(c->launcher == pt::Launcher::kSlurm);
  CHECK(c->rank == 7);
  CHECK(c->world_size == 9);
  CHECK(c->local_rank == 0);
  CHECK(c->local_world_size == 3);  // node 3 is the one after three nodes of 2 tasks

  auto middle = pt::ParseLaunchEnvironment({{"SLURM_PROCID", "3"},
                                            {"SLURM_NTASKS", "9"},
                                            {"SLURM_LOCALID", "1"},
                                            {"SLURM_NODEID", "1"},
                                            {"SLURM_TASKS_PER_NODE", "2(x3),3"},
                                            {"PLEXUS_STORE_ADDR", "node0:29500"}});
  REQUIRE(middle.ok());
  CHECK(middle->local_world_size == 2);

  auto unknown_local = pt::ParseLaunchEnvironment(
      {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"PLEXUS_STORE_PATH", "/nfs/job"}});
  REQUIRE(unknown_local.ok());
  CHECK(unknown_local->local_rank == -1);

  auto no_store = pt::ParseLaunchEnvironment({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}});
  REQUIRE(absl::IsInvalidArgument(no_store.status()));
  CHECK(Message(no_store.status()).find("Slurm") != std::string::npos);
  CHECK(Message(no_store.status()).find("PLEXUS_STORE_ADDR") != std::string::npos);
}

TEST_CASE("launcher precedence: plexus, torchrun, Open MPI, Slurm") {
  auto c = pt::ParseLaunchEnvironment({{"PLEXUS_RANK", "1"},
                                       {"PLEXUS_WORLD_SIZE", "2"},
                                       {"PLEXUS_STORE_ADDR", "127.0.0.1:5000"},
                                       {"RANK", "0"},
                                       {"WORLD_SIZE", "8"},
                                       {"OMPI_COMM_WORLD_RANK", "3"},
                                       {"OMPI_COMM_WORLD_SIZE", "4"}});
  REQUIRE(c.ok());
  CHECK(c->launcher == pt::Launcher::kPlexus);
  CHECK(c->world_size == 2);
  auto t = pt::ParseLaunchEnvironment({{"RANK", "0"},
                                       {"WORLD_SIZE", "8"},
                                       {"MASTER_ADDR", "a"},
                                       {"MASTER_PORT", "1"},
                                       {"SLURM_PROCID", "2"},
                                       {"SLURM_NTASKS", "4"}});
  REQUIRE(t.ok());
  CHECK(t->launcher == pt::Launcher::kTorchrun);
}

TEST_CASE("invalid and inconsistent environments give errors naming the variable") {
  const pt::Environment store = {{"PLEXUS_STORE_ADDR", "127.0.0.1:5000"}};
  auto with_store = [&](pt::Environment env) {
    env.insert(store.begin(), store.end());
    return env;
  };
  struct Case {
    pt::Environment env;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      {with_store({{"PLEXUS_RANK", "4"}, {"PLEXUS_WORLD_SIZE", "4"}}),
       {"PLEXUS_RANK=4", "not below", "PLEXUS_WORLD_SIZE=4"}},
      {with_store({{"RANK", "one"}, {"WORLD_SIZE", "4"}}), {"RANK='one'", "integer"}},
      {with_store({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}), {"RANK='-1'"}},
      {with_store({{"RANK", "1"}, {"WORLD_SIZE", "4x"}}), {"WORLD_SIZE='4x'"}},
      {with_store({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), {"WORLD_SIZE=0", "at least 1"}},
      {with_store({{"RANK", "99999999999999"}, {"WORLD_SIZE", "4"}}), {"RANK="}},
      {with_store({{"RANK", "1"}}), {"RANK is set but WORLD_SIZE is not"}},
      {with_store({{"OMPI_COMM_WORLD_SIZE", "2"}}),
       {"OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not"}},
      {with_store(
           {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
       {"inconsistent local ranks", "LOCAL_RANK=2"}},
      {with_store(
           {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "8"}}),
       {"inconsistent local ranks"}},
      {{{"PLEXUS_RANK", "0"}, {"PLEXUS_WORLD_SIZE", "2"}},
       {"no rendezvous address", "PLEXUS_STORE_ADDR", "PLEXUS_STORE_PATH"}},
      {{{"PLEXUS_RANK", "0"},
        {"PLEXUS_WORLD_SIZE", "2"},
        {"PLEXUS_STORE_ADDR", "h:1"},
        {"PLEXUS_STORE_PATH", "/x"}},
       {"both PLEXUS_STORE_ADDR and PLEXUS_STORE_PATH"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"}},
       {"MASTER_ADDR is set but MASTER_PORT is not"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "http"}},
       {"MASTER_PORT='http'"}},
      {{{"PLEXUS_RANK", "0"}, {"PLEXUS_WORLD_SIZE", "2"}, {"PLEXUS_STORE_ADDR", "node0"}},
       {"PLEXUS_STORE_ADDR=node0", "host:port"}},
      {{{"PLEXUS_RANK", "0"}, {"PLEXUS_WORLD_SIZE", "2"}, {"PLEXUS_STORE_ADDR", "node0:70000"}},
       {"70000"}},
      {{{"PLEXUS_RANK", "0"}, {"PLEXUS_WORLD_SIZE", "2"}, {"PLEXUS_STORE_ADDR", "node0:0"}},
       {"port 0"}},
  };
  for (const Case& c : cases) {
    const absl::Status s = ParseError(c.env);
    INFO(s.ToString());
    REQUIRE_FALSE(s.ok());
    for (const std::string& w : c.words) CHECK(Message(s).find(w) != std::string::npos);
    // FromEnv reports the same error without touching the network.
    auto r = pt::Rendezvous::FromEnv(c.env, absl::Seconds(1));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status() == s);
  }
  // A job of one needs no store address: it gets a private one.
  auto single = pt::ParseLaunchEnvironment({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  REQUIRE(single.ok());
  CHECK(single->store_address == "127.0.0.1:0");
}

TEST_CASE("no launcher variables at all: a job of one") {
  auto c = pt::ParseLaunchEnvironment({{"HOME", "/root"}});
  REQUIRE(c.ok());
  CHECK(c->launcher == pt::Launcher::kNone);
  CHECK(c->rank == 0);
  CHECK(c->world_size == 1);
  CHECK(c->local_rank == 0);
  CHECK(c->local_world_size == 1);
  CHECK(c->store_kind == pt::StoreKind::kTcp);
  CHECK(c->store_address == "127.0.0.1:0");
  CHECK(c->source.find("no launcher") != std::string::npos);

  auto rdzv = pt::Rendezvous::FromEnv(pt::Environment{}, absl::Seconds(10));
  REQUIRE(rdzv.ok());
  CHECK(rdzv->launcher() == pt::Launcher::kNone);
  CHECK(rdzv->rank() == 0);
  CHECK(rdzv->world_size() == 1);
  auto all = rdzv->AllGather("solo", "me", absl::Seconds(5));
  REQUIRE(all.ok());
  CHECK(*all == std::vector<std::string>{"me"});
  CHECK(rdzv->Barrier("solo", absl::Seconds(5)).ok());

  // The overrides still apply to a job of one.
  auto file = pt::ParseLaunchEnvironment({{"PLEXUS_STORE_PATH", "/shared/solo"}});
  REQUIRE(file.ok());
  CHECK(file->store_kind == pt::StoreKind::kFile);
  CHECK(file->store_path == "/shared/solo");
  auto both =
      pt::ParseLaunchEnvironment({{"PLEXUS_STORE_PATH", "/x"}, {"PLEXUS_STORE_ADDR", "h:1"}});
  CHECK(absl::IsInvalidArgument(both.status()));
  auto job = pt::ParseLaunchEnvironment({{"PLEXUS_JOB_ID", "solo-7"}});
  REQUIRE(job.ok());
  CHECK(job->job_id == "solo-7");
}

TEST_CASE("Open MPI and Slurm with a PMIx server exchange the store address through it") {
  const pt::Environment pmix = {{"PMIX_NAMESPACE", "472449025"},
                                {"PMIX_SERVER_URI4", "472449024.0;tcp4://127.0.0.1:40475"}};
  auto with = [](pt::Environment env, const pt::Environment& more) {
    env.insert(more.begin(), more.end());
    return env;
  };
  const pt::Environment mpi = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "3"}};
  const pt::Environment slurm = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "3"}};
  // PMIx is used where this build has it and libpmix loads; else the error says why not.
  std::string no_pmix;
  const bool have_pmix = pt::bootstrap::PmixAvailable(&no_pmix);
  for (const pt::Environment& launcher : {mpi, slurm}) {
    auto c = pt::ParseLaunchEnvironment(with(launcher, pmix));
    if (have_pmix) {
      REQUIRE(c.ok());
      CHECK(c->store_kind == pt::StoreKind::kPmix);
      CHECK(c->store_address.empty());
      CHECK(c->source.find("PMIx server (PMIX_SERVER_URI4)") != std::string::npos);
    } else {
      REQUIRE(absl::IsInvalidArgument(c.status()));
      CHECK(Message(c.status()).find(no_pmix) != std::string::npos);
#if !PLEXUS_HAVE_PMIX
      CHECK(Message(c.status()).find("no PMIx") != std::string::npos);
#endif
    }
    // What the user names beats the launcher's service.
    auto addr =
        pt::ParseLaunchEnvironment(with(with(launcher, pmix), {{"PLEXUS_STORE_ADDR", "h:9"}}));
    REQUIRE(addr.ok());
    CHECK(addr->store_kind == pt::StoreKind::kTcp);
    CHECK(addr->store_address == "h:9");
    auto master = pt::ParseLaunchEnvironment(
        with(with(launcher, pmix), {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "7"}}));
    REQUIRE(master.ok());
    CHECK(master->store_kind == pt::StoreKind::kTcp);
    CHECK(master->store_address == "h:7");
    auto path =
        pt::ParseLaunchEnvironment(with(with(launcher, pmix), {{"PLEXUS_STORE_PATH", "/d"}}));
    REQUIRE(path.ok());
    CHECK(path->store_kind == pt::StoreKind::kFile);
  }
  // A job of one needs no exchange.
  auto one = pt::ParseLaunchEnvironment(
      with({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}}, pmix));
  REQUIRE(one.ok());
  CHECK(one->store_kind == pt::StoreKind::kTcp);
  CHECK(one->store_address == "127.0.0.1:0");
  // A PMix namespace without a server address is no PMIx server.
  auto no_uri = pt::ParseLaunchEnvironment(with(mpi, {{"PMIX_NAMESPACE", "1"}}));
  REQUIRE(absl::IsInvalidArgument(no_uri.status()));
  CHECK(Message(no_uri.status()).find("exports no PMIx server") != std::string::npos);
  // srun without --mpi=pmix: the error says how to get it.
  auto srun = pt::ParseLaunchEnvironment(slurm);
  REQUIRE(absl::IsInvalidArgument(srun.status()));
  CHECK(Message(srun.status()).find("srun --mpi=pmix") != std::string::npos);
  // The plexus launcher and torchrun never use PMIx.
  auto plexus =
      pt::ParseLaunchEnvironment(with({{"PLEXUS_RANK", "0"}, {"PLEXUS_WORLD_SIZE", "2"}}, pmix));
  CHECK(absl::IsInvalidArgument(plexus.status()));
}

TEST_CASE("torchrun's environment selects the agent's store, and only with its flag") {
  pt::Environment env = {{"RANK", "1"},
                         {"WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "127.0.0.1"},
                         {"MASTER_PORT", "29500"},
                         {"TORCHELASTIC_RUN_ID", "job9"},
                         {"TORCHELASTIC_RESTART_COUNT", "2"},
                         {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  auto agent = pt::ParseLaunchEnvironment(env);
  REQUIRE(agent.ok());
  CHECK(agent->store_kind == pt::StoreKind::kTorch);
  CHECK(agent->store_address == "127.0.0.1:29500");
  CHECK(agent->job_id == "torchrun:job9.restart-2");
  // --standalone (c10d rendezvous): the port is the workers' rank 0's to serve.
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  auto standalone = pt::ParseLaunchEnvironment(env);
  REQUIRE(standalone.ok());
  CHECK(standalone->store_kind == pt::StoreKind::kTcp);
  CHECK(standalone->job_id == "torchrun:job9");
  // PLEXUS_STORE_ADDR beats the agent's store.
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["PLEXUS_STORE_ADDR"] = "127.0.0.1:4000";
  auto overridden = pt::ParseLaunchEnvironment(env);
  REQUIRE(overridden.ok());
  CHECK(overridden->store_kind == pt::StoreKind::kTcp);
  CHECK(overridden->store_address == "127.0.0.1:4000");
}

TEST_CASE("FromEnv over tcp (torchrun variables): rank 0 serves, AllGather and Barrier work") {
  const int port = FreePort();
  constexpr int kRanks = 3;
  std::atomic<int> servers{0};
  auto errors = OnThreads(kRanks, [&](int r) -> std::string {
    const pt::Environment env = {
        {"RANK", std::to_string(r)},       {"WORLD_SIZE", std::to_string(kRanks)},
        {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", std::to_string(kRanks)},
        {"MASTER_ADDR", "127.0.0.1"},      {"MASTER_PORT", std::to_string(port)}};
    auto rdzv = pt::Rendezvous::FromEnv(env, absl::Seconds(20));
    if (!rdzv.ok()) return rdzv.status().ToString();
    if (rdzv->store_server() != nullptr) ++servers;
    if ((rdzv->store_server() != nullptr) != (r == 0)) return "wrong rank serves the store";
    if (rdzv->launcher() != pt::Launcher::kTorchrun || rdzv->rank() != r ||
        rdzv->world_size() != kRanks || rdzv->local_rank() != r) {
      return "wrong identity: " + rdzv->source();
    }
    for (int round = 0; round < 3; ++round) {
      // The same prefix every round: values must be this round's, not a stale earlier one.
      auto all = rdzv->AllGather("values", absl::StrCat("r", r, "-", round), absl::Seconds(20));
      if (!all.ok()) return all.status().ToString();
      for (int p = 0; p < kRanks; ++p) {
        if ((*all)[p] != absl::StrCat("r", p, "-", round)) return "bad AllGather: " + (*all)[p];
      }
      if (absl::Status s = rdzv->Barrier("round", absl::Seconds(20)); !s.ok()) return s.ToString();
    }
    return "";
  });
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(errors[r].empty());
    if (!errors[r].empty()) WARN(errors[r]);
  }
  CHECK(servers.load() == 1);
}

TEST_CASE("FromEnv over a file store derives local ranks from host names") {
  const std::string dir = MakeTempDir("rdzv");
  constexpr int kRanks = 3;
  std::vector<std::pair<int, int>> local(kRanks);
  auto errors = OnThreads(kRanks, [&](int r) -> std::string {
    const pt::Environment env = {{"SLURM_PROCID", std::to_string(r)},
                                 {"SLURM_NTASKS", std::to_string(kRanks)},
                                 {"PLEXUS_STORE_PATH", dir + "/store"}};
    auto rdzv = pt::Rendezvous::FromEnv(env, absl::Seconds(20));
    if (!rdzv.ok()) return rdzv.status().ToString();
    local[r] = {rdzv->local_rank(), rdzv->local_world_size()};
    if (rdzv->source().find("host names") == std::string::npos) return "source: " + rdzv->source();
    auto all = rdzv->AllGather("x", std::to_string(r * 10), absl::Seconds(20));
    if (!all.ok()) return all.status().ToString();
    if ((*all)[2] != "20") return "bad AllGather";
    absl::Status s = rdzv->Barrier("done", absl::Seconds(20));
    return s.ok() ? "" : s.ToString();
  });
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(errors[r].empty());
    CHECK(local[r].first == r);  // every thread runs on this host
    CHECK(local[r].second == kRanks);
  }
  RemoveTree(dir);
}

TEST_CASE("Barrier and AllGather time out naming who is missing") {
  const std::string dir = MakeTempDir("rdzv");
  auto store = pt::FileStore::Open(dir);
  REQUIRE(store.ok());
  std::shared_ptr<pt::Store> shared = *std::move(store);
  auto rdzv = pt::Rendezvous::Create(0, 3, shared);
  REQUIRE(rdzv.ok());
  auto other = pt::Rendezvous::Create(2, 3, shared);
  REQUIRE(other.ok());
  // Rank 2 contributes, rank 1 never comes.
  std::thread t([&] { (void)other->AllGather("g", "two", absl::Milliseconds(300)); });
  const auto start = std::chrono::steady_clock::now();
  auto all = rdzv->AllGather("g", "zero", absl::Milliseconds(300));
  t.join();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  REQUIRE(absl::IsDeadlineExceeded(all.status()));
  CHECK(Message(all.status()).find("rank 1 of 3 did not contribute") != std::string::npos);

  auto barrier = rdzv->Barrier("b", absl::Milliseconds(200));
  REQUIRE(absl::IsDeadlineExceeded(barrier));
  CHECK(Message(barrier).find("barrier 'b'") != std::string::npos);
  CHECK(Message(barrier).find("1 of 3 ranks arrived") != std::string::npos);

  CHECK(absl::IsInvalidArgument(pt::Rendezvous::Create(3, 3, shared).status()));
  CHECK(absl::IsInvalidArgument(pt::Rendezvous::Create(0, 2, nullptr).status()));
  CHECK(absl::IsInvalidArgument(pt::Rendezvous::Create(0, 2, shared, 2, 2).status()));
  RemoveTree(dir);
}

TEST_CASE("rank 0 with a store address of another host says so instead of serving") {
  // 192.0.2.1 is TEST-NET-1: never an address of this host, never reachable.
  const auto start = std::chrono::steady_clock::now();
  auto rdzv = pt::Rendezvous::FromEnv(
      {{"PLEXUS_RANK", "0"}, {"PLEXUS_WORLD_SIZE", "2"}, {"PLEXUS_STORE_ADDR", "192.0.2.1:29500"}},
      absl::Milliseconds(500));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(8));
  REQUIRE_FALSE(rdzv.ok());
  CHECK(Message(rdzv.status()).find("192.0.2.1:29500") != std::string::npos);
  CHECK(Message(rdzv.status()).find("not an address of this host") != std::string::npos);
  CHECK(Message(rdzv.status()).find("PLEXUS_STORE_EXTERNAL=1") != std::string::npos);
}

TEST_CASE("rank 0 serves the store on the address given; every interface only when asked") {
  auto served_at = [](pt::Environment env) -> std::string {
    env["PLEXUS_RANK"] = "0";
    env["PLEXUS_WORLD_SIZE"] = "1";
    auto rdzv = pt::Rendezvous::FromEnv(env, absl::Seconds(5));
    if (!rdzv.ok()) return rdzv.status().ToString();
    if (rdzv->store_server() == nullptr) return "no server";
    return rdzv->store_server()->address();
  };
  const int port = FreePort();
  const std::string loopback = absl::StrCat("127.0.0.1:", port);
  // It used to listen on 0.0.0.0 whatever the address said.
  CHECK(served_at({{"PLEXUS_STORE_ADDR", loopback}}) == loopback);
  CHECK(served_at({{"PLEXUS_STORE_ADDR", absl::StrCat("localhost:", port)}}) == loopback);
  CHECK(served_at({{"PLEXUS_STORE_ADDR", loopback}, {"PLEXUS_STORE_BIND", "0.0.0.0"}}) ==
        absl::StrCat("0.0.0.0:", port));
  CHECK(served_at({{"PLEXUS_STORE_ADDR", absl::StrCat("192.0.2.1:", port)},
                   {"PLEXUS_STORE_BIND", "127.0.0.1"}}) == loopback);
  for (const char* bad : {"a b", "1.2.3.4:5", "node/1"}) {
    auto parsed = pt::ParseLaunchEnvironment({{"PLEXUS_RANK", "0"},
                                              {"PLEXUS_WORLD_SIZE", "1"},
                                              {"PLEXUS_STORE_ADDR", loopback},
                                              {"PLEXUS_STORE_BIND", bad}});
    REQUIRE(absl::IsInvalidArgument(parsed.status()));
    CHECK(Message(parsed.status()).find("PLEXUS_STORE_BIND") != std::string::npos);
  }
  auto both = pt::ParseLaunchEnvironment({{"PLEXUS_RANK", "0"},
                                          {"PLEXUS_WORLD_SIZE", "1"},
                                          {"PLEXUS_STORE_ADDR", loopback},
                                          {"PLEXUS_STORE_BIND", "0.0.0.0"},
                                          {"PLEXUS_STORE_EXTERNAL", "1"}});
  CHECK(absl::IsInvalidArgument(both.status()));
  CHECK(absl::IsInvalidArgument(pt::ParseLaunchEnvironment({{"PLEXUS_RANK", "0"},
                                                            {"PLEXUS_WORLD_SIZE", "1"},
                                                            {"PLEXUS_STORE_ADDR", loopback},
                                                            {"PLEXUS_STORE_EXTERNAL", "maybe"}})
                                    .status()));
}

TEST_CASE("rank 0 uses a store it did not start only when told it is external") {
  auto external = pt::TcpStoreServer::Start("127.0.0.1:0");
  REQUIRE(external.ok());
  const std::string address = absl::StrCat("127.0.0.1:", (*external)->port());
  auto env = [&](int rank, bool is_external) {
    pt::Environment e = {{"PLEXUS_RANK", std::to_string(rank)},
                         {"PLEXUS_WORLD_SIZE", "2"},
                         {"PLEXUS_LOCAL_RANK", std::to_string(rank)},
                         {"PLEXUS_LOCAL_WORLD_SIZE", "2"},
                         {"PLEXUS_STORE_ADDR", address}};
    if (is_external) e["PLEXUS_STORE_EXTERNAL"] = "1";
    return e;
  };
  // Without it, rank 0 cannot serve the (taken) port and says who holds it and what to set.
  auto refused = pt::Rendezvous::FromEnv(env(0, false), absl::Seconds(2));
  REQUIRE_FALSE(refused.ok());
  CHECK(Message(refused.status()).find("rank 0 cannot serve the store") != std::string::npos);
  CHECK(Message(refused.status()).find("PLEXUS_STORE_EXTERNAL=1") != std::string::npos);
  std::vector<std::vector<std::string>> got(2);
  auto errors = OnThreads(2, [&](int r) -> std::string {
    auto rdzv = pt::Rendezvous::FromEnv(env(r, true), absl::Seconds(10));
    if (!rdzv.ok()) return rdzv.status().ToString();
    if (rdzv->store_server() != nullptr) return "rank started a server";
    auto all = rdzv->AllGather("v", absl::StrCat("r", r), absl::Seconds(10));
    if (!all.ok()) return all.status().ToString();
    got[r] = *all;
    return "";
  });
  for (int r = 0; r < 2; ++r) {
    INFO(errors[r]);
    CHECK(errors[r].empty());
    CHECK(got[r] == std::vector<std::string>{"r0", "r1"});
  }
}

TEST_CASE("a busy port on rank 0 gives an actionable error") {
  auto blocker = pt::TcpStoreServer::Start("0.0.0.0:0");
  REQUIRE(blocker.ok());
  auto rdzv = pt::Rendezvous::FromEnv(
      {{"PLEXUS_RANK", "0"},
       {"PLEXUS_WORLD_SIZE", "2"},
       {"PLEXUS_STORE_ADDR", absl::StrCat("127.0.0.1:", (*blocker)->port())}},
      absl::Seconds(1));
  REQUIRE_FALSE(rdzv.ok());
  CHECK(Message(rdzv.status()).find("rank 0 cannot serve the store") != std::string::npos);
  CHECK(Message(rdzv.status()).find("another process uses this port") != std::string::npos);
}

TEST_CASE("ProcessEnvironment sees the process's variables") {
  setenv("PLEXUS_BOOTSTRAP_TEST_VAR", "a=b", 1);
  const pt::Environment env = pt::ProcessEnvironment();
  auto it = env.find("PLEXUS_BOOTSTRAP_TEST_VAR");
  REQUIRE(it != env.end());
  CHECK(it->second == "a=b");
  unsetenv("PLEXUS_BOOTSTRAP_TEST_VAR");
}

TEST_CASE("torchrun's own store on MASTER_PORT is recognised, with the way out") {
  // Stands in for torch's TCPStore: it accepts and answers something that is not our protocol.
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  REQUIRE(listen(listener, 4) == 0);
  std::thread responder([&] {
    const int fd = accept(listener, nullptr, nullptr);
    const char reply[] = "\x01\x02\x03\x04\x05\x06\x07\x08";
    [[maybe_unused]] ssize_t n = send(fd, reply, sizeof reply - 1, MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    close(fd);
  });
  auto rdzv = pt::Rendezvous::FromEnv({{"RANK", "1"},
                                       {"WORLD_SIZE", "2"},
                                       {"MASTER_ADDR", "127.0.0.1"},
                                       {"MASTER_PORT", std::to_string(ntohs(addr.sin_port))}},
                                      absl::Seconds(5));
  responder.join();
  close(listener);
  REQUIRE(absl::IsFailedPrecondition(rdzv.status()));
  CHECK(Message(rdzv.status()).find("not a plexus tcp store") != std::string::npos);
  CHECK(Message(rdzv.status()).find("set PLEXUS_STORE_ADDR") != std::string::npos);
}

TEST_CASE("job ids from every launcher's environment") {
  const pt::Environment plexus = {
      {"PLEXUS_RANK", "0"}, {"PLEXUS_WORLD_SIZE", "2"}, {"PLEXUS_STORE_ADDR", "h:1"}};
  auto with = [](pt::Environment env, const pt::Environment& more) {
    env.insert(more.begin(), more.end());
    return env;
  };
  struct Case {
    pt::Environment env;
    std::string id, source;
  };
  const pt::Environment torch = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"PLEXUS_STORE_ADDR", "h:1"}};
  const pt::Environment mpi = {
      {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"PLEXUS_STORE_ADDR", "h:1"}};
  const pt::Environment slurm = {
      {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"PLEXUS_STORE_ADDR", "h:1"}};
  const std::vector<Case> cases = {
      {plexus, "", ""},
      {with(plexus, {{"PLEXUS_JOB_ID", "train-7"}}), "train-7", "PLEXUS_JOB_ID"},
      {with(torch, {{"TORCHELASTIC_RUN_ID", "abc"}}), "torchrun:abc", "TORCHELASTIC_RUN_ID"},
      // torchrun's default --rdzv-id is "none" for every job: not an identity.
      {with(torch, {{"TORCHELASTIC_RUN_ID", "none"}}), "", ""},
      // What Open MPI 4.1 (Debian) exports under mpirun.
      {with(mpi, {{"OMPI_MCA_ess_base_jobid", "1082523649"}, {"PMIX_NAMESPACE", "1082523649"}}),
       "ompi:1082523649", "OMPI_MCA_ess_base_jobid"},
      {with(mpi, {{"PMIX_NAMESPACE", "77"}}), "ompi:77", "PMIX_NAMESPACE"},
      {with(slurm, {{"SLURM_JOB_ID", "991"}, {"SLURM_STEP_ID", "2"}}), "slurm:991.2",
       "SLURM_JOB_ID.SLURM_STEP_ID"},
      {with(slurm, {{"SLURM_JOB_ID", "991"}}), "slurm:991", "SLURM_JOB_ID"},
      // The launcher's id is the launcher's only: a Slurm id does not name a torchrun job.
      {with(torch, {{"SLURM_JOB_ID", "991"}}), "", ""},
      // PLEXUS_JOB_ID beats the launcher's.
      {with(slurm, {{"SLURM_JOB_ID", "991"}, {"PLEXUS_JOB_ID", "mine"}}), "mine", "PLEXUS_JOB_ID"},
  };
  for (const Case& c : cases) {
    auto config = pt::ParseLaunchEnvironment(c.env);
    REQUIRE(config.ok());
    INFO(config->source);
    CHECK(config->job_id == c.id);
    CHECK(config->job_id_source == c.source);
    CHECK(config->source.find(c.id.empty() ? "no job id" : "job '" + c.id + "'") !=
          std::string::npos);
  }
  auto too_long =
      pt::ParseLaunchEnvironment(with(plexus, {{"PLEXUS_JOB_ID", std::string(300, 'j')}}));
  REQUIRE(absl::IsInvalidArgument(too_long.status()));
  CHECK(Message(too_long.status()).find("PLEXUS_JOB_ID") != std::string::npos);
}
