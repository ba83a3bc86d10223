// 2 to 4 processes over shm and tcp: the correctness matrix, a rank killed with SIGKILL, and
// mismatched calls. Each rank is a collectives_peer process sharing a store served here.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "plexus/transport/device.hpp"
#include "plexus/transport/store.hpp"
#include "support/skip.hpp"

extern char** environ;
namespace pt = plexus::transport;

namespace {

struct Outcome {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;
};

// Starts `size` peers and waits for all of them (killing them after `limit`).
std::vector<Outcome> RunPeers(int size, const std::string& backend, const std::string& mode,
                              int victim = -1,
                              std::chrono::seconds limit = std::chrono::seconds(120)) {
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0");
  REQUIRE(server.ok());
  const std::string store = "127.0.0.1:" + std::to_string((*server)->port());
  std::vector<pid_t> pids(size);
  std::vector<std::string> logs(size);
  for (int r = 0; r < size; ++r) {
    logs[r] = "/tmp/plexus-coll-peer-" + std::to_string(getpid()) + "-" + std::to_string(r);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, logs[r].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<std::string> args = {
        COLLECTIVES_PEER,      std::to_string(r), std::to_string(size), store, backend, mode,
        std::to_string(victim)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    REQUIRE(posix_spawn(&pids[r], argv[0], &fa, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
  }
  std::vector<Outcome> out(size);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (int r = 0; r < size; ++r) {
    int status = 0;
    for (;;) {
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    out[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::ifstream in(logs[r]);
    std::stringstream ss;
    ss << in.rdbuf();
    out[r].output = ss.str();
    unlink(logs[r].c_str());
  }
  return out;
}

std::vector<std::string> Backends() {
  std::vector<std::string> out;
  for (pt::Backend b : {pt::Backend::kShm, pt::Backend::kTcp}) {
    std::string why;
    if (pt::Device::Available(b, &why)) {
      out.emplace_back(pt::BackendName(b));
    } else {
      WARN("backend " << pt::BackendName(b) << " unavailable: " << why);
    }
  }
  if (out.empty()) plexus::testing::SkipTest("neither shm nor tcp is available here");
  return out;
}

}  // namespace

TEST_CASE("processes: every collective matches the reference over shm and tcp",
          "[collectives][process]") {
  for (const std::string& backend : Backends()) {
    for (int n : {2, 3, 4}) {
      // The full matrix on 3 ranks (odd world: folded halving-doubling, uneven trees); 2 and 4
      // ranks run it over one backend each to bound the test's time on a 2-core machine.
      if (n != 3 && (n == 2) != (backend == "shm")) continue;
      auto out = RunPeers(n, backend, "suite");
      for (int r = 0; r < n; ++r) {
        INFO(backend << " n=" << n << " rank " << r << ": " << out[r].output);
        CHECK(out[r].exit_code == 0);
        CHECK(out[r].output.find("calls correct") != std::string::npos);
      }
    }
  }
}

TEST_CASE("processes: a killed rank makes every peer fail naming it, within the timeout",
          "[collectives][process]") {
  for (const std::string& backend : Backends()) {
    // kill-small: 8-byte calls, which take the mailbox path on shm.
    for (const std::string mode : {"kill", "kill-small"}) {
      const int n = 4, victim = 2;
      const auto start = std::chrono::steady_clock::now();
      auto out = RunPeers(n, backend, mode, victim, std::chrono::seconds(60));
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      CHECK(out[victim].exit_code == 128 + SIGKILL);
      for (int r = 0; r < n; ++r) {
        if (r == victim) continue;
        INFO(backend << " " << mode << " rank " << r << ": " << out[r].output);
        CHECK(out[r].exit_code == 0);
      }
      CHECK(seconds < 40);  // bounded by the 5 s communicator timeout plus start-up, not a hang
    }
  }
}

TEST_CASE("processes: mismatched counts are reported", "[collectives][process]") {
  for (const std::string& backend : Backends()) {
    for (const std::string mode : {"mismatch", "mismatch-mixed"}) {
      auto out = RunPeers(3, backend, mode, -1, std::chrono::seconds(60));
      bool named = false;
      for (int r = 0; r < 3; ++r) {
        INFO(backend << " " << mode << " rank " << r << ": " << out[r].output);
        CHECK(out[r].exit_code == 0);
        named = named || out[r].output.find("mismatched") != std::string::npos ||
                out[r].output.find("do not match") != std::string::npos;
      }
      CHECK(named);
    }
  }
}
