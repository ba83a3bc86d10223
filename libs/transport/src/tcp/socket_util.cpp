#include "tcp/socket_util.hpp"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace plexus::transport::internal::tcp {

absl::StatusOr<sockaddr_in> ResolveAddress(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("tcp address '", std::string(address), "' is not of the form host:port"));
  }
  const std::string host(address.substr(0, colon));
  uint32_t port = 0;
  if (!absl::SimpleAtoi(std::string(address.substr(colon + 1)), &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("tcp address '", std::string(address), "' has an invalid port"));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "*") {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    return addr;
  }
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc != 0 || result == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot resolve host '", host, "': ", gai_strerror(rc)));
  }
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(result->ai_addr)->sin_addr;
  freeaddrinfo(result);
  return addr;
}

std::string FormatAddress(const sockaddr_in& addr) {
  char ip[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
  return absl::StrCat(ip, ":", ntohs(addr.sin_port));
}

absl::Status ErrnoStatus(int err, std::string_view what) {
  const std::string msg = absl::StrCat(std::string(what), ": ", std::strerror(err));
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
      return absl::FailedPreconditionError(msg);
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status SetNonBlocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0) return ErrnoStatus(errno, "fcntl(F_GETFL)");
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) < 0) return ErrnoStatus(errno, "fcntl(F_SETFL)");
  return absl::OkStatus();
}

namespace {
absl::Status PollFor(int fd, short events, absl::Time deadline, std::string_view what) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(std::string(what), ": timed out"));
    }
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
    const int rc = poll(&p, 1, ms);
    if (rc < 0 && errno != EINTR) return ErrnoStatus(errno, what);
    if (rc > 0) return absl::OkStatus();
  }
}
}  // namespace

absl::Status WriteFully(int fd, const void* data, size_t n, absl::Time deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = PollFor(fd, POLLOUT, deadline, "tcp send"); !s.ok()) return s;
    } else if (w < 0 && errno != EINTR) {
      return ErrnoStatus(errno, "tcp send");
    }
  }
  return absl::OkStatus();
}

absl::Status ReadFully(int fd, void* data, size_t n, absl::Time deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      return absl::UnavailableError("tcp peer closed the connection during the handshake");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status s = PollFor(fd, POLLIN, deadline, "tcp handshake"); !s.ok()) return s;
    } else if (errno != EINTR) {
      return ErrnoStatus(errno, "tcp recv");
    }
  }
  return absl::OkStatus();
}

}  // namespace plexus::transport::internal::tcp
