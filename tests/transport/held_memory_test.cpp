// Memory held for messages that arrive before their receive is posted stays under the caps
// (DeviceOptions::max_held_bytes_per_connection / _per_device) whatever a peer sends: a hostile
// raw TCP client writing valid frames (src/tcp/frame.hpp) and a hostile shm peer writing into
// the ring. The process's own RSS and VmSize (/proc/self/status) are the measure.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"
#include "shm/frame.hpp"
#include "shm/session.hpp"
#include "support/completion.hpp"
#include "support/process_stats.hpp"
#include "tcp/frame.hpp"

namespace pt = plexus::transport;
namespace tcp = plexus::transport::internal::tcp;
namespace shm = plexus::transport::internal::shm;

namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kCap = 32 * kMiB;     // per connection, in these tests
constexpr size_t kMargin = 24 * kMiB;  // allocator slack, thread stacks, staging buffers
constexpr uint64_t k16GiB = uint64_t{1} << 34;

// A field of /proc/self/status in bytes ("VmRSS", "VmSize").
size_t StatusBytes(const char* field) {
  const int64_t bytes = plexus::testing::ProcStatusBytes(field);
  if (bytes < 0) FAIL("no " << field << " in /proc/self/status");
  return static_cast<size_t>(bytes);
}

using plexus::testing::Next;

// Waits until the connection reports an error; its status.
absl::Status WaitForFailure(pt::Connection& conn, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (conn.status().ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  return conn.status();
}

std::shared_ptr<pt::Device> MakeDevice(pt::Backend backend) {
  pt::DeviceOptions o;
  o.backend = backend;
  o.local_address = backend == pt::Backend::kTcp ? "127.0.0.1" : "";
  o.op_timeout = absl::Seconds(20);
  o.max_message_bytes = k16GiB;
  o.max_held_bytes_per_connection = kCap;
  o.max_held_bytes_per_device = 2 * kCap;
  o.shm.ring_bytes = kMiB;
  auto d = pt::Device::Create(o);
  REQUIRE(d.ok());
  return *d;
}

// A raw TCP client speaking the tcp backend's wire format: a hello, then frames.
class RawClient {
 public:
  explicit RawClient(const std::string& address) {
    const size_t colon = address.rfind(':');
    REQUIRE(colon != std::string::npos);
    int port = 0;
    REQUIRE(absl::SimpleAtoi(address.substr(colon + 1), &port));
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    tcp::Hello hello;
    hello.token = 0x1234;
    uint8_t bytes[tcp::kHelloSize];
    tcp::EncodeHello(hello, bytes);
    REQUIRE(WriteAll(bytes, sizeof bytes, absl::Seconds(5)));
  }
  ~RawClient() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Closes with a reset (RST) instead of a FIN, as a crashed peer's kernel may.
  void Reset() {
    const linger abort{.l_onoff = 1, .l_linger = 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &abort, sizeof abort);
    Close();
  }

  // Writes a message frame header announcing `length` bytes.
  bool Header(uint64_t length, absl::Duration timeout) {
    tcp::FrameHeader h;
    h.type = tcp::FrameType::kMessage;
    h.length = length;
    uint8_t bytes[tcp::kFrameHeaderSize];
    tcp::EncodeFrameHeader(h, bytes);
    return WriteAll(bytes, sizeof bytes, timeout);
  }

  // Writes everything unless the peer stops reading for `timeout`; bytes written go to `sent`.
  bool WriteAll(const uint8_t* p, size_t n, absl::Duration timeout) {
    while (n > 0) {
      pollfd pf{fd_, POLLOUT, 0};
      if (::poll(&pf, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) <= 0) return false;
      const ssize_t w = ::send(fd_, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        return false;
      }
      p += w;
      n -= static_cast<size_t>(w);
      sent.fetch_add(static_cast<size_t>(w));
    }
    return true;
  }

  std::atomic<size_t> sent{0};

 private:
  int fd_ = -1;
};

}  // namespace

