#include "tcp/sockets.hpp"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "tcp/frame.hpp"

namespace plexus::transport::internal::tcp {

namespace net = base::net;

namespace {

// DeviceOptions::local_address without the brackets an IPv6 literal may come in.
std::string LocalHost(const std::string& local_address) {
  if (local_address.size() > 2 && local_address.front() == '[' && local_address.back() == ']') {
    return local_address.substr(1, local_address.size() - 2);
  }
  return local_address;
}

// The address outgoing sockets to `target` bind to: local_address, in target's family.
absl::StatusOr<net::SocketAddress> LocalBinding(const DeviceOptions& options,
                                                const net::SocketAddress& target,
                                                const std::string& where) {
  PLEXUS_ASSIGN_OR_RETURN(const std::vector<net::SocketAddress> all,
                          net::Resolve(net::HostPort{LocalHost(options.local_address), 0}));
  for (const net::SocketAddress& a : all) {
    if (a.family() == target.family()) return a;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("tcp local_address ", options.local_address, " has no ",
                   target.family() == AF_INET6 ? "IPv6" : "IPv4", " address to reach ", where));
}

}  // namespace

absl::StatusOr<ListeningSocket> OpenListeningSocket(std::string_view address,
                                                    const DeviceOptions& options) {
  std::string where(address);
  if (where.empty()) {
    where = net::JoinHostPort(
        options.local_address.empty() ? "0.0.0.0" : LocalHost(options.local_address), 0);
  }
  PLEXUS_ASSIGN_OR_RETURN(net::HostPort hp, net::ParseHostPort(where, "tcp listen address"));
  if (hp.host == "*") hp.host.clear();
  PLEXUS_ASSIGN_OR_RETURN(const std::vector<net::SocketAddress> all, net::Resolve(hp));
  const net::SocketAddress& addr = all.front();
  const int fd = socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return net::ErrnoStatus(errno, absl::StrCat("tcp socket for ", where));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, addr.get(), addr.length) < 0) {
    const int err = errno;
    close(fd);
    return net::ErrnoStatus(err, absl::StrCat("tcp bind to ", where));
  }
  if (listen(fd, 512) < 0) {
    const int err = errno;
    close(fd);
    return net::ErrnoStatus(err, absl::StrCat("tcp listen on ", where));
  }
  absl::StatusOr<net::SocketAddress> bound = net::LocalAddress(fd);
  if (!bound.ok()) {
    close(fd);
    return bound.status();
  }
  // A wildcard listener is reached through loopback from this host.
  if (bound->family() == AF_INET) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&bound->storage);
    if (sin->sin_addr.s_addr == htonl(INADDR_ANY)) sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else if (bound->family() == AF_INET6) {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&bound->storage);
    if (IN6_IS_ADDR_UNSPECIFIED(&sin6->sin6_addr)) sin6->sin6_addr = in6addr_loopback;
  }
  return ListeningSocket{fd, net::FormatAddress(*bound)};
}

absl::StatusOr<std::vector<int>> DialConnection(std::string_view address,
                                                const DeviceOptions& options) {
  const std::string where(address);
  PLEXUS_ASSIGN_OR_RETURN(const net::SocketAddress addr, net::ResolveFirst(address, "tcp address"));
  std::optional<net::SocketAddress> local;
  if (!options.local_address.empty()) {
    PLEXUS_ASSIGN_OR_RETURN(local, LocalBinding(options, addr, where));
  }
  const int count = options.tcp.sockets_per_connection;
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  static thread_local absl::BitGen gen;
  Hello hello;
  hello.socket_count = static_cast<uint16_t>(count);
  hello.token = absl::Uniform<uint64_t>(gen);
  std::vector<int> fds;
  auto fail = [&](absl::Status s) {
    for (int fd : fds) close(fd);
    return s;
  };
  for (int i = 0; i < count; ++i) {
    const int fd = socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return fail(net::ErrnoStatus(errno, "tcp socket"));
    fds.push_back(fd);
    if (local.has_value() && bind(fd, local->get(), local->length) < 0) {
      return fail(net::ErrnoStatus(
          errno, absl::StrCat("tcp bind to local address ", options.local_address)));
    }
    if (connect(fd, addr.get(), addr.length) < 0 && errno != EINPROGRESS) {
      return fail(net::ErrnoStatus(errno, absl::StrCat("tcp connect to ", where)));
    }
    for (;;) {
      if (absl::Now() >= deadline) {
        return fail(absl::DeadlineExceededError(
            absl::StrCat("tcp connect to ", where, ": no answer within ",
                         absl::FormatDuration(options.connect_timeout))));
      }
      pollfd p{fd, POLLOUT, 0};
      const int rc = poll(&p, 1, net::PollTimeoutMs(deadline));
      if (rc > 0) break;
      if (rc < 0 && errno != EINTR) return fail(net::ErrnoStatus(errno, "poll"));
    }
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return fail(net::ErrnoStatus(err, absl::StrCat("tcp connect to ", where)));
    hello.socket_index = static_cast<uint16_t>(i);
    uint8_t bytes[kHelloSize];
    EncodeHello(hello, bytes);
    if (absl::Status s = net::SendAll(fd, bytes, sizeof bytes, deadline); !s.ok()) {
      return fail(base::Annotate(s, absl::StrCat("tcp hello to ", where)));
    }
  }
  return fds;
}

namespace {

bool IsLoopbackAddress(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr) >> 24) == 127;
  }
  if (a.ss_family != AF_INET6) return false;
  const in6_addr& ip = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(&ip) || (IN6_IS_ADDR_V4MAPPED(&ip) && ip.s6_addr[12] == 127);
}

bool SameHostAddress(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in&>(b).sin_addr.s_addr;
  }
  if (a.ss_family != AF_INET6) return false;
  return IN6_ARE_ADDR_EQUAL(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr,
                            &reinterpret_cast<const sockaddr_in6&>(b).sin6_addr);
}

}  // namespace

bool IsLoopbackPath(int fd) {
  sockaddr_storage peer{}, self{};
  socklen_t peer_length = sizeof peer, self_length = sizeof self;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_length) != 0) {
    return false;
  }
  return IsLoopbackAddress(peer) || SameHostAddress(peer, self);
}

absl::Status SetCongestionControl(int fd, const std::string& algorithm, std::string_view peer) {
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, algorithm.data(),
                 static_cast<socklen_t>(algorithm.size())) == 0) {
    return absl::OkStatus();
  }
  const int err = errno;
  return absl::InvalidArgumentError(absl::StrCat(
      "tcp connection to ", std::string(peer), ": DeviceOptions::tcp.loopback_congestion_control '",
      algorithm, "' was refused (", net::ErrnoText(err),
      "): name one in net.ipv4.tcp_allowed_congestion_control (or "
      "net.ipv4.tcp_available_congestion_control with CAP_NET_ADMIN), or \"\" for the "
      "system's"));
}

}  // namespace plexus::transport::internal::tcp
