// The shm backend between real processes (fork): messages 1 B..64 MiB with content checks over
// cross-memory attach and over the ring alone, scatter-gather and early messages, one-sided
// writes, 64 connections, a peer killed mid-transfer, a stalled peer, and a hostile peer that
// corrupts the ring or the handshake.
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"
#include "shm/frame.hpp"
#include "shm/session.hpp"
#include "shm/stats.hpp"
#include "shm_support.hpp"
#include "support/completion.hpp"

namespace pt = plexus::transport;
namespace shm = plexus::transport::internal::shm;

using namespace plexus::transport::shm_test;  // NOLINT: test helpers

namespace {

// A failed check inside a forked child: report it and make the child exit non-zero.
#define CHILD_CHECK(cond)                                                           \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "child check failed at line %d: %s\n", __LINE__, #cond); \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

// Carries the listener's address from the parent to a forked child.
class AddressPipe {
 public:
  AddressPipe() { REQUIRE(::pipe(fds_) == 0); }
  ~AddressPipe() {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  void Send(const std::string& address) {
    const std::string line = address + "\n";
    REQUIRE(::write(fds_[1], line.data(), line.size()) == static_cast<ssize_t>(line.size()));
  }
  std::string Receive() {
    std::string out;
    char c;
    pollfd p{fds_[0], POLLIN, 0};
    while (::poll(&p, 1, 10000) == 1 && ::read(fds_[0], &c, 1) == 1 && c != '\n') out += c;
    return out;
  }

 private:
  int fds_[2];
};

// Runs `body` in a forked child process that exits with body's result.
template <typename F>
pid_t ForkChild(F&& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 97;
    try {
      rc = body();
    } catch (...) {
      rc = 98;
    }
    std::fflush(stderr);
    std::_Exit(rc);
  }
  return pid;
}

// The child's exit code; kills it and returns -1 when it does not end within `timeout`.
int WaitChild(pid_t pid, absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

// The parent's end of a test: a device, its completion queue and the connection the forked
// child makes to the listener whose address goes down `pipe`.
struct ParentEnd {
  std::shared_ptr<pt::Device> dev;
  std::unique_ptr<pt::CompletionQueue> cq;
  std::unique_ptr<pt::Connection> conn;
};

ParentEnd AcceptChild(AddressPipe& pipe, const pt::DeviceOptions& options) {
  ParentEnd end;
  end.dev = MakeDevice(options);
  end.cq = end.dev->CreateCompletionQueue();
  auto listener = end.dev->Listen("");
  REQUIRE(listener.ok());
  pipe.Send((*listener)->address());
  auto conn = (*listener)->Accept(end.cq.get(), absl::Seconds(10));
  REQUIRE(conn.ok());
  end.conn = *std::move(conn);
  return end;
}

using plexus::testing::Next;

const std::vector<size_t> kSizes = {
    1, 7, 48, 4096, 65537, 262144, 1000003, (size_t{16} << 20) + 5, size_t{64} << 20};

void RunEcho(bool cma, pt::ProgressMode parent_mode, pt::ProgressMode child_mode) {
  SetCma(cma);
  AddressPipe pipe;
  const pid_t child = ForkChild([&]() -> int {
    auto dev = MakeDevice(Options(child_mode));
    auto cq = dev->CreateCompletionQueue();
    auto conn = dev->Connect(pipe.Receive(), cq.get());
    CHILD_CHECK(conn.ok());
    std::vector<uint8_t> buf(kSizes.back());
    for (size_t k = 0; k < kSizes.size(); ++k) {
      CHILD_CHECK((*conn)->PostRecv({buf.data(), kSizes[k]}, k).ok());
      pt::Completion c = Next(*cq);
      CHILD_CHECK(c.status.ok() && c.opcode == pt::Opcode::kRecv && c.wr_id == k);
      CHILD_CHECK(c.bytes == kSizes[k]);
      CHILD_CHECK(Matches(buf.data(), kSizes[k], k));
      CHILD_CHECK((*conn)->PostSend(pt::ConstBuffer{buf.data(), kSizes[k]}, 100 + k).ok());
      c = Next(*cq);
      CHILD_CHECK(c.status.ok() && c.opcode == pt::Opcode::kSend && c.wr_id == 100 + k);
    }
    uint8_t bye;
    CHILD_CHECK((*conn)->PostRecv({&bye, 1}, 7).ok());
    CHILD_CHECK(Next(*cq).status.ok());
    return 0;
  });

  auto dev = MakeDevice(Options(parent_mode));
  auto cq = dev->CreateCompletionQueue();
  auto listener = dev->Listen("");
  REQUIRE(listener.ok());
  pipe.Send((*listener)->address());
  auto conn = (*listener)->Accept(cq.get(), absl::Seconds(10));
  REQUIRE(conn.ok());
  std::vector<uint8_t> src(kSizes.back()), echo(kSizes.back());
  for (size_t k = 0; k < kSizes.size(); ++k) {
    INFO("message of " << kSizes[k] << " bytes");
    Fill(src.data(), kSizes[k], k);
    REQUIRE((*conn)->PostRecv({echo.data(), kSizes[k]}, 1000 + k).ok());
    REQUIRE((*conn)->PostSend(pt::ConstBuffer{src.data(), kSizes[k]}, k).ok());
    for (int i = 0; i < 2; ++i) {
      pt::Completion c = Next(*cq);
      REQUIRE(c.status.ok());
      if (c.opcode == pt::Opcode::kRecv) {
        CHECK(c.bytes == kSizes[k]);
        CHECK(c.wr_id == 1000 + k);
      } else {
        CHECK(c.opcode == pt::Opcode::kSend);
        CHECK(c.wr_id == k);
      }
    }
    REQUIRE(Matches(echo.data(), kSizes[k], k));
  }
  auto stats = shm::GetConnectionStats(**conn);
  REQUIRE(stats.ok());
  CHECK(stats->peer_can_pull == cma);
  if (cma) {
    CHECK(stats->cma_bytes_sent >= (size_t{64} << 20));
    CHECK(stats->cma_bytes_received >= (size_t{64} << 20));
  } else {
    CHECK(stats->cma_bytes_sent == 0);
    CHECK(stats->cma_bytes_received == 0);
    CHECK(stats->ring_bytes_sent >= (size_t{80} << 20));
  }
  uint8_t bye = 1;
  REQUIRE((*conn)->PostSend(pt::ConstBuffer{&bye, 1}, 9).ok());
  CHECK(Next(*cq).status.ok());
  CHECK(WaitChild(child) == 0);
}

}  // namespace

TEST_CASE("shm: messages of 1 B to 64 MiB between processes, cross-memory attach", "[shm]") {
  RunEcho(/*cma=*/true, pt::ProgressMode::kThread, pt::ProgressMode::kCaller);
}

TEST_CASE("shm: messages of 1 B to 64 MiB between processes, ring only (CMA refused)", "[shm]") {
  RunEcho(/*cma=*/false, pt::ProgressMode::kCaller, pt::ProgressMode::kThread);
  SetCma(true);
}

TEST_CASE("shm: scatter-gather messages sent before their receives are held", "[shm]") {
  SetCma(true);
  AddressPipe pipe;
  const size_t big = size_t{3} << 20;
  const pid_t child = ForkChild([&]() -> int {
    auto dev = MakeDevice(Options(pt::ProgressMode::kThread));
    auto cq = dev->CreateCompletionQueue();
    auto conn = dev->Connect(pipe.Receive(), cq.get());
    CHILD_CHECK(conn.ok());
    std::vector<uint8_t> whole(big);
    Fill(whole.data(), big, 1);
    // Three pieces (one empty) of a cross-memory message, then small and ring-streamed ones.
    const pt::ConstBuffer parts[3] = {
        {whole.data(), 10}, {whole.data() + 10, 0}, {whole.data() + 10, big - 10}};
    CHILD_CHECK((*conn)->PostSend(absl::MakeConstSpan(parts), 1).ok());
    std::vector<uint8_t> small(5);
    Fill(small.data(), small.size(), 2);
    const pt::ConstBuffer small_parts[2] = {{small.data(), 2}, {small.data() + 2, 3}};
    CHILD_CHECK((*conn)->PostSend(absl::MakeConstSpan(small_parts), 2).ok());
    CHILD_CHECK((*conn)->PostSend(pt::ConstBuffer{nullptr, 0}, 3).ok());
    for (int i = 0; i < 3; ++i) CHILD_CHECK(Next(*cq).status.ok());
    uint8_t bye;
    CHILD_CHECK((*conn)->PostRecv({&bye, 1}, 7).ok());
    CHILD_CHECK(Next(*cq).status.ok());
    return 0;
  });
  auto [dev, cq, conn] = AcceptChild(pipe, Options(pt::ProgressMode::kThread));
  absl::SleepFor(absl::Milliseconds(300));  // every message arrives before its receive
  std::vector<uint8_t> a(big + 100), b(100), c(8);
  REQUIRE(conn->PostRecv({a.data(), a.size()}, 10).ok());
  REQUIRE(conn->PostRecv({b.data(), b.size()}, 11).ok());
  REQUIRE(conn->PostRecv({c.data(), c.size()}, 12).ok());
  const size_t expect_bytes[3] = {big, 5, 0};
  for (uint64_t i = 0; i < 3; ++i) {
    pt::Completion done = Next(*cq);
    REQUIRE(done.status.ok());
    CHECK(done.wr_id == 10 + i);
    CHECK(done.bytes == expect_bytes[i]);
  }
  CHECK(Matches(a.data(), big, 1));
  CHECK(Matches(b.data(), 5, 2));
  uint8_t bye = 1;
  REQUIRE(conn->PostSend(pt::ConstBuffer{&bye, 1}, 9).ok());
  CHECK(Next(*cq).status.ok());
  CHECK(WaitChild(child) == 0);
}

TEST_CASE("shm: early messages wait in the ring while the sender has room, then are held",
          "[shm]") {
  // 1 MiB ring: 8 messages of 64 KiB fit and wait there for their receives (one copy); 48 more
  // (3 MiB) do not: the sender's sends still complete without a receive (the contract), because
  // the receiver holds what would block it.
  SetCma(true);
  AddressPipe pipe;
  constexpr size_t kBytes = 64 << 10;
  constexpr int kFirst = 8, kSecond = 48;
  const pid_t child = ForkChild([&]() -> int {
    auto dev = MakeDevice(Options(pt::ProgressMode::kThread));
    auto cq = dev->CreateCompletionQueue();
    auto conn = dev->Connect(pipe.Receive(), cq.get());
    CHILD_CHECK(conn.ok());
    std::vector<std::vector<uint8_t>> messages(kFirst + kSecond, std::vector<uint8_t>(kBytes));
    for (int i = 0; i < kFirst + kSecond; ++i) Fill(messages[i].data(), kBytes, 100 + i);
    for (int i = 0; i < kFirst + kSecond; ++i) {
      if (i == kFirst) {  // the first batch waits in the peer's ring; wait for its go
        uint8_t go;
        CHILD_CHECK((*conn)->PostRecv({&go, 1}, 500).ok());
        CHILD_CHECK(Next(*cq).status.ok());
      }
      CHILD_CHECK((*conn)->PostSend(pt::ConstBuffer{messages[i].data(), kBytes}, i).ok());
      if (i < kFirst) CHILD_CHECK(Next(*cq).status.ok());
    }
    // Every send of the second batch completes although no receive was posted for it.
    for (int i = 0; i < kSecond; ++i) CHILD_CHECK(Next(*cq).status.ok());
    uint8_t bye;
    CHILD_CHECK((*conn)->PostRecv({&bye, 1}, 501).ok());
    CHILD_CHECK(Next(*cq).status.ok());
    return 0;
  });
  auto [dev, cq, conn] = AcceptChild(pipe, Options(pt::ProgressMode::kThread));
  std::vector<std::vector<uint8_t>> got(kFirst + kSecond, std::vector<uint8_t>(kBytes + 1));
  auto receive = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      REQUIRE(conn->PostRecv({got[i].data(), got[i].size()}, i).ok());
    }
    for (int i = from; i < to; ++i) {
      pt::Completion done = Next(*cq);
      REQUIRE(done.status.ok());
      CHECK(done.wr_id == static_cast<uint64_t>(i));
      CHECK(done.bytes == kBytes);
      CHECK(Matches(got[i].data(), kBytes, 100 + i));
    }
  };
  absl::SleepFor(absl::Milliseconds(300));  // the first batch arrives before its receives
  auto stats = shm::GetConnectionStats(*conn);
  REQUIRE(stats.ok());
  CHECK(stats->ring_bytes_received == 0);  // read by nobody yet: it waits in the ring
  receive(0, kFirst);
  stats = shm::GetConnectionStats(*conn);
  REQUIRE(stats.ok());
  CHECK(stats->held_messages == 0);
  CHECK(stats->ring_bytes_received == kFirst * kBytes);

  uint8_t go = 1;
  REQUIRE(conn->PostSend(pt::ConstBuffer{&go, 1}, 900).ok());
  REQUIRE(Next(*cq).status.ok());
  absl::SleepFor(absl::Milliseconds(500));  // the second batch overflows the ring meanwhile
  stats = shm::GetConnectionStats(*conn);
  REQUIRE(stats.ok());
  CHECK(stats->held_messages > 0);
  receive(kFirst, kFirst + kSecond);
  uint8_t bye = 1;
  REQUIRE(conn->PostSend(pt::ConstBuffer{&bye, 1}, 901).ok());
  CHECK(Next(*cq).status.ok());
  CHECK(WaitChild(child) == 0);
}

