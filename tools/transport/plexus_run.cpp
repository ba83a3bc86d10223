// plexus-run -n N [options] [--] program args...
//
// Starts N local ranks of `program` with PLEXUS_RANK, PLEXUS_WORLD_SIZE, PLEXUS_LOCAL_RANK,
// PLEXUS_LOCAL_WORLD_SIZE and PLEXUS_STORE_ADDR set, prefixes every line they print with
// "[rank] ", and exits non-zero when any rank fails. When a rank fails, the others are stopped
// (SIGTERM to their process groups, SIGKILL after a grace period), so that a crashed rank never
// leaves its peers waiting for it forever.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kTimeoutExitCode = 124;
constexpr int kExecFailedExitCode = 127;
// A line longer than this is passed on in pieces, each with its prefix, to bound memory.
constexpr size_t kMaxLineBytes = 64 * 1024;

constexpr char kUsage[] =
    "usage: plexus-run -n N [--timeout SEC] [--grace SEC] [--json] [--] program [args...]\n"
    "\n"
    "Starts N ranks of `program` on this host, each with PLEXUS_RANK, PLEXUS_WORLD_SIZE,\n"
    "PLEXUS_LOCAL_RANK, PLEXUS_LOCAL_WORLD_SIZE and PLEXUS_STORE_ADDR=127.0.0.1:<free port>\n"
    "(rank 0 serves the store; see plexus::transport::Rendezvous::FromEnv). Every line a rank\n"
    "prints is prefixed with \"[rank] \".\n"
    "\n"
    "  -n N           number of ranks (required, >= 1)\n"
    "  --timeout SEC  stop every rank and exit 124 after SEC seconds (default: no limit)\n"
    "  --grace SEC    after SIGTERM, wait SEC seconds before SIGKILL (default 3)\n"
    "  --json         print a JSON summary of the ranks' outcomes on stdout at the end\n"
    "  -h, --help     print this help\n"
    "\n"
    "Exit status: 0 when every rank exits 0; otherwise the first failing rank's exit code\n"
    "(128 + signal number when it was killed by a signal), 124 on timeout, 127 when the program\n"
    "cannot be started. When a rank fails, the others are terminated.\n";

struct Options {
  int ranks = 0;
  std::optional<double> timeout_s;
  double grace_s = 3.0;
  bool json = false;
  std::vector<std::string> command;
};

[[noreturn]] void UsageError(const std::string& message) {
  std::fprintf(stderr, "plexus-run: %s\n\n%s", message.c_str(), kUsage);
  std::exit(2);
}

double ParseSeconds(const std::string& flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !(v >= 0) || v > 1e9) {
    UsageError(fmt::format("{} expects a non-negative number of seconds, got '{}'", flag, text));
  }
  return v;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  int i = 1;
  auto value = [&](const std::string& flag) -> const char* {
    if (i + 1 >= argc) UsageError(fmt::format("{} needs a value", flag));
    return argv[++i];
  };
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    const bool glued_n = arg.size() > 2 && arg.rfind("-n", 0) == 0 &&
                         arg.find_first_not_of("0123456789", 2) == std::string::npos;
    if (arg == "-n" || arg == "--np" || glued_n) {
      const std::string text = glued_n ? arg.substr(2) : std::string(value(arg));
      char* end = nullptr;
      const long n = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || n < 1 || n > 4096) {
        UsageError(fmt::format("-n expects a number of ranks in 1..4096, got '{}'", text));
      }
      o.ranks = static_cast<int>(n);
    } else if (arg == "--timeout") {
      o.timeout_s = ParseSeconds(arg, value(arg));
    } else if (arg == "--grace") {
      o.grace_s = ParseSeconds(arg, value(arg));
    } else if (arg == "--json") {
      o.json = true;
    } else if (arg.size() > 1 && arg[0] == '-') {
      UsageError(fmt::format("unknown option '{}'", arg));
    } else {
      break;
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  if (o.ranks == 0) UsageError("missing -n N (the number of ranks)");
  if (o.command.empty()) UsageError("missing the program to run");
  return o;
}

