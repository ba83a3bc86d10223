// How a thread waits for something another thread or process will do: spin first (lowest
// latency), then poll yielding the CPU between polls (a peer sharing the CPU gets to run), then
// sleep (a 2-core machine must not be burnt by busy loops). One policy for the transport's
// completion queue, progress runtime and doorbells, and the collectives' waits.
//
// On a contended CPU (more runnable threads than CPUs: other processes' builds, or a training
// loop's compute beside the waiting thread) yielding is the worst way to wait: each yield puts
// the thread behind every other runnable one, so what it waits for is seen a round of time
// slices late, while a sleeper woken by the producer is run sooner. Yield() finds that case
// (and remembers it for a moment) and callers then sleep until their next progress (see Yield).
//
// Sleep / SpinUntil / AwaitOthersProgress: the sleeping and spinning phases for waits that have
// no doorbell of their own (a progress engine's caller, a sender waiting for room).
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
#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>

#include "absl/functional/function_ref.h"
#include "absl/time/clock.h"
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
  // other threads' time slices (milliseconds on a loaded host), so it is not asked on every
  // wait; a shorter memory lost what the sleeping waits gain (docs/measurements/torch.md,
  // "Waiting under load").
  static constexpr absl::Duration kContendedFor = absl::Seconds(1);

  // On a contended CPU a waiter that can sleep polls this long without progress before it does:
  // the hops of a running exchange mostly complete within it, and each sleep costs a wake-up
  // (far longer than this on a loaded host; docs/measurements/torch.md, "Waiting under load").
  static constexpr absl::Duration kContendedPoll = absl::Microseconds(200);

  // Gives the CPU to another runnable thread, if any, unless the CPUs were found contended
  // within kContendedFor and the caller `can_sleep` (has a wait its producer wakes). Returns
  // true when they are contended (found then, or by this yield, which took kContendedYield or
  // more): a caller that can sleep should then sleep until its next progress rather than yield.
  // Yielding waiters on a contended CPU see their data a round of time slices late; DDP under
  // load lost much of an iteration to them (docs/measurements/torch.md, "Waiting under load").
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

  // The spinning phase's hint between two polls: lets the sibling hyper-thread (or the other
  // vCPU's host core) run, without giving up the CPU.
  static void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
  }

  // The spinning phase of a wait on something nothing signals: calls `done` until it returns
  // true (then true) or `until` has passed (then false), with CpuRelax() between calls.
  static bool SpinUntil(absl::Time until, absl::FunctionRef<bool()> done) {
    while (absl::Now() < until) {
      if (done()) return true;
      CpuRelax();
    }
    return false;
  }

  // Blocks the calling thread for `d` (returns at once when d <= 0): the sleeping phase of a
  // wait that has no doorbell or condition variable to sleep on.
  static void Sleep(absl::Duration d) {
    if (d > absl::ZeroDuration()) std::this_thread::sleep_for(absl::ToChronoNanoseconds(d));
  }

  // How long a caller of a progress engine that another thread is driving (the engine's lock is
  // taken) waits before it looks again: the CPU goes to that thread rather than to a second
  // poller competing with it, and the caller is back within a fraction of a message's round trip.
  static constexpr absl::Duration kOthersProgress = absl::Microseconds(50);
  // Sleeps kOthersProgress, at most `max_block` (nothing when max_block <= 0: the caller only
  // polls).
  static void AwaitOthersProgress(absl::Duration max_block) {
    Sleep(std::min(max_block, kOthersProgress));
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

// Something done only while it pays, learnt from its outcomes: it stays on while its tries pay,
// goes off after `misses_to_stop` tries in a row that did not, and is tried again on a probe every
// `probe_every` chances while off (a probe that pays turns it back on). What "pays" means is the
// caller's: AdaptiveSpin (below) and rpc's pipelined rounds (libs/rpc/src/conn.hpp). Not
// thread-safe: one per deciding thread (or per role held by one thread at a time).
class AdaptiveToggle {
 public:
  static constexpr uint32_t kMissesToStop = 8;
  static constexpr uint32_t kProbeEvery = 64;

  // `max_probe_every` > `probe_every`: each probe that misses doubles the chances to the next
  // probe, up to that many; a try that pays starts again from `probe_every`.
  explicit AdaptiveToggle(uint32_t misses_to_stop = kMissesToStop,
                          uint32_t probe_every = kProbeEvery, uint32_t max_probe_every = 0)
      : misses_to_stop_(std::max<uint32_t>(misses_to_stop, 1)),
        min_probe_every_(std::max<uint32_t>(probe_every, 1)),
        max_probe_every_(std::max(max_probe_every, min_probe_every_)),
        probe_every_(min_probe_every_) {}

  // Whether to do it this time (on, or a probe while off).
  bool Next() {
    if (on()) return true;
    if (++off_chances_ < probe_every_) return false;
    off_chances_ = 0;
    return true;
  }
  // A try that was done (Next() said so) paid or not. Chances not taken say nothing.
  void Record(bool paid) {
    if (paid) {
      misses_ = 0;
      probe_every_ = min_probe_every_;
    } else if (misses_ < misses_to_stop_) {
      ++misses_;
    } else {  // a probe that missed
      probe_every_ = std::min(probe_every_ * 2, max_probe_every_);
    }
  }
  bool on() const { return misses_ < misses_to_stop_; }
  // Chances from one probe to the next while off.
  uint32_t probe_every() const { return probe_every_; }

 private:
  uint32_t misses_to_stop_;
  uint32_t min_probe_every_;
  uint32_t max_probe_every_;
  uint32_t probe_every_;
  uint32_t misses_ = 0;
  uint32_t off_chances_ = 0;
};

// A spin phase that is kept only while it pays. A waiter whose event keeps coming after the spin
// window (typically: the peer that answers shares this CPU, and cannot run while we spin) stops
// spinning after kMissesToStop such waits, and spins again on a probe after kProbeEvery waits; a
// probe that catches its event turns spinning back on, one that misses doubles the waits to the
// next probe, up to kMaxProbeEvery (on one CPU every probe holds the CPU from the peer for the
// whole spin and costs a failed non-blocking read per pass). Not thread-safe: one per waiting
// thread (or per queue with one waiter at a time).
class AdaptiveSpin {
 public:
  static constexpr uint32_t kMissesToStop = AdaptiveToggle::kMissesToStop;
  static constexpr uint32_t kProbeEvery = AdaptiveToggle::kProbeEvery;
  // A probe that misses doubles the waits to the next one, up to this many: on one CPU each
  // probe blocks the peer for the whole spin.
  static constexpr uint32_t kMaxProbeEvery = 4096;

  explicit AdaptiveSpin(absl::Duration spin) : max_(std::max(spin, absl::ZeroDuration())) {}

  // The spin for the next wait.
  absl::Duration spin() { return toggle_.Next() ? max_ : absl::ZeroDuration(); }
  // A wait with spin `spun` (what spin() returned) that found its event after `waited` (waits
  // that timed out say nothing). Waits that did not spin say nothing either: a sleeper's wake-up
  // time is no measure of what spinning would have done.
  void Record(absl::Duration spun, absl::Duration waited) {
    if (spun <= absl::ZeroDuration()) return;
    toggle_.Record(waited <= spun);
  }
  bool spinning() const { return toggle_.on(); }
  // Waits from one probe to the next while spinning is off.
  uint32_t probe_every() const { return toggle_.probe_every(); }

 private:
  absl::Duration max_;
  AdaptiveToggle toggle_{kMissesToStop, kProbeEvery, kMaxProbeEvery};
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
