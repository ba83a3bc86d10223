#include "plexus/tooling/launch.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "plexus/base/net.hpp"
#include "plexus/tooling/figures.hpp"

extern char** environ;

namespace plexus::tooling {
namespace {

using Clock = std::chrono::steady_clock;

// A line longer than this is passed on in pieces, to bound memory.
constexpr size_t kMaxLineBytes = 64 * 1024;

Clock::duration ToClock(absl::Duration d) { return absl::ToChronoNanoseconds(d); }

void WriteAll(int fd, std::string_view data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone (closed pipe): nothing better to do
    done += static_cast<size_t>(n);
  }
}

void Log(const LaunchOptions& o, const std::string& message) {
  if (o.log_name.empty()) return;
  WriteAll(STDERR_FILENO, absl::StrCat(o.log_name, ": ", message, "\n"));
}

using base::net::ErrnoText;

// pidfd_open(2): a descriptor that polls readable when the child ends, so that the event loop
// wakes for our own children only (no SIGCHLD handling, which a test process may not own).
int PidFd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

}  // namespace

int RankResult::ExitStatus() const {
  if (exit_code) return *exit_code;
  if (signal) return 128 + *signal;
  return 1;
}

std::string RankResult::Describe() const {
  if (exit_code) return absl::StrCat("exited with code ", *exit_code);
  if (signal) {
    return absl::StrFormat("was killed by signal %d (%s)%s", *signal, strsignal(*signal),
                           core_dumped ? ", core dumped" : "");
  }
  return "ended in an unknown way";
}

namespace {

// One output stream of one rank: bytes until a newline, then one line.
struct Pipe {
  int fd = -1;  // read end; -1 once at EOF
  Stream stream = Stream::kStdout;
  std::string pending;
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int pidfd = -1;
  bool running = false;
  std::string prefix;
  Pipe out, err;
  RankResult result;
};

}  // namespace

struct Launcher::Impl {
  LaunchOptions o;
  Launcher* self = nullptr;
  std::vector<Rank> ranks;
  std::string store_addr;
  std::string job_id;  // PLEXUS_JOB_ID given to the ranks unless the environment sets one
  int signal_fd = -1;
  sigset_t old_mask{};
  bool mask_changed = false;
  Clock::time_point start;
  std::optional<Clock::time_point> deadline;
  bool timed_out = false;
  int interrupted = 0;
  int first_failure = -1;
  bool stop_started = false;
  bool killed = false;
  Clock::time_point kill_at;
  bool waited = false;

  ~Impl() {
    StopAll(SIGKILL);
    while (AnyRunning()) Reap(/*block=*/true);
    for (Rank& r : ranks) Close(r);
    RestoreSignals();
  }

  void RestoreSignals() {
    if (signal_fd >= 0) close(signal_fd);
    signal_fd = -1;
    if (mask_changed) pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    mask_changed = false;
  }

  static void Close(Rank& r) {
    for (Pipe* p : {&r.out, &r.err}) {
      if (p->fd >= 0) close(p->fd);
      p->fd = -1;
    }
    if (r.pidfd >= 0) close(r.pidfd);
    r.pidfd = -1;
  }

  bool AnyRunning() const {
    for (const Rank& r : ranks) {
      if (r.running) return true;
    }
    return false;
  }

  // Signals only ranks we started and have not reaped yet, so a pid can never have been reused
  // by an unrelated process. SIGCONT after it, so that a stopped rank sees the signal.
  bool SignalRank(Rank& r, int sig) {
    if (!r.running) return false;
    kill(-r.pid, sig);
    kill(r.pid, sig);  // in case it left its process group
    if (sig != SIGSTOP && sig != SIGCONT && sig != SIGKILL) {
      kill(-r.pid, SIGCONT);
      kill(r.pid, SIGCONT);
    }
    return true;
  }

  void StopAll(int sig) {
    for (Rank& r : ranks) {
      if (SignalRank(r, sig)) r.result.stopped_by_launcher = true;
    }
  }

  void BeginStop(int sig) {
    if (!stop_started) {
      stop_started = true;
      kill_at = Clock::now() + ToClock(o.grace);
    }
    StopAll(sig);
  }

