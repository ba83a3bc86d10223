// Clocks read on per-call paths.
#pragma once

#include <time.h>

#include <cstdint>

#include "absl/time/time.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace plexus::base {

// The wall clock: absl::Now()'s time (CLOCK_REALTIME) read with one vDSO clock_gettime.
// absl::Now() also maintains its own calibration against the cycle counter, which makes each read
// about twice as expensive on a virtual machine; code that stamps every call (rpc's call start)
// reads this instead. Comparable with absl::Now().
inline absl::Time WallNow() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return absl::TimeFromTimespec(ts);
}

// A monotonic count of ticks for arithmetic on intervals that runs on every call (a rate limiter's
// refill): the CPU's invariant time-stamp counter where it has one (x86-64 with an invariant TSC:
// one instruction, about a third of a clock_gettime on a virtual machine), else CLOCK_MONOTONIC in
// nanoseconds. Ticks mean nothing outside the process and are not a time of day; a difference of
// two divided by TicksPerSecond() is seconds. Reads on different CPUs may disagree by a few ticks:
// callers keep their own maximum where that matters.
namespace internal {
struct TickSource {
  bool tsc = false;
  double per_second = 1e9;
};
// Decided once (on first use: a TSC is measured against CLOCK_MONOTONIC for about 2 ms).
const TickSource& Ticks();
inline int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}
}  // namespace internal

inline int64_t TickNow() {
#if defined(__x86_64__)
  if (internal::Ticks().tsc) return static_cast<int64_t>(__rdtsc());
#endif
  return internal::MonotonicNanos();
}

inline double TicksPerSecond() { return internal::Ticks().per_second; }

}  // namespace plexus::base