TEST_CASE("shm: one-sided writes land in the peer's region, immediates in order", "[shm]") {
  const bool cma = GENERATE(true, false);
  SetCma(cma);
  INFO("cross-memory attach " << (cma ? "on" : "off"));
  constexpr size_t kRegion = size_t{8} << 20;
  constexpr size_t kMiB = size_t{1} << 20;
  AddressPipe pipe;
  const pid_t child = ForkChild([&]() -> int {
    auto dev = MakeDevice(Options(pt::ProgressMode::kCaller));
    auto cq = dev->CreateCompletionQueue();
    auto conn = dev->Connect(pipe.Receive(), cq.get());
    CHILD_CHECK(conn.ok());
    uint8_t encoded[pt::RegionHandle::kEncodedSize];
    CHILD_CHECK((*conn)->PostRecv({encoded, sizeof encoded}, 1).ok());
    CHILD_CHECK(Next(*cq).status.ok());
    auto handle = pt::RegionHandle::Decode(encoded);
    CHILD_CHECK(handle.ok());
    std::vector<uint8_t> local(kRegion);
    Fill(local.data(), 100, 1);
    Fill(local.data() + kMiB, 4 * kMiB, 2);
    Fill(local.data() + 6 * kMiB, 100, 3);
    auto region = dev->Register(local.data(), local.size());
    CHILD_CHECK(region.ok());
    const char hello[16] = "before writes";
    CHILD_CHECK((*conn)->PostSend(pt::ConstBuffer{hello, sizeof hello}, 10).ok());
    CHILD_CHECK((*conn)->PostWrite(**region, 0, 100, *handle, 3, std::nullopt, 11).ok());
    CHILD_CHECK((*conn)->PostWrite(**region, kMiB, 4 * kMiB, *handle, kMiB, 7u, 12).ok());
    CHILD_CHECK((*conn)->PostWrite(**region, 6 * kMiB, 100, *handle, 6 * kMiB, 8u, 13).ok());
    // Invalid arguments are refused at once.
    CHILD_CHECK((*conn)->PostWrite(**region, 0, 100, *handle, kRegion - 50, 1u, 14).code() ==
                absl::StatusCode::kOutOfRange);
    CHILD_CHECK(!(*conn)->PostWrite(**region, kRegion - 10, 100, *handle, 0, 1u, 15).ok());
    for (uint64_t id = 10; id <= 13; ++id) {
      pt::Completion c = Next(*cq);
      CHILD_CHECK(c.status.ok() && c.wr_id == id);
      CHILD_CHECK(c.opcode == (id == 10 ? pt::Opcode::kSend : pt::Opcode::kWrite));
    }
    uint8_t ok;
    CHILD_CHECK((*conn)->PostRecv({&ok, 1}, 2).ok());
    CHILD_CHECK(Next(*cq).status.ok());
    // A region the peer never registered: the write fails, and so does the connection.
    pt::RegionHandle stale = *handle;
    stale.id ^= 0x5555;
    CHILD_CHECK((*conn)->PostWrite(**region, 0, 10, stale, 0, std::nullopt, 16).ok());
    pt::Completion c = Next(*cq);
    CHILD_CHECK(c.wr_id == 16 && !c.status.ok());
    CHILD_CHECK(std::string(c.status.message()).find("unknown region") != std::string::npos);
    return 0;
  });
  auto [dev, cq, conn] = AcceptChild(pipe, Options(pt::ProgressMode::kThread));
  std::vector<uint8_t> target(kRegion, 0);
  auto region = dev->Register(target.data(), target.size());
  REQUIRE(region.ok());
  const auto encoded = (*region)->handle().Encode();
  char hello[16];
  REQUIRE(conn->PostRecv({hello, sizeof hello}, 20).ok());
  REQUIRE(conn->PostSend(pt::ConstBuffer{encoded.data(), encoded.size()}, 21).ok());
  std::vector<pt::Completion> seen;
  while (seen.size() < 3) {  // the write without an immediate raises nothing here
    pt::Completion c = Next(*cq);
    REQUIRE(c.status.ok());
    if (c.opcode != pt::Opcode::kSend) seen.push_back(c);
  }
  CHECK(seen[0].opcode == pt::Opcode::kRecv);
  CHECK(seen[1].opcode == pt::Opcode::kRemoteWrite);
  CHECK(seen[1].immediate == 7);
  CHECK(seen[1].has_immediate);
  CHECK(seen[1].bytes == 4 * kMiB);
  CHECK(seen[2].opcode == pt::Opcode::kRemoteWrite);
  CHECK(seen[2].immediate == 8);
  CHECK(Matches(target.data() + 3, 100, 1));
  CHECK(Matches(target.data() + kMiB, 4 * kMiB, 2));
  CHECK(Matches(target.data() + 6 * kMiB, 100, 3));
  CHECK(target[0] == 0);
  CHECK(target[103] == 0);
  const uint8_t ok = 1;
  REQUIRE(conn->PostSend(pt::ConstBuffer{&ok, 1}, 22).ok());
  // The child's write to an unknown region ends the connection on this side too.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (conn->status().ok() && absl::Now() < deadline) (void)cq->Wait(absl::Milliseconds(10));
  CHECK(conn->status().code() == absl::StatusCode::kNotFound);
  CHECK(WaitChild(child) == 0);
  SetCma(true);
}