TEST_CASE("tcp: 512 early 1 MiB messages from a raw client: reading pauses at the cap", "[held]") {
  auto dev = MakeDevice(pt::Backend::kTcp);
  auto cq = dev->CreateCompletionQueue();
  auto listener = dev->Listen("");
  REQUIRE(listener.ok());
  std::vector<uint8_t> payload(kMiB);
  const size_t rss0 = StatusBytes("VmRSS");

  RawClient client((*listener)->address());
  auto conn = (*listener)->Accept(cq.get(), absl::Seconds(10));
  REQUIRE(conn.ok());
  constexpr int kMessages = 512;
  std::atomic<int> written{0};
  std::thread writer([&] {
    for (int i = 0; i < kMessages; ++i) {
      std::memset(payload.data(), i & 0xff, payload.size());
      std::memcpy(payload.data(), &i, sizeof i);
      // Blocks (backpressure) until the test posts receives.
      if (!client.Header(kMiB, absl::Seconds(60)) ||
          !client.WriteAll(payload.data(), payload.size(), absl::Seconds(60))) {
        return;
      }
      written.store(i + 1);
    }
  });

  // Wait until the client is stuck: the backend stopped reading.
  size_t last = 0;
  absl::Time still_since = absl::Now();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline && absl::Now() - still_since < absl::Milliseconds(1500)) {
    absl::SleepFor(absl::Milliseconds(50));
    if (client.sent.load() != last) {
      last = client.sent.load();
      still_since = absl::Now();
    }
  }
  const size_t rss = StatusBytes("VmRSS");
  INFO("client wrote " << client.sent.load() << " bytes; RSS grew by " << (rss - rss0));
  CHECK(written.load() < kMessages);             // it could not send everything
  CHECK(client.sent.load() < kCap + 64 * kMiB);  // the cap plus the socket buffers
  CHECK(rss < rss0 + kCap + kMargin);            // old code: ~512 MiB
  CHECK((*conn)->status().ok());                 // backpressure, not an error

  // Posting receives resumes reading: every message arrives whole and in order.
  std::vector<uint8_t> in(kMiB), expect(kMiB);
  for (int i = 0; i < kMessages; ++i) {
    REQUIRE((*conn)->PostRecv({in.data(), in.size()}, i).ok());
    pt::Completion c = Next(*cq);
    REQUIRE(c.status.ok());
    REQUIRE(c.wr_id == static_cast<uint64_t>(i));
    REQUIRE(c.bytes == kMiB);
    std::memset(expect.data(), i & 0xff, expect.size());
    std::memcpy(expect.data(), &i, sizeof i);
    REQUIRE(in == expect);
  }
  writer.join();
  CHECK(written.load() == kMessages);
  CHECK(StatusBytes("VmRSS") < rss0 + kCap + kMargin);

  // Memory goes back once the client left and the connection is closed.
  client.Close();
  const absl::Status failed = WaitForFailure(**conn, absl::Seconds(10));
  CHECK(absl::IsUnavailable(failed));
  (*conn)->Close();
  CHECK(StatusBytes("VmRSS") < rss0 + kMargin);
}

TEST_CASE("tcp: a 16 GiB length header with no receive posted fails the connection", "[held]") {
  auto dev = MakeDevice(pt::Backend::kTcp);
  auto cq = dev->CreateCompletionQueue();
  auto listener = dev->Listen("");
  REQUIRE(listener.ok());
  const size_t vm0 = StatusBytes("VmSize");
  const size_t rss0 = StatusBytes("VmRSS");
  RawClient client((*listener)->address());
  auto conn = (*listener)->Accept(cq.get(), absl::Seconds(10));
  REQUIRE(conn.ok());
  REQUIRE(client.Header(k16GiB, absl::Seconds(5)));
  std::vector<uint8_t> some(kMiB, 7);
  client.WriteAll(some.data(), some.size(), absl::Seconds(1));  // may be cut off: fine

  const absl::Status failed = WaitForFailure(**conn, absl::Seconds(10));
  INFO(failed.ToString());
  REQUIRE(absl::IsResourceExhausted(failed));
  const std::string text(failed.message());
  CHECK(text.find("tcp: peer 127.0.0.1:") == 0);
  CHECK(text.find("sent a message of 17179869184 bytes while no receive is posted") !=
        std::string::npos);
  CHECK(text.find("cap of 33554432 bytes") != std::string::npos);
  CHECK(text.find("max_held_bytes_per_connection") != std::string::npos);
  CHECK(StatusBytes("VmSize") < vm0 + kCap + 256 * kMiB);  // old code: +16 GiB
  CHECK(StatusBytes("VmRSS") < rss0 + kMargin);
  // A receive posted now gets the connection's error.
  std::vector<uint8_t> buf(16);
  CHECK((*conn)->PostRecv({buf.data(), buf.size()}, 1) == failed);
}

