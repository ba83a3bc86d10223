#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "plexus/transport/runtime.hpp"
#include "plexus/transport/spsc_queue.hpp"

namespace plexus::transport {
namespace {

// Counts live instances, so that tests can see the queue destroys exactly what it holds.
struct Counted {
  static inline std::atomic<int> live{0};
  explicit Counted(int v) : value(v) { live.fetch_add(1); }
  Counted(Counted&& other) noexcept : value(other.value) { live.fetch_add(1); }
  Counted& operator=(Counted&&) = delete;
  ~Counted() { live.fetch_sub(1); }
  int value;
};

TEST_CASE("SpscQueue rounds its capacity up to a power of two") {
  CHECK(SpscQueue<int>(0).capacity() == 1);
  CHECK(SpscQueue<int>(1).capacity() == 1);
  CHECK(SpscQueue<int>(5).capacity() == 8);
  CHECK(SpscQueue<int>(64).capacity() == 64);
  CHECK(SpscQueue<int>(65).capacity() == 128);
}

TEST_CASE("SpscQueue reports full and empty and keeps FIFO order across wrap-around") {
  SpscQueue<std::unique_ptr<int>> queue(4);
  CHECK(queue.EmptyApprox());
  CHECK_FALSE(queue.TryPop().has_value());
  CHECK(queue.Front() == nullptr);

  int next_in = 0;
  int next_out = 0;
  // Uneven push/pop batches move the indices across the ring boundary many times.
  for (int round = 0; round < 200; ++round) {
    const int pushes = 1 + round % 4;
    for (int i = 0; i < pushes; ++i) {
      auto item = std::make_unique<int>(next_in);
      if (queue.TryPush(std::move(item))) {
        ++next_in;
      } else {
        // A failed push leaves the caller's item alone and means the queue is full.
        REQUIRE(item != nullptr);
        REQUIRE(*item == next_in);
        REQUIRE(queue.SizeApprox() == queue.capacity());
        REQUIRE(queue.FullApprox());
      }
    }
    const int pops = 1 + (round * 7) % 3;
    for (int i = 0; i < pops; ++i) {
      std::unique_ptr<int>* front = queue.Front();
      std::optional<std::unique_ptr<int>> item = queue.TryPop();
      if (!item.has_value()) {
        REQUIRE(front == nullptr);
        REQUIRE(queue.EmptyApprox());
        break;
      }
      REQUIRE(**item == next_out);
      ++next_out;
    }
  }
  while (auto item = queue.TryPop()) REQUIRE(**item == next_out++);
  CHECK(next_out == next_in);
  CHECK(next_in > 200);
}

TEST_CASE("SpscQueue destroys the items left in it, once") {
  Counted::live = 0;
  {
    SpscQueue<Counted> queue(8);
    for (int i = 0; i < 6; ++i) REQUIRE(queue.TryEmplace(i));
    REQUIRE(queue.TryPop()->value == 0);
    CHECK(Counted::live.load() == 5);
  }
  CHECK(Counted::live.load() == 0);
}

// Moves `count` items from one thread to another through a small queue; the consumer checks
// that it sees exactly 0, 1, 2, ... with nothing missing, repeated or reordered.
template <typename MakeItem, typename ValueOf>
void RunTwoThreads(size_t capacity, uint64_t count, MakeItem make, ValueOf value_of) {
  using T = decltype(make(uint64_t{0}));
  SpscQueue<T> queue(capacity);
  std::atomic<uint64_t> first_bad{UINT64_MAX};
  std::thread consumer([&] {
    uint64_t expected = 0;
    uint32_t misses = 0;
    while (expected < count) {
      std::optional<T> item = queue.TryPop();
      if (!item.has_value()) {
        // Shared 2-core machine: let the producer run instead of spinning against it.
        if (++misses % 64 == 0) std::this_thread::yield();
        continue;
      }
      if (value_of(*item) != expected) {
        first_bad = expected;
        return;
      }
      ++expected;
    }
  });
  uint32_t misses = 0;
  for (uint64_t i = 0; i < count && first_bad.load(std::memory_order_relaxed) == UINT64_MAX;) {
    T item = make(i);
    while (!queue.TryPush(std::move(item))) {
      if (first_bad.load(std::memory_order_relaxed) != UINT64_MAX) break;
      if (++misses % 64 == 0) std::this_thread::yield();
    }
    ++i;
  }
  consumer.join();
  CHECK(first_bad.load() == UINT64_MAX);
  CHECK(queue.EmptyApprox());
}

TEST_CASE("SpscQueue moves two million integers between two threads in order") {
  RunTwoThreads(
      64, 2'000'000, [](uint64_t i) { return i; }, [](uint64_t v) { return v; });
}

TEST_CASE("SpscQueue moves move-only items between two threads in order") {
  RunTwoThreads(
      16, 200'000, [](uint64_t i) { return std::make_unique<uint64_t>(i); },
      [](const std::unique_ptr<uint64_t>& p) { return *p; });
}

TEST_CASE("MakeChannel rejects a capacity of zero") {
  auto channel = MakeChannel<int>(0);
  REQUIRE_FALSE(channel.ok());
  CHECK(channel.status().code() == absl::StatusCode::kInvalidArgument);
  auto good = MakeChannel<int>(3);
  REQUIRE(good.ok());
  CHECK(good->first.capacity() == 4);
}

TEST_CASE("A doorbell wakes a thread sleeping on a channel push") {
  auto channel = MakeChannel<int>(4);
  REQUIRE(channel.ok());
  auto& [tx, rx] = *channel;
  Doorbell::Ptr bell = Doorbell::Acquire();
  rx.BindDoorbell(bell.get());
  std::atomic<bool> got{false};
  std::thread consumer([&, &rx = rx] {
    // No spin: the wait goes straight to sleep, so only the push's ring can end it early.
    if (bell->Wait([&] { return !rx.EmptyApprox(); }, absl::Seconds(10), absl::ZeroDuration())) {
      got = rx.TryPop() == std::optional<int>(42);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(tx.TryPush(42));
  consumer.join();
  CHECK(got.load());
  // Woken by the ring, not by the 10 s timeout.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK_FALSE(bell->Wait([] { return false; }, absl::Milliseconds(5)));
}

}  // namespace
}  // namespace plexus::transport
