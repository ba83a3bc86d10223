#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "plexus/transport/runtime.hpp"

namespace plexus::transport {
namespace {

using Clock = std::chrono::steady_clock;

// A move-only message, like a real one owning its buffer.
struct Item {
  uint64_t seq = 0;
  uint32_t hops = 0;  // engines that handled it
  std::unique_ptr<uint64_t> payload;
};
uint64_t PayloadOf(uint64_t seq) { return seq * 7 + 1; }
Item MakeItem(uint64_t seq) { return Item{seq, 0, std::make_unique<uint64_t>(PayloadOf(seq))}; }

// What every test engine owns and hands over on Decompose.
struct Stage {
  ChannelReceiver<Item> input;
  ChannelSender<Item> output;
  std::deque<Item> pending;  // taken from input, not yet in output
  uint64_t processed = 0;    // items ever taken from input, across engine swaps
};

EngineState PutStage(std::string kind, uint32_t version, Stage stage) {
  EngineState state(std::move(kind), version);
  state.Put("input", std::move(stage.input));
  state.Put("output", std::move(stage.output));
  state.Put("pending", std::move(stage.pending));
  state.Put("processed", stage.processed);
  return state;
}

absl::StatusOr<Stage> TakeStage(EngineState& state) {
  if (state.kind() != "tagger" && state.kind() != "batcher" && state.kind() != "flaky") {
    return absl::InvalidArgumentError(absl::StrCat("cannot restore from '", state.kind(), "'"));
  }
  Stage stage;
  auto input = state.Take<ChannelReceiver<Item>>("input");
  auto output = state.Take<ChannelSender<Item>>("output");
  auto pending = state.Take<std::deque<Item>>("pending");
  auto processed = state.Take<uint64_t>("processed");
  for (const absl::Status& s :
       {input.status(), output.status(), pending.status(), processed.status()}) {
    if (!s.ok()) return s;
  }
  stage.input = *std::move(input);
  stage.output = *std::move(output);
  stage.pending = *std::move(pending);
  stage.processed = *processed;
  return stage;
}

// Pushes pending items in order until the output is full; true when it pushed any.
bool FlushPending(Stage& stage, size_t limit) {
  bool pushed = false;
  while (limit-- > 0 && !stage.pending.empty() &&
         stage.output.TryPush(std::move(stage.pending.front()))) {
    stage.pending.pop_front();
    pushed = true;
  }
  return pushed;
}

std::atomic<int> live_engines{0};

class TestEngine : public Engine {
 public:
  explicit TestEngine(Stage stage) : stage_(std::move(stage)) { live_engines.fetch_add(1); }
  ~TestEngine() override { live_engines.fetch_sub(1); }
  std::vector<ChannelEndpoint*> Endpoints() override { return {&stage_.input, &stage_.output}; }
  const Stage& stage() const { return stage_; }

 protected:
  Stage stage_;
};

// Forwards items one by one, counting a hop; an item the output cannot take stays in flight.
class TaggerEngine : public TestEngine {
 public:
  using TestEngine::TestEngine;
  std::string_view name() const override { return "tagger"; }
  absl::StatusOr<PollResult> Poll() override {
    bool progress = FlushPending(stage_, SIZE_MAX);
    if (!stage_.pending.empty()) return progress ? PollResult::kProgress : PollResult::kIdle;
    for (int i = 0; i < 32; ++i) {
      std::optional<Item> item = stage_.input.TryPop();
      if (!item.has_value()) break;
      progress = true;
      ++stage_.processed;
      ++item->hops;
      if (!stage_.output.TryPush(std::move(*item))) {
        stage_.pending.push_back(std::move(*item));
        break;
      }
    }
    return progress ? PollResult::kProgress : PollResult::kIdle;
  }
  absl::StatusOr<EngineState> Decompose() override {
    return PutStage("tagger", 1, std::move(stage_));
  }
};

// Forwards whole batches of kBatch items; a partial batch waits for two idle polls, so a
// decomposed batcher usually holds buffered items.
class BatcherEngine : public TestEngine {
 public:
  static constexpr size_t kBatch = 16;
  using TestEngine::TestEngine;
  std::string_view name() const override { return "batcher"; }
  absl::StatusOr<PollResult> Poll() override {
    size_t popped = 0;
    while (popped < 10 && stage_.pending.size() < 4 * kBatch) {
      std::optional<Item> item = stage_.input.TryPop();
      if (!item.has_value()) break;
      ++stage_.processed;
      ++item->hops;
      stage_.pending.push_back(std::move(*item));
      ++popped;
    }
    idle_polls_ = popped == 0 ? idle_polls_ + 1 : 0;
    const bool flush_partial = idle_polls_ >= 2;
    const size_t sendable =
        flush_partial ? stage_.pending.size() : stage_.pending.size() / kBatch * kBatch;
    bool progress = FlushPending(stage_, sendable) || popped > 0;
    // Ask to be polled again soon rather than sleep on a partial batch.
    if (!stage_.pending.empty() && !flush_partial) progress = true;
    return progress ? PollResult::kProgress : PollResult::kIdle;
  }
  absl::StatusOr<EngineState> Decompose() override {
    return PutStage("batcher", 2, std::move(stage_));
  }