TEST_CASE("shm: a hostile peer's 16 GiB message header fails the connection", "[held]") {
  auto dev = MakeDevice(pt::Backend::kShm);
  auto cq = dev->CreateCompletionQueue();
  auto listener = dev->Listen("");
  REQUIRE(listener.ok());
  auto bell = shm::CreateDoorbell();
  REQUIRE(bell.ok());
  const size_t vm0 = StatusBytes("VmSize");
  absl::StatusOr<shm::Session> rogue = absl::UnknownError("not run");
  std::thread t([&] {
    shm::HandshakeOptions h;
    h.ring_bytes = kMiB;
    rogue = shm::ConnectSession((*listener)->address(), bell->fd.get(), h);
  });
  auto conn = (*listener)->Accept(cq.get(), absl::Seconds(10));
  t.join();
  REQUIRE(conn.ok());
  REQUIRE(rogue.ok());
  shm::FrameHeader h;
  h.type = shm::FrameType::kMessage;
  h.total_bytes = k16GiB;
  h.payload_bytes = 8;
  uint8_t header[shm::kFrameHeaderBytes];
  shm::EncodeFrameHeader(h, header);
  rogue->tx.CopyIn(0, header, sizeof header);
  rogue->tx.StoreHead(shm::FrameFootprint(8));
  rogue->peer_doorbell.Ring();

  const absl::Status failed = WaitForFailure(**conn, absl::Seconds(10));
  INFO(failed.ToString());
  REQUIRE(absl::IsResourceExhausted(failed));
  const std::string text(failed.message());
  CHECK(text.find("shm: peer process ") == 0);
  CHECK(text.find("sent a message of 17179869184 bytes while no receive is posted") !=
        std::string::npos);
  CHECK(text.find("max_held_bytes_per_connection") != std::string::npos);
  CHECK(StatusBytes("VmSize") < vm0 + kCap + 256 * kMiB);
}

TEST_CASE("shm: early messages from a peer process stop at the cap until receives come", "[held]") {
  // The peer is a real device in a child process; it sends 128 MiB (4x the cap) before any
  // receive is posted. The ring fills, the child's sends wait, nothing is lost.
  constexpr int kMessages = 128;
  auto dev = MakeDevice(pt::Backend::kShm);
  auto cq = dev->CreateCompletionQueue();
  auto listener = dev->Listen("");
  REQUIRE(listener.ok());
  const std::string address = (*listener)->address();
  const size_t rss0 = StatusBytes("VmRSS");
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 0;
    {
      auto child = pt::Device::Create([] {
        pt::DeviceOptions o;
        o.backend = pt::Backend::kShm;
        o.op_timeout = absl::Seconds(20);
        o.shm.ring_bytes = kMiB;
        return o;
      }());
      if (!child.ok()) std::_Exit(2);
      auto ccq = (*child)->CreateCompletionQueue();
      auto c = (*child)->Connect(address, ccq.get());
      if (!c.ok()) std::_Exit(3);
      std::vector<uint8_t> body(kMiB - 8, 0x3c);
      std::vector<uint64_t> index(kMessages);
      for (int i = 0; i < kMessages; ++i) {
        index[i] = i;
        const pt::ConstBuffer parts[2] = {{&index[i], 8}, {body.data(), body.size()}};
        if (!(*c)->PostSend(parts, i).ok()) std::_Exit(4);
      }
      for (int i = 0; i < kMessages && rc == 0; ++i) {
        auto done = ccq->Wait(absl::Seconds(30));
        if (!done.ok() || !done->status.ok()) rc = 5;
      }
    }
    std::_Exit(rc);
  }
  auto conn = (*listener)->Accept(cq.get(), absl::Seconds(10));
  REQUIRE(conn.ok());
  absl::SleepFor(absl::Seconds(2));  // the child sends as fast as the ring lets it
  const size_t rss = StatusBytes("VmRSS");
  INFO("RSS grew by " << (rss - rss0));
  CHECK(rss < rss0 + kCap + kMargin);  // old code: 128 MiB
  CHECK((*conn)->status().ok());
  std::vector<uint8_t> in(kMiB);
  for (int i = 0; i < kMessages; ++i) {
    REQUIRE((*conn)->PostRecv({in.data(), in.size()}, i).ok());
    pt::Completion c = Next(*cq);
    REQUIRE(c.status.ok());
    REQUIRE(c.bytes == kMiB);
    uint64_t got = 0;
    std::memcpy(&got, in.data(), 8);
    REQUIRE(got == static_cast<uint64_t>(i));
    REQUIRE(in[kMiB - 1] == 0x3c);
  }
  int status = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL("the sending child did not finish");
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  (*conn)->Close();
  CHECK(StatusBytes("VmRSS") < rss0 + kMargin);
}

