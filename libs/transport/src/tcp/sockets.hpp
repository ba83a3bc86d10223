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

// The options.sockets_per_connection sockets of a new connection to `address`, connected and
// greeted within options.connect_timeout, from options.local_address when set. The caller owns
// them.
absl::StatusOr<std::vector<int>> DialConnection(std::string_view address,
                                                const DeviceOptions& options);

}  // namespace plexus::transport::internal::tcp
