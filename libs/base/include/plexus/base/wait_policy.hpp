// How a thread waits for something another thread or process will do: spin first (lowest
// latency), then poll yielding the CPU between polls (a peer sharing the CPU gets to run), then
// sleep (a 2-core machine must not be burnt by busy loops). One policy for the transport's
// completion queue and the collectives' waits.
//
// On a contended CPU (more runnable threads than CPUs: other processes' builds, or a training
// loop's compute beside the waiting thread) yielding is the worst way to wait: each yield puts
// the thread behind every other runnable one, so what it waits for is seen a round of time
// slices late, while a sleeper woken by the producer is run sooner. Yield() finds that case
// (and remembers it for a moment) and callers then sleep until their next progress (see Yield).
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "absl/time/time.h"

namespace plexus::base {

class WaitPolicy {
 public:
  enum class Phase {
    kSpin,   // poll again at once
    kYield,  // poll again after Yield()
    kSleep,  // block (in the transport, on a futex or a condition variable) until woken
  };

  // Spin while idle < `spin`, yield while idle < max(spin, `sleep_after`), sleep from then on.
  // sleep_after == spin (or less): no yielding phase.
  WaitPolicy(absl::Duration spin, absl::Duration sleep_after)
      : spin_(std::max(spin, absl::ZeroDuration())), sleep_after_(std::max(spin_, sleep_after)) {}

  // The phase after `idle` without progress.
  Phase At(absl::Duration idle) const {
    return idle < spin_ ? Phase::kSpin : idle < sleep_after_ ? Phase::kYield : Phase::kSleep;
  }
  absl::Duration spin() const { return spin_; }
  absl::Duration sleep_after() const { return sleep_after_; }

  // A yield that kept the thread off the CPU at least this long found the CPU contended (an
  // uncontended sched_yield returns within microseconds; a peer rank sharing the CPU answers a
  // message in tens of microseconds).
  static constexpr absl::Duration kContendedYield = absl::Microseconds(200);
  // How long one such yield marks the process's CPUs as contended. Finding out costs a round of
  // other threads' time slices (~10 ms at a load of 12 on 2 CPUs), so it is not asked on every
  // wait. (100 ms instead: DDP at parity with gloo rather than ahead, docs/torch.md.)
  static constexpr absl::Duration kContendedFor = absl::Seconds(1);

  // On a contended CPU a waiter that can sleep polls this long without progress before it does:
  // the hops of a running exchange mostly complete within it, and each sleep costs a wake-up
  // (100-300 us on the 2-CPU VM under load).
  static constexpr absl::Duration kContendedPoll = absl::Microseconds(200);

  // Gives the CPU to another runnable thread, if any, unless the CPUs were found contended
  // within kContendedFor and the caller `can_sleep` (has a wait its producer wakes). Returns
  // true when they are contended (found then, or by this yield, which took kContendedYield or
  // more): a caller that can sleep should then sleep until its next progress rather than yield.
  // Measured (docs/torch.md): DDP on 2 ranks at a load of 12-14 on 2 CPUs lost ~20 ms per
  // iteration to yielding waiters.
  static bool Yield(bool can_sleep = true) {
    using Clock = std::chrono::steady_clock;
    const int64_t start = Clock::now().time_since_epoch().count();
    if (can_sleep && start < contended_until_.load(std::memory_order_relaxed)) return true;
    sched_yield();
    const int64_t end = Clock::now().time_since_epoch().count();
    if (end - start < Ticks(kContendedYield)) return false;
    contended_until_.store(end + Ticks(kContendedFor), std::memory_order_relaxed);
    return true;
  }

 private:
  static int64_t Ticks(absl::Duration d) {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
               absl::ToChronoNanoseconds(d))
        .count();
  }
  // steady_clock ticks until which Yield() reports contention without yielding (per process).
  static inline std::atomic<int64_t> contended_until_{0};

  absl::Duration spin_;
  absl::Duration sleep_after_;
};

}  // namespace plexus::base
