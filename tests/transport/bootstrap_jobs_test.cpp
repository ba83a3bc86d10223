// Rendezvous between jobs and ranks that share a store: jobs told apart by their job ids (or by
// rank 0's nonce without them), late and duplicate ranks, two jobs in one file store directory,
// and a process joining a running job. The launchers' variables: bootstrap_rendezvous_test.cpp.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bootstrap_test_util.hpp"
#include "plexus/transport/join.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "support/loopback.hpp"

namespace pt = plexus::transport;
using plexus::testing::FreePort;
using plexus::testing::MakeTempDir;
using plexus::testing::OnThreads;
using plexus::testing::RemoveTree;

namespace {

// Waits (bounded) until `flag` is set.
bool WaitUntil(const std::atomic<bool>& flag,
               std::chrono::milliseconds limit = std::chrono::seconds(8)) {
  return plexus::testing::WaitFor([&] { return flag.load(); }, limit);
}

// One rank of a two-job experiment on threads: FromEnv, then an AllGather of "<job>/<rank>".
struct RankRun {
  std::string label;  // "A" or "B": the job the test means, whatever the environment says
  int rank = 0;
  pt::Environment env;
  absl::Status status;
  std::vector<std::string> gathered;
  std::atomic<bool> joined{false};
  std::atomic<bool> done{false};
  std::thread thread;

  void Init(std::string job_label, int my_rank, pt::Environment environment) {
    label = std::move(job_label);
    rank = my_rank;
    env = std::move(environment);
  }

  void Start() {
    thread = std::thread([this] {
      auto rdzv = pt::Rendezvous::FromEnv(env, absl::Seconds(5));
      if (!rdzv.ok()) {
        status = rdzv.status();
        done = true;
        return;
      }
      joined = true;
      auto all = rdzv->AllGather("values", absl::StrCat(label, "/", rank), absl::Seconds(5));
      if (all.ok()) {
        gathered = *std::move(all);
      } else {
        status = all.status();
      }
      done = true;
      // Keep the rendezvous (rank 0: the store server) until the test has started every rank,
      // so that a later rank meets this job's store, not a free port.
      WaitUntil(release, std::chrono::seconds(20));
    });
  }