namespace {

struct TcpPair {
  std::shared_ptr<pt::Device> sender, receiver;
  std::unique_ptr<pt::CompletionQueue> scq, rcq;
  std::unique_ptr<pt::Listener> listener;
};

TcpPair MakeTcpPair(int sockets, size_t per_connection, size_t per_device) {
  TcpPair p;
  pt::DeviceOptions o;
  o.backend = pt::Backend::kTcp;
  o.local_address = "127.0.0.1";
  o.op_timeout = absl::Seconds(20);
  o.tcp.sockets_per_connection = sockets;
  o.max_held_bytes_per_connection = per_connection;
  o.max_held_bytes_per_device = per_device;
  auto s = pt::Device::Create(o);
  auto r = pt::Device::Create(o);
  REQUIRE(s.ok());
  REQUIRE(r.ok());
  p.sender = *s;
  p.receiver = *r;
  p.scq = p.sender->CreateCompletionQueue();
  p.rcq = p.receiver->CreateCompletionQueue();
  auto l = p.receiver->Listen("");
  REQUIRE(l.ok());
  p.listener = std::move(*l);
  return p;
}

}  // namespace

TEST_CASE("tcp: striped early messages pause at the cap and resume intact", "[held]") {
  // 4 sockets per connection: messages of 3 MiB are striped; the cap holds two of them.
  constexpr size_t kSize = 3 * kMiB;
  constexpr int kMessages = 12;
  TcpPair p = MakeTcpPair(4, 2 * kSize + 2 * 64, size_t{1} << 30);
  auto out = p.sender->Connect(p.listener->address(), p.scq.get());
  REQUIRE(out.ok());
  auto in = p.listener->Accept(p.rcq.get(), absl::Seconds(10));
  REQUIRE(in.ok());
  std::vector<std::vector<uint8_t>> sent(kMessages, std::vector<uint8_t>(kSize));
  for (int i = 0; i < kMessages; ++i) {
    for (size_t j = 0; j < kSize; j += 4096) sent[i][j] = static_cast<uint8_t>(i * 7 + j / 4096);
    REQUIRE((*out)->PostSend(pt::ConstBuffer{sent[i].data(), kSize}, i).ok());
  }
  absl::SleepFor(absl::Milliseconds(500));  // the receiver holds two and stops reading
  CHECK((*in)->status().ok());
  CHECK((*out)->status().ok());
  std::vector<uint8_t> buf(kSize);
  for (int i = 0; i < kMessages; ++i) {
    REQUIRE((*in)->PostRecv({buf.data(), buf.size()}, i).ok());
    pt::Completion c = Next(*p.rcq);
    INFO(c.status.ToString());
    REQUIRE(c.status.ok());
    REQUIRE(c.wr_id == static_cast<uint64_t>(i));
    REQUIRE(buf == sent[i]);
  }
  for (int i = 0; i < kMessages; ++i) {
    pt::Completion c = Next(*p.scq);
    REQUIRE(c.status.ok());
  }
}

