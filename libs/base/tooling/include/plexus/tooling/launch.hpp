// The rank launcher of plexus-run, the benchmarks and the multi-process tests: starts N copies of
// a program, each in its own process group with the plexus rendezvous environment (PLEXUS_RANK,
// PLEXUS_WORLD_SIZE, PLEXUS_LOCAL_RANK, PLEXUS_LOCAL_WORLD_SIZE, PLEXUS_STORE_ADDR), collects
// their output line by line, stops them all when one fails or the timeout passes (SIGTERM, then
// SIGKILL after a grace period) and reports how each ended. It signals and reaps only the
// processes it started.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace plexus::tooling {

inline constexpr int kTimeoutExitCode = 124;
inline constexpr int kExecFailedExitCode = 127;

enum class OutputMode {
  kPrefixed,  // every line to our stdout/stderr, prefixed with "[rank] " (plexus-run)
  kCaptured,  // kept per rank in RankResult::out/err (tests)
  kCallback,  // handed to LaunchOptions::on_line only (benches that parse their ranks' output)
};

enum class Stream { kStdout, kStderr };

class Launcher;

struct LaunchOptions {
  int ranks = 1;
  // The program and its arguments (a name without '/' is looked up in PATH).
  std::vector<std::string> argv;
  // When set, the argv of one rank (replaces `argv`).
  std::function<std::vector<std::string>(int rank)> rank_argv;
  // Extra environment of every rank, and of one rank; they override the inherited environment.
  std::vector<std::pair<std::string, std::string>> env;
  std::function<std::vector<std::pair<std::string, std::string>>(int rank)> rank_env;
  // Sets the PLEXUS_* rendezvous variables; PLEXUS_STORE_ADDR is `store_addr`, or when empty
  // 127.0.0.1 with a free port reserved here (rank 0 serves the store).
  bool plexus_env = true;
  std::string store_addr;
  OutputMode output = OutputMode::kPrefixed;
  // kCaptured: at most this many bytes kept per stream and rank (the rest is counted, dropped).
  size_t max_capture_bytes = size_t{16} << 20;
  // Every complete line of a rank (called for every mode, before the mode's own handling).
  std::function<void(Launcher&, int rank, Stream stream, std::string_view line)> on_line;
  // Called once per rank right after it started (its pid is then valid for Signal()).
  std::function<void(Launcher&, int rank, pid_t pid)> on_start;
  // Stops every rank and reports kTimeoutExitCode after this long.
  absl::Duration timeout = absl::InfiniteDuration();
  absl::Duration grace = absl::Seconds(3);  // between SIGTERM and SIGKILL
  bool stop_on_failure = true;              // a failing rank stops the others
  bool bind_cpus = false;                   // rank r on CPU r mod #CPUs
  bool inherit_stdin_rank0 = false;         // else every rank reads /dev/null
  // Passes SIGINT/SIGTERM/SIGHUP sent to this process on to every rank (a tool's main thread).
  bool forward_signals = false;
  // Progress messages ("rank 1 exited with code 3; stopping the other ranks") on stderr,
  // prefixed with "<log_name>: "; empty: silent.
  std::string log_name;
};

struct RankResult {
  int rank = 0;
  pid_t pid = -1;
  std::optional<int> exit_code;  // set when it exited
  std::optional<int> signal;     // set when a signal ended it
  bool core_dumped = false;
  bool stopped_by_launcher = false;  // the launcher signalled it before it ended
  std::string out, err;              // OutputMode::kCaptured
  size_t dropped_bytes = 0;          // beyond max_capture_bytes

  bool ok() const { return exit_code == 0; }
  // The exit code, or 128 + signal number.
  int ExitStatus() const;
  // "exited with code 3", "was killed by signal 9 (Killed)".
  std::string Describe() const;
};

struct LaunchResult {
  std::vector<RankResult> ranks;
  // 0 when every rank exited 0; else kTimeoutExitCode after a timeout, the first failing rank's
  // ExitStatus(), or 128 + the signal that interrupted us.
  int exit_code = 0;
  bool timed_out = false;
  int first_failure = -1;  // the rank that failed first (not counting ranks we stopped)
  int interrupted_by = 0;  // signal forwarded with forward_signals
  double seconds = 0;
  std::string store_addr;
};

class Launcher {
 public:
  explicit Launcher(LaunchOptions options);
  ~Launcher();  // kills (SIGKILL) and reaps ranks still running
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Starts every rank. An error (no free port, a program that cannot be executed) names the rank
  // and the program; the ranks already started are killed and reaped.
  absl::Status Start();
  // Runs until every rank has ended (or was stopped) and their output is drained.
  LaunchResult Wait();

  // The pid of each rank started so far.
  std::vector<pid_t> pids() const;
  // Sends `sig` to a rank's process group, only while the rank has not been reaped (so the pid
  // cannot belong to another process). Call it from on_start/on_line or between Start and Wait.
  // Returns false when the rank has already ended.
  bool Signal(int rank, int sig);
  const LaunchOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Start() then Wait(); a start failure is returned as the status.
absl::StatusOr<LaunchResult> Launch(LaunchOptions options);

class FigureWriter;
// Runs `options.ranks` ranks of `options.argv` (output and on_line are set here) as a benchmark's
// workers: every line rank 0 prints on stdout that is a figure (FigureFromJsonLine) goes to
// `writer`; every other line goes to stderr prefixed "[rank r]". An error names `what`, the exit
// code and whether the ranks timed out.
absl::Status RunWorkers(LaunchOptions options, FigureWriter& writer, const std::string& what);

// The absolute path of the running program (/proc/self/exe), or `fallback` when it cannot be
// read: how a driver starts its own binary again as a worker rank.
std::string SelfPath(const std::string& fallback);

// Draws a picture with the project's one plotting script, installed (and built) next to the
// running program: `python3 plexus-plot COMMAND DATA -o PNG`. Unavailable when
// python3-matplotlib is missing (the script exits 3 and says so); Internal when it fails.
absl::Status RunPlot(const std::string& command, const std::string& data, const std::string& png);

}  // namespace plexus::tooling
