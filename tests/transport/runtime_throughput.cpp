// Measures the progress runtime: items/s through producer -> A -> B -> consumer (two forwarding
// engines) with 1 and 2 runtime threads, and the pause of a live Replace under that traffic.
// Prints one JSON line per figure (median of --runs runs). Not a unit test: timings depend on the
// machine and its load.
//   build-*/tests/transport/transport_runtime_throughput [--runs N] [--seconds S]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "plexus/transport/runtime.hpp"

namespace plexus::transport {
namespace {

using Clock = std::chrono::steady_clock;

// Forwards up to 64 items per Poll; `version` only tells the two alternating forms apart.
class Forwarder : public Engine {
 public:
  Forwarder(ChannelReceiver<uint64_t> in, ChannelSender<uint64_t> out, uint32_t version)
      : in_(std::move(in)), out_(std::move(out)), version_(version) {}
  std::string_view name() const override { return "forwarder"; }
  absl::StatusOr<PollResult> Poll() override {
    int moved = 0;
    if (held_.has_value()) {
      if (!out_.TryPush(std::move(*held_))) return PollResult::kIdle;
      held_.reset();
      ++moved;
    }
    for (; moved < 64; ++moved) {
      std::optional<uint64_t> item = in_.TryPop();
      if (!item.has_value()) break;
      if (!out_.TryPush(std::move(*item))) {
        held_ = item;
        break;
      }
    }
    return moved > 0 ? PollResult::kProgress : PollResult::kIdle;
  }
  absl::StatusOr<EngineState> Decompose() override {
    EngineState state("forwarder", version_);
    state.Put("in", std::move(in_));
    state.Put("out", std::move(out_));
    state.Put("held", held_);
    return state;
  }
  std::vector<ChannelEndpoint*> Endpoints() override { return {&in_, &out_}; }

  static absl::StatusOr<std::unique_ptr<Engine>> Restore(EngineState state) {
    auto in = state.Take<ChannelReceiver<uint64_t>>("in");
    auto out = state.Take<ChannelSender<uint64_t>>("out");
    auto held = state.Take<std::optional<uint64_t>>("held");
    if (!in.ok()) return in.status();
    if (!out.ok()) return out.status();
    if (!held.ok()) return held.status();
    auto engine =
        std::make_unique<Forwarder>(*std::move(in), *std::move(out), state.version() == 1 ? 2 : 1);
    engine->held_ = *held;
    return engine;
  }

 private:
  ChannelReceiver<uint64_t> in_;
  ChannelSender<uint64_t> out_;
  std::optional<uint64_t> held_;
  uint32_t version_;
};

struct RunResult {
  double items_per_s = 0;
  std::vector<double> pauses_us;
  std::vector<double> replace_calls_us;
  bool ordered = true;
};

RunResult RunChain(int threads, double seconds, int swaps) {
  auto runtime = Runtime::Create({.threads = threads});
  if (!runtime.ok()) {
    std::fprintf(stderr, "%s\n", runtime.status().ToString().c_str());
    std::exit(1);
  }
  auto c0 = MakeChannel<uint64_t>(1024);
  auto c1 = MakeChannel<uint64_t>(1024);
  auto c2 = MakeChannel<uint64_t>(1024);
  auto a = (*runtime)->Attach(
      std::make_unique<Forwarder>(std::move(c0->second), std::move(c1->first), 1), 0);
  auto b = (*runtime)->Attach(
      std::make_unique<Forwarder>(std::move(c1->second), std::move(c2->first), 1), threads - 1);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> consumed{0};
  RunResult result;

  std::thread producer([&, tx = std::move(c0->first)]() mutable {
    Doorbell::Ptr bell = Doorbell::Acquire();
    tx.BindDoorbell(bell.get());
    for (uint64_t seq = 0; !stop.load(std::memory_order_relaxed); ++seq) {
      while (!tx.TryPush(uint64_t{seq})) {
        bell->Wait([&] { return !tx.FullApprox() || stop.load(); }, absl::Milliseconds(100));
        if (stop.load()) return;
      }
    }
  });
  std::thread consumer([&, rx = std::move(c2->second)]() mutable {
    Doorbell::Ptr bell = Doorbell::Acquire();
    rx.BindDoorbell(bell.get());
    uint64_t expected = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      std::optional<uint64_t> item = rx.TryPop();
      if (!item.has_value()) {
        bell->Wait([&] { return !rx.EmptyApprox() || stop.load(); }, absl::Milliseconds(100));
        continue;
      }
      if (*item != expected) result.ordered = false;
      consumed.store(++expected, std::memory_order_relaxed);
    }
  });

  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // warm up
  const uint64_t start_count = consumed.load();
  const auto start = Clock::now();
  for (int i = 0; i < swaps; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(500));
    const auto call = Clock::now();
    auto pause = (*runtime)->Replace(i % 2 == 0 ? *a : *b, &Forwarder::Restore);
    result.replace_calls_us.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - call).count());
    if (!pause.ok()) {
      std::fprintf(stderr, "%s\n", pause.status().ToString().c_str());
      std::exit(1);
    }
    result.pauses_us.push_back(absl::ToDoubleMicroseconds(*pause));
  }
  const auto elapsed_target = std::chrono::duration<double>(seconds);
  while (Clock::now() - start < elapsed_target) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  result.items_per_s = static_cast<double>(consumed.load() - start_count) / elapsed;
  stop = true;
  producer.join();
  consumer.join();
  return result;
}

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(q * values.size()))];
}

}  // namespace
}  // namespace plexus::transport

int main(int argc, char** argv) {
  using namespace plexus::transport;
  int runs = 5;
  double seconds = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--runs") == 0) runs = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::max(0.1, std::atof(argv[i + 1]));
  }
  for (int threads : {1, 2}) {
    std::vector<double> rates;
    for (int r = 0; r < runs; ++r) rates.push_back(RunChain(threads, seconds, 0).items_per_s);
    std::printf(
        "{\"test\":\"runtime_chain\",\"engines\":2,\"runtime_threads\":%d,\"runs\":%d,"
        "\"items_per_s_median\":%.0f,\"items_per_s_min\":%.0f,\"items_per_s_max\":%.0f}\n",
        threads, runs, Percentile(rates, 0.5), Percentile(rates, 0), Percentile(rates, 0.999));
    std::fflush(stdout);
  }
  for (int threads : {1, 2}) {
    std::vector<double> pauses;
    std::vector<double> calls;
    std::vector<double> rates;
    bool ordered = true;
    for (int r = 0; r < runs; ++r) {
      RunResult result = RunChain(threads, seconds, 200);
      pauses.insert(pauses.end(), result.pauses_us.begin(), result.pauses_us.end());
      calls.insert(calls.end(), result.replace_calls_us.begin(), result.replace_calls_us.end());
      rates.push_back(result.items_per_s);
      ordered = ordered && result.ordered;
    }
    std::printf(
        "{\"test\":\"runtime_swap\",\"runtime_threads\":%d,\"swaps\":%zu,\"pause_us_median\":%.2f,"
        "\"pause_us_p99\":%.2f,\"replace_call_us_median\":%.1f,\"replace_call_us_p99\":%.1f,"
        "\"items_per_s_median_while_swapping\":%.0f,\"in_order\":%s}\n",
        threads, pauses.size(), Percentile(pauses, 0.5), Percentile(pauses, 0.99),
        Percentile(calls, 0.5), Percentile(calls, 0.99), Percentile(rates, 0.5),
        ordered ? "true" : "false");
    std::fflush(stdout);
  }
  return 0;
}
