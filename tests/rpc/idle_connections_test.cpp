// Many clients that finish the handshake and then send nothing: the server (a child process,
// forked before this process starts any thread) must keep each of them cheap, and closing them
// all at once must not stall another client's calls. Prints the server's resident memory per
// idle connection and the slowest call while they close (PLEXUS_TEST_IDLE_CONNECTIONS: how many,
// default 1000).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "holding_service.hpp"
#include "kinds.plexus.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/server.hpp"
#include "raw_client.hpp"
#include "support/process_stats.hpp"
#include "support/skip.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Kinds;

namespace {

// The child: serves up to `connections` on tcp 127.0.0.1, writes its address to `out`, and exits
// when `in` closes.
[[noreturn]] void ServeUntilClosed(int out, int in, size_t connections) {
  auto device = pt::Device::Create({.backend = pt::Backend::kTcp, .local_address = "127.0.0.1"});
  if (!device.ok()) std::_Exit(3);
  pr::ServerOptions options;
  options.max_connections = connections;
  auto server = pr::Server::Create(*device, options);
  plexus::rpctest::HoldingService impl;
  if (!server.ok() || !(*server)->Register(&impl).ok() || !(*server)->Start().ok()) std::_Exit(4);
  const std::string address = (*server)->address() + "\n";
  if (write(out, address.data(), address.size()) != static_cast<ssize_t>(address.size())) {
    std::_Exit(5);
  }
  close(out);
  char byte;
  while (read(in, &byte, 1) > 0) {
  }
  std::_Exit(0);  // the test measured what it wanted: no orderly shutdown of thousands
}

size_t IdleConnections() {
  const char* v = std::getenv("PLEXUS_TEST_IDLE_CONNECTIONS");
  return v != nullptr && std::atoi(v) > 0 ? static_cast<size_t>(std::atoi(v)) : 1000;
}

}  // namespace

TEST_CASE("idle handshaken connections cost the server little, and closing them stalls no call",
          "[rpc][idle]") {
  const size_t n = IdleConnections();
  int to_parent[2], to_child[2];
  REQUIRE(pipe(to_parent) == 0);
  REQUIRE(pipe(to_child) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(to_parent[0]);
    close(to_child[1]);
    ServeUntilClosed(to_parent[1], to_child[0], n + 1);
  }
  close(to_parent[1]);
  close(to_child[0]);
  struct Reap {
    pid_t pid;
    int fd;
    ~Reap() {
      close(fd);
      int status = 0;
      waitpid(pid, &status, 0);
    }
  } reap{pid, to_child[1]};
  std::string address;
  char c;
  while (read(to_parent[0], &c, 1) == 1 && c != '\n') address.push_back(c);
  close(to_parent[0]);
  REQUIRE(!address.empty());

  auto device = pt::Device::Create({.backend = pt::Backend::kTcp, .local_address = "127.0.0.1"});
  REQUIRE(device.ok());
  // One well-behaved client first: its connection is part of the baseline.
  auto channel = pr::Channel::Connect(*device, address, {&Kinds::Descriptor()});
  REQUIRE(channel.ok());
  Kinds::Stub stub(*channel);
  AllKinds req;
  for (int i = 0; i < 100; ++i) REQUIRE(stub.EchoSync(req, {.timeout = absl::Seconds(5)}).ok());
  absl::SleepFor(absl::Milliseconds(200));
  const int64_t before = plexus::testing::ProcStatusBytes("VmRSS", pid);
  REQUIRE(before > 0);

  auto cq = (*device)->CreateCompletionQueue();
  std::vector<std::unique_ptr<pt::Connection>> idle;
  std::vector<std::vector<uint8_t>> acks(n);
  for (size_t i = 0; i < n; ++i) {
    auto conn = (*device)->Connect(address, cq.get());
    REQUIRE(conn.ok());
    const absl::Status st = plexus::rpctest::RawHandshake(**conn, *cq, acks[i]);
    INFO("connection " << i << ": " << st);
    REQUIRE(st.ok());
    idle.push_back(std::move(*conn));
  }
  absl::SleepFor(absl::Milliseconds(200));
  const int64_t after = plexus::testing::ProcStatusBytes("VmRSS", pid);
  const double per_connection = static_cast<double>(after - before) / static_cast<double>(n);
  std::printf("server RSS: %.1f MiB before, %.1f MiB with %zu idle connections: %.1f KiB each\n",
              static_cast<double>(before) / (1 << 20), static_cast<double>(after) / (1 << 20), n,
              per_connection / 1024);
  CHECK(per_connection < 64 * 1024);

  // The well-behaved client calls in a loop for a second, once as a baseline and once while every
  // idle connection closes. The bound is on what the closing adds to the slowest call: on a loaded
  // two-CPU machine the baseline's slowest call alone can take a scheduler's quantum or more.
  int failed = 0, calls = 0;
  auto call_for = [&](absl::Duration window, const std::function<void()>& meanwhile) {
    std::atomic<bool> done{false};
    absl::Duration slowest;
    std::thread caller([&] {
      while (!done.load()) {
        const absl::Time t0 = absl::Now();
        if (!stub.EchoSync(req, {.timeout = absl::Seconds(5)}).ok()) ++failed;
        slowest = std::max(slowest, absl::Now() - t0);
        ++calls;
      }
    });
    absl::SleepFor(absl::Milliseconds(100));
    meanwhile();
    absl::SleepFor(window);
    done = true;
    caller.join();
    return slowest;
  };
  const absl::Duration baseline = call_for(absl::Seconds(1), [] {});
  const absl::Duration slowest = call_for(absl::Seconds(1), [&] {
    for (auto& conn : idle) conn->Close();
  });
  std::printf(
      "slowest of %d calls: %s with no connection closing, %s while %zu connections closed\n",
      calls, absl::FormatDuration(baseline).c_str(), absl::FormatDuration(slowest).c_str(), n);
  CHECK(failed == 0);
  CHECK(slowest < baseline + absl::Milliseconds(200) * plexus::testing::kSanitizerSlowdown);
}
