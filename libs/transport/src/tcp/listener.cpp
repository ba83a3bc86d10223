#include "tcp/listener.hpp"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"

namespace plexus::transport::internal::tcp {

namespace net = base::net;

void CloseSocketGroup(SocketGroup& group) {
  for (int fd : group.fds) {
    if (fd >= 0) close(fd);
  }
  group.fds.clear();
}

HelloAcceptor::~HelloAcceptor() {
  close(fd_);
  for (Client& c : clients_) close(c.fd);
  for (auto& [token, group] : groups_) CloseSocketGroup(group);
  for (SocketGroup& group : ready_) CloseSocketGroup(group);
}

absl::StatusOr<SocketGroup> HelloAcceptor::Next(absl::Duration timeout) {
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  last_error_ = absl::OkStatus();
  for (;;) {
    const absl::Time now = absl::Now();
    Expire(now);
    if (!ready_.empty()) {
      SocketGroup group = std::move(ready_.front());
      ready_.pop_front();
      return group;
    }
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "tcp accept on ", address_, ": no connection within ", absl::FormatDuration(timeout),
          last_error_.ok() ? "" : absl::StrCat(" (last rejected: ", last_error_.ToString(), ")")));
    }
    // Sleep until a socket is readable, the caller's deadline, or the next expiry.
    absl::Time wake = deadline;
    std::vector<pollfd> pfds;
    pfds.reserve(clients_.size() + 1);
    pfds.push_back({fd_, POLLIN, 0});
    for (const Client& c : clients_) {
      pfds.push_back({c.fd, POLLIN, 0});
      wake = std::min(wake, c.deadline);
    }
    for (const auto& [token, group] : groups_) wake = std::min(wake, group.deadline);
    const int rc = poll(pfds.data(), pfds.size(), net::PollTimeoutMs(wake, 1000));
    if (rc < 0 && errno != EINTR) {
      return net::ErrnoStatus(errno, absl::StrCat("tcp accept on ", address_, ": poll"));
    }
    if (rc <= 0) continue;
    // Clients first (they are the pfds[1..] of this round), then new ones.
    for (size_t i = 1; i < pfds.size(); ++i) {
      if (pfds[i].revents != 0) ReadHello(clients_[i - 1]);
    }
    std::erase_if(clients_, [](const Client& c) { return c.fd < 0; });
    if (pfds[0].revents != 0) {
      PLEXUS_RETURN_IF_ERROR(AcceptPending());
    }
  }
}

void HelloAcceptor::Reject(Client& c, const absl::Status& why) {
  last_error_ = base::Annotate(why, absl::StrCat("client ", c.peer));
  close(c.fd);
  c.fd = -1;
}

// Drops clients whose hello and groups whose sockets did not arrive in time.
void HelloAcceptor::Expire(absl::Time now) {
  const std::string limit = absl::FormatDuration(connect_timeout_);
  for (Client& c : clients_) {
    if (c.deadline <= now) {
      Reject(c, absl::DeadlineExceededError(
                    absl::StrCat("sent ", c.got, " of ", kHelloSize,
                                 " hello bytes within the connect timeout (", limit, ")")));
    }
  }
  std::erase_if(clients_, [](const Client& c) { return c.fd < 0; });
  absl::erase_if(groups_, [&](auto& entry) {
    SocketGroup& group = entry.second;
    if (group.deadline > now) return false;
    const auto missing = std::count(group.fds.begin(), group.fds.end(), -1);
    last_error_ = absl::DeadlineExceededError(
        absl::StrCat("client ", group.peer, ": ", static_cast<int64_t>(group.fds.size()) - missing,
                     " of ", group.fds.size(),
                     " sockets of a connection arrived within the connect timeout (", limit, ")"));
    CloseSocketGroup(group);
    return true;
  });
}

size_t HelloAcceptor::HeldSockets() const {
  size_t n = clients_.size();
  for (const auto& [token, group] : groups_) {
    n += group.fds.size() - std::count(group.fds.begin(), group.fds.end(), -1);
  }
  return n;
}

// Makes room for one more socket: drops the waiter (client or group) that came first.
void HelloAcceptor::EvictOldest() {
  auto oldest_client =
      std::min_element(clients_.begin(), clients_.end(),
                       [](const Client& a, const Client& b) { return a.deadline < b.deadline; });
  auto oldest_group = std::min_element(
      groups_.begin(), groups_.end(),
      [](const auto& a, const auto& b) { return a.second.deadline < b.second.deadline; });
  if (oldest_client != clients_.end() &&
      (oldest_group == groups_.end() || oldest_client->deadline <= oldest_group->second.deadline)) {
    Reject(*oldest_client, absl::ResourceExhaustedError(absl::StrCat(
                               "dropped: ", kMaxHeldSockets, " sockets waiting for hellos")));
    clients_.erase(oldest_client);
  } else if (oldest_group != groups_.end()) {
    last_error_ = absl::ResourceExhaustedError(
        absl::StrCat("client ", oldest_group->second.peer, ": incomplete connection dropped, ",
                     kMaxHeldSockets, " sockets waiting for hellos"));
    CloseSocketGroup(oldest_group->second);
    groups_.erase(oldest_group);
  }
}

absl::Status HelloAcceptor::AcceptPending() {
  for (int i = 0; i < kAcceptBurst; ++i) {
    net::SocketAddress peer;
    peer.length = sizeof peer.storage;
    const int fd = accept4(fd_, reinterpret_cast<sockaddr*>(&peer.storage), &peer.length,
                           SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return net::ErrnoStatus(errno, absl::StrCat("tcp accept on ", address_));
    }
    while (HeldSockets() >= kMaxHeldSockets) EvictOldest();
    clients_.push_back(Client{fd, net::FormatAddress(peer), absl::Now() + connect_timeout_});
    // The hello usually came with the connection: read it now rather than one poll later.
    ReadHello(clients_.back());
    if (clients_.back().fd < 0) clients_.pop_back();
  }
  return absl::OkStatus();
}

// Reads what is there of `c`'s hello; once whole, moves the socket into its group (c.fd = -1)
// or rejects it (closed, c.fd = -1).
void HelloAcceptor::ReadHello(Client& c) {
  const ssize_t n = recv(c.fd, c.hello + c.got, sizeof c.hello - c.got, MSG_DONTWAIT);
  if (n == 0) return Reject(c, absl::UnavailableError("closed the connection before its hello"));
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
    return Reject(c, net::ErrnoStatus(errno, "reading the tcp hello"));
  }
  c.got += static_cast<size_t>(n);
  if (c.got < sizeof c.hello) return;
  absl::StatusOr<Hello> hello = DecodeHello(c.hello);
  if (!hello.ok()) return Reject(c, hello.status());
  auto [it, fresh] = groups_.try_emplace(hello->token);
  SocketGroup& group = it->second;
  if (fresh) {
    group.fds.assign(hello->socket_count, -1);
    group.peer = c.peer;
    group.deadline = absl::Now() + connect_timeout_;
  }
  if (group.fds.size() != hello->socket_count || group.fds[hello->socket_index] != -1) {
    return Reject(c, absl::DataLossError("inconsistent socket group in tcp hello"));
  }
  group.fds[hello->socket_index] = c.fd;
  c.fd = -1;
  if (std::count(group.fds.begin(), group.fds.end(), -1) > 0) return;
  ready_.push_back(std::move(group));
  groups_.erase(it);
}

}  // namespace plexus::transport::internal::tcp
