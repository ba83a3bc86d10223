#include "plexus/base/net.hpp"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "plexus/base/file.hpp"

namespace plexus::base::net {

std::string ErrnoText(int err) {
  char buf[256];
  return std::string(strerror_r(err, buf, sizeof buf));
}

absl::Status ErrnoStatus(int err, std::string_view what) {
  const std::string msg = absl::StrCat(std::string(what), ": ", ErrnoText(err));
  switch (err) {
    case ECONNREFUSED:
      return absl::UnavailableError(absl::StrCat(msg, " (nothing listening at that address?)"));
    case ETIMEDOUT:
      return absl::DeadlineExceededError(msg);
    case ECONNRESET:
    case EPIPE:
    case ENETUNREACH:
    case EHOSTUNREACH:
      return absl::UnavailableError(msg);
    case EADDRINUSE:
    case EADDRNOTAVAIL:
    case EAFNOSUPPORT:
      return absl::FailedPreconditionError(msg);
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case ENOBUFS:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::StatusOr<HostPort> ParseHostPort(std::string_view address, std::string_view what) {
  const std::string text(address);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " '", text,
                                                   "' is not a valid address: ", why,
                                                   " (expected host:port, e.g. 10.0.0.1:29500)"));
  };
  HostPort hp;
  std::string port_text;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return bad("an IPv6 address needs the form [addr]:port");
    }
    hp.host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) return bad("no ':port'");
    hp.host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    if (hp.host.find(':') != std::string::npos) return bad("IPv6 addresses need brackets");
  }
  uint32_t port = 0;
  if (port_text.empty() || !absl::SimpleAtoi(port_text, &port) || port > 65535 ||
      port_text.find_first_not_of("0123456789") != std::string::npos) {
    return bad(absl::StrCat("port '", port_text, "' is not a number in 0..65535"));
  }
  hp.port = static_cast<uint16_t>(port);
  return hp;
}

std::string JoinHostPort(std::string_view host, uint16_t port) {
  if (host.find(':') != std::string_view::npos)
    return absl::StrCat("[", std::string(host), "]:", port);
  return absl::StrCat(std::string(host), ":", port);
}

bool IsIpLiteral(std::string_view host) {
  const std::string text(host);
  in6_addr storage;  // large enough for either family
  return inet_pton(AF_INET, text.c_str(), &storage) == 1 ||
         inet_pton(AF_INET6, text.c_str(), &storage) == 1;
}

absl::StatusOr<std::vector<SocketAddress>> Resolve(const HostPort& hp) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = hp.host.empty() ? AI_PASSIVE : 0;
  addrinfo* list = nullptr;
  const std::string port = std::to_string(hp.port);
  const int rc =
      getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(), port.c_str(), &hints, &list);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve host '", hp.host, "': ", gai_strerror(rc)));
  }
  std::vector<SocketAddress> out;
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    SocketAddress a;
    std::memcpy(&a.storage, ai->ai_addr, ai->ai_addrlen);
    a.length = ai->ai_addrlen;
    out.push_back(a);
  }
  freeaddrinfo(list);
  std::stable_sort(out.begin(), out.end(), [](const SocketAddress& x, const SocketAddress& y) {
    return x.storage.ss_family == AF_INET && y.storage.ss_family != AF_INET;
  });
  if (out.empty()) {
    return absl::UnavailableError(absl::StrCat("host '", hp.host, "' has no address"));
  }
  return out;
}

absl::StatusOr<SocketAddress> ResolveFirst(std::string_view address, std::string_view what) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address, what);
  if (!hp.ok()) return hp.status();
  absl::StatusOr<std::vector<SocketAddress>> all = Resolve(*hp);
  if (!all.ok()) {
    return absl::Status(all.status().code(),
                        absl::StrCat(std::string(what), " '", std::string(address),
                                     "': ", std::string(all.status().message())));
  }
  return all->front();
}

absl::StatusOr<SocketAddress> LocalAddress(int fd) {
  SocketAddress a;
  a.length = sizeof a.storage;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.length) != 0) {
    return ErrnoStatus(errno, "getsockname");
  }
  return a;
}

