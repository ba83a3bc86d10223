// TcpStoreServer: one epoll thread over the sockets; what a request does to the store is
// StoreState's (store_state.hpp). Each client has at most one request in service: a Get/Wait
// whose keys are missing parks the client as a waiter until the keys appear or its deadline
// passes; further frames from it stay buffered (bounded) until then. What clients can make the
// server hold is bounded three ways: per client (one frame ahead), in count (max_clients) and in
// total input across clients (max_buffered_bytes); clients that go silent are closed.
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
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
#include "bootstrap/store_state.hpp"
#include "plexus/base/env.hpp"
#include "plexus/base/log.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "plexus/transport/store.hpp"

namespace plexus::transport {

namespace net = base::net;

namespace proto = store_protocol;

namespace {

// A client may buffer one maximal frame beyond the one in service; more means it is flooding.
constexpr size_t kMaxBufferedInput = 2 * (proto::kHeaderBytes + proto::kMaxBodyBytes);
// Buffers above this capacity are released once empty, so that one large value does not stay
// resident per client for the life of the connection.
constexpr size_t kKeepCapacity = size_t{1} << 20;

const base::Param<int64_t> kMaxClients(
    "PLEXUS_STORE_MAX_CLIENTS", 4096,
    "connections a TcpStoreServer (rank 0) serves at once; more are refused");
const base::Param<absl::Duration> kIdleTimeout(
    "PLEXUS_STORE_IDLE_TIMEOUT", absl::Minutes(10),
    "a store client with no request in service that sends nothing for this long is closed "
    "(TcpStore reconnects); 'inf' never closes");
const base::Param<base::Bytes> kMaxBuffered(
    "PLEXUS_STORE_MAX_BUFFERED", base::Bytes{uint64_t{1} << 30},
    "bytes of partly received requests a TcpStoreServer buffers across all clients");
const base::Param<base::Bytes> kMaxStoreBytes(
    "PLEXUS_STORE_MAX_BYTES", base::Bytes{proto::kDefaultMaxStoreBytes},
    "bytes of keys and values a TcpStoreServer (rank 0) holds; a Set beyond them is refused "
    "(ResourceExhausted)");

struct Client {
  int fd = -1;
  std::string peer;
  std::string in;
  std::string out;
  size_t out_sent = 0;
  bool hello_ok = false;
  bool close_after_reply = false;  // refused: close once the refusal is sent
  absl::Time last_active;
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
  std::atomic<size_t> accepted{0};
  std::atomic<size_t> dropped{0};
  std::atomic<size_t> refused{0};
  std::atomic<uint64_t> buffered{0};  // sum of clients' `in` sizes
  std::atomic<uint64_t> stored{0};    // the state's bytes(), for other threads
  std::atomic<bool> job_failed{false};

  // Limits and identity, fixed before the thread starts.
  int64_t max_clients = 0;
  absl::Duration idle_timeout = absl::InfiniteDuration();
  uint64_t max_buffered = 0;
  uint64_t max_store = 0;

  // Refusals are logged at most once a second, so that a flood of connections cannot flood
  // the log (base::Log); the count of those not logged is reported with the next line.
  absl::Time last_refusal_log = absl::InfinitePast();
  size_t unlogged_refusals = 0;

  // Owned by the server thread only. The state is created once the address is known.
  std::unique_ptr<proto::StoreState> state;
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
        base::Logf(base::LogLevel::kError, "plexus store %s: epoll_wait failed: %s; stopping",
                   address, net::ErrnoText(errno));
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
    absl::Time next = state->next_deadline();
    if (idle_timeout == absl::InfiniteDuration()) return next;
    for (const auto& [fd, c] : clients) {
      if (!state->parked(fd)) next = std::min(next, c->last_active + idle_timeout);
    }
    return next;
  }

