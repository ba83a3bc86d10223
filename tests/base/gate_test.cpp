// base::Gate (passing without atomic read-modify-writes, closing with membarrier or with fencing
// passers) and base::ThreadCounter (a line per thread): the exclusion a closer relies on, under
// threads that pass all the time, nested entries past a thread's record, and exact counts with
// more threads than lines and with lines handed from exited threads to new ones.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "plexus/base/gate.hpp"
#include "plexus/base/thread_counter.hpp"

namespace pb = plexus::base;
using namespace std::chrono_literals;

namespace {

// Restores the process's mode when a section forced the fallback.
struct PassersFence {
  explicit PassersFence(bool fence) {
    if (fence) pb::Gate::ForcePassersFenceForTesting(true);
  }
  ~PassersFence() { pb::Gate::ForcePassersFenceForTesting(false); }
};

}  // namespace

TEST_CASE("gate: a closed gate refuses, an open one admits, Close waits for the one inside") {
  const bool fence = GENERATE(false, true);
  PassersFence mode(fence);
  INFO("passers fence: " << fence);
  // Without forcing, what the kernel allows (membarrier here; a refusal is printed).
  if (fence) CHECK(pb::Gate::PassersFence());
  if (!fence && pb::Gate::PassersFence()) WARN("the kernel refused membarrier: passers fence");
  pb::Gate gate;
  REQUIRE(gate.TryEnter());
  gate.Leave();
  gate.Close();
  CHECK_FALSE(gate.TryEnter());
  gate.Open();
  REQUIRE(gate.TryEnter());

  // This thread is inside: a closer on another thread must wait until it leaves; the closer
  // reopens once told to (Open is the closing thread's).
  std::atomic<bool> closed{false}, reopen{false};
  std::thread closer([&] {
    gate.Close();
    closed = true;
    while (!reopen.load()) std::this_thread::sleep_for(1ms);
    gate.Open();
  });
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(closed.load());
  gate.Leave();
  while (!closed.load()) std::this_thread::sleep_for(1ms);
  // Another thread waiting in Enter gets in once the closer reopens.
  auto entered = std::async(std::launch::async, [&] {
    gate.Enter();
    gate.Leave();
    return true;
  });
  CHECK(entered.wait_for(100ms) == std::future_status::timeout);
  reopen = true;
  closer.join();
  REQUIRE(entered.wait_for(10s) == std::future_status::ready);
  CHECK(entered.get());
}

TEST_CASE("gate: no passer ever sees the guarded value change while it is inside") {
  const bool fence = GENERATE(false, true);
  PassersFence mode(fence);
  INFO("passers fence: " << fence);
  pb::Gate gate;
  // Written only between Close and Open; read twice by every passer, which must see one value.
  std::atomic<uint64_t> guarded{0};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> torn{0}, passes{0};
  std::vector<std::thread> passers;
  for (int t = 0; t < 4; ++t) {
    passers.emplace_back([&, t] {
      // Thread 3 nests ten gates deep around its entry (past the record's depth): the overflow
      // entries must exclude the closer as well.
      std::vector<pb::Gate> outer(t == 3 ? 10 : 0);
      while (!stop.load(std::memory_order_relaxed)) {
        for (auto& g : outer) g.Enter();
        if (gate.TryEnter()) {
          const uint64_t a = guarded.load(std::memory_order_relaxed);
          for (int spin = 0; spin < 50; ++spin) std::atomic_signal_fence(std::memory_order_seq_cst);
          const uint64_t b = guarded.load(std::memory_order_relaxed);
          if (a != b) torn.fetch_add(1);
          gate.Leave();
          passes.fetch_add(1, std::memory_order_relaxed);
        }
        for (auto it = outer.rbegin(); it != outer.rend(); ++it) it->Leave();
      }
    });
  }
  const auto end = std::chrono::steady_clock::now() + 1s;
  int swaps = 0;
  while (std::chrono::steady_clock::now() < end) {
    gate.Close();
    guarded.store(guarded.load() + 1, std::memory_order_relaxed);
    gate.Open();
    ++swaps;
    std::this_thread::sleep_for(200us);
  }
  stop = true;
  for (auto& t : passers) t.join();
  INFO("swaps " << swaps << ", passes " << passes.load());
  CHECK(swaps > 100);
  CHECK(passes.load() > 1000);
  CHECK(torn.load() == 0);
}

TEST_CASE("thread counter: exact sums past 64 threads and across exited threads") {
  pb::ThreadCounter counter;
  constexpr int kAdds = 20000;
  // Two waves of 80 threads alive at once: the first 64 (at most) get lines, the rest share the
  // atomic; the second wave takes over the first wave's lines with their counts.
  for (int wave = 0; wave < 2; ++wave) {
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 80; ++t) {
      threads.emplace_back([&] {
        ready.fetch_add(1);
        while (ready.load() < 80) std::this_thread::yield();
        for (int i = 0; i < kAdds; ++i) counter.Add();
        counter.Add(3);
      });
    }
    for (auto& t : threads) t.join();
    CHECK(counter.Value() == static_cast<uint64_t>(wave + 1) * 80 * (kAdds + 3));
  }
}
