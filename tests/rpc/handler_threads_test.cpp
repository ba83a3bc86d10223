// Synchronous handlers run on the server's handler threads (ServerOptions::handler_threads), so
// that one that blocks does not stall the dispatcher and every other call with it.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "handlers.plexus.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/server.hpp"
#include "test_server.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;
using plexus::rpctest::Calc;
using plexus::rpctest::Pair;
using plexus::rpctest::Sum;
using plexus::rpctest::WaitUntil;

namespace {

// Add answers at once; Stats blocks until the test releases it, its call is cancelled (unless
// `heed_cancel` is off) or `stats_limit` passed; MarkAsync answers at once from the thread that
// dispatched it. Each notes its thread.
class CalcImpl : public Calc::Service {
 public:
  absl::Status Add(pr::ServerContext&, const Pair& req, Sum* resp) override {
    Note(&add_threads);
    ++adds;
    resp->value = req.a + req.b;
    return absl::OkStatus();
  }
  absl::Status Stats(pr::ServerContext& ctx, const Pair& req, Sum* resp) override {
    Note(&stats_threads);
    ++stats_started;
    std::unique_lock<std::mutex> lock(mu);
    const auto until = std::chrono::steady_clock::now() + stats_limit;
    while (!released && !(heed_cancel && ctx.IsCancelled()) &&
           std::chrono::steady_clock::now() < until) {
      cv.wait_for(lock, std::chrono::milliseconds(1));
    }
    ++stats_finished;
    resp->value = req.a;
    return absl::OkStatus();
  }
  void MarkAsync(pr::ServerCall<Pair, Sum> call) override {
    Note(&mark_threads);
    call.Finish(absl::OkStatus());
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu);
      released = true;
    }
    cv.notify_all();
  }
  // The threads that ran `of` (add_threads, ...) so far.
  std::vector<std::thread::id> Threads(const std::vector<std::thread::id>& of) {
    std::lock_guard<std::mutex> lock(mu);
    return of;
  }

  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  std::chrono::milliseconds stats_limit{2000};  // set before the calls
  bool heed_cancel = true;
  std::vector<std::thread::id> add_threads, stats_threads, mark_threads;
  std::atomic<int> adds{0}, stats_started{0}, stats_finished{0};

 private:
  void Note(std::vector<std::thread::id>* to) {
    std::lock_guard<std::mutex> lock(mu);
    to->push_back(std::this_thread::get_id());
  }
};

// A server of a CalcImpl with `options` (never blocking: `never_block`) on `backend`, and a
// channel to it; Stats is released before it shuts down.
struct CalcServer {
  explicit CalcServer(pr::ServerOptions options = {}, std::vector<std::string> never_block = {},
                      pt::Backend backend = pt::Backend::kInproc) {
    auto d = pt::Device::Create({.backend = backend, .local_address = "127.0.0.1"});
    REQUIRE(d.ok());
    device = *d;
    auto s = pr::Server::Create(device, std::move(options));
    REQUIRE(s.ok());
    server = std::move(*s);
    REQUIRE(server->Register(&impl, std::move(never_block)).ok());
    REQUIRE(server->Start().ok());
    auto c = pr::Channel::Connect(device, server->address(), {&Calc::Descriptor()});
    REQUIRE(c.ok());
    channel = *c;
  }
  ~CalcServer() {
    impl.Release();
    server->Shutdown();
  }
  std::shared_ptr<pt::Device> device;
  CalcImpl impl;
  std::unique_ptr<pr::Server> server;
  std::shared_ptr<pr::Channel> channel;
};

pr::ServerOptions HandlerThreads(size_t threads, size_t queue = pr::ServerOptions().handler_queue) {
  pr::ServerOptions o;
  o.handler_threads = threads;
  o.handler_queue = queue;
  return o;
}

}  // namespace