 private:
  int idle_polls_ = 0;
};

// A tagger that fails on item `fail_at`, keeping that item in flight.
class FlakyEngine : public TestEngine {
 public:
  FlakyEngine(Stage stage, uint64_t fail_at) : TestEngine(std::move(stage)), fail_at_(fail_at) {}
  std::string_view name() const override { return "flaky"; }
  absl::StatusOr<PollResult> Poll() override {
    bool progress = FlushPending(stage_, SIZE_MAX);
    if (!stage_.pending.empty()) return progress ? PollResult::kProgress : PollResult::kIdle;
    std::optional<Item> item = stage_.input.TryPop();
    if (!item.has_value()) return progress ? PollResult::kProgress : PollResult::kIdle;
    ++stage_.processed;
    ++item->hops;
    const uint64_t seq = item->seq;
    stage_.pending.push_back(std::move(*item));
    if (seq == fail_at_) return absl::DataLossError(absl::StrCat("corrupt item ", seq));
    FlushPending(stage_, SIZE_MAX);
    return PollResult::kProgress;
  }
  absl::StatusOr<EngineState> Decompose() override {
    if (refuse_decompose_) return absl::UnavailableError("decompose refused on purpose");
    return PutStage("flaky", 1, std::move(stage_));
  }
  bool refuse_decompose_ = false;

 private:
  uint64_t fail_at_;
};

std::atomic<int> restores_with_pending{0};

template <typename E>
RestoreFn RestoreAs() {
  return [](EngineState state) -> absl::StatusOr<std::unique_ptr<Engine>> {
    absl::StatusOr<Stage> stage = TakeStage(state);
    if (!stage.ok()) return stage.status();
    if (!stage->pending.empty()) restores_with_pending.fetch_add(1);
    return std::make_unique<E>(*std::move(stage));
  };
}

// producer -> [channel 0] -> A -> [channel 1] -> B -> [channel 2] -> consumer
struct Chain {
  static Chain Make(size_t capacity) {
    Chain chain;
    auto c0 = MakeChannel<Item>(capacity);
    auto c1 = MakeChannel<Item>(capacity);
    auto c2 = MakeChannel<Item>(capacity);
    REQUIRE(c0.ok());
    REQUIRE(c1.ok());
    REQUIRE(c2.ok());
    chain.source = std::move(c0->first);
    chain.a.input = std::move(c0->second);
    chain.a.output = std::move(c1->first);
    chain.b.input = std::move(c1->second);
    chain.b.output = std::move(c2->first);
    chain.sink = std::move(c2->second);
    return chain;
  }
  ChannelSender<Item> source;
  Stage a;
  Stage b;
  ChannelReceiver<Item> sink;
};

// Pushes 0, 1, 2, ... until told to stop, sleeping on its doorbell when the channel is full.
class Producer {
 public:
  explicit Producer(ChannelSender<Item> sender) : sender_(std::move(sender)) {
    sender_.BindDoorbell(bell_.get());
    thread_ = std::thread([this] { Run(); });
  }
  // Stops after `limit` items in total (or now, if more were pushed); returns the count.
  uint64_t StopAt(uint64_t limit) {
    limit_.store(limit);
    bell_->Ring();
    thread_.join();
    return pushed_.load();
  }
  uint64_t pushed() const { return pushed_.load(std::memory_order_relaxed); }
  bool stalled() const { return stalled_.load(); }

