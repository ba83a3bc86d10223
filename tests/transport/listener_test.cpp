// Listeners under hostile or broken clients (tcp and shm): silent clients, garbage, half-open
// tcp socket groups; ConnectFullMesh with an intruder; the tcp data path over IPv6 ([ipv6],
// registered as its own CTest entry that is skipped where the host has no IPv6 loopback).
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "plexus/base/net.hpp"
#include "plexus/transport/device.hpp"
#include "plexus/transport/mesh.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "plexus/transport/store.hpp"
#include "support/loopback.hpp"
#include "support/skip.hpp"
#include "tcp/frame.hpp"

namespace pt = plexus::transport;
namespace net = plexus::base::net;

namespace {

// Slack for a loaded 2-core CI machine on top of a detection-latency bound.
constexpr absl::Duration kSlack = absl::Milliseconds(500);

std::shared_ptr<pt::Device> MakeDevice(pt::Backend backend, absl::Duration connect_timeout) {
  pt::DeviceOptions o;
  o.backend = backend;
  o.connect_timeout = connect_timeout;
  auto dev = pt::Device::Create(o);
  REQUIRE(dev.ok());
  return *dev;
}

// A raw client of a listener's address: a TCP socket ("ip:port") or a SOCK_SEQPACKET socket on
// the abstract name (shm). Returns the connected fd. Asserts nothing, so that threads may use it
// (Catch2 assertions are not thread-safe).
absl::StatusOr<int> TryRawConnect(pt::Backend backend, const std::string& address) {
  if (backend == pt::Backend::kTcp) {
    auto to = net::ResolveFirst(address, "test address");
    if (!to.ok()) return to.status();
    bool retryable = false;
    return net::ConnectTcp(*to, absl::Now() + absl::Seconds(10), &retryable);
  }
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return net::ErrnoStatus(errno, "socket");
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, address.data(), address.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + address.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) {
    const absl::Status error = net::ErrnoStatus(errno, "connect");
    close(fd);
    return error;
  }
  return fd;
}

// TryRawConnect, required to succeed (main thread only).
int RawConnect(pt::Backend backend, const std::string& address) {
  absl::StatusOr<int> fd = TryRawConnect(backend, address);
  INFO(fd.status());
  REQUIRE(fd.ok());
  return *fd;
}

void SendGarbage(int fd) {
  const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  REQUIRE(send(fd, junk, sizeof junk - 1, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof junk - 1));
}

int OpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  REQUIRE(d != nullptr);
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - 1;  // the directory stream's own fd
}

// Closes `fd` after `delay` unless cancelled first: on a listener that blocks on a silent client
// (the old behaviour) the test then fails on its timing checks instead of hanging.
class DelayedClose {
 public:
  DelayedClose(int fd, absl::Duration delay)
      : thread_([this, fd, delay] {
          if (!done_.WaitForNotificationWithTimeout(delay)) shutdown(fd, SHUT_RDWR);
        }) {}
  ~DelayedClose() {
    done_.Notify();
    thread_.join();
  }

 private:
  absl::Notification done_;
  std::thread thread_;
};

// One message from `from` to `to`, to show that an accepted connection works.
void Exchange(pt::Connection& from, pt::CompletionQueue& cq_from, pt::Connection& to,
              pt::CompletionQueue& cq_to) {
  uint64_t out = 0x1234567890abcdefULL, in = 0;
  REQUIRE(to.PostRecv({&in, sizeof in}, 2).ok());
  REQUIRE(from.PostSend(pt::ConstBuffer{&out, sizeof out}, 1).ok());
  auto sent = cq_from.Wait(absl::Seconds(5));
  REQUIRE(sent.ok());
  CHECK(sent->status.ok());
  auto got = cq_to.Wait(absl::Seconds(5));
  REQUIRE(got.ok());
  CHECK(got->status.ok());
  CHECK(in == out);
}

}  // namespace

