// plexus-run -n N [options] [--] program args...
//
// Starts N local ranks of `program` with PLEXUS_RANK, PLEXUS_WORLD_SIZE, PLEXUS_LOCAL_RANK,
// PLEXUS_LOCAL_WORLD_SIZE and PLEXUS_STORE_ADDR set, prefixes every line they print with
// "[rank] ", and exits non-zero when any rank fails. When a rank fails, the others are stopped
// (SIGTERM to their process groups, SIGKILL after a grace period), so that a crashed rank never
// leaves its peers waiting for it forever. The launching itself is plexus::tooling::Launcher.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/launch.hpp"

namespace tooling = plexus::tooling;

namespace {

constexpr char kDescription[] =
    "usage: plexus-run -n N [--timeout SEC] [--grace SEC] [--json] [--] program [args...]\n"
    "\n"
    "Starts N ranks of `program` on this host, each with PLEXUS_RANK, PLEXUS_WORLD_SIZE,\n"
    "PLEXUS_LOCAL_RANK, PLEXUS_LOCAL_WORLD_SIZE and PLEXUS_STORE_ADDR=127.0.0.1:<free port>\n"
    "(rank 0 serves the store; see plexus::transport::Rendezvous::FromEnv), or, when\n"
    "PLEXUS_STORE=etcd://host:port is set, meeting in that etcd instead. Every line a rank\n"
    "prints is prefixed with \"[rank] \".\n"
    "\n"
    "Exit status: 0 when every rank exits 0; otherwise the first failing rank's exit code\n"
    "(128 + signal number when it was killed by a signal), 124 on timeout, 127 when the program\n"
    "cannot be started, 2 on a usage error. When a rank fails, the others are terminated.";

void PrintJson(const tooling::LaunchResult& result) {
  nlohmann::json j;
  j["ranks"] = nlohmann::json::array();
  for (const tooling::RankResult& r : result.ranks) {
    nlohmann::json jr;
    jr["rank"] = r.rank;
    jr["pid"] = r.pid;
    jr["exit_code"] = r.exit_code ? nlohmann::json(*r.exit_code) : nlohmann::json(nullptr);
    jr["signal"] = r.signal ? nlohmann::json(*r.signal) : nlohmann::json(nullptr);
    jr["stopped_by_launcher"] = r.stopped_by_launcher;
    j["ranks"].push_back(jr);
  }
  j["exit_code"] = result.exit_code;
  j["seconds"] = result.seconds;
  j["timed_out"] = result.timed_out;
  j["first_failure"] =
      result.first_failure >= 0 ? nlohmann::json(result.first_failure) : nlohmann::json(nullptr);
  std::fflush(stdout);
  const std::string text = j.dump() + "\n";
  [[maybe_unused]] ssize_t n = write(STDOUT_FILENO, text.data(), text.size());
}

}  // namespace

int main(int argc, char** argv) {
  tooling::Tool tool("plexus-run", kDescription);
  CLI::App& app = tool.app();
  int ranks = 0;
  double timeout_s = 0;
  double grace_s = 3;
  bool json = false;
  bool keep_going = false;
  std::vector<std::string> command;
  tooling::AddNumber(&app, "--np,-n", &ranks, "number of ranks (required)", 1, 4096);
  tooling::AddNumber(&app, "--timeout", &timeout_s,
                     "stop every rank and exit 124 after SEC seconds (0: no limit)", 0.0, 1e9);
  tooling::AddNumber(&app, "--grace", &grace_s, "after SIGTERM, wait SEC seconds before SIGKILL",
                     0.0, 1e9);
  app.add_flag("--json", json, "print a JSON summary of the ranks' outcomes on stdout at the end");
  app.add_flag("--keep-going", keep_going,
               "a rank that fails does not stop the others (elastic jobs that survive a dead "
               "rank); the exit code still reports the first failure");
  // Everything from the program on (or after "--") belongs to the ranks.
  app.prefix_command();
  if (auto code = tool.Parse(argc, argv)) return *code;
  if (ranks == 0) return tool.Usage("missing -n N (the number of ranks)");
  command = app.remaining();
  if (!command.empty() && command.front() == "--") command.erase(command.begin());
  if (command.empty()) return tool.Usage("missing the program to run");

  signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill us before the ranks are stopped
  tooling::LaunchOptions options;
  options.ranks = ranks;
  options.argv = command;
  options.output = tooling::OutputMode::kPrefixed;
  if (timeout_s > 0) options.timeout = absl::Seconds(timeout_s);
  options.grace = absl::Seconds(grace_s);
  options.inherit_stdin_rank0 = true;
  options.forward_signals = true;
  options.stop_on_failure = !keep_going;
  options.log_name = "plexus-run";
  tooling::Launcher launcher(std::move(options));
  if (absl::Status s = launcher.Start(); !s.ok()) {
    tool.Fail(s);
    return s.code() == absl::StatusCode::kNotFound ? tooling::kExecFailedExitCode
                                                   : tooling::kExitFailure;
  }
  const tooling::LaunchResult result = launcher.Wait();
  if (result.exit_code == 0) {
    std::fprintf(stderr, "plexus-run: all %d ranks exited with code 0 (%.2f s)\n", ranks,
                 result.seconds);
  } else {
    for (const tooling::RankResult& r : result.ranks) {
      if (r.ok()) continue;
      const char* why = r.stopped_by_launcher ? " (stopped by plexus-run)" : "";
      std::fprintf(stderr, "plexus-run: rank %d %s%s\n", r.rank, r.Describe().c_str(), why);
    }
    std::fprintf(stderr, "plexus-run: failed with exit code %d after %.2f s\n", result.exit_code,
                 result.seconds);
  }
  if (json) PrintJson(result);
  return result.exit_code;
}