// A free TCP port on the loopback interface for rank 0's store. Another process could take it
// before rank 0 binds it; the kernel hands out ephemeral ports round-robin, so that is rare.
int ReserveStorePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone (closed pipe): nothing better to do
    done += static_cast<size_t>(n);
  }
}

// One output stream of one rank: bytes until a newline, then one prefixed write, so that lines
// of different ranks never interleave.
struct Stream {
  int fd = -1;  // read end; -1 once at EOF
  int out_fd = STDOUT_FILENO;
  std::string pending;

  void Emit(const std::string& prefix, std::string_view line) {
    std::string text = prefix;
    text.append(line);
    text.push_back('\n');
    WriteAll(out_fd, text);
  }

  // Reads what is available; false at EOF.
  bool Pump(const std::string& prefix) {
    char buf[16 * 1024];
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
      if (!pending.empty()) Emit(prefix, pending);
      pending.clear();
      close(fd);
      fd = -1;
      return false;
    }
    pending.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      Emit(prefix, std::string_view(pending).substr(start, nl - start));
    }
    pending.erase(0, start);
    while (pending.size() >= kMaxLineBytes) {
      Emit(prefix, std::string_view(pending).substr(0, kMaxLineBytes));
      pending.erase(0, kMaxLineBytes);
    }
    return true;
  }
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int wait_status = 0;
  bool stopped_by_us = false;  // we sent it a signal before it ended
  std::string prefix;
  Stream out;
  Stream err;

  bool failed() const {
    return !running && !(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0);
  }
  int exit_code() const {
    if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
    if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
    return 1;
  }
  std::string Describe() const {
    if (WIFEXITED(wait_status)) return fmt::format("exited with code {}", WEXITSTATUS(wait_status));
    if (WIFSIGNALED(wait_status)) {
      const int sig = WTERMSIG(wait_status);
      return fmt::format("was killed by signal {} ({}){}", sig, strsignal(sig),
                         WCOREDUMP(wait_status) ? ", core dumped" : "");
    }
    return "ended in an unknown way";
  }
};

class Launcher {
 public:
  explicit Launcher(Options options) : o_(std::move(options)) {}

  int Run() {
    start_ = Clock::now();
    signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill us before the ranks are stopped
    const int port = ReserveStorePort();
    if (port < 0) {
      std::fprintf(stderr, "plexus-run: cannot find a free TCP port on 127.0.0.1: %s\n",
                   std::strerror(errno));
      return 1;
    }
    store_addr_ = fmt::format("127.0.0.1:{}", port);

    // Signals arrive through a signalfd, so that the event loop sees them in order with output.
    sigset_t mask;
    sigemptyset(&mask);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&mask, s);
    sigprocmask(SIG_BLOCK, &mask, &old_mask_);
    signal_fd_ = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (signal_fd_ < 0) {
      std::fprintf(stderr, "plexus-run: signalfd: %s\n", std::strerror(errno));
      return 1;
    }

