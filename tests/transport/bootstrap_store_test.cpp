// TcpStore (server and client) and FileStore: semantics, concurrency across threads and
// processes, failures of either side, and hostile input to the server.
#include <catch2/catch.hpp>

#include <poll.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bootstrap/store_protocol.hpp"
#include "bootstrap_test_util.hpp"
#include "plexus/base/net.hpp"
#include "plexus/tooling/launch.hpp"
#include "plexus/transport/store.hpp"
#include "support/loopback.hpp"

namespace pt = plexus::transport;
namespace net = plexus::base::net;
using plexus::testing::Child;
using plexus::testing::FreePort;
using plexus::testing::Loopback;
using plexus::testing::MakeTempDir;
using plexus::testing::RawConnect;
using plexus::testing::RemoveTree;
using plexus::testing::SecondsSince;
using Clock = std::chrono::steady_clock;

namespace {

// Null on failure (callers check; Catch2 assertions are not allowed off the main thread).
std::unique_ptr<pt::TcpStore> TryConnect(const std::string& address) {
  auto store = pt::TcpStore::Connect(address, absl::Seconds(10));
  if (!store.ok()) return nullptr;
  return *std::move(store);
}

// The address a store server child process writes to `file` once it listens (bounded wait).
std::string AddressWrittenTo(const std::string& file) {
  std::string address;
  REQUIRE(
      plexus::testing::WaitFor([&] { return !(address = plexus::testing::ReadFile(file)).empty(); },
                               std::chrono::seconds(5)));
  return address;
}

std::unique_ptr<pt::TcpStore> MustConnect(const std::string& address) {
  auto store = TryConnect(address);
  REQUIRE(store != nullptr);
  return store;
}

// Exercises the Store contract on any implementation.
void CheckBasicSemantics(pt::Store& store) {
  REQUIRE(store.Set("alpha", "one").ok());
  auto v = store.Get("alpha", absl::Seconds(1));
  REQUIRE(v.ok());
  CHECK(*v == "one");
  REQUIRE(store.Set("alpha", std::string("two\0bytes", 9)).ok());
  CHECK(*store.Get("alpha", absl::Seconds(1)) == std::string("two\0bytes", 9));
  REQUIRE(store.Set("empty", "").ok());
  CHECK(store.Get("empty", absl::Seconds(1))->empty());

  CHECK(*store.Add("n", 5) == 5);
  CHECK(*store.Add("n", -2) == 3);
  CHECK(*store.Get("n", absl::Seconds(1)) == "3");
  auto bad_add = store.Add("alpha", 1);
  REQUIRE_FALSE(bad_add.ok());
  CHECK(std::string(bad_add.status().message()).find("not a counter") != std::string::npos);
  REQUIRE(store.Set("big", "9223372036854775807").ok());
  CHECK_FALSE(store.Add("big", 1).ok());

  CHECK(*store.Check({"alpha", "n"}));
  CHECK_FALSE(*store.Check({"alpha", "absent"}));
  CHECK(*store.Check({}));
  CHECK(store.Wait({"alpha", "n"}, absl::Seconds(1)).ok());

  CHECK(*store.Delete("alpha"));
  CHECK_FALSE(*store.Delete("alpha"));
  CHECK_FALSE(*store.Check({"alpha"}));

  const auto start = Clock::now();
  auto missing = store.Get("never/set", absl::Milliseconds(200));
  CHECK(SecondsSince(start) >= 0.19);
  CHECK(SecondsSince(start) < 5);
  REQUIRE(absl::IsDeadlineExceeded(missing.status()));
  CHECK(std::string(missing.status().message()).find("'never/set'") != std::string::npos);
  auto wait = store.Wait({"n", "missing/one"}, absl::Milliseconds(100));
  REQUIRE(absl::IsDeadlineExceeded(wait));
  CHECK(std::string(wait.message()).find("'missing/one'") != std::string::npos);
  CHECK(std::string(wait.message()).find("'n'") == std::string::npos);

  CHECK(absl::IsInvalidArgument(store.Set("", "x")));
  CHECK(absl::IsInvalidArgument(store.Set(std::string(pt::kMaxStoreKeyBytes + 1, 'k'), "x")));
  CHECK(store.Set(std::string(pt::kMaxStoreKeyBytes, 'k'), "long key").ok());
  CHECK(*store.Get(std::string(pt::kMaxStoreKeyBytes, 'k'), absl::Seconds(1)) == "long key");
  const std::string large(3 << 20, 'L');
  REQUIRE(store.Set("large", large).ok());
  CHECK(*store.Get("large", absl::Seconds(5)) == large);
}

// Several threads: counters add up, Get wakes when another thread sets the key.
void CheckConcurrentThreads(const std::function<std::unique_ptr<pt::Store>()>& open) {
  constexpr int kThreads = 6;
  constexpr int kAdds = 100;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto store = open();
      if (store == nullptr) {
        ++failures;
        return;
      }
      for (int i = 0; i < kAdds; ++i) {
        if (!store->Add("shared/counter", 1).ok()) ++failures;
      }
      // Each thread waits for the next one's key, so every Get has to wake on another's Set.
      if (!store->Set(absl::StrCat("thread/", t), std::to_string(t * t)).ok()) ++failures;
      auto next = store->Get(absl::StrCat("thread/", (t + 1) % kThreads), absl::Seconds(20));
      if (!next.ok() || *next != std::to_string(((t + 1) % kThreads) * ((t + 1) % kThreads))) {
        ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);
  auto store = open();
  CHECK(*store->Get("shared/counter", absl::Seconds(1)) == std::to_string(kThreads * kAdds));
}

void CheckWorkerProcesses(const std::string& kind, const std::string& where, pt::Store& store) {
  constexpr int kWorkers = 4;
  plexus::tooling::LaunchOptions options;
  options.ranks = kWorkers;
  options.rank_argv = [&](int r) -> std::vector<std::string> {
    return {BOOTSTRAP_HELPER,  "store-worker",          kind, where,
            std::to_string(r), std::to_string(kWorkers)};
  };
  options.plexus_env = false;  // the workers meet through `where`, named on their command line
  options.timeout = absl::Seconds(40);
  options.stop_on_failure = false;
  absl::StatusOr<plexus::tooling::LaunchResult> launched =
      plexus::tooling::Launch(std::move(options));
  REQUIRE(launched.ok());
  CHECK_FALSE(launched->timed_out);
  for (const plexus::tooling::RankResult& worker : launched->ranks) {
    INFO("worker " << worker.rank << " " << worker.Describe());
    CHECK(worker.ok());
  }
  CHECK(*store.Get("counter", absl::Seconds(1)) == std::to_string(kWorkers * 50));
}

void SendRaw(int fd, const std::string& bytes) {
  REQUIRE(net::SendAll(fd, bytes.data(), bytes.size(), absl::Now() + absl::Seconds(5)).ok());
}

}  // namespace