std::string FormatAddress(const SocketAddress& address) {
  char ip[INET6_ADDRSTRLEN] = {0};
  if (address.storage.ss_family == AF_INET) {
    const auto* sin = reinterpret_cast<const sockaddr_in*>(&address.storage);
    inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof ip);
    return absl::StrCat(ip, ":", ntohs(sin->sin_port));
  }
  const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(&address.storage);
  inet_ntop(AF_INET6, &sin6->sin6_addr, ip, sizeof ip);
  return absl::StrCat("[", ip, "]:", ntohs(sin6->sin6_port));
}

bool IsLocalHost(const std::string& host) {
  if (host.empty() || host == "localhost") return true;
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) == 0 && host == name) return true;
  auto resolved = Resolve(HostPort{host, 0});
  if (!resolved.ok()) return false;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) ifs = nullptr;
  bool local = false;
  for (const SocketAddress& a : *resolved) {
    if (a.storage.ss_family == AF_INET) {
      const in_addr ip = reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr;
      if ((ntohl(ip.s_addr) >> 24) == 127 || ip.s_addr == htonl(INADDR_ANY)) local = true;
      for (ifaddrs* i = ifs; i != nullptr && !local; i = i->ifa_next) {
        if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET &&
            reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == ip.s_addr) {
          local = true;
        }
      }
    } else if (a.storage.ss_family == AF_INET6) {
      const in6_addr ip = reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr;
      if (IN6_IS_ADDR_LOOPBACK(&ip) || IN6_IS_ADDR_UNSPECIFIED(&ip)) local = true;
      for (ifaddrs* i = ifs; i != nullptr && !local; i = i->ifa_next) {
        if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET6 &&
            std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr, &ip,
                        sizeof ip) == 0) {
          local = true;
        }
      }
    }
    if (local) break;
  }
  if (ifs != nullptr) freeifaddrs(ifs);
  return local;
}

std::vector<std::string> InterfaceAddresses() {
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return {};
  std::vector<std::string> v4;
  std::vector<std::string> v6;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0 ||
        (i->ifa_flags & IFF_LOOPBACK) != 0) {
      continue;
    }
    char ip[INET6_ADDRSTRLEN] = {0};
    if (i->ifa_addr->sa_family == AF_INET) {
      const auto* sin = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if ((ntohl(sin->sin_addr.s_addr) >> 24) == 127) continue;
      inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof ip);
      v4.emplace_back(ip);
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      if (IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr) || IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr)) {
        continue;
      }
      inet_ntop(AF_INET6, &sin6->sin6_addr, ip, sizeof ip);
      v6.emplace_back(ip);
    }
  }
  freeifaddrs(ifs);
  v4.insert(v4.end(), v6.begin(), v6.end());
  return v4;
}

int PollTimeoutMs(absl::Time deadline, int cap_ms) {
  if (deadline == absl::InfiniteFuture()) return cap_ms >= (1 << 30) ? -1 : cap_ms;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, cap_ms));
}

absl::StatusOr<int> ConnectTcp(const SocketAddress& address, absl::Time deadline, bool* retryable) {
  *retryable = true;
  const int fd = socket(address.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *retryable = false;
    return absl::ResourceExhaustedError(absl::StrCat("socket(): ", ErrnoText(errno)));
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  int err = 0;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int rc;
      do {
        rc = poll(&p, 1, PollTimeoutMs(deadline));
      } while (rc < 0 && errno == EINTR);
      if (rc == 0) {
        err = ETIMEDOUT;
      } else {
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
  }
  if (err != 0) {
    close(fd);
    *retryable = err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH ||
                 err == EHOSTUNREACH || err == ECONNRESET || err == EAGAIN || err == EINTR ||
                 err == ECONNABORTED;
    return absl::UnavailableError(ErrnoText(err));
  }
  return fd;
}

namespace {

// Waits until `fd` is ready for `events`; DeadlineExceeded when the deadline passes first.
absl::Status WaitReady(int fd, short events, absl::Time deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, PollTimeoutMs(deadline));
    if (rc > 0) return absl::OkStatus();
    if (rc == 0) return absl::DeadlineExceededError(absl::StrCat("timed out while ", what));
    if (errno != EINTR) return absl::InternalError(absl::StrCat("poll: ", ErrnoText(errno)));
  }
}

}  // namespace

