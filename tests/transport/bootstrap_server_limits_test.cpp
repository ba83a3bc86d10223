// TcpStoreServer bounds what clients can make it hold: a client limit, an idle timeout and a cap
// on input buffered across clients; and a server of one job refuses clients of another.
#include <catch2/catch.hpp>

#include <poll.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bootstrap/store_protocol.hpp"
#include "plexus/base/net.hpp"
#include "plexus/transport/store.hpp"
#include "support/loopback.hpp"
#include "support/process_stats.hpp"

namespace pt = plexus::transport;
namespace net = plexus::base::net;
namespace proto = plexus::transport::store_protocol;
using plexus::testing::Loopback;
using plexus::testing::RawConnect;
using plexus::testing::ReadUntilClosed;
using plexus::testing::SecondsSince;
using plexus::testing::WaitFor;
using Clock = std::chrono::steady_clock;

namespace {

struct EnvVar {
  EnvVar(const char* name, const char* value) : name(name) { setenv(name, value, 1); }
  ~EnvVar() { unsetenv(name); }
  const char* name;
};

}  // namespace

TEST_CASE("store server: limits come from the options, else the environment, else defaults") {
  {
    auto server = pt::TcpStoreServer::Start("127.0.0.1:0");
    REQUIRE(server.ok());
    CHECK((*server)->max_clients() == 4096);
    CHECK((*server)->idle_timeout() == absl::Minutes(10));
    CHECK((*server)->max_buffered_bytes() == (uint64_t{1} << 30));
    CHECK((*server)->max_store_bytes() == (uint64_t{256} << 20));
  }
  EnvVar clients("PLEXUS_STORE_MAX_CLIENTS", "7");
  EnvVar idle("PLEXUS_STORE_IDLE_TIMEOUT", "45s");
  EnvVar buffered("PLEXUS_STORE_MAX_BUFFERED", "512M");
  EnvVar stored("PLEXUS_STORE_MAX_BYTES", "1G");
  {
    auto server = pt::TcpStoreServer::Start("127.0.0.1:0");
    REQUIRE(server.ok());
    CHECK((*server)->max_clients() == 7);
    CHECK((*server)->idle_timeout() == absl::Seconds(45));
    CHECK((*server)->max_buffered_bytes() == (uint64_t{512} << 20));
    CHECK((*server)->max_store_bytes() == (uint64_t{1} << 30));
  }
  {
    pt::TcpStoreServer::Options options;
    options.max_clients = 3;
    options.idle_timeout = absl::InfiniteDuration();
    options.max_buffered_bytes = uint64_t{256} << 20;
    options.max_store_bytes = uint64_t{128} << 20;
    auto server = pt::TcpStoreServer::Start("127.0.0.1:0", options);
    REQUIRE(server.ok());
    CHECK((*server)->max_store_bytes() == (uint64_t{128} << 20));
    CHECK((*server)->max_clients() == 3);
    CHECK((*server)->idle_timeout() == absl::InfiniteDuration());
    CHECK((*server)->max_buffered_bytes() == (uint64_t{256} << 20));
  }
  {
    EnvVar bad("PLEXUS_STORE_MAX_CLIENTS", "lots");
    auto server = pt::TcpStoreServer::Start("127.0.0.1:0");
    REQUIRE(absl::IsInvalidArgument(server.status()));
    CHECK(std::string(server.status().message()).find("PLEXUS_STORE_MAX_CLIENTS") !=
          std::string::npos);
  }
  pt::TcpStoreServer::Options zero;
  zero.max_clients = 0;
  CHECK(absl::IsInvalidArgument(pt::TcpStoreServer::Start("127.0.0.1:0", zero).status()));
  pt::TcpStoreServer::Options tiny;
  tiny.max_buffered_bytes = 1 << 20;  // less than one maximal frame
  CHECK(absl::IsInvalidArgument(pt::TcpStoreServer::Start("127.0.0.1:0", tiny).status()));
  pt::TcpStoreServer::Options small_store;
  small_store.max_store_bytes = 1 << 20;  // less than one maximal value
  auto refused = pt::TcpStoreServer::Start("127.0.0.1:0", small_store);
  REQUIRE(absl::IsInvalidArgument(refused.status()));
  CHECK(std::string(refused.status().message()).find("PLEXUS_STORE_MAX_BYTES") !=
        std::string::npos);
}

