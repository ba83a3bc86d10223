// Failures of the Lazarus runtime across real processes (plexus-moe-demo train under the
// launcher plexus-run uses): rank 0 serves the job's store, so killing it must end the job with
// an error naming the store within a bounded time, never a hang.
#include <signal.h>

#include <catch2/catch.hpp>
#include <string>

#include "plexus/tooling/launch.hpp"

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
