#include "plexus/transport/completion.hpp"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "plexus/base/wait_policy.hpp"

namespace plexus::transport {
namespace {
// Set while this thread runs the driver on behalf of a Wait: its own pushes need no wake-up.
thread_local bool driving = false;
}  // namespace

void CompletionQueue::Push(Completion completion) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(std::move(completion));
    count_.fetch_add(1, std::memory_order_release);
  }
  // With a driver, Wait never sleeps on cv_ (it sleeps in the driver): skip the notify, and
  // wake the driver only when a waiter blocks in it.
  if (driver_ == nullptr) {
    cv_.notify_one();
  } else if (!driving && blocked_in_driver_.load(std::memory_order_acquire) > 0) {
    driver_->Wake();
  }
}

size_t CompletionQueue::size() const { return count_.load(std::memory_order_acquire); }

size_t CompletionQueue::Poll(absl::Span<Completion> out) {
  if (driver_ != nullptr && count_.load(std::memory_order_acquire) < out.size()) {
    const bool was_driving = driving;
    driving = true;
    driver_->Progress(absl::ZeroDuration());
    driving = was_driving;
  }
  return Take(out);
}

size_t CompletionQueue::Take(absl::Span<Completion> out) {
  if (out.empty() || count_.load(std::memory_order_acquire) == 0) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  while (n < out.size() && !items_.empty()) {
    out[n++] = std::move(items_.front());
    items_.pop_front();
  }
  count_.fetch_sub(n, std::memory_order_release);
  return n;
}

absl::StatusOr<Completion> CompletionQueue::Wait(absl::Duration timeout, absl::Duration spin) {
  const absl::Time start = absl::Now();
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : start + timeout;
  // Spin, then sleep: no yielding phase here (the sleep is in the driver or on cv_).
  const base::WaitPolicy wait(spin, spin);
  Completion c;
  // The first pass reuses `start`: one clock read less per Wait (most return on that pass).
  bool first_pass = true;
  for (;;) {
    const absl::Time now = first_pass ? start : absl::Now();
    first_pass = false;
    if (wait.At(now - start) == base::WaitPolicy::Phase::kSpin) {  // making progress each pass
      if (Poll({&c, 1}) == 1) return c;
      continue;
    }
    if (Take({&c, 1}) == 1) return c;
    if (now >= deadline) {
      if (Poll({&c, 1}) == 1) return c;  // Wait(0) still makes one pass
      break;
    }
    // Sleep. In caller mode the driver blocks in its own wait (epoll/futex), which returns at
    // once when bytes are already there; going there directly, without a non-blocking pass
    // first, saves a system call per message. In thread mode we sleep on the condition variable.
    const absl::Duration slice = std::min(deadline - now, absl::Milliseconds(50));
    if (driver_ != nullptr) {
      blocked_in_driver_.fetch_add(1, std::memory_order_acq_rel);
      if (count_.load(std::memory_order_acquire) == 0) {
        driving = true;
        driver_->Progress(slice);
        driving = false;
      }
      blocked_in_driver_.fetch_sub(1, std::memory_order_acq_rel);
      // What the driver just delivered is taken without another clock read (a completion that
      // is there is returned before the deadline is looked at, as on every pass).
      if (Take({&c, 1}) == 1) return c;
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, absl::ToChronoNanoseconds(slice), [&] { return !items_.empty(); });
    }
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no completion within ", absl::FormatDuration(timeout)));
}

}  // namespace plexus::transport