TEST_CASE("store server: Sets beyond the byte cap are refused and memory stays flat") {
  // The default cap (256 MiB): 20 Sets of 64 MiB used to keep all 1.25 GiB.
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0");
  REQUIRE(server.ok());
  const uint64_t cap = (*server)->max_store_bytes();
  auto store = pt::TcpStore::Connect(Loopback(**server), absl::Seconds(5));
  REQUIRE(store.ok());
  const std::string value(size_t{64} << 20, 'v');
  const int64_t baseline = plexus::testing::ProcStatusBytes("VmRSS");
  REQUIRE(baseline > 0);
  int stored = 0;
  absl::Status refusal;
  for (int i = 0; i < 20; ++i) {
    const absl::Status s = (*store)->Set(absl::StrCat("blob/", i), value);
    if (s.ok()) {
      ++stored;
      continue;
    }
    refusal = s;
    CHECK(absl::IsResourceExhausted(s));
  }
  const int64_t grown = plexus::testing::ProcStatusBytes("VmRSS") - baseline;
  INFO("RSS growth " << (grown >> 20) << " MiB, cap " << (cap >> 20) << " MiB; " << refusal);
  CHECK(stored == 3);  // a 4th 64 MiB value and its key would pass 256 MiB
  CHECK((*server)->stored_bytes() <= cap);
  CHECK(grown < static_cast<int64_t>(cap + (uint64_t{160} << 20)));
  const std::string message(refusal.message());
  for (const std::string& word :
       {std::string("key 'blob/19'"), absl::StrCat(value.size(), " bytes"),
        absl::StrCat("cap of ", cap), std::string("PLEXUS_STORE_MAX_BYTES")}) {
    CHECK(message.find(word) != std::string::npos);
  }
  // The store still serves, and room comes back when keys go.
  REQUIRE((*store)->Set("small", "ok").ok());
  REQUIRE(*(*store)->Delete("blob/0"));
  CHECK((*store)->Set("blob/again", value).ok());
  auto counter = (*store)->Add("n", 1);
  REQUIRE(counter.ok());
}

TEST_CASE("store server: connections beyond the client limit are refused and closed") {
  pt::TcpStoreServer::Options options;
  options.max_clients = 3;
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0", options);
  REQUIRE(server.ok());
  auto good = pt::TcpStore::Connect(Loopback(**server), absl::Seconds(5));
  REQUIRE(good.ok());
  std::vector<int> held = {RawConnect((*server)->port()), RawConnect((*server)->port())};
  REQUIRE(WaitFor([&] { return (*server)->connected_clients() == 3; }, std::chrono::seconds(5)));
  for (int i = 0; i < 4; ++i) {
    const int fd = RawConnect((*server)->port());
    auto reply = ReadUntilClosed(fd, std::chrono::seconds(5));
    close(fd);
    REQUIRE(reply.has_value());
    // The refusal is a Hello answer, so a TcpStore client can say why.
    auto size = proto::PeekFrame(
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(reply->data()), reply->size()));
    REQUIRE(size.ok());
    REQUIRE(*size == reply->size());
    auto response = proto::DecodeResponse(
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(reply->data()) + proto::kHeaderBytes,
                            reply->size() - proto::kHeaderBytes));
    REQUIRE(response.ok());
    CHECK(response->code == proto::Code::kBusy);
    CHECK(response->value.find("PLEXUS_STORE_MAX_CLIENTS") != std::string::npos);
  }
  CHECK((*server)->refused_clients() == 4);
  CHECK((*server)->connected_clients() == 3);
  auto refused = pt::TcpStore::Connect(Loopback(**server), absl::Seconds(5));
  REQUIRE(absl::IsResourceExhausted(refused.status()));
  CHECK(std::string(refused.status().message()).find("limit") != std::string::npos);
  // The client already in is served on; a slot that frees up is usable again.
  REQUIRE((*good)->Set("k", "v").ok());
  CHECK(*(*good)->Get("k", absl::Seconds(1)) == "v");
  close(held.back());
  held.pop_back();
  REQUIRE(WaitFor([&] { return (*server)->connected_clients() == 2; }, std::chrono::seconds(5)));
  auto later = pt::TcpStore::Connect(Loopback(**server), absl::Seconds(5));
  REQUIRE(later.ok());
  CHECK(*(*later)->Get("k", absl::Seconds(1)) == "v");
  for (int fd : held) close(fd);
}

