// Doorbells: futex sleep/wake with asymmetric fences (membarrier) so that wakers pay no fence.
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <mutex>

#include "futex.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/transport/runtime.hpp"

namespace plexus::transport {
namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "futex needs a plain 32-bit word");

uint32_t* Word(std::atomic<uint32_t>* word) { return reinterpret_cast<uint32_t*>(word); }

bool RegisterMembarrier() {
  const long supported = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (supported < 0 || (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}

// The sleeper's side of the barrier pair: orders its "sleeping" store before its re-check of
// every wake condition, and (asymmetric mode) also every waker's publish before its state read.
void SleeperFence() {
  if (internal::asymmetric_fences.load(std::memory_order_relaxed)) {
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) return;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace

// Doorbells are recycled, never freed: see the class comment.
class DoorbellPool {
 public:
  static DoorbellPool& Get() {
    static DoorbellPool* pool = new DoorbellPool();  // never destroyed, like its doorbells
    return *pool;
  }

  Doorbell* Acquire() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_ == nullptr) return new Doorbell();
    Doorbell* bell = free_;
    free_ = bell->next_free_;
    bell->next_free_ = nullptr;
    bell->state_.store(Doorbell::kAwake, std::memory_order_relaxed);
    return bell;
  }

  void Release(Doorbell* bell) {
    std::lock_guard<std::mutex> lock(mu_);
    bell->next_free_ = free_;
    free_ = bell;
  }

 private:
  DoorbellPool() {
    if (RegisterMembarrier()) internal::asymmetric_fences.store(true, std::memory_order_seq_cst);
  }

  std::mutex mu_;
  Doorbell* free_ = nullptr;
};

void Doorbell::Releaser::operator()(Doorbell* bell) const noexcept {
  if (bell != nullptr) DoorbellPool::Get().Release(bell);
}

Doorbell::Ptr Doorbell::Acquire() { return Ptr(DoorbellPool::Get().Acquire()); }

void Doorbell::RingSlow() noexcept {
  if (state_.exchange(kAwake, std::memory_order_acq_rel) == kSleeping) {
    internal::FutexWake(Word(&state_), /*shared=*/false, 1);
  }
}

void Doorbell::PrepareSleep() noexcept {
  state_.store(kSleeping, std::memory_order_seq_cst);
  SleeperFence();
}

void Doorbell::Sleep(absl::Duration timeout) noexcept {
  if (timeout == absl::InfiniteDuration()) {
    while (state_.load(std::memory_order_acquire) == kSleeping) {
      internal::FutexWait(Word(&state_), kSleeping, /*shared=*/false, absl::InfiniteDuration());
    }
  } else {
    const auto deadline = std::chrono::steady_clock::now() +
                          absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration()));
    while (state_.load(std::memory_order_acquire) == kSleeping) {
      const auto left = deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::nanoseconds::zero()) break;
      internal::FutexWait(
          Word(&state_), kSleeping, /*shared=*/false,
          absl::FromChrono(std::chrono::duration_cast<std::chrono::nanoseconds>(left)));
    }
  }
  state_.store(kAwake, std::memory_order_relaxed);
}

bool Doorbell::Wait(absl::FunctionRef<bool()> ready, absl::Duration timeout, absl::Duration spin) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const bool finite = timeout != absl::InfiniteDuration();
  const auto deadline =
      finite ? start + absl::ToChronoNanoseconds(timeout) : Clock::time_point::max();
  // Spin, then sleep on the futex: no yielding phase (the waker rings).
  const base::WaitPolicy wait(spin, spin);
  for (;;) {
    if (ready()) return true;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    if (wait.At(absl::FromChrono(now - start)) == base::WaitPolicy::Phase::kSpin) {
      base::WaitPolicy::CpuRelax();
      continue;
    }
    PrepareSleep();
    if (ready()) {
      CancelSleep();
      return true;
    }
    Sleep(finite ? absl::FromChrono(deadline - now) : absl::InfiniteDuration());
  }
}

}  // namespace plexus::transport
