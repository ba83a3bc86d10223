// How a thread waits for something another thread or process will do: spin first (lowest
// latency), then poll yielding the CPU between polls (a peer sharing the CPU gets to run), then
// sleep (a 2-core machine must not be burnt by busy loops). One policy for the transport's
// completion queue and the collectives' waits.
#pragma once

#include <sched.h>

#include <algorithm>

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

 private:
  absl::Duration spin_;
  absl::Duration sleep_after_;
};

}  // namespace plexus::base