TEST_CASE("a silent and a garbage client do not delay a real one", "[listener]") {
  const pt::Backend backend = GENERATE(pt::Backend::kTcp, pt::Backend::kShm);
  SECTION(std::string(pt::BackendName(backend))) {
    const absl::Duration connect_timeout = absl::Seconds(4);
    auto server = MakeDevice(backend, connect_timeout);
    auto client = MakeDevice(backend, connect_timeout);
    auto cq_s = server->CreateCompletionQueue();
    auto cq_c = client->CreateCompletionQueue();
    auto listener = server->Listen(backend == pt::Backend::kTcp ? "127.0.0.1:0" : "");
    REQUIRE(listener.ok());
    const std::string address = (*listener)->address();
    const int silent = RawConnect(backend, address);
    DelayedClose release(silent, absl::Seconds(6));
    const int garbage = RawConnect(backend, address);
    SendGarbage(garbage);
    // shm's Connect needs the acceptor's reply, so it runs beside Accept.
    absl::StatusOr<std::unique_ptr<pt::Connection>> conn = absl::UnknownError("not run");
    std::thread connector([&] { conn = client->Connect(address, cq_c.get()); });
    const absl::Time start = absl::Now();
    auto accepted = (*listener)->Accept(cq_s.get(), absl::Seconds(10));
    const absl::Duration took = absl::Now() - start;
    connector.join();
    INFO(accepted.status().ToString() << " after " << absl::FormatDuration(took));
    REQUIRE(accepted.ok());
    REQUIRE(conn.ok());
    // Well within both the Accept timeout and the silent client's hello deadline.
    CHECK(took < absl::Seconds(1) + kSlack);
    Exchange(**conn, *cq_c, **accepted, *cq_s);
    close(garbage);
    close(silent);
  }
}

TEST_CASE("Accept with only a silent client returns DeadlineExceeded in time", "[listener]") {
  const pt::Backend backend = GENERATE(pt::Backend::kTcp, pt::Backend::kShm);
  SECTION(std::string(pt::BackendName(backend))) {
    // The client's hello deadline (connect_timeout) is longer than the Accept timeout.
    auto server = MakeDevice(backend, absl::Seconds(10));
    auto cq = server->CreateCompletionQueue();
    auto listener = server->Listen(backend == pt::Backend::kTcp ? "127.0.0.1:0" : "");
    REQUIRE(listener.ok());
    const int silent = RawConnect(backend, (*listener)->address());
    DelayedClose release(silent, absl::Seconds(5));
    const absl::Duration timeout = absl::Seconds(1);
    const absl::Time start = absl::Now();
    auto accepted = (*listener)->Accept(cq.get(), timeout);
    const absl::Duration took = absl::Now() - start;
    INFO(accepted.status().ToString() << " after " << absl::FormatDuration(took));
    CHECK(absl::IsDeadlineExceeded(accepted.status()));
    CHECK(took >= timeout);
    CHECK(took <= timeout * 1.25 + kSlack);
    close(silent);
  }
}

TEST_CASE("tcp: half-open socket groups are closed after the connect timeout", "[listener]") {
  const absl::Duration connect_timeout = absl::Seconds(2);
  auto server = MakeDevice(pt::Backend::kTcp, connect_timeout);
  auto cq = server->CreateCompletionQueue();
  auto listener = server->Listen("127.0.0.1:0");
  REQUIRE(listener.ok());
  const int baseline = OpenFds();
  // Each client announces socket 0 of a 2-socket connection, then never opens socket 1.
  constexpr int kGroups = 200;
  std::vector<int> clients;
  for (int i = 0; i < kGroups; ++i) {
    const int fd = RawConnect(pt::Backend::kTcp, (*listener)->address());
    namespace tcp = pt::internal::tcp;
    tcp::Hello hello;
    hello.socket_index = 0;
    hello.socket_count = 2;
    hello.token = 1000 + static_cast<uint64_t>(i);
    uint8_t bytes[tcp::kHelloSize];
    tcp::EncodeHello(hello, bytes);
    REQUIRE(send(fd, bytes, sizeof bytes, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof bytes));
    clients.push_back(fd);
  }
  // Waits (in Accepts that find no complete connection) until the fd count is `want`.
  auto settle = [&](int want, absl::Duration within) {
    const absl::Time until = absl::Now() + within;
    absl::Status last;
    while (OpenFds() != want && absl::Now() < until) {
      last = (*listener)->Accept(cq.get(), absl::Milliseconds(100)).status();
      CHECK(absl::IsDeadlineExceeded(last));
    }
    return last;
  };
  // The listener holds the server side of every half group...
  (void)settle(baseline + 2 * kGroups, absl::Seconds(1));  // only the fd count matters here
  CHECK(OpenFds() == baseline + 2 * kGroups);
  // ...until the connect timeout passes: then only the test's own client sockets are left.
  const absl::Status why = settle(baseline + kGroups, connect_timeout + absl::Seconds(3));
  CHECK(OpenFds() == baseline + kGroups);
  INFO(why.ToString());
  CHECK(std::string(why.message()).find("1 of 2 sockets") != std::string::npos);
  for (int fd : clients) close(fd);
  CHECK(OpenFds() == baseline);

  // The listener still serves a real 2-socket connection.
  pt::DeviceOptions o;
  o.backend = pt::Backend::kTcp;
  o.tcp.sockets_per_connection = 2;
  auto client = pt::Device::Create(o);
  REQUIRE(client.ok());
  auto cq_c = (*client)->CreateCompletionQueue();
  auto conn = (*client)->Connect((*listener)->address(), cq_c.get());
  REQUIRE(conn.ok());
  auto accepted = (*listener)->Accept(cq.get(), absl::Seconds(5));
  REQUIRE(accepted.ok());
  Exchange(**conn, *cq_c, **accepted, *cq);
}