absl::Status SetNonBlocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0) return ErrnoStatus(errno, "fcntl(F_GETFL)");
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) < 0) return ErrnoStatus(errno, "fcntl(F_SETFL)");
  return absl::OkStatus();
}

absl::Status SendAll(int fd, const void* data, size_t size, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = WaitReady(fd, POLLOUT, deadline, "sending"); !s.ok()) return s;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return absl::UnavailableError(absl::StrCat("send failed: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> RecvSome(int fd, void* data, size_t size, absl::Time deadline) {
  for (;;) {
    const ssize_t n = recv(fd, data, size, 0);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) return absl::UnavailableError("the peer closed the connection");
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status s = WaitReady(fd, POLLIN, deadline, "waiting for the reply"); !s.ok()) {
        return s;
      }
      continue;
    }
    if (errno == EINTR) continue;
    return absl::UnavailableError(absl::StrCat("receive failed: ", ErrnoText(errno)));
  }
}

SocketPool::~SocketPool() {
  for (int fd : idle_) close(fd);
}

absl::StatusOr<int> SocketPool::Take(absl::Time deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      const int fd = idle_.back();
      idle_.pop_back();
      return fd;
    }
  }
  bool retryable = false;
  return ConnectTcp(address_, deadline, &retryable);
}

void SocketPool::Give(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(fd);
}

absl::Status RecvAll(int fd, void* data, size_t size, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    absl::StatusOr<size_t> n = RecvSome(fd, p, size, deadline);
    if (!n.ok()) return n.status();
    p += *n;
    size -= *n;
  }
  return absl::OkStatus();
}

namespace {

// Binds a TCP socket to 127.0.0.1:`port` (0: the kernel picks) and releases it; the port bound,
// or 0 where the bind failed with `*err` set.
uint16_t TryBindLoopback(uint16_t port, int* err) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = errno;
    return 0;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  socklen_t len = sizeof addr;
  uint16_t bound = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    bound = ntohs(addr.sin_port);
  } else {
    *err = errno;
  }
  close(fd);
  return bound;
}

}  // namespace

uint16_t EphemeralPortLow() {
  constexpr uint16_t kLinuxDefault = 32768;
  absl::StatusOr<std::string> range = ReadFile("/proc/sys/net/ipv4/ip_local_port_range", 64);
  if (!range.ok()) return kLinuxDefault;
  std::vector<std::string> parts =
      absl::StrSplit(*range, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  uint32_t low = 0;
  if (parts.empty() || !absl::SimpleAtoi(parts[0], &low) || low == 0 || low > 65535) {
    return kLinuxDefault;
  }
  return static_cast<uint16_t>(low);
}

absl::StatusOr<uint16_t> ReserveLoopbackPort() {
  // Below the kernel's ephemeral range: a port bound to 0 comes from the range every outgoing
  // connect() draws from, so any process's next connection could take it before the store binds
  // it (seen as a failed CI run: "store server cannot listen ... Address already in use"). Below
  // the range only an explicit bind of the same port can, which a random choice makes unlikely.
  constexpr uint16_t kLowest = 10000;
  const uint16_t low = EphemeralPortLow();
  int err = 0;
  if (low > kLowest + 1000) {
    std::mt19937 random(std::random_device{}() ^ static_cast<uint32_t>(getpid()));
    std::uniform_int_distribution<int> pick(kLowest, low - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      if (const uint16_t port = TryBindLoopback(static_cast<uint16_t>(pick(random)), &err)) {
        return port;
      }
    }
  }
  if (const uint16_t port = TryBindLoopback(0, &err)) return port;
  return ErrnoStatus(err, "reserving a port on 127.0.0.1");
}

}  // namespace plexus::base::net
