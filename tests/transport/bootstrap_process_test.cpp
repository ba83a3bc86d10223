// Rendezvous across separate processes, each started alone with its own environment (as ranks
// started by hand are) and a time bound: rank 0's exit when a rank stops while the others report
// the job failed, and two jobs without job ids started interleaved on one store address.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bootstrap_test_util.hpp"
#include "plexus/tooling/launch.hpp"

namespace tooling = plexus::tooling;
using plexus::testing::FreePort;

namespace {

using Env = std::vector<std::pair<std::string, std::string>>;

// One process of a hand-started job: PLEXUS_RANK and the rest set here, nothing inherited from a
// launcher, its output captured, stopped after `limit`.
struct Process {
  std::string name;
  std::unique_ptr<tooling::Launcher> launcher;
  tooling::LaunchResult result;
  double seconds = 0;  // from its start to its end

  void Start(std::string label, std::vector<std::string> argv, Env env,
             absl::Duration limit = absl::Seconds(40)) {
    name = std::move(label);
    tooling::LaunchOptions options;
    options.argv = std::move(argv);
    options.plexus_env = false;
    options.env = std::move(env);
    options.output = tooling::OutputMode::kCaptured;
    options.timeout = limit;
    options.grace = absl::Seconds(1);
    launcher = std::make_unique<tooling::Launcher>(std::move(options));
    const absl::Status started = launcher->Start();
    if (!started.ok()) throw std::runtime_error(started.ToString());
  }
  void Wait() {
    result = launcher->Wait();
    seconds = result.seconds;
  }
  int exit_code() const {
    return result.timed_out ? tooling::kTimeoutExitCode : result.ranks[0].ExitStatus();
  }
  std::string output() const { return result.ranks[0].out + result.ranks[0].err; }
  bool Says(const std::string& text) const { return output().find(text) != std::string::npos; }
};

Env RankEnv(int port, int rank, int world_size) {
  return {{"PLEXUS_RANK", std::to_string(rank)},
          {"PLEXUS_WORLD_SIZE", std::to_string(world_size)},
          {"PLEXUS_LOCAL_RANK", std::to_string(rank)},
          {"PLEXUS_LOCAL_WORLD_SIZE", std::to_string(world_size)},
          {"PLEXUS_STORE_ADDR", absl::StrCat("127.0.0.1:", port)},
          {"PLEXUS_JOB_ID", ""}};
}

}  // namespace

TEST_CASE("rank 0 exits soon after the job failed, not after the linger, when a rank hangs") {
  // Rank 1 joins and then sleeps holding its store connection (as a stopped rank does); ranks 0
  // and 2 fail a 1 s barrier and report it. Rank 0 used to wait the whole 10 s linger for rank 1
  // to leave the store.
  const int port = FreePort();
  std::vector<Process> ranks(3);
  for (int r : {0, 1, 2}) {
    ranks[r].Start(absl::StrCat("rank ", r), {BOOTSTRAP_HELPER, "fail", "1"}, RankEnv(port, r, 3));
  }
  ranks[0].Wait();
  ranks[2].Wait();
  INFO("rank 0 (" << ranks[0].seconds << " s): " << ranks[0].output());
  INFO("rank 2 (" << ranks[2].seconds << " s): " << ranks[2].output());
  CHECK(ranks[0].exit_code() == 1);
  CHECK(ranks[2].exit_code() == 1);
  CHECK(ranks[0].Says("barrier 'all' timed out"));
  CHECK(ranks[0].Says("2 of 3 ranks arrived"));
  CHECK(ranks[0].seconds < 5);  // 1 s barrier, start-up; the linger is 10 s
  // The hung rank is still there (the launcher's destructor kills it).
  CHECK(ranks[1].launcher->Signal(0, 0));
}

namespace {

// Starts the processes of two jobs without job ids on one store address in `order` ("A0", "B1",
// ...), 0.3 s apart, each running the helper's rendezvous (FromEnv, AllGather, Barrier with a
// 20 s timeout), and checks that every one fails, within the timeout, saying that two jobs share
// the address and how to separate them: none prints a result gathered from a mixed job.
void CheckInterleavedJobsAllFail(const std::vector<std::string>& order, int world_size) {
  const int port = FreePort();
  std::vector<Process> procs(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const int rank = order[i][1] - '0';
    procs[i].Start(order[i], {BOOTSTRAP_HELPER, "rendezvous"}, RankEnv(port, rank, world_size));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  for (Process& p : procs) p.Wait();
  for (const Process& p : procs) {
    INFO(p.name << " (" << p.seconds << " s, exit " << p.exit_code() << "): " << p.output());
    CHECK(p.exit_code() == 1);
    CHECK_FALSE(p.Says("gathered"));
    CHECK(p.Says("two jobs share this store address"));
    CHECK(p.Says("PLEXUS_JOB_ID"));
    CHECK(p.seconds < 15);  // the helper's timeout is 20 s
  }
}

}  // namespace

TEST_CASE("two 2-rank jobs without job ids on one address (A0 B0 A1 B1): all four fail") {
  // B0 finds the port taken by A0's store while A0 waits for its rank 1: it tells A's job so.
  CheckInterleavedJobsAllFail({"A0", "B0", "A1", "B1"}, 2);
}

TEST_CASE("two 4-rank jobs without job ids (A0 B1 A1 B0 A2 B2 A3 B3): all eight fail") {
  // A1 claims rank 1 after B1 did, while both wait for ranks 2 and 3.
  CheckInterleavedJobsAllFail({"A0", "B1", "A1", "B0", "A2", "B2", "A3", "B3"}, 4);
}
