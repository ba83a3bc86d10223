#include "raw_tcp.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace plexus::bench {
namespace {
absl::Status Errno(const char* what) {
  return absl::UnavailableError(absl::StrCat("raw tcp ", what, ": ", std::strerror(errno)));
}
void NoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}
}  // namespace

absl::StatusOr<int> TcpListenLoopback(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Errno("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 16) != 0) {
    absl::Status s = Errno("bind/listen on 127.0.0.1");
    close(fd);
    return s;
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

absl::StatusOr<int> TcpAccept(int listen_fd) {
  const int fd = accept(listen_fd, nullptr, nullptr);
  if (fd < 0) return Errno("accept");
  NoDelay(fd);
  return fd;
}

absl::StatusOr<int> TcpConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Errno("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    absl::Status s = Errno(absl::StrCat("connect to 127.0.0.1:", port).c_str());
    close(fd);
    return s;
  }
  NoDelay(fd);
  return fd;
}

ssize_t RecvAfterSpin(int fd, void* data, size_t len, absl::Duration spin) {
  if (spin > absl::ZeroDuration()) {
    const absl::Time until = absl::Now() + spin;
    do {
      const ssize_t r = recv(fd, data, len, MSG_DONTWAIT);
      if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return r;
    } while (absl::Now() < until);
  }
  return recv(fd, data, len, 0);
}

absl::Status ReadFull(int fd, void* data, size_t n, absl::Duration spin) {
  auto* b = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = RecvAfterSpin(fd, b, n, spin);
    if (r == 0) return absl::UnavailableError("raw tcp read: the peer closed the connection");
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("read");
    }
    b += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

absl::Status WriteFull(int fd, const void* data, size_t n) {
  const auto* b = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = write(fd, b, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("write");
    }
    b += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

void PinToCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (cpu < 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i) CPU_SET(i, &set);
  } else {
    CPU_SET(cpu % std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))), &set);
  }
  sched_setaffinity(0, sizeof set, &set);
}

}  // namespace plexus::bench