TEST_CASE("store server: idle clients are closed after the idle timeout, waiters are not") {
  pt::TcpStoreServer::Options options;
  options.idle_timeout = absl::Milliseconds(400);
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0", options);
  REQUIRE(server.ok());

  const int silent = RawConnect((*server)->port());
  const int partial = RawConnect((*server)->port());
  const std::string header = proto::EncodeRequest([] {
    proto::Request r;
    r.op = proto::Op::kSet;
    r.keys = {"x"};
    r.value = "y";
    return r;
  }());
  REQUIRE(send(partial, header.data(), 6, MSG_NOSIGNAL) == 6);  // a frame that never ends
  const auto start = Clock::now();
  CHECK(ReadUntilClosed(silent, std::chrono::milliseconds(1500)).has_value());
  const double closed_after = SecondsSince(start);
  CHECK(closed_after >= 0.35);
  CHECK(closed_after <= 0.4 * 1.25 + 0.5);
  CHECK(ReadUntilClosed(partial, std::chrono::milliseconds(1500)).has_value());
  close(silent);
  close(partial);

  CHECK((*server)->dropped_clients() == 2);
  // A Get parked longer than the idle timeout is a request in service, not idleness.
  auto store = pt::TcpStore::Connect(Loopback(**server), absl::Seconds(5));
  REQUIRE(store.ok());
  REQUIRE((*store)->Set("k", "v").ok());
  const auto parked = Clock::now();
  auto missing = (*store)->Get("never", absl::Milliseconds(1200));
  CHECK(absl::IsDeadlineExceeded(missing.status()));
  CHECK(SecondsSince(parked) >= 1.1);
  CHECK((*server)->dropped_clients() == 2);
  // Left idle, the client's connection is closed; its next call opens a new one. The server
  // counts the drop before it forgets the connection: both are waited for.
  REQUIRE(WaitFor([&] { return (*server)->dropped_clients() == 3; }, std::chrono::seconds(3)));
  CHECK(WaitFor([&] { return (*server)->connected_clients() == 0; }, std::chrono::seconds(1)));
  auto value = (*store)->Get("k", absl::Seconds(1));
  REQUIRE(value.ok());
  CHECK(*value == "v");
}

