// A child process of a test, started with plexus::tooling::Launcher: in its own process group,
// stdin from /dev/null, its output on ours prefixed with "[0] ", stopped (SIGTERM, then SIGKILL)
// after a time limit and killed and reaped by the destructor, so that no test leaves one behind
// or waits for it forever. Tests that include it link plexus::tooling.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "plexus/tooling/launch.hpp"

namespace plexus::testing {

class Child {
 public:
  // argv[0] is a path (or a name looked up in PATH). Throws when it cannot be started.
  explicit Child(std::vector<std::string> argv, absl::Duration limit = absl::Seconds(60))
      : launcher_(Options(std::move(argv), limit)) {
    const absl::Status started = launcher_.Start();
    if (!started.ok()) throw std::runtime_error(started.ToString());
  }

  // Sends `sig` to the child's process group; false when it has already been reaped.
  bool Signal(int sig) { return launcher_.Signal(0, sig); }

  // Waits for the end: the exit code, 128 + the signal that ended it, or
  // tooling::kTimeoutExitCode when the limit stopped it.
  int Wait() {
    const tooling::LaunchResult result = launcher_.Wait();
    return result.timed_out ? tooling::kTimeoutExitCode : result.ranks[0].ExitStatus();
  }

 private:
  static tooling::LaunchOptions Options(std::vector<std::string> argv, absl::Duration limit) {
    tooling::LaunchOptions options;
    options.argv = std::move(argv);
    options.plexus_env = false;
    options.timeout = limit;
    options.grace = absl::Seconds(1);
    return options;
  }

  tooling::Launcher launcher_;
};

}  // namespace plexus::testing
