// futex(2) on a 32-bit word. `shared`: the word may live in memory mapped by other processes
// (shm rings, doorbells, mailboxes); otherwise the cheaper process-private futex is used.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstdint>

#include "absl/time/time.h"

namespace plexus::transport::internal {

// Wakes up to `waiters` threads sleeping on `word`.
inline void FutexWake(uint32_t* word, bool shared, int waiters = INT_MAX) {
  ::syscall(SYS_futex, word, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, waiters, nullptr, nullptr,
            0);
}

// Sleeps while *word == expected, at most `max` (InfiniteDuration: no limit); wake-ups can be
// spurious.
inline void FutexWait(uint32_t* word, uint32_t expected, bool shared, absl::Duration max) {
  const int op = shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE;
  if (max == absl::InfiniteDuration()) {
    ::syscall(SYS_futex, word, op, expected, nullptr, nullptr, 0);
    return;
  }
  const timespec ts = absl::ToTimespec(max);
  ::syscall(SYS_futex, word, op, expected, &ts, nullptr, 0);
}

}  // namespace plexus::transport::internal