TEST_CASE("shm: 64 concurrent connections between two processes", "[shm]") {
  SetCma(true);
  constexpr int kConns = 64;
  AddressPipe pipe;
  const pid_t child = ForkChild([&]() -> int {
    auto dev = MakeDevice(Options(pt::ProgressMode::kCaller));
    auto cq = dev->CreateCompletionQueue();
    const std::string address = pipe.Receive();
    std::vector<std::unique_ptr<pt::Connection>> conns;
    std::vector<std::vector<uint8_t>> out(kConns), in(kConns);
    for (int i = 0; i < kConns; ++i) {
      auto c = dev->Connect(address, cq.get());
      CHILD_CHECK(c.ok());
      conns.push_back(std::move(*c));
    }
    for (int i = 0; i < kConns; ++i) {
      out[i].resize(1000 + i * 997);
      in[i].resize(out[i].size());
      Fill(out[i].data(), out[i].size(), 500 + i);
      CHILD_CHECK(conns[i]->PostRecv({in[i].data(), in[i].size()}, i).ok());
      CHILD_CHECK(conns[i]->PostSend(pt::ConstBuffer{out[i].data(), out[i].size()}, 1000 + i).ok());
    }
    for (int n = 0; n < 2 * kConns; ++n) CHILD_CHECK(Next(*cq).status.ok());
    for (int i = 0; i < kConns; ++i) CHILD_CHECK(Matches(in[i].data(), in[i].size(), 500 + i));
    return 0;
  });
  auto dev = MakeDevice(Options(pt::ProgressMode::kThread));
  auto cq = dev->CreateCompletionQueue();
  auto listener = dev->Listen("");
  REQUIRE(listener.ok());
  pipe.Send((*listener)->address());
  std::vector<std::unique_ptr<pt::Connection>> conns;
  std::map<uint64_t, int> index;
  std::vector<std::vector<uint8_t>> bufs(kConns, std::vector<uint8_t>(1000 + kConns * 997));
  for (int i = 0; i < kConns; ++i) {
    auto c = (*listener)->Accept(cq.get(), absl::Seconds(10));
    REQUIRE(c.ok());
    index[(*c)->id()] = i;
    REQUIRE((*c)->PostRecv({bufs[i].data(), bufs[i].size()}, i).ok());
    conns.push_back(std::move(*c));
  }
  int echoed = 0, sent = 0;
  while (echoed < kConns || sent < kConns) {
    pt::Completion c = Next(*cq);
    REQUIRE(c.status.ok());
    if (c.opcode == pt::Opcode::kSend) {
      ++sent;
      continue;
    }
    const int i = index.at(c.connection_id);
    CHECK(c.bytes == size_t(1000 + i * 997));
    CHECK(Matches(bufs[i].data(), c.bytes, 500 + i));
    REQUIRE(conns[i]->PostSend(pt::ConstBuffer{bufs[i].data(), c.bytes}, 100 + i).ok());
    ++echoed;
  }
  CHECK(WaitChild(child) == 0);
}

