// TcpStoreServer: one epoll thread. Each client has at most one request in service: a Get/Wait
// whose keys are missing parks the client as a waiter until the keys appear or its deadline
// passes; further frames from it stay buffered (bounded) until then.
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bootstrap/store_protocol.hpp"
#include "plexus/base/net.hpp"
#include "plexus/transport/store.hpp"

namespace plexus::transport {

namespace net = base::net;
namespace proto = store_protocol;

namespace {

// A client may buffer one maximal frame beyond the one in service; more means it is flooding.
constexpr size_t kMaxBufferedInput = 2 * (proto::kHeaderBytes + proto::kMaxBodyBytes);

struct Client {
  int fd = -1;
  std::string peer;
  std::string in;
  std::string out;
  size_t out_sent = 0;
  bool waiting = false;  // a Get/Wait is parked
  proto::Request parked;
  absl::Time deadline = absl::InfiniteFuture();
};

}  // namespace

struct TcpStoreServer::Impl {
  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  std::string address;
  uint16_t port = 0;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<size_t> connected{0};
  std::atomic<size_t> dropped{0};

  // Owned by the server thread only.
  absl::flat_hash_map<std::string, std::string> data;
  absl::flat_hash_map<int, std::unique_ptr<Client>> clients;

  ~Impl() {
    if (thread.joinable()) {
      stop.store(true);
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = write(wake_fd, &one, sizeof one);
      thread.join();
    }
    for (auto& [fd, client] : clients) close(fd);
    for (int fd : {listen_fd, epoll_fd, wake_fd}) {
      if (fd >= 0) close(fd);
    }
  }

