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

// Lines of per-thread tables: the first kThreadLines threads alive at once get one each.
inline constexpr int kThreadLines = 64;

namespace internal {
int AcquireThreadLine();
}  // namespace internal

// This thread's line: an index in [0, kThreadLines) that no other live thread holds, or
// kThreadLines when every line is taken. A line passes to a later thread after its owner exits;
// the owner's last writes happen before the next owner's first (the handover takes a mutex), so
// what a line indexes (a count, tokens) carries over to the next owner.
inline int ThisThreadLine() {
  thread_local int line = -1;
  if (line < 0) line = internal::AcquireThreadLine();
  return line;
}

class ThreadCounter {
 public:
  ThreadCounter();
  ThreadCounter(const ThreadCounter&) = delete;
  ThreadCounter& operator=(const ThreadCounter&) = delete;

  void Add(uint64_t n = 1) {
    const int i = ThisThreadLine();
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

  static constexpr int kLines = kThreadLines;

 private:
  struct alignas(64) Line {
    std::atomic<uint64_t> value{0};
  };
  std::unique_ptr<Line[]> lines_;
  std::atomic<uint64_t> shared_{0};
};

}  // namespace plexus::base