namespace {

// A device that lets an intruder connect to each listener it creates before anyone learns the
// listener's address: the intruder is then the first client the listener sees.
class IntrudedDevice final : public pt::Device {
 public:
  IntrudedDevice(std::shared_ptr<pt::Device> inner, std::function<void(const std::string&)> intrude)
      : Device(inner->options()), inner_(std::move(inner)), intrude_(std::move(intrude)) {}
  pt::Backend backend() const override { return inner_->backend(); }
  std::unique_ptr<pt::CompletionQueue> CreateCompletionQueue() override {
    return inner_->CreateCompletionQueue();
  }
  absl::StatusOr<std::unique_ptr<pt::MemoryRegion>> Register(void* data, size_t bytes,
                                                             pt::MemoryKind kind) override {
    return inner_->Register(data, bytes, kind);
  }
  absl::StatusOr<std::unique_ptr<pt::Listener>> Listen(std::string_view address) override {
    auto listener = inner_->Listen(address);
    if (listener.ok()) intrude_((*listener)->address());
    return listener;
  }
  absl::StatusOr<std::unique_ptr<pt::Connection>> Connect(std::string_view address,
                                                          pt::CompletionQueue* cq) override {
    return inner_->Connect(address, cq);
  }
  void Wake() override { inner_->Wake(); }

 protected:
  void DriveProgress(absl::Duration max_block) override { inner_->Progress(max_block); }

 private:
  std::shared_ptr<pt::Device> inner_;
  std::function<void(const std::string&)> intrude_;
};

}  // namespace

TEST_CASE("ConnectFullMesh succeeds in time with a silent intruder", "[listener]") {
  const pt::Backend backend = GENERATE(pt::Backend::kTcp, pt::Backend::kShm);
  SECTION(std::string(pt::BackendName(backend))) {
    const plexus::testing::LoopbackStore loopback = plexus::testing::StartLoopbackStore();
    const std::shared_ptr<pt::Store>& shared = loopback.store;
    std::vector<int> intruders;
    std::mutex mu;
    const absl::Duration timeout = absl::Seconds(5);
    std::vector<absl::Status> results(2);
    // Each rank's intruder connections that failed, checked after the join.
    std::vector<absl::Status> intrusions(2);
    std::vector<absl::Duration> took(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        pt::DeviceOptions o;
        o.backend = backend;
        if (backend == pt::Backend::kTcp) o.local_address = "127.0.0.1";
        auto inner = pt::Device::Create(o);
        if (!inner.ok()) {
          results[r] = inner.status();
          return;
        }
        IntrudedDevice dev(*inner, [&](const std::string& address) {
          absl::StatusOr<int> fd = TryRawConnect(backend, address);
          if (!fd.ok()) {
            intrusions[r].Update(fd.status());
            return;
          }
          std::lock_guard<std::mutex> lock(mu);
          intruders.push_back(*fd);
        });
        auto cq = dev.CreateCompletionQueue();
        auto rdv = pt::Rendezvous::Create(r, 2, shared);
        if (!rdv.ok()) {
          results[r] = rdv.status();
          return;
        }
        const absl::Time start = absl::Now();
        auto mesh = pt::ConnectFullMesh(*rdv, dev, cq.get(), "intruder", timeout);
        took[r] = absl::Now() - start;
        results[r] = mesh.status();
      });
    }
    // Releases the intruders late, so that a listener that blocks on them (the old behaviour)
    // fails the timing checks instead of hanging.
    absl::Notification done;
    std::thread release([&] {
      if (done.WaitForNotificationWithTimeout(absl::Seconds(8))) return;
      std::lock_guard<std::mutex> lock(mu);
      for (int fd : intruders) shutdown(fd, SHUT_RDWR);
    });
    for (auto& t : ranks) t.join();
    done.Notify();
    release.join();
    for (int fd : intruders) close(fd);
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << " intruder: " << intrusions[r]);
      REQUIRE(intrusions[r].ok());
    }
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << results[r].ToString() << " after "
                   << absl::FormatDuration(took[r]));
      CHECK(results[r].ok());
      CHECK(took[r] < timeout);
    }
  }
}