  void Run() {
    std::vector<epoll_event> events(64);
    while (!stop.load()) {
      const int timeout_ms = net::PollTimeoutMs(NextDeadline(), 1000);
      const int n =
          epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()), timeout_ms);
      if (n < 0 && errno != EINTR) {
        std::fprintf(stderr, "plexus store %s: epoll_wait failed: %s; stopping\n", address.c_str(),
                     net::ErrnoText(errno).c_str());
        return;
      }
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == wake_fd) {
          uint64_t v;
          [[maybe_unused]] ssize_t r = read(wake_fd, &v, sizeof v);
        } else if (fd == listen_fd) {
          AcceptAll();
        } else {
          OnClientEvent(fd, events[i].events);
        }
      }
      ExpireWaiters();
    }
  }

  absl::Time NextDeadline() const {
    absl::Time next = absl::InfiniteFuture();
    for (const auto& [fd, c] : clients) {
      if (c->waiting && c->deadline < next) next = c->deadline;
    }
    return next;
  }

  void AcceptAll() {
    for (;;) {
      sockaddr_storage peer{};
      socklen_t len = sizeof peer;
      const int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // EAGAIN, or out of descriptors: retried on the next event
      }
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto client = std::make_unique<Client>();
      client->fd = fd;
      net::SocketAddress sa;
      sa.storage = peer;
      sa.length = len;
      client->peer = net::FormatAddress(sa);
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.fd = fd;
      if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        close(fd);
        continue;
      }
      clients[fd] = std::move(client);
      connected.fetch_add(1);
    }
  }

  void CloseClient(int fd) {
    auto it = clients.find(fd);
    if (it == clients.end()) return;
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    clients.erase(it);
    connected.fetch_sub(1);
  }

  void DropClient(int fd, const std::string& why) {
    auto it = clients.find(fd);
    if (it == clients.end()) return;
    std::fprintf(stderr, "plexus store %s: dropping client %s: %s\n", address.c_str(),
                 it->second->peer.c_str(), why.c_str());
    dropped.fetch_add(1);
    CloseClient(fd);
  }

  void OnClientEvent(int fd, uint32_t events) {
    auto it = clients.find(fd);
    if (it == clients.end()) return;
    Client& c = *it->second;
    if (events & EPOLLOUT) {
      if (!Flush(c)) return;
    }
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      char buf[64 * 1024];
      for (;;) {
        const ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n > 0) {
          c.in.append(buf, static_cast<size_t>(n));
          if (c.in.size() > kMaxBufferedInput) {
            DropClient(fd, "sent more than one frame ahead of its replies");
            return;
          }
          continue;
        }
        if (n == 0) {
          CloseClient(fd);  // an orderly goodbye, or a client that died: its waits end with it
          return;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        CloseClient(fd);
        return;
      }
    }
    Serve(fd);
  }

  // Sends what is queued; false when the client was closed.
  bool Flush(Client& c) {
    while (c.out_sent < c.out.size()) {
      const ssize_t n =
          send(c.fd, c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP | EPOLLOUT;
        ev.data.fd = c.fd;
        epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.fd, &ev);
        return true;
      }
      CloseClient(c.fd);
      return false;
    }
    if (!c.out.empty()) {
      c.out.clear();
      c.out_sent = 0;
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.fd = c.fd;
      epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.fd, &ev);
    }
    return true;
  }

  void Reply(Client& c, const proto::Response& response) {
    c.out += proto::EncodeResponse(response);
  }

  // Handles buffered frames while the client is neither parked nor behind on its replies.
  void Serve(int fd) {
    for (;;) {
      auto it = clients.find(fd);
      if (it == clients.end()) return;
      Client& c = *it->second;
      if (c.waiting || !c.out.empty()) return;
      auto size = proto::PeekFrame(
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(c.in.data()), c.in.size()));
      if (!size.ok()) {
        DropClient(fd, std::string(size.status().message()));
        return;
      }
      if (*size == 0 || c.in.size() < *size) return;
      auto request = proto::DecodeRequest(
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(c.in.data()) + proto::kHeaderBytes,
                              *size - proto::kHeaderBytes));
      c.in.erase(0, *size);
      if (!request.ok()) {
        DropClient(fd, std::string(request.status().message()));
        return;
      }
      std::vector<int> woken;
      Handle(c, std::move(*request), &woken);
      if (!Flush(c)) return;
      for (int other : woken) {
        auto o = clients.find(other);
        if (o != clients.end() && Flush(*o->second)) Serve(other);
      }
    }
  }

  bool AllPresent(const std::vector<std::string>& keys) const {
    for (const std::string& k : keys) {
      if (!data.contains(k)) return false;
    }
    return true;
  }

  proto::Response Satisfied(const proto::Request& req) const {
    proto::Response r;
    r.op = req.op;
    if (req.op == proto::Op::kGet) r.value = data.at(req.keys[0]);
    return r;
  }

  proto::Response TimedOut(const proto::Request& req) const {
    proto::Response r;
    r.op = req.op;
    r.code = proto::Code::kTimeout;
    std::vector<std::string> missing;
    for (const std::string& k : req.keys) {
      if (!data.contains(k)) missing.push_back(absl::StrCat("'", k, "'"));
    }
    r.value = absl::StrCat("missing ", missing.size() == 1 ? "key " : "keys ",
                           absl::StrJoin(missing, ", "));
    return r;
  }

  void Handle(Client& c, proto::Request req, std::vector<int>* woken) {
    proto::Response r;
    r.op = req.op;
    switch (req.op) {
      case proto::Op::kHello:
        r.number = proto::kVersion;
        if (req.version != proto::kVersion) {
          r.code = proto::Code::kInvalid;
          r.value = absl::StrCat("protocol version ", req.version, " is not supported (server ",
                                 proto::kVersion, "); use the same plexus build on every rank");
        }
        break;
      case proto::Op::kSet:
        data[req.keys[0]] = std::move(req.value);
        WakeWaiters(woken);
        break;
      case proto::Op::kAdd: {
        auto [it, inserted] = data.try_emplace(req.keys[0], "0");
        int64_t current = 0;
        if (!absl::SimpleAtoi(it->second, &current)) {
          if (inserted) data.erase(it);
          r.code = proto::Code::kInvalid;
          r.value = absl::StrCat("key '", req.keys[0], "' holds a value that is not a counter");
          break;
        }
        if ((req.delta > 0 && current > std::numeric_limits<int64_t>::max() - req.delta) ||
            (req.delta < 0 && current < std::numeric_limits<int64_t>::min() - req.delta)) {
          r.code = proto::Code::kInvalid;
          r.value = absl::StrCat("counter '", req.keys[0], "' would overflow");
          break;
        }
        r.number = current + req.delta;
        it->second = std::to_string(r.number);
        WakeWaiters(woken);
        break;
      }
      case proto::Op::kCheck:
        r.flag = AllPresent(req.keys);
        break;
      case proto::Op::kDelete:
        r.flag = data.erase(req.keys[0]) > 0;
        break;
      case proto::Op::kGet:
      case proto::Op::kWait:
        if (AllPresent(req.keys)) {
          r = Satisfied(req);
        } else if (req.timeout_ms == 0) {
          r = TimedOut(req);
        } else {
          c.waiting = true;
          c.deadline = req.timeout_ms == proto::kNoTimeout
                           ? absl::InfiniteFuture()
                           : absl::Now() + absl::Milliseconds(static_cast<int64_t>(
                                               std::min<uint64_t>(req.timeout_ms, 1ull << 50)));
          c.parked = std::move(req);
          return;
        }
        break;
    }
    Reply(c, r);
  }

  void WakeWaiters(std::vector<int>* woken) {
    for (auto& [fd, c] : clients) {
      if (c->waiting && AllPresent(c->parked.keys)) {
        c->waiting = false;
        Reply(*c, Satisfied(c->parked));
        c->parked = proto::Request();
        woken->push_back(fd);
      }
    }
  }

  void ExpireWaiters() {
    const absl::Time now = absl::Now();
    std::vector<int> expired;
    for (auto& [fd, c] : clients) {
      if (c->waiting && c->deadline <= now) {
        c->waiting = false;
        Reply(*c, TimedOut(c->parked));
        c->parked = proto::Request();
        expired.push_back(fd);
      }
    }
    for (int fd : expired) {
      auto it = clients.find(fd);
      if (it != clients.end() && Flush(*it->second)) Serve(fd);
    }
  }
};

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(std::string_view address) {
  const std::string text = address.empty() ? std::string(":0") : std::string(address);
  auto hp = net::ParseHostPort(text, "store server address");
  if (!hp.ok()) return hp.status();
  auto resolved = net::Resolve(*hp);
  if (!resolved.ok()) return resolved.status();
  const net::SocketAddress& sa = resolved->front();

  auto impl = std::make_unique<Impl>();
  impl->listen_fd = socket(sa.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (impl->listen_fd < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("store server: socket(): ", net::ErrnoText(errno)));
  }
  const int one = 1;
  setsockopt(impl->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(impl->listen_fd, reinterpret_cast<const sockaddr*>(&sa.storage), sa.length) != 0) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat(
        "store server cannot listen on ", net::FormatAddress(sa), ": ", net::ErrnoText(err),
        err == EADDRINUSE ? " (another process uses this port: pick another one)" : ""));
  }
  if (listen(impl->listen_fd, 1024) != 0) {
    return absl::UnavailableError(absl::StrCat("store server: listen(): ", net::ErrnoText(errno)));
  }
  net::SocketAddress bound;
  bound.length = sizeof bound.storage;
  getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&bound.storage), &bound.length);
  impl->address = net::FormatAddress(bound);
  impl->port = bound.storage.ss_family == AF_INET
                   ? ntohs(reinterpret_cast<sockaddr_in*>(&bound.storage)->sin_port)
                   : ntohs(reinterpret_cast<sockaddr_in6*>(&bound.storage)->sin6_port);

  impl->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->epoll_fd < 0 || impl->wake_fd < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("store server: epoll/eventfd: ", net::ErrnoText(errno)));
  }
  for (int fd : {impl->listen_fd, impl->wake_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(impl->epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStoreServer::~TcpStoreServer() = default;
std::string TcpStoreServer::address() const { return impl_->address; }
uint16_t TcpStoreServer::port() const { return impl_->port; }
size_t TcpStoreServer::connected_clients() const { return impl_->connected.load(); }
size_t TcpStoreServer::dropped_clients() const { return impl_->dropped.load(); }

}  // namespace plexus::transport