TEST_CASE("tcp store: set, get, add, wait, check, delete") {
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0");
  REQUIRE(server.ok());
  CHECK((*server)->port() != 0);
  CHECK((*server)->address() == Loopback(**server));
  auto store = MustConnect((*server)->address());
  CHECK(store->description().find((*server)->address()) != std::string::npos);
  CheckBasicSemantics(*store);
}

TEST_CASE("tcp store: many client threads, and threads sharing one client") {
  auto server = pt::TcpStoreServer::Start(":0");
  REQUIRE(server.ok());
  const std::string address = Loopback(**server);
  SECTION("one client per thread") {
    CheckConcurrentThreads([&]() -> std::unique_ptr<pt::Store> { return TryConnect(address); });
  }
  SECTION("one client shared by every thread: a blocked Get does not block a Set") {
    std::shared_ptr<pt::Store> shared = MustConnect(address);
    struct Borrowed : pt::Store {
      std::shared_ptr<pt::Store> s;
      absl::Status Set(std::string_view k, std::string_view v) override { return s->Set(k, v); }
      absl::StatusOr<std::string> Get(std::string_view k, absl::Duration t) override {
        return s->Get(k, t);
      }
      absl::StatusOr<int64_t> Add(std::string_view k, int64_t d) override { return s->Add(k, d); }
      absl::Status Wait(absl::Span<const std::string> k, absl::Duration t) override {
        return s->Wait(k, t);
      }
      absl::StatusOr<bool> Check(absl::Span<const std::string> k) override { return s->Check(k); }
      absl::StatusOr<bool> Delete(std::string_view k) override { return s->Delete(k); }
      std::string description() const override { return s->description(); }
    };
    CheckConcurrentThreads([&]() -> std::unique_ptr<pt::Store> {
      auto b = std::make_unique<Borrowed>();
      b->s = shared;
      return b;
    });
  }
}