TEST_CASE("tcp: a connection paused by the device cap resumes when another one drains", "[held]") {
  // Each connection may hold 8 MiB, the device 10 MiB: the second connection to fill up waits
  // for the first one's receives.
  TcpPair p = MakeTcpPair(1, 8 * kMiB + 8 * 64, 10 * kMiB + 10 * 64);
  auto a_out = p.sender->Connect(p.listener->address(), p.scq.get());
  REQUIRE(a_out.ok());
  auto a_in = p.listener->Accept(p.rcq.get(), absl::Seconds(10));
  REQUIRE(a_in.ok());
  auto b_out = p.sender->Connect(p.listener->address(), p.scq.get());
  REQUIRE(b_out.ok());
  auto b_in = p.listener->Accept(p.rcq.get(), absl::Seconds(10));
  REQUIRE(b_in.ok());
  std::vector<uint8_t> ones(kMiB, 1), twos(kMiB, 2);
  for (int i = 0; i < 8; ++i) {
    REQUIRE((*a_out)->PostSend(pt::ConstBuffer{ones.data(), kMiB}, i).ok());
  }
  absl::SleepFor(absl::Milliseconds(300));
  for (int i = 0; i < 8; ++i) {
    REQUIRE((*b_out)->PostSend(pt::ConstBuffer{twos.data(), kMiB}, 100 + i).ok());
  }
  absl::SleepFor(absl::Milliseconds(300));  // b holds 2 MiB, then waits for room
  CHECK((*b_in)->status().ok());
  // a's receives free the device's room: b reads on without a receive of its own.
  for (int k = 0; k < 8; ++k) {
    REQUIRE((*a_in)->PostRecv({ones.data(), ones.size()}, k).ok());
  }
  int got_a = 0, got_b = 0;
  for (int i = 0; i < 8; ++i) {
    pt::Completion c = Next(*p.rcq);
    REQUIRE(c.status.ok());
    ++got_a;
  }
  absl::SleepFor(absl::Milliseconds(300));
  std::vector<uint8_t> buf(kMiB);
  for (int i = 0; i < 8; ++i) {
    REQUIRE((*b_in)->PostRecv({buf.data(), buf.size()}, 100 + i).ok());
    pt::Completion c = Next(*p.rcq);
    REQUIRE(c.status.ok());
    REQUIRE(c.wr_id == 100u + i);
    ++got_b;
  }
  CHECK(got_a == 8);
  CHECK(got_b == 8);
  CHECK(buf[kMiB - 1] == 2);
}

TEST_CASE("inproc: a send the peer cannot hold is refused, the connection stays up", "[held]") {
  pt::DeviceOptions o;
  o.backend = pt::Backend::kInproc;
  o.max_held_bytes_per_connection = 4 * (1000 + 64);
  auto dev = pt::Device::Create(o);
  REQUIRE(dev.ok());
  auto cq_a = (*dev)->CreateCompletionQueue();
  auto cq_b = (*dev)->CreateCompletionQueue();
  auto listener = (*dev)->Listen("");
  REQUIRE(listener.ok());
  auto a = (*dev)->Connect((*listener)->address(), cq_a.get());
  REQUIRE(a.ok());
  auto b = (*listener)->Accept(cq_b.get(), absl::Seconds(5));
  REQUIRE(b.ok());
  std::vector<uint8_t> msg(1000, 9), big(5000, 1), in(1000);
  for (int i = 0; i < 4; ++i) {
    REQUIRE((*a)->PostSend(pt::ConstBuffer{msg.data(), msg.size()}, i).ok());
  }
  const absl::Status full = (*a)->PostSend(pt::ConstBuffer{msg.data(), msg.size()}, 4);
  CHECK(absl::IsResourceExhausted(full));
  CHECK(std::string(full.message()).find("max_held_bytes_per_connection") != std::string::npos);
  const absl::Status too_big = (*a)->PostSend(pt::ConstBuffer{big.data(), big.size()}, 5);
  CHECK(absl::IsResourceExhausted(too_big));
  CHECK(std::string(too_big.message()).find("sent a message of 5000 bytes") != std::string::npos);
  CHECK((*a)->status().ok());
  CHECK((*b)->status().ok());
  REQUIRE((*b)->PostRecv({in.data(), in.size()}, 0).ok());
  REQUIRE((*a)->PostSend(pt::ConstBuffer{msg.data(), msg.size()}, 4).ok());  // room again
  for (int i = 1; i < 5; ++i) REQUIRE((*b)->PostRecv({in.data(), in.size()}, i).ok());
  for (int i = 0; i < 5; ++i) {
    pt::Completion c = Next(*cq_b);
    REQUIRE(c.status.ok());
    CHECK(c.wr_id == static_cast<uint64_t>(i));
    CHECK(c.bytes == 1000);
  }
}

