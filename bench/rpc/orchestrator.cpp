// The driver of plexus-bench-rpc (see orchestrator.hpp).
#include "orchestrator.hpp"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "plexus/tooling/launch.hpp"
#include "plexus_peer.hpp"

namespace plexus::benchrpc {
namespace {

// Runs one peer process; `on_line` sees its stdout lines. Wait() in a thread.
class Peer {
 public:
  Peer(std::vector<std::string> argv, absl::Duration timeout,
       std::vector<std::pair<std::string, std::string>> env = {}) {
    plexus::tooling::LaunchOptions o;
    o.ranks = 1;
    o.argv = std::move(argv);
    o.env = std::move(env);
    o.plexus_env = false;
    o.output = plexus::tooling::OutputMode::kCallback;
    o.timeout = timeout;
    o.grace = absl::Seconds(2);
    o.on_line = [this](plexus::tooling::Launcher&, int, plexus::tooling::Stream stream,
                       std::string_view line) {
      if (stream == plexus::tooling::Stream::kStderr) {
        std::fprintf(stderr, "  [%s] %.*s\n", name_.c_str(), static_cast<int>(line.size()),
                     line.data());
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(line);
      cv_.notify_all();
    };
    name_ = o.argv[0].substr(o.argv[0].rfind('/') + 1) + " " + o.argv[2];
    launcher_ = std::make_unique<plexus::tooling::Launcher>(std::move(o));
    if (auto s = launcher_->Start(); !s.ok()) Die(s.ToString());
    waiter_ = std::thread([this] {
      plexus::tooling::LaunchResult r = launcher_->Wait();
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = true;
      result_ = r.ranks.empty() ? "did not start" : r.ranks[0].Describe();
      exit_ok_ = !r.ranks.empty() && (r.ranks[0].ok() || r.ranks[0].stopped_by_launcher);
      cv_.notify_all();
    });
  }
  ~Peer() {
    launcher_->Signal(0, SIGTERM);
    waiter_.join();
  }
  // Waits for the process to end; dies unless it ended well (exit 0, or stopped by this side):
  // a peer that printed its result and then crashed must not count.
  void ExpectCleanExit(absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return ended_; })) {
      Die(absl::StrCat(name_, " did not exit within ", absl::FormatDuration(timeout),
                       " after its result"));
    }
    if (!exit_ok_) Die(absl::StrCat(name_, " ", result_, " after printing its result"));
  }
  // The first stdout line starting with `prefix` (without it); dies when the process ended first
  // or `timeout` passed.
  std::string Line(const std::string& prefix, absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
    while (true) {
      for (const std::string& l : lines_) {
        if (l.rfind(prefix, 0) == 0) return l.substr(prefix.size());
      }
      if (ended_) Die(absl::StrCat(name_, " ", result_, " without printing '", prefix, "'"));
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        Die(absl::StrCat(name_, " printed no '", prefix, "' line within ",
                         absl::FormatDuration(timeout)));
      }
    }
  }

 private:
  std::string name_;
  std::unique_ptr<plexus::tooling::Launcher> launcher_;
  std::thread waiter_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
  bool ended_ = false;
  bool exit_ok_ = false;
  std::string result_;
};

// A side's syscall_clock report: user-space us per send (one send per round trip and side at the
// latency mode's sizes), or NaN when it wrote none.
double UserUsPerCall(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return NAN;
  unsigned long long sends = 0, syscalls = 0;
  double user_ns = 0, kernel_ns = 0;
  const int n = std::fscanf(f, "sends=%llu syscalls=%llu user_ns=%lf kernel_ns=%lf", &sends,
                            &syscalls, &user_ns, &kernel_ns);
  std::fclose(f);
  std::remove(path.c_str());
  return n == 4 && sends > 0 ? user_ns / 1e3 / static_cast<double>(sends) : NAN;
}

}  // namespace