TEST_CASE("shm: a peer killed mid-transfer fails every outstanding operation", "[shm]") {
  SetCma(true);
  const absl::Duration op_timeout = absl::Seconds(5);
  const bool kill_receiver = GENERATE(true, false);
  INFO((kill_receiver ? "the receiver" : "the sender") << " is killed");
  AddressPipe pipe;
  const size_t msg = size_t{8} << 20;
  const pid_t child = ForkChild([&]() -> int {
    auto dev = MakeDevice(Options(pt::ProgressMode::kThread, op_timeout));
    auto cq = dev->CreateCompletionQueue();
    auto conn = dev->Connect(pipe.Receive(), cq.get());
    CHILD_CHECK(conn.ok());
    std::vector<uint8_t> buf(msg, 0x5a);
    for (uint64_t i = 0;; ++i) {  // until killed
      if (kill_receiver) {
        CHILD_CHECK((*conn)->PostRecv({buf.data(), buf.size()}, i).ok());
      } else {
        CHILD_CHECK((*conn)->PostSend(pt::ConstBuffer{buf.data(), buf.size()}, i).ok());
      }
      CHILD_CHECK(Next(*cq).status.ok());
    }
  });
  auto [dev, cq, conn] = AcceptChild(pipe, Options(pt::ProgressMode::kThread, op_timeout));
  std::vector<uint8_t> buf(msg, 0xa5);
  constexpr int kOps = 400;
  for (int i = 0; i < kOps; ++i) {
    if (kill_receiver) {
      REQUIRE(conn->PostSend(pt::ConstBuffer{buf.data(), buf.size()}, i).ok());
    } else {
      REQUIRE(conn->PostRecv({buf.data(), buf.size()}, i).ok());
    }
  }
  uint8_t never[8];
  if (kill_receiver) REQUIRE(conn->PostRecv({never, sizeof never}, kOps).ok());
  const int outstanding = kill_receiver ? kOps + 1 : kOps;
  pt::Completion first = Next(*cq);
  REQUIRE(first.status.ok());  // the transfer is under way
  REQUIRE(::kill(child, SIGKILL) == 0);
  const absl::Time killed = absl::Now();
  int failed = 0;
  for (int n = 1; n < outstanding; ++n) {
    pt::Completion c = Next(*cq, op_timeout);
    REQUIRE(c.wr_id != ~uint64_t{0});  // a completion came
    if (!c.status.ok()) {
      ++failed;
      CHECK(c.status.code() == absl::StatusCode::kUnavailable);
    }
  }
  const absl::Duration took = absl::Now() - killed;
  CHECK(failed > 0);
  CHECK(took < op_timeout);
  CHECK_FALSE(conn->status().ok());
  CHECK(std::string(conn->status().message()).find("died") != std::string::npos);
  CHECK(WaitChild(child) == -SIGKILL);
}

