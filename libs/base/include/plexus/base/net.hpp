// Socket helpers shared by the bootstrap store, the tcp backend and the launchers: "host:port"
// parsing (IPv4, IPv6 in brackets, names), resolution, formatting, errno as a status, and
// deadline-bounded connect / send / receive on non-blocking sockets.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace plexus::base::net {

struct HostPort {
  std::string host;  // without brackets; empty means every interface
  uint16_t port = 0;
};
// Parses "host:port", "[v6]:port" or ":port"; `what` names the setting in errors.
absl::StatusOr<HostPort> ParseHostPort(std::string_view address, std::string_view what);
// "host:port", or "[host]:port" when host is an IPv6 literal (the inverse of ParseHostPort).
std::string JoinHostPort(std::string_view host, uint16_t port);
// Whether `host` is a numeric IPv4 or IPv6 address ("10.0.0.1", "fd00::2"; no brackets, no name).
bool IsIpLiteral(std::string_view host);

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};
// Resolves host (numeric or a name) to its addresses, IPv4 first.
absl::StatusOr<std::vector<SocketAddress>> Resolve(const HostPort& hp);
// ParseHostPort + Resolve: the first address of "host:port".
absl::StatusOr<SocketAddress> ResolveFirst(std::string_view address, std::string_view what);
// The address a socket is bound to (getsockname).
absl::StatusOr<SocketAddress> LocalAddress(int fd);
std::string FormatAddress(const SocketAddress& address);  // "ip:port" or "[ip]:port"

// Whether `host` names this machine (loopback, one of its interface addresses, or its host name).
bool IsLocalHost(const std::string& host);

// The addresses other hosts may reach this one at: every up, non-loopback interface's IPv4
// address, then its global IPv6 addresses (link-local ones need a scope and are left out), as
// numeric text without port or brackets; empty when the machine has none.
std::vector<std::string> InterfaceAddresses();

// A non-blocking, close-on-exec TCP connection to `address`, established within `deadline`.
// The error keeps the errno text; *retryable says whether trying again later may succeed.
absl::StatusOr<int> ConnectTcp(const SocketAddress& address, absl::Time deadline, bool* retryable);

// Send or receive exactly `size` bytes on a non-blocking socket before `deadline` (a blocking
// socket blocks in the call itself). DeadlineExceeded on timeout, Unavailable when the peer
// closed or reset the connection.
absl::Status SendAll(int fd, const void* data, size_t size, absl::Time deadline);
absl::Status RecvAll(int fd, void* data, size_t size, absl::Time deadline);
// Receives what has arrived, at least one byte and at most `size`, before `deadline`: the count,
// or the errors of RecvAll (for protocols whose messages do not announce their length up front).
absl::StatusOr<size_t> RecvSome(int fd, void* data, size_t size, absl::Time deadline);

// Idle connected sockets to one address, for clients that keep one request in flight per socket
// (the store clients): Take reuses an idle socket or connects a new one by `deadline`; Give
// takes back a socket whose exchange ended cleanly (the caller closes one that failed: a late
// answer must never be read as the next request's). Thread-safe.
class SocketPool {
 public:
  SocketPool() = default;
  explicit SocketPool(SocketAddress address) : address_(address) {}
  SocketPool(const SocketPool&) = delete;
  SocketPool& operator=(const SocketPool&) = delete;
  ~SocketPool();  // closes the idle sockets

  void set_address(const SocketAddress& address) { address_ = address; }
  const SocketAddress& address() const { return address_; }
  absl::StatusOr<int> Take(absl::Time deadline);
  void Give(int fd);

 private:
  SocketAddress address_;
  std::mutex mu_;
  std::vector<int> idle_;
};

absl::Status SetNonBlocking(int fd, bool on);

// Milliseconds to pass to poll() for `deadline` (-1 for infinite), capped at `cap_ms`.
int PollTimeoutMs(absl::Time deadline, int cap_ms = 1 << 30);

std::string ErrnoText(int err);
// errno as an actionable status (ECONNREFUSED -> Unavailable, EMFILE -> ResourceExhausted, ...),
// prefixed by what was being done.
absl::Status ErrnoStatus(int err, std::string_view what);

// A TCP port on 127.0.0.1 that was free a moment ago (bound, then released), for launchers that
// must name a store address before the store exists: a random one below the kernel's ephemeral
// range (which outgoing connections draw from), else one the kernel picks. Another process may
// still take it in between; the store's own bind reports that (FailedPrecondition, EADDRINUSE).
absl::StatusOr<uint16_t> ReserveLoopbackPort();

// The lowest port of the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range;
// 32768, Linux's default, where it cannot be read).
uint16_t EphemeralPortLow();

}  // namespace plexus::base::net
