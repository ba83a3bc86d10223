#include "plexus/base/clock.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <thread>

namespace plexus::base::internal {
namespace {

TickSource Decide() {
  TickSource s;
#if defined(__x86_64__)
  // CPUID 0x80000007, EDX bit 8: the TSC runs at a constant rate in every power state (Intel and
  // AMD), so its ticks measure time.
  unsigned a, b, c, d;
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) == 0 || a < 0x80000007) return s;
  if (__get_cpuid(0x80000007, &a, &b, &c, &d) == 0 || (d & (1u << 8)) == 0) return s;
  // The counter's rate against CLOCK_MONOTONIC over at least 2 ms, each end bracketed by two
  // clock reads (a preemption between them would show as a wide bracket: taken again).
  auto sample = [](int64_t* ns, uint64_t* tsc) {
    for (int tries = 0;; ++tries) {
      const int64_t t0 = MonotonicNanos();
      const uint64_t x = __rdtsc();
      const int64_t t1 = MonotonicNanos();
      if (t1 - t0 < 2000 || tries == 20) {
        *ns = t0 + (t1 - t0) / 2;
        *tsc = x;
        return;
      }
    }
  };
  int64_t ns0, ns1;
  uint64_t tsc0, tsc1;
  sample(&ns0, &tsc0);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  sample(&ns1, &tsc1);
  if (ns1 <= ns0 || tsc1 <= tsc0) return s;
  const double rate = static_cast<double>(tsc1 - tsc0) * 1e9 / static_cast<double>(ns1 - ns0);
  if (!(rate > 1e8)) return s;  // under 100 MHz: not a counter worth trusting
  s.tsc = true;
  s.per_second = rate;
#endif
  return s;
}

}  // namespace

const TickSource& Ticks() {
  static const TickSource source = Decide();
  return source;
}

}  // namespace plexus::base::internal