TEST_CASE("shm: a stalled peer fails operations after op_timeout", "[shm]") {
  SetCma(true);
  AddressPipe pipe;
  const pid_t child = ForkChild([&]() -> int {
    // Caller-driven progress that nobody drives: the peer is alive but never reads.
    auto dev = MakeDevice(Options(pt::ProgressMode::kCaller));
    auto cq = dev->CreateCompletionQueue();
    auto conn = dev->Connect(pipe.Receive(), cq.get());
    CHILD_CHECK(conn.ok());
    absl::SleepFor(absl::Seconds(60));
    return 0;
  });
  const absl::Duration op_timeout = absl::Seconds(1);
  auto [dev, cq, conn] = AcceptChild(pipe, Options(pt::ProgressMode::kThread, op_timeout));
  std::vector<uint8_t> buf(size_t{4} << 20);
  const absl::Time start = absl::Now();
  REQUIRE(conn->PostSend(pt::ConstBuffer{buf.data(), buf.size()}, 1).ok());
  REQUIRE(conn->PostSend(pt::ConstBuffer{buf.data(), 100}, 2).ok());
  REQUIRE(conn->PostRecv({buf.data(), buf.size()}, 3).ok());
  for (int n = 0; n < 3; ++n) {
    pt::Completion c = Next(*cq, absl::Seconds(5));
    REQUIRE(c.wr_id != ~uint64_t{0});
    // The small message fits the ring, so its send is done; the bulk one waits for the peer
    // to pull it, and the receive for a message that never comes.
    if (c.wr_id == 2) continue;
    CHECK(c.status.code() == absl::StatusCode::kDeadlineExceeded);
  }
  const absl::Duration took = absl::Now() - start;
  CHECK(took >= op_timeout);
  CHECK(took < op_timeout + absl::Seconds(2));
  ::kill(child, SIGKILL);
  WaitChild(child);
}

