// Loopback plumbing of tests: a TCP store that threads playing ranks share, raw TCP connections
// to a server under test, and bounded waits. Catch2 assertions, so main-thread use only.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "plexus/base/net.hpp"
#include "plexus/transport/store.hpp"

namespace plexus::testing {

inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Polls `pred` every 2 ms; false when it is still false after `limit`.
inline bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// A TCP store server on 127.0.0.1 and one client of it, shared by threads that play ranks.
struct LoopbackStore {
  std::unique_ptr<transport::TcpStoreServer> server;
  std::shared_ptr<transport::Store> store;
};
inline LoopbackStore StartLoopbackStore() {
  LoopbackStore out;
  auto server = transport::TcpStoreServer::Start("127.0.0.1:0");
  REQUIRE(server.ok());
  out.server = *std::move(server);
  auto store = transport::TcpStore::Connect("127.0.0.1:" + std::to_string(out.server->port()),
                                            absl::Seconds(10));
  REQUIRE(store.ok());
  out.store = *std::move(store);
  return out;
}

// "127.0.0.1:<port>" of a store server listening on loopback.
inline std::string Loopback(const transport::TcpStoreServer& server) {
  return "127.0.0.1:" + std::to_string(server.port());
}

// A plain TCP connection to 127.0.0.1:port (non-blocking), for speaking raw bytes to a server.
inline int RawConnect(uint16_t port) {
  bool retryable = false;
  auto sa = base::net::Resolve({"127.0.0.1", port});
  REQUIRE(sa.ok());
  auto fd = base::net::ConnectTcp(sa->front(), absl::Now() + absl::Seconds(5), &retryable);
  REQUIRE(fd.ok());
  return *fd;
}

// Everything the server sends until it closes `fd` (or resets it); nullopt when it is still open
// at `timeout`.
inline std::optional<std::string> ReadUntilClosed(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string got;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return got;
    got.append(buf, static_cast<size_t>(n));
  }
  return std::nullopt;
}

}  // namespace plexus::testing