  static inline std::atomic<bool> release{false};
};

pt::Environment JobEnv(int port, int rank, int world_size, const std::string& job_id) {
  pt::Environment env = {{"PLEXUS_RANK", std::to_string(rank)},
                         {"PLEXUS_WORLD_SIZE", std::to_string(world_size)},
                         {"PLEXUS_LOCAL_RANK", std::to_string(rank)},
                         {"PLEXUS_LOCAL_WORLD_SIZE", std::to_string(world_size)},
                         {"PLEXUS_STORE_ADDR", absl::StrCat("127.0.0.1:", port)}};
  if (!job_id.empty()) env["PLEXUS_JOB_ID"] = job_id;
  return env;
}

// Starts the ranks in the given order, 300 ms apart (a rank's FromEnv returns only once its
// whole job has joined, or failed), waits until each has finished or failed, then lets them go.
void RunInOrder(const std::vector<RankRun*>& order) {
  RankRun::release = false;
  for (RankRun* run : order) {
    run->Start();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  for (RankRun* run : order) WaitUntil(run->done, std::chrono::seconds(15));
  RankRun::release = true;
  for (RankRun* run : order) run->thread.join();
}

bool Has(const absl::Status& s, const std::string& word) {
  return std::string(s.message()).find(word) != std::string::npos;
}

}  // namespace

TEST_CASE(
    "two jobs with job ids on one store port (A0, B1, A1, B0): B fails clearly, A completes") {
  const int port = FreePort();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  RankRun a0, a1, b0, b1;
  a0.Init("A", 0, JobEnv(port, 0, 2, "job-A"));
  a1.Init("A", 1, JobEnv(port, 1, 2, "job-A"));
  b0.Init("B", 0, JobEnv(port, 0, 2, "job-B"));
  b1.Init("B", 1, JobEnv(port, 1, 2, "job-B"));
  const auto start = std::chrono::steady_clock::now();
  RunInOrder({&a0, &b1, &a1, &b0});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  INFO("A0: " << a0.status << "\nA1: " << a1.status << "\nB0: " << b0.status
              << "\nB1: " << b1.status);
  REQUIRE(a0.status.ok());
  REQUIRE(a1.status.ok());
  const std::vector<std::string> expected = {"A/0", "A/1"};
  CHECK(a0.gathered == expected);
  CHECK(a1.gathered == expected);
  // B1 reached A's store (B0 could not bind the port): refused at once, naming its own job, the
  // store and what to set, but not A's job (B1 could simply reconnect with it).
  REQUIRE(absl::IsFailedPrecondition(b1.status));
  CHECK_FALSE(b1.joined.load());
  for (const char* word : {"'job-B'", "127.0.0.1:", "PLEXUS_STORE_ADDR", "PLEXUS_JOB_ID"}) {
    CHECK(Has(b1.status, word));
  }
  CHECK_FALSE(Has(b1.status, "job-A"));
  CHECK(Has(b1.status, address));
  // B0 cannot serve the port, and says that a store of another job holds it.
  REQUIRE_FALSE(b0.status.ok());
  CHECK(Has(b0.status, "rank 0 cannot serve the store"));
  CHECK(Has(b0.status, "job whose id differs"));
  CHECK_FALSE(Has(b0.status, "job-A"));
  CHECK(seconds < 8);  // nobody waited for a timeout
}

TEST_CASE("two jobs without job ids (nonce): a different world size is told apart") {
  const int port = FreePort();
  RankRun a0, a1, b0, b1, b2;
  a0.Init("A", 0, JobEnv(port, 0, 2, ""));
  a1.Init("A", 1, JobEnv(port, 1, 2, ""));
  b0.Init("B", 0, JobEnv(port, 0, 3, ""));
  b1.Init("B", 1, JobEnv(port, 1, 3, ""));
  b2.Init("B", 2, JobEnv(port, 2, 3, ""));
  const auto start = std::chrono::steady_clock::now();
  RunInOrder({&a0, &b1, &a1, &b0, &b2});
  INFO("A0: " << a0.status << "\nA1: " << a1.status << "\nB0: " << b0.status
              << "\nB1: " << b1.status << "\nB2: " << b2.status);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(8));
  REQUIRE(a0.status.ok());
  REQUIRE(a1.status.ok());
  const std::vector<std::string> expected = {"A/0", "A/1"};
  CHECK(a0.gathered == expected);
  CHECK(a1.gathered == expected);
  for (RankRun* b : {&b1, &b2}) {
    REQUIRE(absl::IsFailedPrecondition(b->status));
    CHECK(Has(b->status, "has world size 3, but rank 0"));
    CHECK(Has(b->status, "world size 2"));
    CHECK(Has(b->status, "nonce-"));
    CHECK(Has(b->status, "PLEXUS_JOB_ID"));
  }
  REQUIRE_FALSE(b0.status.ok());
  CHECK(Has(b0.status, "rank 0 cannot serve the store"));
  CHECK(Has(b0.status, "a job without job id is running there"));
}

TEST_CASE("two jobs without job ids (nonce), same size: a rank number is never taken twice") {
  const int port = FreePort();
  RankRun a0, a1, b0, b1;
  a0.Init("A", 0, JobEnv(port, 0, 2, ""));
  a1.Init("A", 1, JobEnv(port, 1, 2, ""));
  b0.Init("B", 0, JobEnv(port, 0, 2, ""));
  b1.Init("B", 1, JobEnv(port, 1, 2, ""));
  SECTION("A0, A1, B1, B0: B fails clearly, A completes") {
    RunInOrder({&a0, &a1, &b1, &b0});
    INFO("B1: " << b1.status << "\nB0: " << b0.status);
    REQUIRE(a0.status.ok());
    REQUIRE(a1.status.ok());
    CHECK(a0.gathered == std::vector<std::string>{"A/0", "A/1"});
    CHECK(a1.gathered == std::vector<std::string>{"A/0", "A/1"});
    REQUIRE(absl::IsAlreadyExists(b1.status));
    CHECK(Has(b1.status, "rank 1 of job 'nonce-"));
    CHECK(Has(b1.status, "already joined"));
    CHECK(Has(b1.status, "PLEXUS_JOB_ID"));
    CHECK(absl::IsUnavailable(b0.status));
  }
  SECTION("A0, B1, A1, B0: the second claim of rank 1 fails clearly") {
    // With two ranks, B1 completes A's job before anything else comes: nothing tells B1 from A1
    // then (docs/architecture.md). A1's claim comes after that job ran, and fails.
    RunInOrder({&a0, &b1, &a1, &b0});
    INFO("A1: " << a1.status);
    REQUIRE(absl::IsAlreadyExists(a1.status));
    CHECK(Has(a1.status, "rank 1 of job 'nonce-"));
    CHECK(Has(a1.status, "claimed by two processes"));
    CHECK(Has(a1.status, "PLEXUS_JOB_ID"));
    CHECK(absl::IsUnavailable(b0.status));
  }
}