TEST_CASE("handler threads: a blocking synchronous handler does not delay another method",
          "[rpc][handlers]") {
  const pt::Backend backend = GENERATE(pt::Backend::kInproc, pt::Backend::kTcp);
  CalcServer s({}, {}, backend);
  Calc::Stub stub(s.channel);
  Pair slow_req{.a = 7};
  auto slow = stub.Stats(slow_req, {.timeout = absl::Seconds(10)});
  WaitUntil([&] { return s.impl.stats_started.load() == 1; }, "Stats is running");
  int on_time = 0;
  for (int i = 0; i < 20; ++i) {
    Pair req{.a = i, .b = 1};
    const absl::Time start = absl::Now();
    auto r = stub.AddSync(req, {.timeout = absl::Milliseconds(100)});
    const absl::Duration took = absl::Now() - start;
    INFO("Add #" << i << ": " << r.status() << " after " << absl::FormatDuration(took));
    CHECK(r.ok());
    if (r.ok() && took < absl::Milliseconds(100)) {
      CHECK((*r)->value == i + 1);
      ++on_time;
    }
  }
  CHECK(on_time == 20);
  CHECK(s.impl.stats_finished.load() == 0);  // the slow call was in flight throughout
  s.impl.Release();
  auto r = slow.Get();
  REQUIRE(r.ok());
  CHECK((*r)->value == 7);
}

TEST_CASE("handler threads: a method registered as never blocking runs on the dispatcher thread",
          "[rpc][handlers]") {
  SECTION("Add registered as never blocking, Stats not") {
    CalcServer s({}, {"Add"});
    Calc::Stub stub(s.channel);
    s.impl.Release();  // Stats answers at once
    Pair req{.a = 2, .b = 3};
    for (int i = 0; i < 3; ++i) {
      REQUIRE(stub.MarkSync(req, {.timeout = absl::Seconds(5)}).ok());
      REQUIRE(stub.AddSync(req, {.timeout = absl::Seconds(5)}).ok());
      REQUIRE(stub.StatsSync(req, {.timeout = absl::Seconds(5)}).ok());
    }
    // An asynchronous handler runs on the dispatcher thread: Mark names it.
    const auto marks = s.impl.Threads(s.impl.mark_threads);
    const auto adds = s.impl.Threads(s.impl.add_threads);
    const auto stats = s.impl.Threads(s.impl.stats_threads);
    REQUIRE(marks.size() == 3);
    const std::thread::id dispatcher = marks[0];
    for (const auto& t : marks) CHECK(t == dispatcher);
    for (const auto& t : adds) CHECK(t == dispatcher);
    for (const auto& t : stats) CHECK(t != dispatcher);
  }
  SECTION("handler_threads 0: every synchronous handler runs on the dispatcher thread") {
    CalcServer s(HandlerThreads(0));
    Calc::Stub stub(s.channel);
    s.impl.Release();
    Pair req;
    REQUIRE(stub.MarkSync(req, {.timeout = absl::Seconds(5)}).ok());
    REQUIRE(stub.StatsSync(req, {.timeout = absl::Seconds(5)}).ok());
    CHECK(s.impl.Threads(s.impl.stats_threads) == s.impl.Threads(s.impl.mark_threads));
  }
  SECTION("a name the service does not have is refused") {
    auto d = pt::Device::Create({.backend = pt::Backend::kInproc});
    REQUIRE(d.ok());
    auto server = pr::Server::Create(*d);
    REQUIRE(server.ok());
    CalcImpl impl;
    absl::Status st = (*server)->Register(&impl, {"Add", "Sub"});
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(st.message()), Catch::Contains("plexus.rpctest.Calc") &&
                                              Catch::Contains("'Sub'") &&
                                              Catch::Contains("Add, Stats, Mark"));
  }
}

TEST_CASE("handler threads: a full queue refuses a call at once, naming its method",
          "[rpc][handlers]") {
  CalcServer s(HandlerThreads(1, 1));
  Calc::Stub stub(s.channel);
  Pair a{.a = 1}, b{.a = 2}, c{.a = 3};
  auto running = stub.Stats(a, {.timeout = absl::Seconds(10)});
  WaitUntil([&] { return s.impl.stats_started.load() == 1; }, "the first Stats is running");
  auto waiting = stub.Stats(b, {.timeout = absl::Seconds(10)});  // the queue's one place
  const absl::Time start = absl::Now();
  auto refused = stub.StatsSync(c, {.timeout = absl::Seconds(10)});
  CHECK(absl::Now() - start < absl::Seconds(2));
  REQUIRE(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("plexus.rpctest.Calc/Stats refused") &&
                 Catch::Contains("ServerOptions::handler_queue 1"));
  s.impl.Release();
  auto r1 = running.Get();
  auto r2 = waiting.Get();
  REQUIRE(r1.ok());
  REQUIRE(r2.ok());
  CHECK((*r1)->value == 1);
  CHECK((*r2)->value == 2);
  CHECK(s.impl.stats_started.load() == 2);
}