  std::vector<std::string> ArgvOf(int r) const { return o.rank_argv ? o.rank_argv(r) : o.argv; }

  // The environment of rank r, built here because the child of a fork in a threaded process may
  // only call async-signal-safe functions (setenv is not).
  std::vector<std::string> EnvOf(int r) const {
    std::map<std::string, std::string> vars;
    std::vector<std::string> order;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      const std::string entry = *e;
      const size_t eq = entry.find('=');
      if (eq == std::string::npos) continue;
      vars[entry.substr(0, eq)] = entry.substr(eq + 1);
    }
    if (o.plexus_env) {
      vars["PLEXUS_RANK"] = std::to_string(r);
      vars["PLEXUS_WORLD_SIZE"] = std::to_string(o.ranks);
      vars["PLEXUS_LOCAL_RANK"] = std::to_string(r);
      vars["PLEXUS_LOCAL_WORLD_SIZE"] = std::to_string(o.ranks);
      // A store the user names for the job (PLEXUS_STORE=etcd://...) is where the ranks meet;
      // otherwise rank 0 serves one on the address reserved here.
      const auto named = [&](const char* name) {
        return vars.count(name) > 0 || std::any_of(o.env.begin(), o.env.end(), [&](const auto& kv) {
                 return kv.first == name;
               });
      };
      if (!named("PLEXUS_STORE")) vars["PLEXUS_STORE_ADDR"] = store_addr;
      if (!named("PLEXUS_JOB_ID")) vars["PLEXUS_JOB_ID"] = job_id;
    }
    for (const auto& [k, v] : o.env) vars[k] = v;
    if (o.rank_env) {
      for (const auto& [k, v] : o.rank_env(r)) vars[k] = v;
    }
    std::vector<std::string> env;
    env.reserve(vars.size());
    for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
    return env;
  }

  absl::Status Spawn(int r) {
    Rank& rank = ranks[r];
    rank.rank = r;
    rank.result.rank = r;
    rank.prefix = absl::StrCat("[", r, "] ");
    std::vector<std::string> args = ArgvOf(r);
    if (args.empty()) return absl::InvalidArgumentError(absl::StrCat("rank ", r, ": no program"));
    std::vector<std::string> env = EnvOf(r);
    std::vector<char*> argv, envp;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    int out[2], err[2], exec_status[2];
    if (pipe2(out, O_CLOEXEC) != 0) return absl::UnavailableError("pipe: " + ErrnoText(errno));
    if (pipe2(err, O_CLOEXEC) != 0) {
      close(out[0]), close(out[1]);
      return absl::UnavailableError("pipe: " + ErrnoText(errno));
    }
    if (pipe2(exec_status, O_CLOEXEC) != 0) {
      close(out[0]), close(out[1]), close(err[0]), close(err[1]);
      return absl::UnavailableError("pipe: " + ErrnoText(errno));
    }
    const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    const bool keep_stdin = r == 0 && o.inherit_stdin_rank0;
    const long cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    const pid_t parent = getpid();

    const pid_t pid = fork();
    if (pid < 0) {
      const int e = errno;
      for (int fd : {out[0], out[1], err[0], err[1], exec_status[0], exec_status[1], null_fd}) {
        if (fd >= 0) close(fd);
      }
      return absl::UnavailableError("fork: " + ErrnoText(e));
    }
    if (pid == 0) {
      // Own process group: stopping a rank also stops whatever it started.
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // launcher killed with -9: take the ranks with it
      if (getppid() != parent) _exit(kExecFailedExitCode);
      if (o.bind_cpus) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(r % cpus, &set);
        sched_setaffinity(0, sizeof set, &set);
      }
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      if (!keep_stdin && null_fd >= 0) dup2(null_fd, STDIN_FILENO);
      for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) signal(s, SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, mask_changed ? &old_mask : &none, nullptr);
      execvpe(argv[0], argv.data(), envp.data());
      const int e = errno;
      [[maybe_unused]] ssize_t n = write(exec_status[1], &e, sizeof e);
      _exit(kExecFailedExitCode);
    }
    setpgid(pid, pid);  // also here, so that a kill right after fork reaches the group
    close(out[1]);
    close(err[1]);
    close(exec_status[1]);
    if (null_fd >= 0) close(null_fd);
    rank.pid = pid;
    rank.result.pid = pid;
    rank.running = true;
    rank.pidfd = PidFd(pid);
    rank.out.fd = out[0];
    rank.err.fd = err[0];
    rank.err.stream = Stream::kStderr;
    int exec_errno = 0;
    ssize_t n;
    do {
      n = read(exec_status[0], &exec_errno, sizeof exec_errno);
    } while (n < 0 && errno == EINTR);
    close(exec_status[0]);
    if (n == static_cast<ssize_t>(sizeof exec_errno)) {
      return absl::NotFoundError(
          absl::StrCat("rank ", r, ": cannot execute '", args[0], "': ", ErrnoText(exec_errno)));
    }
    if (o.on_start) o.on_start(*self, r, pid);
    return absl::OkStatus();
  }

  void Deliver(Rank& r, Pipe& p, std::string_view line) {
    if (o.on_line) o.on_line(*self, r.rank, p.stream, line);
    switch (o.output) {
      case OutputMode::kPrefixed: {
        std::string text = r.prefix;
        text.append(line);
        text.push_back('\n');
        WriteAll(p.stream == Stream::kStdout ? STDOUT_FILENO : STDERR_FILENO, text);
        break;
      }
      case OutputMode::kCaptured: {
        std::string& sink = p.stream == Stream::kStdout ? r.result.out : r.result.err;
        if (sink.size() + line.size() + 1 > o.max_capture_bytes) {
          r.result.dropped_bytes += line.size() + 1;
        } else {
          sink.append(line);
          sink.push_back('\n');
        }
        break;
      }
      case OutputMode::kCallback:
        break;
    }
  }

  // Reads what is available from one pipe.
  void Pump(Rank& r, Pipe& p) {
    char buf[16 * 1024];
    const ssize_t n = read(p.fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      if (!p.pending.empty()) Deliver(r, p, p.pending);
      p.pending.clear();
      close(p.fd);
      p.fd = -1;
      return;
    }
    p.pending.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = p.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      Deliver(r, p, std::string_view(p.pending).substr(start, nl - start));
    }
    p.pending.erase(0, start);
    while (p.pending.size() >= kMaxLineBytes) {
      Deliver(r, p, std::string_view(p.pending).substr(0, kMaxLineBytes));
      p.pending.erase(0, kMaxLineBytes);
    }
  }

  // Reaps our own ranks only (never waitpid(-1): the caller may have other children).
  void Reap(bool block) {
    for (Rank& r : ranks) {
      if (!r.running) continue;
      int status = 0;
      pid_t got;
      do {
        got = waitpid(r.pid, &status, block ? 0 : WNOHANG);
      } while (got < 0 && errno == EINTR);
      if (got != r.pid) continue;
      r.running = false;
      if (r.pidfd >= 0) close(r.pidfd);
      r.pidfd = -1;
      if (WIFEXITED(status)) r.result.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) {
        r.result.signal = WTERMSIG(status);
        r.result.core_dumped = WCOREDUMP(status);
      }
      if (!r.result.ok() && !r.result.stopped_by_launcher && first_failure < 0 && !timed_out &&
          interrupted == 0) {
        first_failure = r.rank;
        if (o.stop_on_failure) {
          Log(o, absl::StrCat("rank ", r.rank, " ", r.result.Describe(),
                              "; stopping the other ranks"));
          BeginStop(SIGTERM);
        }
      }
    }
  }

  void OnSignal() {
    signalfd_siginfo info;
    while (read(signal_fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (interrupted == 0) interrupted = sig;
      Log(o, absl::StrCat("got ", strsignal(sig), "; passing it on to every rank"));
      BeginStop(sig);
    }
  }

  void Loop() {
    std::optional<Clock::time_point> drain_until;
    for (;;) {
      Reap(false);
      std::vector<pollfd> fds;
      std::vector<Rank*> owners;
      std::vector<Pipe*> pipes;
      auto add = [&](int fd, Rank* r, Pipe* p) {
        fds.push_back({fd, POLLIN, 0});
        owners.push_back(r);
        pipes.push_back(p);
      };
      if (signal_fd >= 0) add(signal_fd, nullptr, nullptr);
      bool all_pidfds = true;
      int open_pipes = 0;
      for (Rank& r : ranks) {
        if (r.running) {
          if (r.pidfd >= 0) {
            add(r.pidfd, &r, nullptr);
          } else {
            all_pidfds = false;
          }
        }
        for (Pipe* p : {&r.out, &r.err}) {
          if (p->fd < 0) continue;
          add(p->fd, &r, p);
          ++open_pipes;
        }
      }
      const bool running = AnyRunning();
      if (!running && open_pipes == 0) return;
      if (!running && !drain_until) {
        // Every rank has ended; a background process it left may hold the pipes open.
        drain_until = Clock::now() + std::chrono::seconds(1);
      }
      const Clock::time_point now = Clock::now();
      if (drain_until && now >= *drain_until) return;
      if (deadline && now >= *deadline && !timed_out) {
        timed_out = true;
        Log(o, absl::StrFormat("timed out after %g s; stopping every rank",
                               absl::ToDoubleSeconds(o.timeout)));
        BeginStop(SIGTERM);
      }
      if (stop_started && !killed && now >= kill_at) {
        killed = true;
        StopAll(SIGKILL);
      }
      Clock::time_point wake = now + std::chrono::seconds(1);
      if (!all_pidfds) wake = std::min(wake, now + std::chrono::milliseconds(10));
      if (deadline && !timed_out) wake = std::min(wake, *deadline);
      if (stop_started && !killed) wake = std::min(wake, kill_at);
      if (drain_until) wake = std::min(wake, *drain_until);
      const auto wait_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1;
      const int n = poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait_ms, 0)));
      if (n < 0 && errno != EINTR) {
        Log(o, "poll: " + ErrnoText(errno));
        BeginStop(SIGKILL);
        return;
      }
      for (size_t i = 0; n > 0 && i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (owners[i] == nullptr) {
          OnSignal();
        } else if (pipes[i] != nullptr) {
          Pump(*owners[i], *pipes[i]);
        }  // a pidfd: reaped at the top of the loop
      }
    }
  }

  LaunchResult Finish() {
    // Ranks still running here only hold pipes of a leftover background process: stop them.
    if (AnyRunning()) {
      StopAll(SIGKILL);
      while (AnyRunning()) Reap(true);
    }
    LaunchResult result;
    for (Rank& r : ranks) {
      Close(r);
      result.ranks.push_back(r.result);
    }
    RestoreSignals();
    result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.timed_out = timed_out;
    result.first_failure = first_failure;
    result.interrupted_by = interrupted;
    result.store_addr = store_addr;
    if (timed_out) {
      result.exit_code = kTimeoutExitCode;
    } else if (first_failure >= 0) {
      result.exit_code = ranks[first_failure].result.ExitStatus();
    } else if (interrupted != 0) {
      result.exit_code = 128 + interrupted;
    } else {
      for (const Rank& r : ranks) {
        if (!r.result.ok()) {
          result.exit_code = r.result.ExitStatus();
          break;
        }
      }
    }
    return result;
  }
};