// A connection that stopped reading at its held-bytes cap must still notice that its peer is
// gone: its own operations complete with an error naming the peer within the op_timeout, and the
// messages the peer sent before it went away are delivered whole, in order, before the error.
namespace {

constexpr size_t kSmallCap = 256 << 10;
constexpr size_t kSmallMessage = 64 << 10;
constexpr absl::Duration kPeerTimeout = absl::Seconds(2);
// Detection latency allowed: the op_timeout with some slack for a loaded 2-core machine.
const absl::Duration kDetectBound = kPeerTimeout * 1.25 + absl::Milliseconds(500);

std::shared_ptr<pt::Device> MakeSmallCapDevice() {
  pt::DeviceOptions o;
  o.backend = pt::Backend::kTcp;
  o.local_address = "127.0.0.1";
  o.op_timeout = kPeerTimeout;
  o.max_held_bytes_per_connection = kSmallCap;
  o.max_held_bytes_per_device = 4 * kSmallCap;
  auto d = pt::Device::Create(o);
  REQUIRE(d.ok());
  return *d;
}

// Message i: every byte is (i * 31 + offset / 4096) & 0xff, and its first 4 bytes are i.
std::vector<uint8_t> SmallMessage(int i) {
  std::vector<uint8_t> m(kSmallMessage);
  for (size_t j = 0; j < m.size(); ++j) m[j] = static_cast<uint8_t>(i * 31 + j / 4096);
  std::memcpy(m.data(), &i, sizeof i);
  return m;
}

// A small-cap device that accepted one connection from a RawClient.
struct RawClientConnection {
  RawClientConnection() {
    auto l = dev->Listen("");
    REQUIRE(l.ok());
    listener = std::move(*l);
    client = std::make_unique<RawClient>(listener->address());
    auto c = listener->Accept(cq.get(), absl::Seconds(10));
    REQUIRE(c.ok());
    conn = std::move(*c);
    peer = conn->peer_address();
  }
  // Writes SmallMessages until the receiver stops reading (no progress for 1 s); how many.
  int WriteUntilStalled(int most) {
    int written = 0;
    for (; written < most; ++written) {
      const std::vector<uint8_t> m = SmallMessage(written);
      if (!client->Header(m.size(), absl::Seconds(1)) ||
          !client->WriteAll(m.data(), m.size(), absl::Seconds(1))) {
        break;
      }
    }
    return written;
  }

  std::shared_ptr<pt::Device> dev = MakeSmallCapDevice();
  std::unique_ptr<pt::CompletionQueue> cq = dev->CreateCompletionQueue();
  std::unique_ptr<pt::Listener> listener;
  std::unique_ptr<RawClient> client;
  std::unique_ptr<pt::Connection> conn;
  std::string peer;
};

// Two small-cap devices, one connection between them, and `messages` SmallMessages posted by
// the sender: far more than the receiver holds, so that it pauses at the cap.
struct PausedPair {
  explicit PausedPair(int messages) {
    auto l = receiver->Listen("");
    REQUIRE(l.ok());
    listener = std::move(*l);
    auto o = sender->Connect(listener->address(), scq.get());
    REQUIRE(o.ok());
    out = std::move(*o);
    auto i = listener->Accept(rcq.get(), absl::Seconds(10));
    REQUIRE(i.ok());
    in = std::move(*i);
    peer = in->peer_address();
    for (int m = 0; m < messages; ++m) {
      sent.push_back(SmallMessage(m));
      REQUIRE(out->PostSend(pt::ConstBuffer{sent[m].data(), sent[m].size()}, m).ok());
    }
    absl::SleepFor(absl::Milliseconds(500));  // the receiver holds the cap and stops reading
    REQUIRE(in->status().ok());
  }