  void LogRefusal(const std::string& peer, const std::string& why) {
    const absl::Time now = absl::Now();
    if (now - last_refusal_log < absl::Seconds(1)) {
      ++unlogged_refusals;
      return;
    }
    std::string more;
    if (unlogged_refusals > 0) {
      more = absl::StrCat(" (and ", unlogged_refusals, " more refusals in the last second)");
    }
    base::Logf(base::LogLevel::kWarning, "plexus store %s: refusing client %s: %s%s", address, peer,
               why, more);
    last_refusal_log = now;
    unlogged_refusals = 0;
  }

  // Answers a connection over the client limit with a refused Hello and closes it. Its own Hello
  // (small, usually already here) is read first, so that the close sends FIN rather than a reset
  // that could destroy the answer before the client reads it.
  void RefuseAtAccept(int fd, const std::string& peer) {
    const std::string why = absl::StrCat(
        "the store at ", address, " already serves ", clients.size(), " clients, its limit (",
        "PLEXUS_STORE_MAX_CLIENTS on the rank serving it, or TcpStoreServer::Options::"
        "max_clients); raise it, or find who holds the connections");
    LogRefusal(peer, why);
    refused.fetch_add(1);
    char scratch[4096];
    [[maybe_unused]] ssize_t r = recv(fd, scratch, sizeof scratch, MSG_DONTWAIT);
    proto::Response response;
    response.op = proto::Op::kHello;
    response.code = proto::Code::kBusy;
    response.value = why;
    const std::string frame = proto::EncodeResponse(response);
    [[maybe_unused]] ssize_t n = send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    close(fd);
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
      net::SocketAddress sa;
      sa.storage = peer;
      sa.length = len;
      if (static_cast<int64_t>(clients.size()) >= max_clients) {
        RefuseAtAccept(fd, net::FormatAddress(sa));
        continue;
      }
      auto client = std::make_unique<Client>();
      client->fd = fd;
      client->peer = net::FormatAddress(sa);
      client->last_active = absl::Now();
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.fd = fd;
      if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        close(fd);
        continue;
      }
      clients[fd] = std::move(client);
      connected.fetch_add(1);
      accepted.fetch_add(1);
    }
  }

  void CloseClient(int fd) {
    auto it = clients.find(fd);
    if (it == clients.end()) return;
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    buffered.fetch_sub(it->second->in.size());
    state->Forget(fd);
    clients.erase(it);
    connected.fetch_sub(1);
  }

  void DropClient(int fd, const std::string& why) {
    auto it = clients.find(fd);
    if (it == clients.end()) return;
    base::Logf(base::LogLevel::kWarning, "plexus store %s: dropping client %s: %s", address,
               it->second->peer, why);
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
          c.last_active = absl::Now();
          if (c.in.size() + static_cast<size_t>(n) > kMaxBufferedInput) {
            DropClient(fd, "sent more than one frame ahead of its replies");
            return;
          }
          // Over the cap across clients, the client holding the most input goes (this one when
          // it would), so that small requests of legitimate ranks get through.
          while (buffered.load() + static_cast<uint64_t>(n) > max_buffered) {
            int victim = fd;
            size_t most = c.in.size() + static_cast<size_t>(n);
            for (const auto& [other_fd, other] : clients) {
              if (other_fd != fd && other->in.size() > most) {
                victim = other_fd;
                most = other->in.size();
              }
            }
            DropClient(victim, absl::StrCat("its ", most,
                                            " bytes of unfinished requests are the most while "
                                            "the store is at its cap of ",
                                            max_buffered,
                                            " bytes across all clients "
                                            "(PLEXUS_STORE_MAX_BUFFERED)"));
            if (victim == fd) return;
          }
          ReserveFrame(c);
          c.in.append(buf, static_cast<size_t>(n));
          buffered.fetch_add(static_cast<uint64_t>(n));
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

  // Once a frame's header is in, reserves the whole frame at once: growing by doubling would
  // hold the old and the new copy at the same time.
  static void ReserveFrame(Client& c) {
    if (c.in.size() < proto::kHeaderBytes) return;
    auto size = proto::PeekFrame(
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(c.in.data()), c.in.size()));
    if (size.ok() && *size > c.in.capacity()) c.in.reserve(*size);
  }

  // Consumes `bytes` from the front of the client's input.
  void ConsumeInput(Client& c, size_t bytes) {
    c.in.erase(0, bytes);
    buffered.fetch_sub(bytes);
    if (c.in.empty() && c.in.capacity() > kKeepCapacity) std::string().swap(c.in);
  }

  // Sends what is queued; false when the client was closed.
  bool Flush(Client& c) {
    while (c.out_sent < c.out.size()) {
      const ssize_t n =
          send(c.fd, c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_sent += static_cast<size_t>(n);
        c.last_active = absl::Now();
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
    if (c.close_after_reply) {
      CloseClient(c.fd);
      return false;
    }
    if (!c.out.empty()) {
      c.out.clear();
      if (c.out.capacity() > kKeepCapacity) std::string().swap(c.out);
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
      if (state->parked(fd) || !c.out.empty()) return;
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
      ConsumeInput(c, *size);
      if (!request.ok()) {
        DropClient(fd, std::string(request.status().message()));
        return;
      }
      // A store of one job checks every connection's hello before anything else.
      const std::string& job_id = state->job_id();
      if (!c.hello_ok && request->op != proto::Op::kHello && !job_id.empty()) {
        DropClient(fd, absl::StrCat("sent a '", proto::OpName(request->op),
                                    "' before its hello (this store serves job '", job_id,
                                    "' and checks every connection's job)"));
        return;
      }
      proto::StoreState::Outcome outcome = state->Handle(fd, std::move(*request), absl::Now());
      stored.store(state->bytes());
      if (state->job_failed() && !job_failed.exchange(true)) {
        base::Logf(base::LogLevel::kInfo, "plexus store %s: client %s reported the job failed (%s)",
                   address, c.peer, state->failed_key());
      }
      if (outcome.hello_accepted) c.hello_ok = true;
      if (!outcome.refusal.empty()) {
        c.close_after_reply = true;
        refused.fetch_add(1);
        LogRefusal(c.peer, outcome.refusal);
      }
      if (outcome.reply) Reply(c, *outcome.reply);
      std::vector<std::pair<int, proto::Response>> completed = state->TakeCompleted();
      for (const auto& [other, response] : completed) Reply(*clients.at(other), response);
      if (!Flush(c)) return;
      for (const auto& [other, response] : completed) {
        auto o = clients.find(other);
        if (o != clients.end() && Flush(*o->second)) Serve(other);
      }
    }
  }

  void ExpireWaiters() {
    const absl::Time now = absl::Now();
    if (idle_timeout != absl::InfiniteDuration()) {
      std::vector<int> idle;
      for (auto& [fd, c] : clients) {
        if (!state->parked(fd) && now - c->last_active >= idle_timeout) idle.push_back(fd);
      }
      for (int fd : idle) {
        DropClient(fd, absl::StrCat("idle for ", absl::FormatDuration(idle_timeout),
                                    " (PLEXUS_STORE_IDLE_TIMEOUT) with no request in service"));
      }
    }
    const std::vector<std::pair<int, proto::Response>> expired = state->Expire(now);
    for (const auto& [fd, response] : expired) Reply(*clients.at(fd), response);
    for (const auto& [fd, response] : expired) {
      auto it = clients.find(fd);
      if (it != clients.end() && Flush(*it->second)) Serve(fd);
    }
  }
};

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(std::string_view address,
                                                                      const Options& options) {
  PLEXUS_ASSIGN_OR_RETURN(const int64_t max_clients, kMaxClients.Resolve(options.max_clients));
  PLEXUS_ASSIGN_OR_RETURN(const absl::Duration idle_timeout,
                          kIdleTimeout.Resolve(options.idle_timeout));
  std::optional<base::Bytes> explicit_buffered;
  if (options.max_buffered_bytes) explicit_buffered = base::Bytes{*options.max_buffered_bytes};
  PLEXUS_ASSIGN_OR_RETURN(const base::Bytes max_buffered, kMaxBuffered.Resolve(explicit_buffered));
  std::optional<base::Bytes> explicit_store;
  if (options.max_store_bytes) explicit_store = base::Bytes{*options.max_store_bytes};
  PLEXUS_ASSIGN_OR_RETURN(const base::Bytes max_store, kMaxStoreBytes.Resolve(explicit_store));
  if (max_clients < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("store server: max_clients (PLEXUS_STORE_MAX_CLIENTS) is ", max_clients,
                     "; it must be at least 1"));
  }
  if (idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store server: idle_timeout (PLEXUS_STORE_IDLE_TIMEOUT) is ",
        absl::FormatDuration(idle_timeout), "; it must be positive ('inf' disables it)"));
  }
  if (max_buffered.value < proto::kHeaderBytes + proto::kMaxBodyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("store server: max_buffered_bytes (PLEXUS_STORE_MAX_BUFFERED) is ",
                     max_buffered.value, "; it must hold at least one maximal frame (",
                     proto::kHeaderBytes + proto::kMaxBodyBytes, " bytes)"));
  }
  if (max_store.value <
      kMaxStoreValueBytes + kMaxStoreKeyBytes + proto::StoreState::kEntryOverheadBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store server: max_store_bytes (PLEXUS_STORE_MAX_BYTES) is ", max_store.value,
        "; it must hold at least one maximal key and value (",
        kMaxStoreValueBytes + kMaxStoreKeyBytes + proto::StoreState::kEntryOverheadBytes,
        " bytes)"));
  }
  if (options.job_id.size() > proto::kMaxJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("store server: job id of ",
                                                   options.job_id.size(), " bytes; the limit is ",
                                                   proto::kMaxJobIdBytes));
  }
  const std::string text = address.empty() ? std::string(":0") : std::string(address);
  PLEXUS_ASSIGN_OR_RETURN(auto hp, net::ParseHostPort(text, "store server address"));
  PLEXUS_ASSIGN_OR_RETURN(auto resolved, net::Resolve(hp));
  const net::SocketAddress& sa = resolved.front();

  auto impl = std::make_unique<Impl>();
  impl->max_clients = max_clients;
  impl->idle_timeout = idle_timeout;
  impl->max_buffered = max_buffered.value;
  impl->max_store = max_store.value;
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
  impl->state = std::make_unique<proto::StoreState>(
      options.job_id, options.job_id_is_nonce && !options.job_id.empty(), impl->address,
      impl->max_store);

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

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(std::string_view address) {
  return Start(address, Options());
}

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStoreServer::~TcpStoreServer() = default;
std::string TcpStoreServer::address() const { return impl_->address; }
uint16_t TcpStoreServer::port() const { return impl_->port; }
size_t TcpStoreServer::connected_clients() const { return impl_->connected.load(); }
size_t TcpStoreServer::accepted_clients() const { return impl_->accepted.load(); }
size_t TcpStoreServer::dropped_clients() const { return impl_->dropped.load(); }
size_t TcpStoreServer::refused_clients() const { return impl_->refused.load(); }
uint64_t TcpStoreServer::buffered_bytes() const { return impl_->buffered.load(); }
int64_t TcpStoreServer::max_clients() const { return impl_->max_clients; }
absl::Duration TcpStoreServer::idle_timeout() const { return impl_->idle_timeout; }
uint64_t TcpStoreServer::max_buffered_bytes() const { return impl_->max_buffered; }
uint64_t TcpStoreServer::max_store_bytes() const { return impl_->max_store; }
uint64_t TcpStoreServer::stored_bytes() const { return impl_->stored.load(); }
bool TcpStoreServer::job_failed() const { return impl_->job_failed.load(); }

}  // namespace plexus::transport