Launcher::Launcher(LaunchOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->o = std::move(options);
  impl_->self = this;
}

Launcher::~Launcher() = default;

const LaunchOptions& Launcher::options() const { return impl_->o; }

std::vector<pid_t> Launcher::pids() const {
  std::vector<pid_t> out;
  for (const Rank& r : impl_->ranks) {
    if (r.pid > 0) out.push_back(r.pid);
  }
  return out;
}

bool Launcher::Signal(int rank, int sig) {
  if (rank < 0 || rank >= static_cast<int>(impl_->ranks.size())) return false;
  Rank& r = impl_->ranks[rank];
  if (!r.running || r.pid <= 0) return false;
  kill(-r.pid, sig);
  kill(r.pid, sig);
  return true;
}

absl::Status Launcher::Start() {
  Impl& m = *impl_;
  if (!m.ranks.empty()) return absl::FailedPreconditionError("Launcher::Start called twice");
  if (m.o.ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the number of ranks must be >= 1, got ", m.o.ranks));
  }
  m.start = Clock::now();
  m.store_addr = m.o.store_addr;
  if (m.o.plexus_env && m.store_addr.empty()) {
    absl::StatusOr<uint16_t> port = base::net::ReserveLoopbackPort();
    if (!port.ok()) return port.status();
    m.store_addr = absl::StrCat("127.0.0.1:", *port);
  }
  if (m.o.plexus_env) {
    // One job identity per launch, so that ranks of two launches that meet at one store address
    // refuse each other instead of pairing (docs/architecture.md, Bootstrap).
    m.job_id = absl::StrCat("plexus-run-", getpid(), "-", absl::ToUnixNanos(absl::Now()));
  }
  if (m.o.forward_signals) {
    // Signals arrive through a signalfd, so that the event loop sees them in order with output.
    sigset_t mask;
    sigemptyset(&mask);
    for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&mask, s);
    pthread_sigmask(SIG_BLOCK, &mask, &m.old_mask);
    m.mask_changed = true;
    m.signal_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (m.signal_fd < 0) {
      const int e = errno;
      m.RestoreSignals();
      return absl::UnavailableError("signalfd: " + ErrnoText(e));
    }
  }
  m.ranks.resize(static_cast<size_t>(m.o.ranks));
  for (int r = 0; r < m.o.ranks; ++r) {
    if (absl::Status s = m.Spawn(r); !s.ok()) {
      m.StopAll(SIGKILL);
      while (m.AnyRunning()) m.Reap(/*block=*/true);
      for (Rank& rank : m.ranks) Impl::Close(rank);
      m.RestoreSignals();
      return s;
    }
  }
  if (m.o.timeout != absl::InfiniteDuration()) m.deadline = m.start + ToClock(m.o.timeout);
  return absl::OkStatus();
}