TEST_CASE("shm: corrupted frames from a hostile peer close the connection", "[shm]") {
  const int variant = GENERATE(range(0, 9));
  INFO("corruption variant " << variant);
  auto dev = MakeDevice(Options(pt::ProgressMode::kThread));
  auto cq = dev->CreateCompletionQueue();
  auto listener = dev->Listen("");
  REQUIRE(listener.ok());
  auto bell = shm::CreateDoorbell();
  REQUIRE(bell.ok());
  absl::StatusOr<shm::Session> rogue = absl::UnknownError("not run");
  std::thread t([&] {
    shm::HandshakeOptions h;
    h.ring_bytes = size_t{1} << 20;
    rogue = shm::ConnectSession((*listener)->address(), bell->fd.get(), h);
  });
  auto conn = (*listener)->Accept(cq.get(), absl::Seconds(10));
  t.join();
  REQUIRE(conn.ok());
  REQUIRE(rogue.ok());
  std::vector<uint8_t> buf(1 << 16);
  REQUIRE((*conn)->PostRecv({buf.data(), buf.size()}, 1).ok());

  shm::Ring& tx = rogue->tx;
  shm::FrameHeader h;
  uint8_t header[shm::kFrameHeaderBytes];
  uint64_t head = 0;
  auto put_header = [&](const shm::FrameHeader& fh, uint64_t advance) {
    shm::EncodeFrameHeader(fh, header);
    tx.CopyIn(0, header, sizeof header);
    head = advance;
  };
  absl::StatusCode expect = absl::StatusCode::kDataLoss;
  switch (variant) {
    case 0: {  // garbage: bad magic
      std::vector<uint8_t> junk(64, 0xab);
      tx.CopyIn(0, junk.data(), junk.size());
      head = 64;
      break;
    }
    case 1:  // unknown type
      put_header(h, shm::kFrameHeaderBytes);
      header[2] = 42;
      tx.CopyIn(0, header, sizeof header);
      break;
    case 2:  // payload longer than the ring
      h.total_bytes = h.payload_bytes = (1 << 20) - 8;
      put_header(h, shm::kFrameHeaderBytes);
      break;
    case 3:  // truncated: announces 1000 bytes, publishes 16
      h.total_bytes = h.payload_bytes = 1000;
      put_header(h, shm::kFrameHeaderBytes + 16);
      break;
    case 4:  // head far beyond the ring
      put_header(h, uint64_t{3} << 20);
      break;
    case 5:  // a message part with no message
      h.type = shm::FrameType::kMessagePart;
      h.total_bytes = 100;
      h.offset = 50;
      h.payload_bytes = 8;
      put_header(h, shm::FrameFootprint(8));
      break;
    case 6:  // over max_message_bytes
      h.total_bytes = size_t{2} << 30;
      h.payload_bytes = 8;
      put_header(h, shm::FrameFootprint(8));
      break;
    case 7:  // half a header
      put_header(h, 20);
      break;
    case 8:  // a write into a region that does not exist
      h.type = shm::FrameType::kWrite;
      h.region_id = 12345;
      h.total_bytes = h.payload_bytes = 8;
      put_header(h, shm::FrameFootprint(8));
      expect = absl::StatusCode::kNotFound;
      break;
  }
  tx.StoreHead(head);
  rogue->peer_doorbell.Ring();
  pt::Completion c = Next(*cq, absl::Seconds(5));
  REQUIRE(c.wr_id == 1);
  CHECK(c.status.code() == expect);
  CHECK((*conn)->status().code() == expect);
  INFO("error: " << std::string(c.status.message()));
  CHECK((*conn)->PostRecv({buf.data(), buf.size()}, 2).code() ==
        absl::StatusCode::kFailedPrecondition);
  // The backend told the hostile peer why, with an error close frame.
  shm::Ring& rx = rogue->rx;
  REQUIRE(rx.LoadHead() >= shm::kFrameHeaderBytes);
  uint8_t back[shm::kFrameHeaderBytes];
  rx.CopyOut(0, back, sizeof back);
  auto close = shm::DecodeFrameHeader(back, {1 << 20, 1 << 20});
  REQUIRE(close.ok());
  CHECK(close->type == shm::FrameType::kClose);
  CHECK((close->flags & shm::kFlagError) != 0);
}

