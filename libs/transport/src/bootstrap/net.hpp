// Small socket helpers of the bootstrap layer: address parsing and deadline-bounded I/O.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace plexus::transport::bootstrap {

struct HostPort {
  std::string host;  // without brackets; empty means every interface
  uint16_t port = 0;
};
// Parses "host:port", "[v6]:port" or ":port"; `what` names the setting in errors.
absl::StatusOr<HostPort> ParseHostPort(std::string_view address, std::string_view what);

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
};
// Resolves host (numeric or a name) to its addresses, IPv4 first.
absl::StatusOr<std::vector<SocketAddress>> Resolve(const HostPort& hp);
std::string FormatAddress(const SocketAddress& address);  // "ip:port" or "[ip]:port"

// Whether `host` names this machine (loopback, one of its interface addresses, or its host name).
bool IsLocalHost(const std::string& host);

// A non-blocking, close-on-exec TCP connection to `address`, established within `deadline`.
// The error keeps the errno text; *retryable says whether trying again later may succeed.
absl::StatusOr<int> ConnectTcp(const SocketAddress& address, absl::Time deadline, bool* retryable);

// Send or receive exactly `size` bytes on a non-blocking socket before `deadline`.
// DeadlineExceeded on timeout, Unavailable when the peer closed or reset the connection.
absl::Status SendAll(int fd, const void* data, size_t size, absl::Time deadline);
absl::Status RecvAll(int fd, void* data, size_t size, absl::Time deadline);

// Milliseconds to pass to poll() for `deadline` (-1 for infinite), capped at `cap_ms`.
int PollTimeoutMs(absl::Time deadline, int cap_ms = 1 << 30);

std::string ErrnoText(int err);

}  // namespace plexus::transport::bootstrap