TEST_CASE("two 4-rank jobs without job ids, interleaved: every rank fails, none runs mixed") {
  // A0 B1 A1 B0 A2 B2 A3 B3: A0, B1, A2 and A3 used to form one job and return wrong results.
  // A1's claim of rank 1 comes while A0 and B1 wait for ranks 2 and 3: both claimants and the
  // waiting ranks fail, and so does every rank that comes later.
  const int port = FreePort();
  std::vector<std::unique_ptr<RankRun>> a, b;
  for (int r = 0; r < 4; ++r) {
    a.push_back(std::make_unique<RankRun>());
    a.back()->Init("A", r, JobEnv(port, r, 4, ""));
    b.push_back(std::make_unique<RankRun>());
    b.back()->Init("B", r, JobEnv(port, r, 4, ""));
  }
  const auto start = std::chrono::steady_clock::now();
  RunInOrder({a[0].get(), b[1].get(), a[1].get(), b[0].get(), a[2].get(), b[2].get(), a[3].get(),
              b[3].get()});
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  for (const auto* job : {&a, &b}) {
    for (const auto& run : *job) {
      INFO(run->label << run->rank << ": " << run->status);
      CHECK_FALSE(run->joined.load());
      REQUIRE_FALSE(run->status.ok());
      if (run->label == "B" && run->rank == 0) {
        CHECK(Has(run->status, "rank 0 cannot serve the store"));
      } else {
        CHECK(absl::IsAlreadyExists(run->status));
        CHECK(Has(run->status, "two jobs share this store address"));
      }
      CHECK(Has(run->status, "PLEXUS_JOB_ID"));
    }
  }
}

TEST_CASE("one job: a late rank joins, a rank of another world size fails alone") {
  const int port = FreePort();
  RankRun r0, r1, r2, wrong;
  r0.Init("J", 0, JobEnv(port, 0, 3, "job-J"));
  r1.Init("J", 1, JobEnv(port, 1, 3, "job-J"));
  r2.Init("J", 2, JobEnv(port, 2, 3, "job-J"));
  wrong.Init("J", 1, JobEnv(port, 1, 2, "job-J"));
  RankRun::release = true;  // r0 serves until r2, the last, is done: nothing to hold
  r0.Start();
  r1.Start();
  wrong.Start();
  wrong.thread.join();
  // The late rank comes after the others have started waiting for it.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK_FALSE(r0.joined.load());
  r2.Start();
  for (RankRun* r : {&r0, &r1, &r2}) r->thread.join();
  const std::vector<std::string> expected = {"J/0", "J/1", "J/2"};
  INFO("r0: " << r0.status << "\nwrong: " << wrong.status);
  CHECK(r0.gathered == expected);
  CHECK(r1.gathered == expected);
  CHECK(r2.gathered == expected);
  REQUIRE(absl::IsFailedPrecondition(wrong.status));
  CHECK(Has(wrong.status, "has world size 2, but rank 0"));
  CHECK(Has(wrong.status, "world size 3"));
}

TEST_CASE("one job: a rank started twice fails both claimants and the ranks of the job") {
  const int port = FreePort();
  RankRun r0, r1, dup1, r2;
  r0.Init("J", 0, JobEnv(port, 0, 3, "job-J"));
  r1.Init("J", 1, JobEnv(port, 1, 3, "job-J"));
  dup1.Init("J", 1, JobEnv(port, 1, 3, "job-J"));
  r2.Init("J", 2, JobEnv(port, 2, 3, "job-J"));
  RunInOrder({&r0, &r1, &dup1, &r2});
  for (RankRun* r : {&r0, &r1, &dup1, &r2}) {
    INFO("rank " << r->rank << ": " << r->status);
    CHECK_FALSE(r->joined.load());
    REQUIRE(absl::IsAlreadyExists(r->status));
    CHECK(Has(r->status, "rank 1 was claimed by two processes"));
    CHECK(Has(r->status, "job 'job-J' (PLEXUS_JOB_ID)"));
  }
  CHECK(Has(dup1.status, "rank 1 of job 'job-J' (PLEXUS_JOB_ID) already joined"));
}

