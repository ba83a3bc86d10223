// Backoff's schedule and PollUntil (WaitPolicy is header-only: it sits on hot polling paths).
#include "plexus/base/wait_policy.hpp"

#include <unistd.h>

#include "absl/time/clock.h"

namespace plexus::base {

Backoff::Backoff(absl::Duration initial, absl::Duration max, absl::Duration jitter)
    : initial_(std::max(initial, absl::ZeroDuration())),
      max_(std::max(max, initial_)),
      jitter_(std::max(jitter, absl::ZeroDuration())),
      delay_(initial_),
      // Seeded per process: ranks started together draw different jitter.
      rng_(static_cast<uint32_t>(getpid())) {}

absl::Duration Backoff::Next() {
  absl::Duration out = delay_;
  if (jitter_ > absl::ZeroDuration()) {
    const auto span = static_cast<uint64_t>(absl::ToInt64Nanoseconds(jitter_));
    if (span > 0) out += absl::Nanoseconds(static_cast<int64_t>(rng_() % span));
  }
  delay_ = std::min(delay_ * 2, max_);
  return out;
}

bool Backoff::SleepBefore(absl::Time deadline) {
  const absl::Time now = absl::Now();
  if (now >= deadline) return false;
  absl::SleepFor(std::min(Next(), deadline - now));
  return true;
}

bool PollUntil(absl::Time deadline, absl::Duration interval, absl::FunctionRef<bool()> done) {
  for (;;) {
    if (done()) return true;
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    absl::SleepFor(std::min(interval, deadline - now));
  }
}

}  // namespace plexus::base