  std::shared_ptr<pt::Device> sender = MakeSmallCapDevice();
  std::shared_ptr<pt::Device> receiver = MakeSmallCapDevice();
  std::unique_ptr<pt::CompletionQueue> scq = sender->CreateCompletionQueue();
  std::unique_ptr<pt::CompletionQueue> rcq = receiver->CreateCompletionQueue();
  std::unique_ptr<pt::Listener> listener;
  std::unique_ptr<pt::Connection> out;
  std::unique_ptr<pt::Connection> in;
  std::string peer;
  std::vector<std::vector<uint8_t>> sent;
};

// The next completion on `cq` is operation `wr_id`'s failure, naming `peer`, within
// kDetectBound of `t0`; returns it.
pt::Completion ExpectFailureNamingPeer(pt::CompletionQueue& cq, uint64_t wr_id,
                                       const std::string& peer, absl::Time t0) {
  pt::Completion c = Next(cq, kPeerTimeout + absl::Seconds(10));
  const absl::Duration took = absl::Now() - t0;
  INFO(c.status.ToString() << " after " << absl::FormatDuration(took));
  CHECK(c.wr_id == wr_id);
  CHECK(!c.status.ok());
  CHECK(absl::StrContains(c.status.message(), peer));
  CHECK(took <= kDetectBound);
  return c;
}

}  // namespace

TEST_CASE("tcp: a connection paused at the cap fails its send when the peer resets", "[held]") {
  RawClientConnection t;
  // The client writes 64 KiB messages until the receiver stops reading (no progress for 1 s).
  REQUIRE(t.WriteUntilStalled(512) < 512);  // the receiver stopped reading
  REQUIRE(t.conn->status().ok());
  // An operation of the receiver's own that the client never reads: it stays outstanding.
  std::vector<uint8_t> big(16 << 20, 7);
  REQUIRE(t.conn->PostSend(pt::ConstBuffer{big.data(), big.size()}, 42).ok());
  absl::SleepFor(absl::Milliseconds(200));
  REQUIRE(t.cq->size() == 0);

  const absl::Time t0 = absl::Now();
  t.client->Reset();
  ExpectFailureNamingPeer(*t.cq, 42, t.peer, t0);
  CHECK(!t.conn->status().ok());
}

TEST_CASE("tcp: a connection paused at the cap fails its send when the peer device is destroyed",
          "[held]") {
  constexpr int kMessages = 128;  // 8 MiB: far more than the cap and the socket buffers
  PausedPair p(kMessages);
  REQUIRE(p.scq->size() < kMessages);  // the sender is stuck

  const absl::Time t0 = absl::Now();
  p.out.reset();
  p.sender.reset();  // the peer goes away with its sends still queued
  // The receiver's own send to the dead peer must fail, naming it, within the op_timeout.
  std::vector<uint8_t> big(16 << 20, 7);
  REQUIRE(p.in->PostSend(pt::ConstBuffer{big.data(), big.size()}, 42).ok());
  ExpectFailureNamingPeer(*p.rcq, 42, p.peer, t0);
  CHECK(!p.in->status().ok());
}