TEST_CASE("two jobs with job ids share a file store directory without seeing each other") {
  const std::string dir = MakeTempDir("rdzv");
  std::vector<std::vector<std::string>> got(4);
  auto errors = OnThreads(4, [&](int t) -> std::string {
    const std::string job = t < 2 ? "A" : "B";
    const int rank = t % 2;
    const pt::Environment env = {{"PLEXUS_RANK", std::to_string(rank)},
                                 {"PLEXUS_WORLD_SIZE", "2"},
                                 {"PLEXUS_LOCAL_RANK", std::to_string(rank)},
                                 {"PLEXUS_LOCAL_WORLD_SIZE", "2"},
                                 {"PLEXUS_STORE_PATH", dir},
                                 {"PLEXUS_JOB_ID", job}};
    auto rdzv = pt::Rendezvous::FromEnv(env, absl::Seconds(10));
    if (!rdzv.ok()) return rdzv.status().ToString();
    if (rdzv->job_id() != job) return "job id " + rdzv->job_id();
    auto all = rdzv->AllGather("values", absl::StrCat(job, "/", rank), absl::Seconds(10));
    if (!all.ok()) return all.status().ToString();
    got[t] = *all;
    return "";
  });
  for (int t = 0; t < 4; ++t) {
    INFO(errors[t]);
    CHECK(errors[t].empty());
    const std::string job = t < 2 ? "A" : "B";
    CHECK(got[t] == std::vector<std::string>{job + "/0", job + "/1"});
  }
  RemoveTree(dir);
}

TEST_CASE("OpenJobStore opens a running job's store for a joining process") {
  // A launcher's job id: the joiner names it.
  pt::Environment env = {{"PLEXUS_RANK", "0"},
                         {"PLEXUS_WORLD_SIZE", "1"},
                         {"PLEXUS_STORE_ADDR", "127.0.0.1:0"},
                         {"PLEXUS_JOB_ID", "join-test"}};
  auto rdv = pt::Rendezvous::FromEnv(env, absl::Seconds(10));
  REQUIRE(rdv.ok());
  REQUIRE(rdv->store_server() != nullptr);
  REQUIRE(rdv->store()->Set("k", "v").ok());
  const std::string addr = absl::StrCat("127.0.0.1:", rdv->store_server()->port());
  auto store = pt::OpenJobStore({{"PLEXUS_STORE_ADDR", addr}, {"PLEXUS_JOB_ID", "join-test"}},
                                absl::Seconds(5));
  REQUIRE(store.ok());
  auto v = (*store)->Get("k", absl::Seconds(1));
  REQUIRE(v.ok());
  CHECK(*v == "v");
  auto other = pt::OpenJobStore({{"PLEXUS_STORE_ADDR", addr}, {"PLEXUS_JOB_ID", "another"}},
                                absl::Seconds(5));
  REQUIRE_FALSE(other.ok());
  CHECK(other.status().code() == absl::StatusCode::kFailedPrecondition);
  // No launcher id: rank 0's nonce, which the server tells a client naming no job.
  env.erase("PLEXUS_JOB_ID");
  auto nonce_job = pt::Rendezvous::FromEnv(env, absl::Seconds(10));
  REQUIRE(nonce_job.ok());
  REQUIRE(nonce_job->store()->Set("k", "w").ok());
  auto joined = pt::OpenJobStore(
      {{"PLEXUS_STORE_ADDR", absl::StrCat("127.0.0.1:", nonce_job->store_server()->port())}},
      absl::Seconds(5));
  REQUIRE(joined.ok());
  auto w = (*joined)->Get("k", absl::Seconds(1));
  REQUIRE(w.ok());
  CHECK(*w == "w");
  auto none = pt::OpenJobStore({}, absl::Seconds(1));
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(none.status().message()).find("PLEXUS_STORE_ADDR") != std::string::npos);
}