TEST_CASE("tcp store: worker processes share one server") {
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0");
  REQUIRE(server.ok());
  auto store = MustConnect((*server)->address());
  CheckWorkerProcesses("tcp", (*server)->address(), *store);
}

TEST_CASE("tcp store: clients wait for a server that starts later") {
  const int port = FreePort();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::unique_ptr<pt::TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    auto s = pt::TcpStoreServer::Start(address);
    if (s.ok()) server = *std::move(s);
  });
  const auto start = Clock::now();
  auto store = pt::TcpStore::Connect(address, absl::Seconds(10));
  starter.join();
  REQUIRE(server != nullptr);
  REQUIRE(store.ok());
  CHECK(SecondsSince(start) >= 0.35);
  CHECK((*store)->Set("late", "ok").ok());
}

TEST_CASE("tcp store: no server gives a clear error naming the address after the timeout") {
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  const auto start = Clock::now();
  auto store = pt::TcpStore::Connect(address, absl::Milliseconds(300));
  const double elapsed = SecondsSince(start);
  REQUIRE(absl::IsDeadlineExceeded(store.status()));
  CHECK(std::string(store.status().message()).find(address) != std::string::npos);
  CHECK(std::string(store.status().message()).find("refused") != std::string::npos);
  CHECK(elapsed >= 0.29);
  CHECK(elapsed < 3);

  CHECK(absl::IsInvalidArgument(pt::TcpStore::Connect("no-port", absl::Seconds(1)).status()));
  CHECK(absl::IsInvalidArgument(pt::TcpStore::Connect("host:99999", absl::Seconds(1)).status()));
  CHECK(absl::IsInvalidArgument(pt::TcpStore::Connect("host:0", absl::Seconds(1)).status()));
}

TEST_CASE("tcp store: a server that stops fails pending and later calls at once") {
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0");
  REQUIRE(server.ok());
  auto store = MustConnect((*server)->address());
  REQUIRE(store->Set("k", "v").ok());
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    server->reset();
  });
  const auto start = Clock::now();
  auto pending = store->Get("never", absl::Seconds(60));
  stopper.join();
  CHECK(SecondsSince(start) < 5);
  REQUIRE(absl::IsUnavailable(pending.status()));
  CHECK(std::string(pending.status().message()).find("lost the connection") != std::string::npos);
  CHECK(absl::IsUnavailable(store->Set("k", "v2")));
}

TEST_CASE("tcp store: a server process killed with SIGKILL gives an error, not a hang") {
  const std::string dir = MakeTempDir("store");
  const std::string address_file = dir + "/address";
  Child server({BOOTSTRAP_HELPER, "serve", address_file});
  const std::string address = AddressWrittenTo(address_file);
  auto store = MustConnect(address);
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    server.Signal(SIGKILL);
  });
  const auto start = Clock::now();
  auto pending = store->Get("never", absl::Seconds(60));
  killer.join();
  CHECK(server.Wait() == 128 + SIGKILL);
  CHECK(SecondsSince(start) < 5);
  CHECK(absl::IsUnavailable(pending.status()));
  RemoveTree(dir);
}