LaunchResult Launcher::Wait() {
  Impl& m = *impl_;
  if (!m.waited && !m.ranks.empty()) {
    m.waited = true;
    m.Loop();
  }
  return m.Finish();
}

absl::StatusOr<LaunchResult> Launch(LaunchOptions options) {
  Launcher launcher(std::move(options));
  if (absl::Status s = launcher.Start(); !s.ok()) return s;
  return launcher.Wait();
}

absl::Status RunWorkers(LaunchOptions options, FigureWriter& writer, const std::string& what) {
  options.output = OutputMode::kCallback;
  options.on_line = [&writer](Launcher&, int rank, Stream stream, std::string_view text) {
    const std::string line(text);
    if (rank == 0 && stream == Stream::kStdout) {
      if (std::optional<Figure> f = FigureFromJsonLine(line)) {
        writer.Add(*f);
        return;
      }
    }
    std::fprintf(stderr, "[rank %d] %s\n", rank, line.c_str());
  };
  absl::StatusOr<LaunchResult> launched = Launch(std::move(options));
  if (!launched.ok()) return launched.status();
  if (launched->exit_code != 0) {
    return absl::InternalError(absl::StrCat(what, ": the ranks failed (exit ", launched->exit_code,
                                            launched->timed_out ? ", timed out" : "", ")"));
  }
  return absl::OkStatus();
}

std::string SelfPath(const std::string& fallback) {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  return n <= 0 ? fallback : std::string(path, static_cast<size_t>(n));
}

absl::Status RunPlot(const std::string& command, const std::string& data, const std::string& png) {
  const std::string self = SelfPath("");
  const std::string dir = self.empty() ? "." : self.substr(0, self.rfind('/'));
  auto quoted = [](const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  };
  const std::string cmd = absl::StrCat("/usr/bin/python3 ", quoted(dir + "/plexus-plot"), " ",
                                       quoted(command), " ", quoted(data), " -o ", quoted(png));
  const int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 0) return absl::OkStatus();
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) {
    return absl::UnavailableError("no picture: python3-matplotlib is missing (see above)");
  }
  return absl::InternalError(absl::StrCat("plexus-plot ", command, " failed (", cmd, ")"));
}

}  // namespace plexus::tooling