TEST_CASE("tcp over IPv6 loopback: listen, connect, local_address", "[ipv6]") {
  {
    const int probe = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    const bool ok = probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (probe >= 0) close(probe);
    if (!ok) plexus::testing::SkipTest("this host has no IPv6 loopback (::1 cannot be bound)");
  }
  pt::DeviceOptions o;
  o.backend = pt::Backend::kTcp;
  o.tcp.sockets_per_connection = GENERATE(1, 2);
  auto server = pt::Device::Create(o);
  REQUIRE(server.ok());
  auto cq_s = (*server)->CreateCompletionQueue();

  SECTION("explicit [::1]:0") {
    auto listener = (*server)->Listen("[::1]:0");
    REQUIRE(listener.ok());
    const std::string address = (*listener)->address();
    CHECK(address.rfind("[::1]:", 0) == 0);
    CHECK(address != "[::1]:0");
    auto client = pt::Device::Create(o);
    REQUIRE(client.ok());
    auto cq_c = (*client)->CreateCompletionQueue();
    auto conn = (*client)->Connect(address, cq_c.get());
    REQUIRE(conn.ok());
    auto accepted = (*listener)->Accept(cq_s.get(), absl::Seconds(5));
    REQUIRE(accepted.ok());
    CHECK((*accepted)->peer_address().rfind("[::1]:", 0) == 0);
    Exchange(**conn, *cq_c, **accepted, *cq_s);
  }
  SECTION("local_address ::1 on both sides") {
    pt::DeviceOptions v6 = o;
    v6.local_address = "::1";
    auto server6 = pt::Device::Create(v6);
    REQUIRE(server6.ok());
    auto cq6 = (*server6)->CreateCompletionQueue();
    auto listener = (*server6)->Listen("");
    REQUIRE(listener.ok());
    CHECK((*listener)->address().rfind("[::1]:", 0) == 0);
    auto client = pt::Device::Create(v6);
    REQUIRE(client.ok());
    auto cq_c = (*client)->CreateCompletionQueue();
    auto conn = (*client)->Connect((*listener)->address(), cq_c.get());
    REQUIRE(conn.ok());
    auto accepted = (*listener)->Accept(cq6.get(), absl::Seconds(5));
    REQUIRE(accepted.ok());
    CHECK((*accepted)->peer_address().rfind("[::1]:", 0) == 0);
    Exchange(**conn, *cq_c, **accepted, *cq6);

    // An IPv4 local_address cannot reach an IPv6 listener: a clear error, naming both.
    pt::DeviceOptions v4 = o;
    v4.local_address = "127.0.0.1";
    auto client4 = pt::Device::Create(v4);
    REQUIRE(client4.ok());
    auto refused = (*client4)->Connect((*listener)->address(), cq_c.get());
    REQUIRE_FALSE(refused.ok());
    INFO(refused.status().ToString());
    CHECK(std::string(refused.status().message()).find("127.0.0.1") != std::string::npos);
    CHECK(std::string(refused.status().message()).find((*listener)->address()) !=
          std::string::npos);
  }
}