Sample Orchestrator::Run(const std::string& system, const Layout& layout, const std::string& mode,
                         uint32_t size, uint32_t reply, int inflight, const std::string& policy,
                         double deny_percent) {
  std::vector<std::string> common;
  std::string program = self;
  std::string server_role = "server", client_role = "client";
  if (system == "grpc") {
    program = grpc_peer;
  } else if (system == "raw-tcp" || system == "raw-tcp-spin") {
    server_role = "raw-server";
    client_role = "raw-client";
    // The spinning floor polls as long as Plexus's tcp waits spin (50 us, then it blocks).
    if (system == "raw-tcp-spin") common = {"--spin-us", "50"};
  } else {
    // The transport moves bytes in the threads that poll for completions (ProgressMode::kCaller:
    // rpc handles each completion run-to-completion on the thread that read it);
    // "plexus-tcp-thread" is the same with a device thread moving the bytes (kThread: one
    // thread hop more per side). shm's rate runs keep kThread, faster there (docs/rpc.md).
    const bool thread_mode =
        system == "plexus-tcp-thread" || (system == "plexus-shm" && mode == "rate");
    common = {"--transport", system == "plexus-shm" ? "shm" : "tcp", "--progress",
              thread_mode ? "thread" : "caller"};
  }
  std::vector<std::string> sargv = {program, "--role", server_role, "--cpu",
                                    std::to_string(layout.server_cpu)};
  sargv.insert(sargv.end(), common.begin(), common.end());
  const absl::Duration limit = absl::Seconds(base.seconds * 3 + 60);
  std::string clock_out[2];  // server's, client's
  auto env_for = [&](int side) -> std::vector<std::pair<std::string, std::string>> {
    if (!split) return {};
    const char* tmp = std::getenv("TMPDIR");
    clock_out[side] = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                   "/plexus-bench-rpc-clock-", getpid(), "-", side);
    return {{"LD_PRELOAD", self.substr(0, self.rfind('/') + 1) + "libplexus_syscall_clock.so"},
            {"PLEXUS_SYSCALL_CLOCK_OUT", clock_out[side]}};
  };
  Peer server(sargv, limit, env_for(0));
  const std::string address = server.Line("address ", absl::Seconds(30));
  std::vector<std::string> cargv = {program,
                                    "--role",
                                    client_role,
                                    "--cpu",
                                    std::to_string(layout.client_cpu),
                                    "--address",
                                    address,
                                    "--mode",
                                    mode,
                                    "--size",
                                    std::to_string(size),
                                    "--reply",
                                    std::to_string(reply),
                                    "--inflight",
                                    std::to_string(inflight),
                                    "--seconds",
                                    absl::StrCat(base.seconds),
                                    "--deny-percent",
                                    absl::StrCat(deny_percent)};
  cargv.insert(cargv.end(), common.begin(), common.end());
  if (policy != "none") {
    cargv.push_back("--policy");
    cargv.push_back(policy);
  }
  Peer client(cargv, limit, env_for(1));
  const std::string line = client.Line("result ", limit);
  Sample s;
  for (absl::string_view kv : absl::StrSplit(line, ' ')) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    double v = 0;
    if (!absl::SimpleAtod(p.second, &v)) continue;
    if (p.first == "rate") s.rate = v;
    if (p.first == "base_rate") s.base_rate = v;
    if (p.first == "pair_cost") s.pair_cost = v;
    if (p.first == "goodput") s.goodput = v;
    if (p.first == "median_us") s.median_us = v;
    if (p.first == "p99_us") s.p99_us = v;
    if (p.first == "ok") s.ok = static_cast<uint64_t>(v);
    if (p.first == "failed") s.failed = static_cast<uint64_t>(v);
    if (p.first == "wrong") s.wrong = static_cast<uint64_t>(v);
  }
  if (s.wrong > 0) {
    Die(absl::StrCat(system, " ", mode, ": ", s.wrong, " of ", s.ok,
                     " replies were not the echo of their request"));
  }
  if (policy == "upgrade") {
    for (absl::string_view kv : absl::StrSplit(client.Line("upgrade ", limit), ' ')) {
      std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
      double v = 0;
      if (absl::SimpleAtod(p.second, &v)) s.upgrade[p.first] = v;
    }
  }
  client.ExpectCleanExit(absl::Seconds(30));
  if (split) {
    // The server reports every 1024 sends (it is ended by a signal); the client at its exit.
    s.server_user_us = UserUsPerCall(clock_out[0]);
    s.client_user_us = UserUsPerCall(clock_out[1]);
    if (std::isnan(s.server_user_us) || std::isnan(s.client_user_us)) {
      Die(absl::StrCat(system, ": no user-space split from ", clock_out[0], " / ", clock_out[1],
                       " (is libplexus_syscall_clock.so next to ", self, "?)"));
    }
  }
  return s;
}

}  // namespace plexus::benchrpc
