// C++ side of tools/netbed for tests and benchmarks: creates a bed (and removes it on
// destruction), runs its commands, and runs code inside one of its network namespaces.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace plexus::netbed {

// Runs `argv` (no shell) and waits; OK when it exits 0.
inline absl::Status RunCommand(const std::vector<std::string>& argv, bool quiet = false) {
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    if (quiet) {
      const int null = open("/dev/null", O_WRONLY);
      if (null >= 0) {
        dup2(null, 1);
        dup2(null, 2);
      }
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("'", absl::StrJoin(argv, " "), "' failed (status ", status, ")"));
}

class Bed {
 public:
  // Creates bed `name` with one shaped path per rate (Mbit/s) using the netbed script.
  static absl::StatusOr<std::unique_ptr<Bed>> Create(std::string script, std::string name,
                                                     const std::vector<int>& rates_mbit) {
    std::vector<std::string> argv = {script, "-n", name, "down"};
    (void)RunCommand(argv, true);  // a leftover of a killed run with the same name
    argv = {script, "-n", name, "up"};
    for (int r : rates_mbit) argv.push_back(std::to_string(r));
    if (absl::Status s = RunCommand(argv); !s.ok()) {
      (void)RunCommand({script, "-n", name, "down"}, true);
      return s;
    }
    return std::unique_ptr<Bed>(new Bed(std::move(script), std::move(name), rates_mbit.size()));
  }
  ~Bed() { (void)Run({"down"}); }
  Bed(const Bed&) = delete;
  Bed& operator=(const Bed&) = delete;

  // netbed -n NAME <args...>
  absl::Status Run(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {script_, "-n", name_};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  }
  const std::string& name() const { return name_; }
  size_t paths() const { return paths_; }
  std::string ns(char side) const { return absl::StrCat(name_, "-", std::string(1, side)); }
  // Path k (1-based): 10.77.k.1 on side a, 10.77.k.2 on side b.
  static std::string Address(char side, size_t k) {
    return absl::StrCat("10.77.", k, ".", side == 'a' ? 1 : 2);
  }

 private:
  Bed(std::string script, std::string name, size_t paths)
      : script_(std::move(script)), name_(std::move(name)), paths_(paths) {}
  std::string script_, name_;
  size_t paths_;
};

// Runs fn() in a new thread that entered network namespace `ns` (sockets it creates live
// there; the rest of the process is unaffected).
template <typename F>
absl::Status InNetns(const std::string& ns, F&& fn) {
  absl::Status result;
  std::thread t([&] {
    const std::string path = "/var/run/netns/" + ns;
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      result = absl::UnavailableError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
      return;
    }
    if (setns(fd, CLONE_NEWNET) != 0) {
      result = absl::UnavailableError(absl::StrCat("setns ", ns, ": ", std::strerror(errno)));
      close(fd);
      return;
    }
    close(fd);
    result = fn();
  });
  t.join();
  return result;
}

// Why a bed cannot be built here (not root, or namespaces unavailable); "" when it can.
inline std::string WhyNoBed() {
  if (geteuid() != 0) return "netns tests need root (CAP_NET_ADMIN) to create namespaces";
  const std::string probe = absl::StrCat("plexus-probe-", getpid());
  if (!RunCommand({"ip", "netns", "add", probe}, true).ok()) return "'ip netns add' failed";
  (void)RunCommand({"ip", "netns", "del", probe}, true);
  return "";
}

}  // namespace plexus::netbed
