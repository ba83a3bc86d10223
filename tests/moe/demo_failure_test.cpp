// Failures of the Lazarus runtime across real processes (plexus-moe-demo under the launcher
// plexus-run uses): where rank 0 serves the job's store, killing it must end the job with an
// error naming the store within a bounded time, never a hang; where the job meets in etcd, the
// job must survive it.
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "plexus/tooling/etcd.hpp"
#include "plexus/tooling/launch.hpp"
#include "support/skip.hpp"

namespace tooling = plexus::tooling;

TEST_CASE("killing rank 0, which serves the store, ends the job with an error naming the store",
          "[moe][runtime][process]") {
  tooling::LaunchOptions o;
  o.ranks = 3;
  o.argv = {
      PLEXUS_MOE_DEMO, "train", "--steps", "40",  "--kill-rank", "0",  "--kill-step",        "5",
      "--timeout",     "1",     "--grace", "0.3", "--tokens",    "96", "--checkpoint-every", "0"};
  o.output = tooling::OutputMode::kCaptured;
  o.stop_on_failure = false;  // the survivors must find out by themselves
  o.timeout = absl::Seconds(90);
  absl::StatusOr<tooling::LaunchResult> r = tooling::Launch(o);
  REQUIRE(r.ok());
  REQUIRE_FALSE(r->timed_out);
  REQUIRE(r->ranks.size() == 3);
  CHECK(r->ranks[0].signal == SIGKILL);
  for (int i : {1, 2}) {
    INFO("rank " << i << " " << r->ranks[i].Describe() << ": " << r->ranks[i].err);
    CHECK(r->ranks[i].exit_code.has_value());
    CHECK(r->ranks[i].exit_code.value_or(0) != 0);
    CHECK(r->ranks[i].err.find("lost the job's store") != std::string::npos);
    CHECK(r->ranks[i].err.find("rank 0") != std::string::npos);
  }
  // Start, 5 steps, detection within the 1 s timeout, and an immediate store error: far below
  // the store's 30 s reply timeout, which a hang on the store would reach.
  CHECK(r->seconds < 20);
}

// The same kill when the job meets in etcd, a store that outlives every rank: the survivors
// recover without rank 0, the lowest of them reports the job, a new rank still joins, and both
// the elastic and the checkpoint-restart run end bit-identical to a run that never failed.
TEST_CASE("with an etcd store, the job survives the death of rank 0", "[moe][runtime][process]") {
  if (!tooling::EtcdServer::Installed()) {
    plexus::testing::SkipTest("etcd is not installed (apt-get install etcd-server)");
  }
  tooling::LaunchOptions o;
  o.ranks = 1;
  o.plexus_env = false;
  o.argv = {PLEXUS_MOE_DEMO,
            "--store",
            "etcd",
            "--kill-rank",
            "0",
            "--steps",
            "40",
            "--kill-step",
            "25",
            "--checkpoint-every",
            "10",
            "--join-step",
            "32",
            "--json"};
  o.output = tooling::OutputMode::kCaptured;
  o.timeout = absl::Seconds(150);
  absl::StatusOr<tooling::LaunchResult> r = tooling::Launch(o);
  REQUIRE(r.ok());
  REQUIRE(r->ranks.size() == 1);
  INFO(r->ranks[0].Describe() << "\n" << r->ranks[0].out << "\n" << r->ranks[0].err);
  REQUIRE(r->ranks[0].ok());
  const nlohmann::json j = nlohmann::json::parse(r->ranks[0].out);
  CHECK(j["same_parameters"] == true);
  CHECK(j["kill_rank"] == 0);
  CHECK(j["store"].get<std::string>().rfind("etcd://127.0.0.1:", 0) == 0);
  for (const char* run : {"elastic", "checkpoint_restart"}) {
    INFO(run);
    const nlohmann::json& failure = j[run]["failure"];
    REQUIRE(failure.is_object());
    std::vector<int> members = failure["members"];  // in plan order
    std::sort(members.begin(), members.end());
    CHECK(members == std::vector<int>{1, 2, 3});
    const nlohmann::json& join = j[run]["join"];
    REQUIRE(join.is_object());
    CHECK(join["joined"] == nlohmann::json::array({4}));
  }
  CHECK(j["elastic"]["failure"]["steps_lost"] == 0);
}