 private:
  void Run() {
    for (uint64_t seq = 0; seq < limit_.load(std::memory_order_relaxed); ++seq) {
      Item item = MakeItem(seq);
      while (!sender_.TryPush(std::move(item))) {
        if (!bell_->Wait([&] { return !sender_.FullApprox() || limit_.load() <= seq; },
                         absl::Seconds(10))) {
          stalled_ = true;
          return;
        }
        if (limit_.load() <= seq) return;
      }
      pushed_.store(seq + 1, std::memory_order_relaxed);
    }
  }

  ChannelSender<Item> sender_;
  Doorbell::Ptr bell_ = Doorbell::Acquire();
  std::atomic<uint64_t> limit_{UINT64_MAX};
  std::atomic<uint64_t> pushed_{0};
  std::atomic<bool> stalled_{false};
  std::thread thread_;
};

// Checks that items arrive as 0, 1, 2, ... exactly once, each having passed both engines.
class Consumer {
 public:
  explicit Consumer(ChannelReceiver<Item> receiver) : receiver_(std::move(receiver)) {
    receiver_.BindDoorbell(bell_.get());
    thread_ = std::thread([this] { Run(); });
  }
  ~Consumer() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    stop_ = true;
    bell_->Ring();
    thread_.join();
  }
  // Waits up to `timeout` until `count` items arrived.
  bool WaitFor(uint64_t count, std::chrono::milliseconds timeout) const {
    const auto deadline = Clock::now() + timeout;
    while (received() < count && error().empty()) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return error().empty();
  }
  uint64_t received() const { return received_.load(); }
  std::string error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  void Run() {
    uint64_t expected = 0;
    while (!stop_.load()) {
      std::optional<Item> item = receiver_.TryPop();
      if (!item.has_value()) {
        bell_->Wait([&] { return !receiver_.EmptyApprox() || stop_.load(); },
                    absl::InfiniteDuration());
        continue;
      }
      std::string problem;
      if (item->seq != expected) {
        problem = absl::StrCat("expected item ", expected, ", got ", item->seq,
                               item->seq < expected ? " (duplicate/reordered)" : " (lost items)");
      } else if (item->hops != 2) {
        problem = absl::StrCat("item ", item->seq, " passed ", item->hops, " engines, not 2");
      } else if (item->payload == nullptr || *item->payload != PayloadOf(item->seq)) {
        problem = absl::StrCat("item ", item->seq, " has a damaged payload");
      }
      if (!problem.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = problem;
        return;
      }
      received_.store(++expected);
    }
  }