TEST_CASE("shm: handshake mismatches are rejected with an error", "[shm]") {
  auto dev = MakeDevice(Options(pt::ProgressMode::kThread));
  auto cq = dev->CreateCompletionQueue();
  auto listener = dev->Listen("");
  REQUIRE(listener.ok());
  auto bell = shm::CreateDoorbell();
  REQUIRE(bell.ok());
  const bool bad_version = GENERATE(true, false);
  absl::StatusOr<shm::Session> rogue = absl::UnknownError("not run");
  std::thread t([&] {
    shm::HandshakeOptions h;
    h.ring_bytes = size_t{1} << 20;
    if (bad_version) {
      h.version = 99;
    } else {
      h.magic = 0x12345678;
    }
    rogue = shm::ConnectSession((*listener)->address(), bell->fd.get(), h);
  });
  // The listener refuses the connector, tells it why, and keeps listening: Accept reports the
  // refusal when its own timeout passes with no good connector.
  auto conn = (*listener)->Accept(cq.get(), absl::Seconds(2));
  t.join();
  REQUIRE_FALSE(conn.ok());
  CHECK(absl::IsDeadlineExceeded(conn.status()));
  REQUIRE_FALSE(rogue.ok());
  const std::string word = bad_version ? "version" : "magic";
  CHECK(std::string(conn.status().message()).find(word) != std::string::npos);
  CHECK(std::string(rogue.status().message()).find(word) != std::string::npos);
}