TEST_CASE("store server: clients sending huge partial requests stay under the memory cap") {
  constexpr uint64_t kCap = uint64_t{192} << 20;
  constexpr size_t kPartial = size_t{60} << 20;
  constexpr int kClients = 6;
  pt::TcpStoreServer::Options options;
  options.max_buffered_bytes = kCap;
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0", options);
  REQUIRE(server.ok());
  auto good = pt::TcpStore::Connect(Loopback(**server), absl::Seconds(5));
  REQUIRE(good.ok());

  const int64_t baseline = plexus::testing::ProcStatusBytes("VmRSS");
  REQUIRE(baseline > 0);
  std::atomic<bool> sampling{true};
  std::atomic<int64_t> peak{baseline};
  std::thread sampler([&] {
    while (sampling.load()) {
      const int64_t rss = plexus::testing::ProcStatusBytes("VmRSS");
      if (rss > peak.load()) peak = rss;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  // Each client announces a maximal Set and sends 60 MiB of it, from one shared chunk (so that
  // the test's own memory does not grow), one client after the other.
  std::string head(proto::kHeaderBytes, '\0');
  const uint32_t magic = proto::kMagic;
  const uint32_t body = static_cast<uint32_t>(proto::kMaxBodyBytes);
  std::memcpy(head.data(), &magic, 4);
  std::memcpy(head.data() + 4, &body, 4);
  const std::string chunk(1 << 20, 'z');
  // A legitimate client's small requests get through while the store is at its cap.
  std::atomic<bool> flooding{true};
  std::atomic<int> good_failures{0};
  std::atomic<int> good_calls{0};
  std::thread legit([&] {
    while (flooding.load()) {
      if (!(*good)->Set("live", "yes").ok()) ++good_failures;
      ++good_calls;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::vector<int> fds;
  int cut_off = 0;
  for (int c = 0; c < kClients; ++c) {
    const int fd = RawConnect((*server)->port());
    fds.push_back(fd);
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    bool ok = net::SendAll(fd, head.data(), head.size(), deadline).ok();
    for (size_t sent = 0; ok && sent < kPartial; sent += chunk.size()) {
      ok = net::SendAll(fd, chunk.data(), chunk.size(), deadline).ok();
    }
    if (!ok) ++cut_off;
  }
  flooding = false;
  legit.join();
  CHECK(good_failures.load() == 0);
  CHECK(good_calls.load() > 0);
  // Whatever was sent is in the server (or it dropped the sender).
  const size_t survivors_bytes = 3 * (kPartial + proto::kHeaderBytes);
  REQUIRE(WaitFor([&] { return (*server)->buffered_bytes() == survivors_bytes; },
                  std::chrono::seconds(10)));
  sampling = false;
  sampler.join();
  const int64_t grown = peak.load() - baseline;
  INFO("peak RSS growth " << (grown >> 20) << " MiB, cap " << (kCap >> 20) << " MiB");
  // Three 60 MiB requests fit in 192 MiB; each time a 4th would not, the client holding the most
  // was dropped: three in all (the old server held all six: 360 MiB).
  CHECK((*server)->dropped_clients() == 3);
  CHECK(cut_off <= 3);
  CHECK(grown < static_cast<int64_t>(kCap + (size_t{48} << 20)));
  // A legitimate client is served on.
  REQUIRE((*good)->Set("after", "ok").ok());
  CHECK(*(*good)->Get("after", absl::Seconds(1)) == "ok");
  for (int fd : fds) close(fd);
  REQUIRE(WaitFor([&] { return (*server)->buffered_bytes() == 0; }, std::chrono::seconds(5)));
}

TEST_CASE("store server of a job refuses clients of another job without naming its own") {
  pt::TcpStoreServer::Options options;
  options.job_id = "job-A";
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0", options);
  REQUIRE(server.ok());
  auto other =
      pt::TcpStore::Connect(Loopback(**server), absl::Seconds(5), absl::Seconds(5), "job-B");
  REQUIRE(absl::IsFailedPrecondition(other.status()));
  const std::string message(other.status().message());
  CHECK(message.find("job-A") == std::string::npos);  // it would simply reconnect with it
  CHECK(message.find("job whose id differs") != std::string::npos);
  CHECK(message.find("is job 'job-B'") != std::string::npos);
  CHECK(message.find("PLEXUS_JOB_ID") != std::string::npos);
  auto none = pt::TcpStore::Connect(Loopback(**server), absl::Seconds(5));
  REQUIRE(absl::IsFailedPrecondition(none.status()));
  CHECK(std::string(none.status().message()).find("names no job id") != std::string::npos);
  CHECK(std::string(none.status().message()).find("job-A") == std::string::npos);
  CHECK((*server)->refused_clients() == 2);
  auto mine =
      pt::TcpStore::Connect(Loopback(**server), absl::Seconds(5), absl::Seconds(5), "job-A");
  REQUIRE(mine.ok());
  CHECK((*mine)->server_job_id() == "job-A");
  CHECK_FALSE((*mine)->server_job_id_is_nonce());
  REQUIRE((*mine)->Set("k", "v").ok());
  // A connection that skips its Hello cannot bypass the check.
  const int raw = RawConnect((*server)->port());
  proto::Request get;
  get.op = proto::Op::kGet;
  get.keys = {"k"};
  const std::string frame = proto::EncodeRequest(get);
  REQUIRE(send(raw, frame.data(), frame.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(frame.size()));
  auto reply = ReadUntilClosed(raw, std::chrono::seconds(5));
  close(raw);
  REQUIRE(reply.has_value());
  CHECK(reply->empty());  // dropped, the value not sent

  pt::TcpStoreServer::Options nonce_options;
  nonce_options.job_id = "nonce-0123";
  nonce_options.job_id_is_nonce = true;
  auto nonce_server = pt::TcpStoreServer::Start("127.0.0.1:0", nonce_options);
  REQUIRE(nonce_server.ok());
  auto learner = pt::TcpStore::Connect(Loopback(**nonce_server), absl::Seconds(5));
  REQUIRE(learner.ok());
  CHECK((*learner)->server_job_id() == "nonce-0123");
  CHECK((*learner)->server_job_id_is_nonce());
  CHECK(absl::IsFailedPrecondition(
      pt::TcpStore::Connect(Loopback(**nonce_server), absl::Seconds(5), absl::Seconds(5), "job-B")
          .status()));
}

TEST_CASE("a client whose server was replaced by another job's is refused, not served") {
  pt::TcpStoreServer::Options a;
  a.job_id = "job-A";
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0", a);
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();
  auto store =
      pt::TcpStore::Connect(Loopback(**server), absl::Seconds(5), absl::Seconds(5), "job-A");
  REQUIRE(store.ok());
  REQUIRE((*store)->Set("k", "from A").ok());
  server->reset();  // job A's rank 0 exits; job B's rank 0 takes the port
  pt::TcpStoreServer::Options b;
  b.job_id = "job-B";
  auto replacement = pt::TcpStoreServer::Start(absl::StrCat("127.0.0.1:", port), b);
  REQUIRE(replacement.ok());
  for (int i = 0; i < 2; ++i) {
    auto got = (*store)->Get("k", absl::Milliseconds(100));
    REQUIRE(absl::IsFailedPrecondition(got.status()));
    CHECK(std::string(got.status().message()).find("is job 'job-A'") != std::string::npos);
    CHECK(std::string(got.status().message()).find("job-B") == std::string::npos);
  }
}
