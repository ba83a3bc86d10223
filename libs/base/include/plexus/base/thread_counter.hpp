// ThreadCounter: a count that many threads add to on every operation and few read (a policy's
// checked calls). Each thread adds to a cache line of its own with a plain load and store (no
// atomic read-modify-write, no line shared between the adding threads); Value() sums the lines.
// The first 64 threads of the process that add at the same time get a line each; more add to a
// shared atomic. A thread's line passes to a later thread after it exits, with its count.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace plexus::base {

class ThreadCounter {
 public:
  ThreadCounter();
  ThreadCounter(const ThreadCounter&) = delete;
  ThreadCounter& operator=(const ThreadCounter&) = delete;

  void Add(uint64_t n = 1) {
    const int i = ThisThreadIndex();
    if (i < kLines) {
      std::atomic<uint64_t>& v = lines_[i].value;
      v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    } else {
      shared_.fetch_add(n, std::memory_order_relaxed);
    }
  }
  // The sum of every thread's additions that happened before the call (relaxed: a count being
  // added concurrently may or may not be included).
  uint64_t Value() const;

  static constexpr int kLines = 64;

 private:
  // This thread's line, or kLines when every line is taken.
  static int ThisThreadIndex() {
    thread_local int index = -1;
    if (index < 0) index = AcquireIndex();
    return index;
  }
  static int AcquireIndex();

  struct alignas(64) Line {
    std::atomic<uint64_t> value{0};
  };
  std::unique_ptr<Line[]> lines_;
  std::atomic<uint64_t> shared_{0};
};

}  // namespace plexus::base
