// How a thread waits for something another thread or process will do: spin first (lowest
// latency), then poll yielding the CPU between polls (a peer sharing the CPU gets to run), then
// sleep (a 2-core machine must not be burnt by busy loops). One policy for the transport's
// completion queue, progress runtime and doorbells, and the collectives' waits.
//
// PollUntil: a bounded poll of a condition nothing signals (a store key, a peer's count), at a
// fixed interval.
//
// Backoff: the delays between retries of something that fails for a while (a server not yet
// listening, a key not yet written, a replica down), doubling up to a cap, bounded by a deadline.
// One schedule for the bootstrap stores' connects and polls and rpc's reconnects.
#pragma once

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <random>

#include "absl/functional/function_ref.h"
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

  // Gives the CPU to another runnable thread, if any.
  static void Yield() { sched_yield(); }

  // The spinning phase's hint between two polls: lets the sibling hyper-thread (or the other
  // vCPU's host core) run, without giving up the CPU.
  static void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
  }

 private:
  absl::Duration spin_;
  absl::Duration sleep_after_;
};

class Backoff {
 public:
  // Delays start at `initial` and double up to `max`; each one handed out gets up to `jitter`
  // more, at random, so that many processes retrying together (ranks dialing rank 0) spread out.
  Backoff(absl::Duration initial, absl::Duration max, absl::Duration jitter = absl::ZeroDuration());

  // The delay the next retry waits (without jitter); does not advance the schedule.
  absl::Duration delay() const { return delay_; }
  // The delay before the next retry (delay() plus jitter); later calls return longer ones.
  absl::Duration Next();
  // Back to `initial` (the thing retried succeeded).
  void Reset() { delay_ = initial_; }
  // Sleeps Next(), cut short at `deadline`. False, without sleeping, once `deadline` has passed:
  // the caller gives up (typically with DeadlineExceeded naming what it waited for).
  bool SleepBefore(absl::Time deadline);

 private:
  absl::Duration initial_;
  absl::Duration max_;
  absl::Duration jitter_;
  absl::Duration delay_;
  std::minstd_rand rng_;
};

// Calls `done` until it returns true or `deadline` has passed, sleeping `interval` between calls
// (cut at the deadline); `done` runs at least once. Whether it returned true. A `done` that meets
// an error records it, returns true, and the caller looks at the error first.
bool PollUntil(absl::Time deadline, absl::Duration interval, absl::FunctionRef<bool()> done);

}  // namespace plexus::base
