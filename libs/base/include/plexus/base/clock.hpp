// The wall clock on per-call paths: absl::Now()'s time (CLOCK_REALTIME) read with one vDSO
// clock_gettime. absl::Now() also maintains its own calibration against the cycle counter, which
// makes each read about twice as expensive on a virtual machine; code that stamps every call
// (rpc's call start, a rate limiter) reads this instead. Comparable with absl::Now().
#pragma once

#include <time.h>

#include "absl/time/time.h"

namespace plexus::base {

inline absl::Time WallNow() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return absl::TimeFromTimespec(ts);
}

}  // namespace plexus::base