    ranks_.resize(o_.ranks);
    for (int r = 0; r < o_.ranks; ++r) {
      if (!Spawn(r)) {
        StopAll(SIGKILL);
        while (AnyRunning()) Reap(/*block=*/true);
        return kExecFailedExitCode;
      }
    }
    if (o_.timeout_s) deadline_ = start_ + ToDuration(*o_.timeout_s);
    Loop();
    return Finish();
  }

 private:
  static Clock::duration ToDuration(double seconds) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }

  bool Spawn(int r) {
    Rank& rank = ranks_[r];
    rank.rank = r;
    rank.prefix = fmt::format("[{}] ", r);
    int out[2], err[2], exec_status[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 ||
        pipe2(exec_status, O_CLOEXEC) != 0) {
      std::fprintf(stderr, "plexus-run: pipe: %s\n", std::strerror(errno));
      return false;
    }
    const std::vector<std::pair<std::string, std::string>> env = {
        {"PLEXUS_RANK", std::to_string(r)},
        {"PLEXUS_WORLD_SIZE", std::to_string(o_.ranks)},
        {"PLEXUS_LOCAL_RANK", std::to_string(r)},
        {"PLEXUS_LOCAL_WORLD_SIZE", std::to_string(o_.ranks)},
        {"PLEXUS_STORE_ADDR", store_addr_},
    };
    std::vector<char*> argv;
    for (std::string& a : o_.command) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();

    const pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "plexus-run: fork: %s\n", std::strerror(errno));
      return false;
    }
    if (pid == 0) {
      // Own process group: stopping a rank also stops whatever it started.
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // plexus-run killed with -9: take the ranks with it
      if (getppid() != parent) _exit(kExecFailedExitCode);
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      if (r != 0) {
        const int null_fd = open("/dev/null", O_RDONLY);
        if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
      }
      for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
      for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) signal(s, SIG_DFL);
      sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
      execvp(argv[0], argv.data());
      const int e = errno;
      [[maybe_unused]] ssize_t n = write(exec_status[1], &e, sizeof e);
      _exit(kExecFailedExitCode);
    }
    setpgid(pid, pid);  // also here, so that a kill right after fork reaches the group
    close(out[1]);
    close(err[1]);
    close(exec_status[1]);
    rank.pid = pid;
    rank.running = true;
    rank.out.fd = out[0];
    rank.err.fd = err[0];
    rank.err.out_fd = STDERR_FILENO;
    int exec_errno = 0;
    ssize_t n;
    do {
      n = read(exec_status[0], &exec_errno, sizeof exec_errno);
    } while (n < 0 && errno == EINTR);
    close(exec_status[0]);
    if (n == static_cast<ssize_t>(sizeof exec_errno)) {
      std::fprintf(stderr, "plexus-run: cannot execute '%s': %s\n", o_.command[0].c_str(),
                   std::strerror(exec_errno));
      return false;
    }
    return true;
  }

  bool AnyRunning() const {
    for (const Rank& r : ranks_) {
      if (r.running) return true;
    }
    return false;
  }

  // Signals only the process groups of ranks we started and have not reaped yet, so a pid can
  // never have been reused by an unrelated process.
  void StopAll(int sig) {
    for (Rank& r : ranks_) {
      if (!r.running) continue;
      r.stopped_by_us = true;
      kill(-r.pid, sig);
      kill(r.pid, sig);  // in case it left its process group
    }
  }

  void BeginStop(int sig) {
    if (!stop_started_) {
      stop_started_ = true;
      kill_at_ = Clock::now() + ToDuration(o_.grace_s);
    }
    StopAll(sig);
  }

  void Reap(bool block) {
    for (;;) {
      int status = 0;
      const pid_t pid = waitpid(-1, &status, block ? 0 : WNOHANG);
      if (pid <= 0) return;
      for (Rank& r : ranks_) {
        if (r.pid != pid || !r.running) continue;
        r.running = false;
        r.wait_status = status;
        if (r.failed() && !r.stopped_by_us && first_failure_ < 0 && !timed_out_ &&
            interrupted_ == 0) {
          first_failure_ = r.rank;
          std::fprintf(stderr, "plexus-run: rank %d %s; stopping the other ranks\n", r.rank,
                       r.Describe().c_str());
          BeginStop(SIGTERM);
        }
      }
      block = false;
    }
  }

  void OnSignal() {
    signalfd_siginfo info;
    while (read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      if (info.ssi_signo == SIGCHLD) continue;  // reaped below in any case
      if (interrupted_ == 0) interrupted_ = static_cast<int>(info.ssi_signo);
      std::fprintf(stderr, "plexus-run: got %s; passing it on to every rank\n",
                   strsignal(static_cast<int>(info.ssi_signo)));
      BeginStop(static_cast<int>(info.ssi_signo));
    }
    Reap(false);
  }

  void Loop() {
    std::optional<Clock::time_point> drain_until;
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<Rank*> owners;
      std::vector<Stream*> streams;
      fds.push_back({signal_fd_, POLLIN, 0});
      owners.push_back(nullptr);
      streams.push_back(nullptr);
      for (Rank& r : ranks_) {
        for (Stream* s : {&r.out, &r.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          owners.push_back(&r);
          streams.push_back(s);
        }
      }
      const bool running = AnyRunning();
      if (!running && fds.size() == 1) return;
      if (!running && !drain_until) {
        // Every rank has ended; a background process it left may hold the pipes open.
        drain_until = Clock::now() + std::chrono::seconds(1);
      }
      const Clock::time_point now = Clock::now();
      if (drain_until && now >= *drain_until) return;
      if (deadline_ && now >= *deadline_ && !timed_out_) {
        timed_out_ = true;
        std::fprintf(stderr, "plexus-run: timed out after %g s; stopping every rank\n",
                     *o_.timeout_s);
        BeginStop(SIGTERM);
      }
      if (stop_started_ && !killed_ && now >= kill_at_) {
        killed_ = true;
        StopAll(SIGKILL);
      }
      Clock::time_point wake = now + std::chrono::seconds(1);
      if (deadline_ && !timed_out_) wake = std::min(wake, *deadline_);
      if (stop_started_ && !killed_) wake = std::min(wake, kill_at_);
      if (drain_until) wake = std::min(wake, *drain_until);
      const auto wait_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1;
      const int n = poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait_ms, 0)));
      if (n < 0 && errno != EINTR) {
        std::fprintf(stderr, "plexus-run: poll: %s\n", std::strerror(errno));
        BeginStop(SIGKILL);
        return;
      }
      for (size_t i = 0; n > 0 && i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (streams[i] == nullptr) {
          OnSignal();
        } else {
          streams[i]->Pump(owners[i]->prefix);
        }
      }
      Reap(false);
    }
  }

  int Finish() {
    // Ranks still running here only hold pipes of a leftover background process: stop them.
    if (AnyRunning()) {
      StopAll(SIGKILL);
      while (AnyRunning()) Reap(true);
    }
    for (Rank& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd >= 0) close(s->fd);
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    int code = 0;
    if (timed_out_) {
      code = kTimeoutExitCode;
    } else if (first_failure_ >= 0) {
      code = ranks_[first_failure_].exit_code();
    } else if (interrupted_ != 0) {
      code = 128 + interrupted_;
    } else {
      for (const Rank& r : ranks_) {
        if (r.failed()) {
          code = r.exit_code();
          break;
        }
      }
    }
    if (code == 0) {
      std::fprintf(stderr, "plexus-run: all %d ranks exited with code 0 (%.2f s)\n", o_.ranks,
                   seconds);
    } else {
      for (const Rank& r : ranks_) {
        if (!r.failed()) continue;
        const char* why = r.stopped_by_us ? " (stopped by plexus-run)" : "";
        std::fprintf(stderr, "plexus-run: rank %d %s%s\n", r.rank, r.Describe().c_str(), why);
      }
      std::fprintf(stderr, "plexus-run: failed with exit code %d after %.2f s\n", code, seconds);
    }
    if (o_.json) {
      nlohmann::json j;
      j["ranks"] = nlohmann::json::array();
      for (const Rank& r : ranks_) {
        nlohmann::json jr;
        jr["rank"] = r.rank;
        jr["pid"] = r.pid;
        jr["exit_code"] = WIFEXITED(r.wait_status) ? nlohmann::json(WEXITSTATUS(r.wait_status))
                                                   : nlohmann::json(nullptr);
        jr["signal"] = WIFSIGNALED(r.wait_status) ? nlohmann::json(WTERMSIG(r.wait_status))
                                                  : nlohmann::json(nullptr);
        jr["stopped_by_launcher"] = r.stopped_by_us;
        j["ranks"].push_back(jr);
      }
      j["exit_code"] = code;
      j["seconds"] = seconds;
      j["timed_out"] = timed_out_;
      j["first_failure"] = first_failure_ >= 0 ? nlohmann::json(first_failure_) : nullptr;
      std::fflush(stdout);
      WriteAll(STDOUT_FILENO, j.dump() + "\n");
    }
    return code;
  }

  Options o_;
  std::vector<Rank> ranks_;
  std::string store_addr_;
  int signal_fd_ = -1;
  sigset_t old_mask_{};
  Clock::time_point start_;
  std::optional<Clock::time_point> deadline_;
  bool timed_out_ = false;
  int interrupted_ = 0;
  int first_failure_ = -1;
  bool stop_started_ = false;
  bool killed_ = false;
  Clock::time_point kill_at_;
};

}  // namespace

int main(int argc, char** argv) {
  Options options = ParseArgs(argc, argv);
  Launcher launcher(std::move(options));
  return launcher.Run();
}
