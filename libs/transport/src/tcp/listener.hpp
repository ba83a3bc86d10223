// The accepting half of the tcp listener: reads the hellos of accepted sockets and assembles
// the socket groups of connections (tcp.sockets_per_connection > 1), with no knowledge of the
// connection's data path. Split from tcp_device.cpp so that the protocol of accepting (hellos,
// deadlines, eviction) reads apart from the epoll core.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tcp/frame.hpp"

namespace plexus::transport::internal::tcp {

// The sockets of one connection, by socket index, and the peer that opened them.
struct SocketGroup {
  std::vector<int> fds;  // -1: not yet arrived
  std::string peer;
  absl::Time deadline;
};

// Closes the group's sockets.
void CloseSocketGroup(SocketGroup& group);

// Serves one listening socket. Clients are served concurrently: every accepted socket is
// non-blocking and must deliver its hello within `connect_timeout`, and the socket group of a
// connection must be complete within `connect_timeout` of its first hello. Silent, garbage and
// half-open clients are closed when they fail that, while other clients' hellos are read as they
// arrive; at most kMaxHeldSockets sockets wait at once (the oldest waiter is dropped first).
// Expiry runs inside Next, and the destructor closes what is left (the listening socket too).
class HelloAcceptor {
 public:
  HelloAcceptor(int fd, std::string address, absl::Duration connect_timeout)
      : fd_(fd), address_(std::move(address)), connect_timeout_(connect_timeout) {}
  ~HelloAcceptor();
  HelloAcceptor(const HelloAcceptor&) = delete;
  HelloAcceptor& operator=(const HelloAcceptor&) = delete;

  const std::string& address() const { return address_; }

  // The next complete socket group; DeadlineExceeded (naming the last rejected client) when
  // none is complete within `timeout`. The caller owns the returned sockets.
  absl::StatusOr<SocketGroup> Next(absl::Duration timeout);

 private:
  // Sockets held at most while waiting for hellos or for the rest of a group.
  static constexpr size_t kMaxHeldSockets = 1024;
  // Accepted per poll round, so that reading hellos is not starved by a flood of connects.
  static constexpr int kAcceptBurst = 64;

  struct Client {  // an accepted socket whose hello is not complete
    int fd = -1;
    std::string peer;
    absl::Time deadline;
    uint8_t hello[kHelloSize] = {};
    size_t got = 0;
  };

  void Reject(Client& c, const absl::Status& why);
  void Expire(absl::Time now);
  size_t HeldSockets() const;
  void EvictOldest();
  absl::Status AcceptPending();
  void ReadHello(Client& c);

  int fd_;
  std::string address_;
  absl::Duration connect_timeout_;
  std::vector<Client> clients_;
  absl::flat_hash_map<uint64_t, SocketGroup> groups_;  // by the token of the connection's hello
  std::deque<SocketGroup> ready_;                      // complete, not yet returned by Next
  absl::Status last_error_;                            // why the last client was dropped
};

}  // namespace plexus::transport::internal::tcp
