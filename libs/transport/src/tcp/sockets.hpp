// Opening the sockets of tcp connections, apart from the epoll core (tcp/core.cpp): the
// listening socket, and the connecting half (bind to local_address, connect within
// connect_timeout, one hello per socket so that the listener groups them: tcp/listener.hpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/transport/device.hpp"

namespace plexus::transport::internal::tcp {

struct ListeningSocket {
  int fd = -1;          // non-blocking; the caller owns it
  std::string address;  // where clients reach it: a wildcard address is reported as loopback
};
// `address` is "ip:port", "[ipv6]:port" or a name ("*" for the host: every interface); ""
// listens on options.local_address (or every IPv4 interface) at an ephemeral port.
absl::StatusOr<ListeningSocket> OpenListeningSocket(std::string_view address,
                                                    const DeviceOptions& options);

// The options.tcp.sockets_per_connection sockets of a new connection to `address`, connected and
// greeted within options.connect_timeout, from options.local_address when set. The caller owns
// them.
absl::StatusOr<std::vector<int>> DialConnection(std::string_view address,
                                                const DeviceOptions& options);

// Whether both ends of the connected socket `fd` are on this host, so that its traffic takes
// the loopback device: the peer's address is a loopback one (127.0.0.0/8, ::1, an IPv4-mapped
// 127.x) or the socket's own. False when either address cannot be read.
bool IsLoopbackPath(int fd);

// Sets the socket's congestion control (TCP_CONGESTION) to `algorithm`; InvalidArgument naming
// it, `peer` and the sysctl that lists what may be chosen when the kernel refuses.
absl::Status SetCongestionControl(int fd, const std::string& algorithm, std::string_view peer);

}  // namespace plexus::transport::internal::tcp