TEST_CASE("shm: connecting to an address with no listener names it", "[shm]") {
  auto dev = MakeDevice(Options(pt::ProgressMode::kCaller));
  auto cq = dev->CreateCompletionQueue();
  auto conn = dev->Connect("plexus-shm-nobody-listens-here", cq.get());
  REQUIRE_FALSE(conn.ok());
  CHECK(conn.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(conn.status().message()).find("plexus-shm-nobody-listens-here") !=
        std::string::npos);
  auto listener = dev->Listen("plexus-shm-test-taken");
  REQUIRE(listener.ok());
  CHECK((*listener)->address() == "plexus-shm-test-taken");
  CHECK(dev->Listen("plexus-shm-test-taken").status().code() == absl::StatusCode::kAlreadyExists);
  CHECK((*listener)->Accept(cq.get(), absl::Milliseconds(20)).status().code() ==
        absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("shm: both ends' mappings of a connection's rings are faulted in when it is made",
          "[shm]") {
  // Resident memory per mapping of the connection file in this process (both ends live here):
  // every page of each mapping is already mapped before any frame is sent.
  auto resident = [] {
    std::vector<std::pair<uint64_t, uint64_t>> sizes;  // (Size, Rss) in kB
    std::FILE* f = std::fopen("/proc/self/smaps", "r");
    REQUIRE(f != nullptr);
    char line[512];
    bool ours = false;
    while (std::fgets(line, sizeof line, f) != nullptr) {
      unsigned long long kb = 0, from = 0, to = 0;
      if (std::sscanf(line, "%llx-%llx ", &from, &to) == 2) {  // a mapping's first line
        ours = std::strstr(line, "plexus-shm-connection") != nullptr;
      } else if (ours && std::sscanf(line, "Size: %llu kB", &kb) == 1) {
        sizes.emplace_back(kb, 0);
      } else if (ours && std::sscanf(line, "Rss: %llu kB", &kb) == 1) {
        sizes.back().second = kb;
      }
    }
    std::fclose(f);
    return sizes;
  };
  LocalPair p = MakeLocalPair(pt::ProgressMode::kCaller);
  const auto sizes = resident();
  REQUIRE(sizes.size() == 2);
  for (const auto& [size, rss] : sizes) {
    INFO("mapping of " << size << " kB");
    CHECK(size > 0);
    CHECK(rss == size);
  }
}

TEST_CASE("shm: faulting in a peer's file allocates nothing; at most the first 64 MiB", "[shm]") {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto blocks = [](int fd) {  // 512-byte blocks the file holds
    struct stat st {};
    REQUIRE(::fstat(fd, &st) == 0);
    return static_cast<size_t>(st.st_blocks);
  };
  // A peer's file with three pages written: reading every page maps those three, allocates none.
  const int fd = ::memfd_create("plexus-shm-test-peer-file", 0);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 256 * page) == 0);
  {
    auto writer = shm::MapShared(fd, 256 * page, "the test file");
    REQUIRE(writer.ok());
    for (size_t p : {0, 7, 200}) writer->data()[p * page] = 1;
  }
  const size_t written = blocks(fd);
  CHECK(written == 3 * page / 512);
  auto reader = shm::MapShared(fd, 256 * page, "the test file");
  REQUIRE(reader.ok());
  shm::FaultInPeerFile(*reader);
  CHECK(blocks(fd) == written);
  ::close(fd);
  // Our own fresh file: every page up to the limit, none beyond.
  const size_t big = shm::kFaultInLimit + 64 * page;
  const int own = ::memfd_create("plexus-shm-test-own-file", 0);
  REQUIRE(own >= 0);
  REQUIRE(::ftruncate(own, static_cast<off_t>(big)) == 0);
  auto mine = shm::MapShared(own, big, "the test file");
  REQUIRE(mine.ok());
  shm::FaultInOwnFile(*mine);
  CHECK(blocks(own) == shm::kFaultInLimit / 512);
  ::close(own);
}

TEST_CASE("shm: Close cancels outstanding operations and the peer learns of it", "[shm]") {
  LocalPair p = MakeLocalPair();
  uint8_t a[16], b[16];
  REQUIRE(p.ca->PostRecv({a, sizeof a}, 1).ok());
  REQUIRE(p.ca->PostRecv({a, sizeof a}, 2).ok());
  REQUIRE(p.cb->PostRecv({b, sizeof b}, 3).ok());
  p.ca->Close();
  p.ca->Close();  // idempotent
  for (uint64_t id = 1; id <= 2; ++id) {
    pt::Completion c = Next(*p.cqa, absl::Seconds(2));
    CHECK(c.wr_id == id);
    CHECK(c.status.code() == absl::StatusCode::kCancelled);
  }
  pt::Completion c = Next(*p.cqb, absl::Seconds(2));
  CHECK(c.wr_id == 3);
  CHECK(c.status.code() == absl::StatusCode::kAborted);  // a deliberate close
  CHECK_FALSE(p.cb->PostSend(pt::ConstBuffer{b, 1}, 4).ok());
}

TEST_CASE("shm: a message longer than its receive fails it and closes the connection", "[shm]") {
  LocalPair p = MakeLocalPair(pt::ProgressMode::kCaller);
  uint8_t small[10], big[100] = {};
  REQUIRE(p.ca->PostRecv({small, sizeof small}, 1).ok());
  REQUIRE(p.cb->PostSend(pt::ConstBuffer{big, sizeof big}, 2).ok());
  pt::Completion c = Next(*p.cqa, absl::Seconds(2));
  CHECK(c.wr_id == 1);
  CHECK(c.status.code() == absl::StatusCode::kResourceExhausted);
  CHECK_FALSE(p.ca->status().ok());
}