TEST_CASE("tcp store: a frozen server gives DeadlineExceeded within timeout + io timeout") {
  const std::string dir = MakeTempDir("store");
  const std::string address_file = dir + "/address";
  Child server({BOOTSTRAP_HELPER, "serve", address_file});
  const std::string address = AddressWrittenTo(address_file);
  auto store = pt::TcpStore::Connect(address, absl::Seconds(10), absl::Milliseconds(300));
  REQUIRE(store.ok());
  REQUIRE(server.Signal(SIGSTOP));
  const auto start = Clock::now();
  auto pending = (*store)->Get("never", absl::Milliseconds(200));
  const double elapsed = SecondsSince(start);
  server.Signal(SIGKILL);
  CHECK(server.Wait() == 128 + SIGKILL);
  CHECK(absl::IsDeadlineExceeded(pending.status()));
  CHECK(std::string(pending.status().message()).find("did not answer") != std::string::npos);
  CHECK(elapsed >= 0.45);
  CHECK(elapsed < 3);
  RemoveTree(dir);
}

TEST_CASE("tcp store: a client that dies while waiting is forgotten by the server") {
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0");
  REQUIRE(server.ok());
  Child client({BOOTSTRAP_HELPER, "store-get", (*server)->address(), "never"});
  for (int i = 0; i < 500 && (*server)->connected_clients() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE((*server)->connected_clients() == 1);
  client.Signal(SIGKILL);
  CHECK(client.Wait() == 128 + SIGKILL);
  for (int i = 0; i < 500 && (*server)->connected_clients() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK((*server)->connected_clients() == 0);
  auto store = MustConnect((*server)->address());
  CHECK(store->Set("never", "now").ok());
  CHECK(*store->Get("never", absl::Seconds(1)) == "now");
}

TEST_CASE("tcp store: malformed frames drop only the offending client") {
  namespace proto = pt::store_protocol;
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0");
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();
  auto good = MustConnect((*server)->address());
  REQUIRE(good->Set("before", "1").ok());
  // A good client parked in a Get across all the abuse must still be answered afterwards.
  std::atomic<bool> parked_ok{false};
  std::thread parked([&] {
    auto store = TryConnect((*server)->address());
    parked_ok = store != nullptr && store->Get("after", absl::Seconds(30)).ok();
  });

  auto header = [](uint32_t magic, uint32_t length) {
    std::string h(8, '\0');
    std::memcpy(h.data(), &magic, 4);
    std::memcpy(h.data() + 4, &length, 4);
    return h;
  };
  const std::string valid = proto::EncodeRequest([] {
    proto::Request r;
    r.op = proto::Op::kSet;
    r.keys = {"x"};
    r.value = "y";
    return r;
  }());
  std::vector<std::pair<std::string, std::string>> abuses = {
      {"http", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"oversized length", header(proto::kMagic, 0xFFFFFFF0u)},
      {"unknown op", header(proto::kMagic, 1) + "\x77"},
      {"key longer than the frame",
       header(proto::kMagic, 9) + std::string("\x07\xff\xff\x00\x00xxxx", 9)},
      {"trailing garbage",
       header(proto::kMagic, static_cast<uint32_t>(valid.size() - 8 + 1)) + valid.substr(8) + "!"},
  };
  size_t dropped = 0;
  for (const auto& [name, bytes] : abuses) {
    INFO(name);
    const int fd = RawConnect(port);
    SendRaw(fd, bytes);
    CHECK(plexus::testing::ReadUntilClosed(fd, std::chrono::seconds(5)).has_value());
    close(fd);
    ++dropped;
    CHECK((*server)->dropped_clients() == dropped);
    CHECK(good->Add("served", 1).ok());
  }
  {
    // A truncated frame and a vanished client: nothing to answer, nobody hurt.
    const int fd = RawConnect(port);
    SendRaw(fd, valid.substr(0, valid.size() - 3));
    close(fd);
  }
  {
    // A client that pipelines requests and never reads the replies gets one reply at a time
    // (backpressure), so the server buffers at most one large value for it.
    REQUIRE(good->Set("large", std::string(8 << 20, 'L')).ok());
    proto::Request get;
    get.op = proto::Op::kGet;
    get.keys = {"large"};
    const std::string frame = proto::EncodeRequest(get);
    const int fd = RawConnect(port);
    std::string burst;
    for (int i = 0; i < 64; ++i) burst += frame;
    SendRaw(fd, burst);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    close(fd);
  }
  CHECK(good->Set("after", "ok").ok());
  parked.join();
  CHECK(parked_ok.load());
  CHECK(*good->Get("before", absl::Seconds(1)) == "1");
  CHECK(*good->Get("served", absl::Seconds(1)) == std::to_string(abuses.size()));
}

TEST_CASE("tcp store: a server that is not a plexus store is reported as such") {
  // A listener that answers with garbage, like a web server would.
  auto fake = pt::TcpStoreServer::Start("127.0.0.1:0");  // only to get a free port reserved
  REQUIRE(fake.ok());
  const uint16_t port = (*fake)->port();
  fake->reset();
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const int one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(listen(listener, 4) == 0);
  std::thread responder([&] {
    const int fd = accept(listener, nullptr, nullptr);
    const char reply[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    [[maybe_unused]] ssize_t n = send(fd, reply, sizeof reply - 1, MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    close(fd);
  });
  auto store = pt::TcpStore::Connect(absl::StrCat("127.0.0.1:", port), absl::Seconds(5));
  responder.join();
  close(listener);
  REQUIRE_FALSE(store.ok());
  CHECK(std::string(store.status().message()).find("not a plexus tcp store") != std::string::npos);
}

TEST_CASE("file store: semantics, threads, processes") {
  const std::string dir = MakeTempDir("filestore");
  auto store = pt::FileStore::Open(dir + "/nested/store");
  REQUIRE(store.ok());
  SECTION("semantics") { CheckBasicSemantics(**store); }
  SECTION("threads") {
    CheckConcurrentThreads([&]() -> std::unique_ptr<pt::Store> {
      auto s = pt::FileStore::Open(dir + "/nested/store");
      if (!s.ok()) return nullptr;
      return *std::move(s);
    });
  }
  SECTION("processes") { CheckWorkerProcesses("file", dir + "/nested/store", **store); }
  SECTION("keys with any bytes map to distinct files") {
    const std::vector<std::string> keys = {
        "a/b", "a%2Fb", "../escape",           ".",
        "..",  "a b",   std::string(300, 'x'), std::string(300, 'x') + "y"};
    for (size_t i = 0; i < keys.size(); ++i)
      REQUIRE((*store)->Set(keys[i], std::to_string(i)).ok());
    for (size_t i = 0; i < keys.size(); ++i) {
      CHECK(*(*store)->Get(keys[i], absl::Seconds(1)) == std::to_string(i));
    }
    CHECK_FALSE(std::filesystem::exists(dir + "/nested/escape"));
  }
  SECTION("readers never see a partly written value") {
    const std::string a(1 << 20, 'a');
    const std::string b(1 << 20, 'b');
    REQUIRE((*store)->Set("flip", a).ok());
    std::atomic<bool> done{false};
    std::atomic<int> write_errors{0};
    std::thread writer([&] {
      for (int i = 0; i < 60; ++i) {
        if (!(*store)->Set("flip", i % 2 ? a : b).ok()) ++write_errors;
      }
      done = true;
    });
    int torn = 0;
    int reads = 0;
    while (!done.load()) {
      auto v = (*store)->Get("flip", absl::Seconds(1));
      REQUIRE(v.ok());
      ++reads;
      if (*v != a && *v != b) ++torn;
    }
    writer.join();
    CHECK(write_errors.load() == 0);
    CHECK(reads > 0);
    CHECK(torn == 0);
  }
  RemoveTree(dir);
}

TEST_CASE("file store: unusable directories give clear errors") {
  auto empty = pt::FileStore::Open("");
  CHECK(absl::IsInvalidArgument(empty.status()));
  const std::string dir = MakeTempDir("filestore");
  {
    std::ofstream f(dir + "/file");
    f << "x";
  }
  auto not_dir = pt::FileStore::Open(dir + "/file");
  REQUIRE_FALSE(not_dir.ok());
  CHECK(std::string(not_dir.status().message()).find(dir + "/file") != std::string::npos);
  RemoveTree(dir);
}