TEST_CASE("handler threads: a call that expired or was cancelled while queued does not run",
          "[rpc][handlers]") {
  CalcServer s(HandlerThreads(1));
  Calc::Stub stub(s.channel);
  Pair req{.a = 1, .b = 1};
  auto running = stub.Stats(req, {.timeout = absl::Seconds(10)});
  WaitUntil([&] { return s.impl.stats_started.load() == 1; }, "Stats is running");
  auto expired = stub.AddSync(req, {.timeout = absl::Milliseconds(50)});
  CHECK(expired.status().code() == absl::StatusCode::kDeadlineExceeded);
  auto cancelled = stub.Stats(req, {.timeout = absl::Seconds(10)});
  cancelled.Cancel();
  CHECK(cancelled.Get().status().code() == absl::StatusCode::kCancelled);
  s.impl.Release();
  REQUIRE(running.Get().ok());
  // FIFO: this one is dispatched after the two stale calls were dropped.
  auto after = stub.AddSync(req, {.timeout = absl::Seconds(5)});
  REQUIRE(after.ok());
  CHECK((*after)->value == 2);
  CHECK(s.impl.adds.load() == 1);
  CHECK(s.impl.stats_started.load() == 1);
}

TEST_CASE("handler threads: Shutdown with handlers running ends within a bound",
          "[rpc][handlers]") {
  Pair req;
  SECTION("handlers that watch IsCancelled return at once") {
    CalcServer s(HandlerThreads(2));
    Calc::Stub stub(s.channel);
    auto r1 = stub.Stats(req, {.timeout = absl::Seconds(10)});
    auto r2 = stub.Stats(req, {.timeout = absl::Seconds(10)});
    WaitUntil([&] { return s.impl.stats_started.load() == 2; }, "two Stats are running");
    auto queued = stub.Stats(req, {.timeout = absl::Seconds(10)});
    auto add = stub.Add(req, {.timeout = absl::Seconds(10)});
    WaitUntil(
        [&] {
          auto conns = s.server->Connections();
          return conns.size() == 1 && conns[0].active_calls == 4;
        },
        "both reach the queue");
    const absl::Time start = absl::Now();
    s.server->Shutdown();
    CHECK(absl::Now() - start < absl::Seconds(1));
    // The queued calls never ran; the running handlers returned before Shutdown did.
    CHECK(s.impl.stats_started.load() == 2);
    CHECK(s.impl.stats_finished.load() == 2);
    CHECK(s.impl.adds.load() == 0);
    for (auto* call : {&r1, &r2, &queued}) {
      REQUIRE(call->WaitFor(absl::Seconds(5)));
      CHECK_FALSE(call->Get().ok());
    }
    REQUIRE(add.WaitFor(absl::Seconds(5)));
    CHECK_FALSE(add.Get().ok());
  }
  SECTION("a handler that ignores cancellation is waited for, and only that long") {
    CalcServer s(HandlerThreads(1));
    s.impl.heed_cancel = false;
    s.impl.stats_limit = std::chrono::milliseconds(300);
    Calc::Stub stub(s.channel);
    auto r1 = stub.Stats(req, {.timeout = absl::Seconds(10)});
    WaitUntil([&] { return s.impl.stats_started.load() == 1; }, "Stats is running");
    const absl::Time start = absl::Now();
    s.server->Shutdown();
    CHECK(absl::Now() - start < absl::Seconds(2));
    CHECK(s.impl.stats_finished.load() == 1);
    REQUIRE(r1.WaitFor(absl::Seconds(5)));
    CHECK_FALSE(r1.Get().ok());
  }
}
