// Peer death by a killed process: a server in a child process (forked before this process starts
// any thread) holds every call; the client's outstanding calls must fail with UNAVAILABLE naming
// the peer within their deadline after `kill -9` of that PID, and new calls fail at once.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "holding_service.hpp"
#include "kinds.plexus.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/server.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Empty;
using plexus::rpctest::Inner;
using plexus::rpctest::Kinds;

namespace {

using HoldingImpl = plexus::rpctest::HoldingService;

// The child: serves on tcp 127.0.0.1, writes its address to `fd`, and waits to be killed.
[[noreturn]] void ServeAndWait(int fd) {
  auto device = pt::Device::Create({.backend = pt::Backend::kTcp, .local_address = "127.0.0.1"});
  if (!device.ok()) std::_Exit(3);
  auto server = pr::Server::Create(*device, {});
  HoldingImpl impl;
  if (!server.ok() || !(*server)->Register(&impl).ok() || !(*server)->Start().ok()) std::_Exit(4);
  const std::string address = (*server)->address() + "\n";
  if (write(fd, address.data(), address.size()) != static_cast<ssize_t>(address.size())) {
    std::_Exit(5);
  }
  close(fd);
  // Bounded: the parent kills this process long before.
  for (int i = 0; i < 600; ++i) sleep(1);
  std::_Exit(6);
}

}  // namespace

TEST_CASE("peer death: a killed server process fails outstanding calls with UNAVAILABLE",
          "[rpc][death]") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    ServeAndWait(fds[1]);
  }
  close(fds[1]);
  std::string address;
  char c;
  while (read(fds[0], &c, 1) == 1 && c != '\n') address.push_back(c);
  close(fds[0]);
  REQUIRE(!address.empty());

  auto device = pt::Device::Create({.backend = pt::Backend::kTcp, .local_address = "127.0.0.1"});
  REQUIRE(device.ok());
  auto channel = pr::Channel::Connect(*device, address, {&Kinds::Descriptor()});
  REQUIRE(channel.ok());
  Kinds::Stub stub(*channel);
  const absl::Duration deadline = absl::Seconds(5);
  std::vector<Inner> reqs(4);
  std::vector<pr::PendingCall<Inner>> calls;
  for (auto& r : reqs) calls.push_back(stub.Hold(r, {.timeout = deadline}));
  AllKinds echo;
  REQUIRE(stub.EchoSync(echo, {.timeout = deadline}).ok());  // the held calls reached the server

  const absl::Time killed = absl::Now();
  REQUIRE(kill(pid, SIGKILL) == 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  for (auto& call : calls) {
    auto r = call.Get();
    CHECK(r.status().code() == absl::StatusCode::kUnavailable);
    CHECK(std::string(r.status().message()).find(address) != std::string::npos);
  }
  const absl::Duration took = absl::Now() - killed;
  INFO("failed after " << absl::FormatDuration(took));
  CHECK(took < deadline);
  auto after = stub.EchoSync(echo, {.timeout = deadline});
  CHECK(after.status().code() == absl::StatusCode::kUnavailable);
}
