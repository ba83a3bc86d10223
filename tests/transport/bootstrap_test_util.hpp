// Helpers of the bootstrap tests: free ports, temporary directories and shell commands with a
// bounded lifetime (child processes: support/child_process.hpp). Tests that include it link
// plexus::tooling.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/base/file.hpp"
#include "plexus/base/net.hpp"
#include "plexus/tooling/launch.hpp"
#include "support/child_process.hpp"

namespace plexus::testing {

// A TCP port that was free on 127.0.0.1 a moment ago.
inline int FreePort() {
  const absl::StatusOr<uint16_t> port = base::net::ReserveLoopbackPort();
  if (!port.ok()) throw std::runtime_error(port.status().ToString());
  return *port;
}

inline std::string MakeTempDir(const std::string& tag) {
  std::string pattern = "/tmp/plexus-" + tag + "-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

inline void RemoveTree(const std::string& dir) {
  if (dir.rfind("/tmp/plexus-", 0) == 0) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
}

// The file's contents; empty when it cannot be read (yet).
inline std::string ReadFile(const std::string& path) {
  return base::ReadFile(path).value_or(std::string());
}

// Runs `body(rank)` on `n` threads and returns what each returned: empty for a rank that
// succeeded, else its failure (Catch2 assertions are main-thread only).
inline std::vector<std::string> OnThreads(int n, const std::function<std::string(int)>& body) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { errors[r] = body(r); });
  for (auto& t : threads) t.join();
  return errors;
}

struct ShellResult {
  int exit_code = -1;
  std::string out;
  std::string err;
  double seconds = 0;
};

// Runs `command` through /bin/sh with stdout and stderr captured, stopped after `limit`
// (exit code tooling::kTimeoutExitCode).
inline ShellResult RunShell(const std::string& command, absl::Duration limit = absl::Seconds(100)) {
  tooling::LaunchOptions options;
  options.argv = {"/bin/sh", "-c", command};
  options.plexus_env = false;
  options.output = tooling::OutputMode::kCaptured;
  options.timeout = limit;
  absl::StatusOr<tooling::LaunchResult> launched = tooling::Launch(std::move(options));
  if (!launched.ok()) throw std::runtime_error(launched.status().ToString());
  ShellResult r;
  r.exit_code = launched->timed_out ? tooling::kTimeoutExitCode : launched->ranks[0].ExitStatus();
  r.out = std::move(launched->ranks[0].out);
  r.err = std::move(launched->ranks[0].err);
  r.seconds = launched->seconds;
  return r;
}

}  // namespace plexus::testing
