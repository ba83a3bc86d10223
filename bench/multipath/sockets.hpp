// Plain TCP / MPTCP sockets between the two sides of a netbed, for the benchmark's references
// (single-path TCP, K streams, kernel MPTCP): bound to a path's address so routing picks the path.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace plexus::mpbench {

#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif

inline absl::StatusOr<int> ListenOn(const std::string& ip, int protocol, int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, protocol);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 16) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("bind/listen ", ip, ": ", std::strerror(errno)));
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

inline absl::StatusOr<int> ConnectFrom(const std::string& from, const std::string& to, int port,
                                       int protocol) {
  const int fd = socket(AF_INET, SOCK_STREAM, protocol);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in l{}, r{};
  l.sin_family = r.sin_family = AF_INET;
  inet_pton(AF_INET, from.c_str(), &l.sin_addr);
  inet_pton(AF_INET, to.c_str(), &r.sin_addr);
  r.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&l), sizeof l) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&r), sizeof r) != 0) {
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("connect ", from, " -> ", to, ":", port, ": ", std::strerror(errno)));
  }
  return fd;
}

}  // namespace plexus::mpbench
