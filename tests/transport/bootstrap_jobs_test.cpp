// Rendezvous between jobs and ranks that share a store: jobs told apart by their job ids (or by
// rank 0's nonce without them), late and duplicate ranks, two jobs in one file store directory,
// and a process joining a running job. The launchers' variables: bootstrap_rendezvous_test.cpp.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
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

// Starts the ranks in the given order; each waits for the previous one to have joined (or
// failed), so the interleaving is exactly the one asked for.
void RunInOrder(const std::vector<RankRun*>& order) {
  RankRun::release = false;
  for (RankRun* run : order) {
    run->Start();
    plexus::testing::WaitFor([&] { return run->joined.load() || run->done.load(); },
                             std::chrono::seconds(8));
  }
  // Every rank has joined or failed; those that joined finish their AllGather, then all let go.
  for (RankRun* run : order) {
    if (run->joined.load()) WaitUntil(run->done);
  }
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
  // B1 reached A's store (B0 could not bind the port): refused at once, naming both jobs, the
  // store and what to set.
  REQUIRE(absl::IsFailedPrecondition(b1.status));
  CHECK_FALSE(b1.joined.load());
  for (const char* word :
       {"'job-A'", "'job-B'", "127.0.0.1:", "PLEXUS_STORE_ADDR", "PLEXUS_JOB_ID"}) {
    CHECK(Has(b1.status, word));
  }
  CHECK(Has(b1.status, address));
  // B0 cannot serve the port, and says whose store holds it.
  REQUIRE_FALSE(b0.status.ok());
  CHECK(Has(b0.status, "rank 0 cannot serve the store"));
  CHECK(Has(b0.status, "job 'job-A'"));
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
  CHECK(Has(b0.status, "without job id (nonce 'nonce-"));
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
    // Without a job id nothing tells B1 from A1 but the order they came in: B1 takes rank 1 and
    // runs with A0, A1 gets the error that says to set PLEXUS_JOB_ID (docs/architecture.md).
    RunInOrder({&a0, &b1, &a1, &b0});
    INFO("A1: " << a1.status);
    REQUIRE(absl::IsAlreadyExists(a1.status));
    CHECK(Has(a1.status, "rank 1 of job 'nonce-"));
    CHECK(Has(a1.status, "PLEXUS_JOB_ID"));
    CHECK(absl::IsUnavailable(b0.status));
  }
}

TEST_CASE("one job: a late rank joins, a duplicate rank and a different world size fail") {
  const int port = FreePort();
  RankRun r0, r1, r2, dup1, wrong;
  r0.Init("J", 0, JobEnv(port, 0, 3, "job-J"));
  r1.Init("J", 1, JobEnv(port, 1, 3, "job-J"));
  r2.Init("J", 2, JobEnv(port, 2, 3, "job-J"));
  dup1.Init("J", 1, JobEnv(port, 1, 3, "job-J"));
  wrong.Init("J", 1, JobEnv(port, 1, 2, "job-J"));
  RankRun::release = true;  // r0 serves until r2, the last, is done: nothing to hold
  r0.Start();
  REQUIRE(WaitUntil(r0.joined));
  r1.Start();
  REQUIRE(WaitUntil(r1.joined));
  dup1.Start();
  wrong.Start();
  dup1.thread.join();
  wrong.thread.join();
  // The late rank comes after the others have started waiting for it.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  r2.Start();
  for (RankRun* r : {&r0, &r1, &r2}) r->thread.join();
  const std::vector<std::string> expected = {"J/0", "J/1", "J/2"};
  INFO("r0: " << r0.status << "\ndup: " << dup1.status << "\nwrong: " << wrong.status);
  CHECK(r0.gathered == expected);
  CHECK(r1.gathered == expected);
  CHECK(r2.gathered == expected);
  REQUIRE(absl::IsAlreadyExists(dup1.status));
  CHECK(Has(dup1.status, "rank 1 of job 'job-J' (PLEXUS_JOB_ID) already joined"));
  REQUIRE(absl::IsFailedPrecondition(wrong.status));
  CHECK(Has(wrong.status, "has world size 2, but rank 0"));
  CHECK(Has(wrong.status, "world size 3"));
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
