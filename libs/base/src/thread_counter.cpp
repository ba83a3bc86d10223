#include "plexus/base/thread_counter.hpp"

#include <mutex>
#include <vector>

namespace plexus::base {
namespace {

// The line indexes of the live threads that hold one. A line is written by one thread at a time:
// an exiting thread's last addition happens before its release (the mutex), which happens before
// the next owner's acquisition.
struct Indexes {
  std::mutex mu;
  std::vector<bool> taken = std::vector<bool>(kThreadLines, false);
};
// Never destroyed: threads may exit after static destruction began.
Indexes& Taken() {
  static Indexes* i = new Indexes;
  return *i;
}

struct Release {
  int index = kThreadLines;
  ~Release() {
    if (index >= kThreadLines) return;
    std::lock_guard<std::mutex> lock(Taken().mu);
    Taken().taken[static_cast<size_t>(index)] = false;
  }
};

}  // namespace

ThreadCounter::ThreadCounter() : lines_(new Line[kLines]) {}

int internal::AcquireThreadLine() {
  thread_local Release release;
  std::lock_guard<std::mutex> lock(Taken().mu);
  for (int i = 0; i < kThreadLines; ++i) {
    if (!Taken().taken[static_cast<size_t>(i)]) {
      Taken().taken[static_cast<size_t>(i)] = true;
      release.index = i;
      return i;
    }
  }
  return kThreadLines;
}

uint64_t ThreadCounter::Value() const {
  uint64_t sum = shared_.load(std::memory_order_relaxed);
  for (int i = 0; i < kLines; ++i) sum += lines_[i].value.load(std::memory_order_relaxed);
  return sum;
}

}  // namespace plexus::base