  ChannelReceiver<Item> receiver_;
  Doorbell::Ptr bell_ = Doorbell::Acquire();
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> received_{0};
  mutable std::mutex mu_;
  std::string error_;
  std::thread thread_;
};

std::unique_ptr<Runtime> MakeRuntime(RuntimeOptions options = {}) {
  auto runtime = Runtime::Create(std::move(options));
  REQUIRE(runtime.ok());
  return *std::move(runtime);
}

double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

TEST_CASE("An engine chain survives 100 live swaps with no item lost, duplicated or reordered") {
  for (int threads : {1, 2}) {
    DYNAMIC_SECTION(threads << " runtime thread(s)") {
      auto runtime = MakeRuntime({.threads = threads});
      Chain chain = Chain::Make(256);
      const int a_thread = 0;
      const int b_thread = threads - 1;
      auto a = runtime->Attach(std::make_unique<TaggerEngine>(std::move(chain.a)), a_thread);
      auto b = runtime->Attach(std::make_unique<BatcherEngine>(std::move(chain.b)), b_thread);
      REQUIRE(a.ok());
      REQUIRE(b.ok());
      Consumer consumer(std::move(chain.sink));
      Producer producer(std::move(chain.source));
      restores_with_pending = 0;

      // A and B each alternate between tagger and batcher; every swap happens under traffic:
      // items must have flowed end to end since the previous one.
      bool a_is_tagger = true;
      bool b_is_tagger = false;
      std::vector<double> pauses_us;
      for (int swap = 0; swap < 100; ++swap) {
        REQUIRE(consumer.WaitFor(consumer.received() + 2000, std::chrono::seconds(10)));
        const bool on_a = swap % 2 == 0;
        bool& is_tagger = on_a ? a_is_tagger : b_is_tagger;
        absl::StatusOr<absl::Duration> pause = runtime->Replace(
            on_a ? *a : *b, is_tagger ? RestoreAs<BatcherEngine>() : RestoreAs<TaggerEngine>());
        REQUIRE(pause.ok());
        pauses_us.push_back(absl::ToDoubleMicroseconds(*pause));
        is_tagger = !is_tagger;
      }
      const uint64_t total = producer.StopAt(producer.pushed() + 1000);
      REQUIRE_FALSE(producer.stalled());
      INFO("consumer error: " << consumer.error());
      REQUIRE(consumer.WaitFor(total, std::chrono::seconds(10)));
      CHECK(consumer.received() == total);
      // Batchers are decomposed with partial batches in them: the swaps carried buffered items.
      CHECK(restores_with_pending.load() > 0);
      CHECK(runtime->EngineStatus(*a).ok());
      CHECK(runtime->EngineStatus(*b).ok());

      // Each stage's item count survived every swap: both engines saw every item once.
      for (EngineHandle handle : {*a, *b}) {
        auto engine = runtime->Detach(handle);
        REQUIRE(engine.ok());
        auto state = (*engine)->Decompose();
        REQUIRE(state.ok());
        CHECK(state->Take<uint64_t>("processed").value() == total);
        CHECK(state->Take<std::deque<Item>>("pending").value().empty());
      }
      std::sort(pauses_us.begin(), pauses_us.end());
      WARN(threads << " thread(s): " << total << " items, " << restores_with_pending.load()
                   << " swaps carried buffered items, median swap pause " << pauses_us[50]
                   << " us");
    }
  }
}

TEST_CASE("An idle runtime sleeps: near-zero CPU time, and wakes up on a push") {
  auto runtime = MakeRuntime({.threads = 2});
  Chain chain = Chain::Make(64);
  REQUIRE(runtime->Attach(std::make_unique<TaggerEngine>(std::move(chain.a)), 0).ok());
  REQUIRE(runtime->Attach(std::make_unique<TaggerEngine>(std::move(chain.b)), 1).ok());
  Consumer consumer(std::move(chain.sink));
  {
    Producer producer(std::move(chain.source));
    REQUIRE(producer.StopAt(2000) == 2000);
  }
  REQUIRE(consumer.WaitFor(2000, std::chrono::seconds(10)));

  // Let the spin phase end, then measure the whole process while it has nothing to do (the
  // consumer sleeps on its doorbell too).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double cpu_before = ProcessCpuSeconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double idle_cpu = ProcessCpuSeconds() - cpu_before;
  INFO("CPU time used by an idle runtime over 300 ms: " << idle_cpu * 1e3 << " ms");
  CHECK(idle_cpu < 0.015);  // a single spinning thread would use ~300 ms
  CHECK(consumer.received() == 2000);
}

TEST_CASE("A sleeping runtime wakes up on a push from outside") {
  auto runtime = MakeRuntime({.threads = 2});
  Chain chain = Chain::Make(64);
  REQUIRE(runtime->Attach(std::make_unique<TaggerEngine>(std::move(chain.a)), 0).ok());
  REQUIRE(runtime->Attach(std::make_unique<BatcherEngine>(std::move(chain.b)), 1).ok());
  Consumer consumer(std::move(chain.sink));
  for (uint64_t seq = 0; seq < 5; ++seq) {
    // Long enough for both runtime threads to fall asleep between two items.
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    REQUIRE(chain.source.TryPush(MakeItem(seq)));
    INFO("consumer error: " << consumer.error());
    REQUIRE(consumer.WaitFor(seq + 1, std::chrono::seconds(5)));
  }
}

TEST_CASE("Wake-ups are not lost when pushes race with runtime threads going to sleep") {
  // Gaps around the spin time make pushes land just before, during and after the threads'
  // switch to sleep; a lost wake-up would leave an item stuck (the runtime sleeps forever).
  auto runtime = MakeRuntime({.threads = 2, .spin = absl::Microseconds(40)});
  Chain chain = Chain::Make(64);
  REQUIRE(runtime->Attach(std::make_unique<TaggerEngine>(std::move(chain.a)), 0).ok());
  REQUIRE(runtime->Attach(std::make_unique<TaggerEngine>(std::move(chain.b)), 1).ok());
  Consumer consumer(std::move(chain.sink));
  for (uint64_t seq = 0; seq < 400; ++seq) {
    std::this_thread::sleep_for(std::chrono::microseconds(seq % 5 * 25));
    REQUIRE(chain.source.TryPush(MakeItem(seq)));
    INFO("consumer error: " << consumer.error());
    REQUIRE(consumer.WaitFor(seq + 1, std::chrono::seconds(5)));
  }
}

TEST_CASE("A failing engine is detached with its error; the others keep running") {
  std::mutex mu;
  std::vector<std::pair<uint64_t, absl::Status>> reported;
  auto runtime =
      MakeRuntime({.threads = 1, .on_engine_error = [&](EngineHandle h, const absl::Status& s) {
                     std::lock_guard<std::mutex> lock(mu);
                     reported.emplace_back(h.id, s);
                   }});
  Chain chain = Chain::Make(64);
  auto flaky = runtime->Attach(std::make_unique<FlakyEngine>(std::move(chain.a), 5));
  auto healthy = runtime->Attach(std::make_unique<TaggerEngine>(std::move(chain.b)));
  REQUIRE(flaky.ok());
  REQUIRE(healthy.ok());
  Consumer consumer(std::move(chain.sink));
  for (uint64_t seq = 0; seq < 10; ++seq) REQUIRE(chain.source.TryPush(MakeItem(seq)));

  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (runtime->EngineStatus(*flaky).ok() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const absl::Status status = runtime->EngineStatus(*flaky);
  CHECK(status.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("corrupt item 5") && Catch::Contains("flaky"));
  REQUIRE(consumer.WaitFor(5, std::chrono::seconds(5)));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(consumer.received() == 5);  // nothing passed the failed engine
  CHECK(runtime->EngineStatus(*healthy).ok());
  {
    std::lock_guard<std::mutex> lock(mu);
    REQUIRE(reported.size() == 1);
    CHECK(reported[0].first == flaky->id);
    CHECK(reported[0].second == status);
  }

  SECTION("Detach hands back the failed engine and releases the handle") {
    auto engine = runtime->Detach(*flaky);
    REQUIRE(engine.ok());
    REQUIRE(*engine != nullptr);
    CHECK((*engine)->name() == "flaky");
    CHECK(runtime->EngineStatus(*flaky).code() == absl::StatusCode::kNotFound);
    CHECK(runtime->Detach(*flaky).status().code() == absl::StatusCode::kNotFound);
  }
  SECTION("Replace recovers the failed engine, keeping its in-flight item") {
    REQUIRE(runtime->Replace(*flaky, RestoreAs<TaggerEngine>()).ok());
    CHECK(runtime->EngineStatus(*flaky).ok());
    INFO("consumer error: " << consumer.error());
    REQUIRE(consumer.WaitFor(10, std::chrono::seconds(5)));
    CHECK(consumer.received() == 10);
  }
}

TEST_CASE("Replace reports failures of Decompose and of the restore function") {
  auto runtime = MakeRuntime();
  Chain chain = Chain::Make(16);
  auto flaky_engine = std::make_unique<FlakyEngine>(std::move(chain.a), UINT64_MAX);
  flaky_engine->refuse_decompose_ = true;
  auto a = runtime->Attach(std::move(flaky_engine));
  auto b = runtime->Attach(std::make_unique<TaggerEngine>(std::move(chain.b)));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  Consumer consumer(std::move(chain.sink));

  // A refused Decompose leaves the engine running.
  auto refused = runtime->Replace(*a, RestoreAs<TaggerEngine>());
  CHECK(refused.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("Decompose"));
  CHECK(runtime->EngineStatus(*a).ok());
  REQUIRE(chain.source.TryPush(MakeItem(0)));
  REQUIRE(consumer.WaitFor(1, std::chrono::seconds(5)));

  // A restore function that does not understand the state fails the handle with its reason.
  auto wrong =
      runtime->Replace(*b, [](EngineState state) -> absl::StatusOr<std::unique_ptr<Engine>> {
        auto input = state.Take<ChannelReceiver<int>>("input");  // the wrong item type
        if (!input.ok()) return input.status();
        return absl::InternalError("unreachable: the field has another type");
      });
  CHECK(wrong.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(wrong.status().message()),
             Catch::Contains("Restore") && Catch::Contains("'input'"));
  CHECK(runtime->EngineStatus(*b) == wrong.status());
  // Detach releases the engine-less handle and says why it has no engine.
  CHECK(runtime->Detach(*b).status() == wrong.status());
  CHECK(runtime->EngineStatus(*b).code() == absl::StatusCode::kNotFound);

  auto null_restore = runtime->Replace(
      *a, [](EngineState) -> absl::StatusOr<std::unique_ptr<Engine>> { return nullptr; });
  CHECK_FALSE(null_restore.ok());
}

TEST_CASE("Detach and Replace refuse to run on the runtime's own thread") {
  class SelfDetacher : public Engine {
   public:
    explicit SelfDetacher(Runtime* runtime) : runtime_(runtime) {}
    std::string_view name() const override { return "self-detacher"; }
    absl::StatusOr<PollResult> Poll() override {
      const uint64_t id = handle_id.load();
      if (id != 0 && !tried.load()) {
        detach_result = runtime_->Detach(EngineHandle{id}).status();
        replace_result = runtime_->Replace(EngineHandle{id}, RestoreAs<TaggerEngine>()).status();
        tried = true;
      }
      return PollResult::kIdle;
    }
    absl::StatusOr<EngineState> Decompose() override { return EngineState("self-detacher", 1); }
    std::vector<ChannelEndpoint*> Endpoints() override { return {}; }

    std::atomic<uint64_t> handle_id{0};
    std::atomic<bool> tried{false};
    absl::Status detach_result;   // written before `tried`
    absl::Status replace_result;  // written before `tried`

   private:
    Runtime* runtime_;
  };
  auto runtime = MakeRuntime();
  auto owned = std::make_unique<SelfDetacher>(runtime.get());
  SelfDetacher* engine = owned.get();
  auto handle = runtime->Attach(std::move(owned));
  REQUIRE(handle.ok());
  engine->handle_id = handle->id;
  auto bell = runtime->GetDoorbell(*handle);
  REQUIRE(bell.ok());
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!engine->tried.load() && Clock::now() < deadline) {
    (*bell)->Ring();  // the thread may be asleep: the engine has no channel to wake it
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(engine->tried.load());
  CHECK(engine->detach_result.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(engine->replace_result.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(runtime->EngineStatus(*handle).ok());
  CHECK(runtime->Detach(*handle).ok());
}

TEST_CASE("Runtime rejects bad options and bad handles") {
  CHECK(Runtime::Create({.threads = 0}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Runtime::Create({.threads = 1000}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Runtime::Create({.spin = absl::Microseconds(-1)}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  auto runtime = MakeRuntime({.threads = 2});
  CHECK(runtime->threads() == 2);
  CHECK(runtime->Attach(nullptr).status().code() == absl::StatusCode::kInvalidArgument);
  Chain chain = Chain::Make(4);
  CHECK(runtime->Attach(std::make_unique<TaggerEngine>(std::move(chain.a)), 2).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(runtime->Detach(EngineHandle{12345}).status().code() == absl::StatusCode::kNotFound);
  CHECK(runtime->Replace(EngineHandle{12345}, RestoreAs<TaggerEngine>()).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(runtime->EngineStatus(EngineHandle{12345}).code() == absl::StatusCode::kNotFound);
  CHECK(runtime->GetDoorbell(EngineHandle{12345}).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("EngineState reports missing fields and wrong types") {
  EngineState state("batcher", 2);
  state.Put("count", uint64_t{7});
  state.Put("items", std::deque<Item>{});
  CHECK(state.Has("count"));
  CHECK(state.Keys() == std::vector<std::string>{"count", "items"});
  auto wrong = state.Take<int>("count");
  CHECK(wrong.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(wrong.status().message()), Catch::Contains("unsigned long"));
  auto missing = state.Take<int>("nope");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains("count, items"));
  CHECK(state.Take<uint64_t>("count").value() == 7);
  CHECK_FALSE(state.Has("count"));
}

TEST_CASE("Runtimes start and stop cleanly, destroying the engines left attached") {
  live_engines = 0;
  for (int round = 0; round < 20; ++round) {
    auto runtime = MakeRuntime({.threads = 1 + round % 2});
    Chain chain = Chain::Make(8);
    REQUIRE(runtime->Attach(std::make_unique<TaggerEngine>(std::move(chain.a))).ok());
    REQUIRE(runtime->Attach(std::make_unique<BatcherEngine>(std::move(chain.b))).ok());
    for (uint64_t seq = 0; seq < static_cast<uint64_t>(round % 8); ++seq) {
      REQUIRE(chain.source.TryPush(MakeItem(seq)));
    }
    CHECK(live_engines.load() == 2);
    runtime.reset();
    CHECK(live_engines.load() == 0);
    // The channels outlive the runtime; a push no longer rings any of its doorbells.
    (void)chain.source.TryPush(MakeItem(99));
  }
}

}  // namespace
}  // namespace plexus::transport