TEST_CASE("tcp: a connection paused at the cap delivers what a departed peer sent, then EOF",
          "[held]") {
  constexpr int kMessages = 128;
  PausedPair p(kMessages);
  // The sender goes away; the sends it had written completed (in order) before it did.
  p.out.reset();
  p.sender.reset();
  int completed = 0;
  while (p.scq->size() > 0) {
    pt::Completion c = Next(*p.scq, absl::Seconds(1));
    if (!c.status.ok()) break;
    REQUIRE(c.wr_id == static_cast<uint64_t>(completed));
    ++completed;
  }
  INFO("sender completed " << completed << " of " << kMessages);
  REQUIRE(completed < kMessages);

  // Receives drain what was held and what the kernel still has: every message the sender
  // completed arrives intact and in order, then the end of the stream fails a receive, naming
  // the peer, within the op_timeout.
  std::vector<uint8_t> buf(kSmallMessage);
  int got = 0;
  absl::Status end;
  for (int i = 0; i < kMessages && end.ok(); ++i) {
    // Once the stream ended and nothing whole is left, the post itself reports the end.
    if (absl::Status posted = p.in->PostRecv({buf.data(), buf.size()}, i); !posted.ok()) {
      end = posted;
      break;
    }
    const absl::Time t0 = absl::Now();
    pt::Completion c = Next(*p.rcq, kPeerTimeout + absl::Seconds(10));
    const absl::Duration took = absl::Now() - t0;
    INFO("receive " << i << ": " << c.status.ToString() << " after " << absl::FormatDuration(took));
    REQUIRE(c.wr_id == static_cast<uint64_t>(i));
    CHECK(took <= kDetectBound);
    if (!c.status.ok()) {
      end = c.status;
      break;
    }
    REQUIRE(c.bytes == kSmallMessage);
    REQUIRE(buf == p.sent[i]);
    ++got;
  }
  INFO("received " << got << "; the end: " << end.ToString());
  CHECK(got >= completed);
  CHECK(got < kMessages);
  CHECK(absl::IsUnavailable(end));
  CHECK(absl::StrContains(end.message(), p.peer));
}

TEST_CASE("tcp: a connection paused at the cap fails its send when the peer hangs", "[held]") {
  RawClientConnection t;
  REQUIRE(t.WriteUntilStalled(512) < 512);
  // The client stays connected but neither reads nor writes: the receiver's send cannot finish
  // and fails after op_timeout without progress.
  std::vector<uint8_t> big(16 << 20, 7);
  const absl::Time t0 = absl::Now();
  REQUIRE(t.conn->PostSend(pt::ConstBuffer{big.data(), big.size()}, 42).ok());
  const pt::Completion c = ExpectFailureNamingPeer(*t.cq, 42, t.peer, t0);
  CHECK(absl::IsDeadlineExceeded(c.status));
  CHECK(absl::Now() - t0 >= kPeerTimeout - absl::Milliseconds(100));
}

TEST_CASE("tcp: a paused connection whose peer closed delivers exactly what it sent, then EOF",
          "[held]") {
  RawClientConnection t;
  // 6 messages: above the cap (the receiver stops reading), within the kernel's socket buffers
  // (the client's writes and its FIN all get through).
  constexpr int kMessages = 6;
  for (int i = 0; i < kMessages; ++i) {
    const std::vector<uint8_t> m = SmallMessage(i);
    REQUIRE(t.client->Header(m.size(), absl::Seconds(5)));
    REQUIRE(t.client->WriteAll(m.data(), m.size(), absl::Seconds(5)));
  }
  t.client->Close();
  absl::SleepFor(absl::Milliseconds(300));
  // The peer's FIN waits behind its messages: nothing is lost, the connection is not failed yet.
  CHECK(t.conn->status().ok());
  std::vector<uint8_t> buf(kSmallMessage);
  for (int i = 0; i < kMessages; ++i) {
    REQUIRE(t.conn->PostRecv({buf.data(), buf.size()}, i).ok());
    pt::Completion c = Next(*t.cq, absl::Seconds(10));
    INFO("receive " << i << ": " << c.status.ToString());
    REQUIRE(c.status.ok());
    REQUIRE(c.wr_id == static_cast<uint64_t>(i));
    REQUIRE(buf == SmallMessage(i));
  }
  // Then the end of the stream, naming the peer, promptly.
  absl::Status end = t.conn->PostRecv({buf.data(), buf.size()}, 99);
  if (end.ok()) {
    const absl::Time t0 = absl::Now();
    pt::Completion c = Next(*t.cq, kPeerTimeout + absl::Seconds(10));
    CHECK(c.wr_id == 99u);
    CHECK(absl::Now() - t0 <= kDetectBound);
    end = c.status;
  }
  INFO(end.ToString());
  CHECK(absl::IsUnavailable(end));
  CHECK(absl::StrContains(end.message(), t.peer));
}
