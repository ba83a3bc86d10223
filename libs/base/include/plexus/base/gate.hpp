// Gate: what many threads pass on every operation and one thread rarely closes, to change what
// it guards with nobody inside (rpc's engine slots: a policy is swapped live under load).
//
// Passing costs no atomic read-modify-write and no fence: a thread announces that it is inside in
// a record of its own (a store to a cache line no other thread writes) and then reads whether the
// gate is closed. Closing pays for both sides: it sets the flag, makes every thread of the process
// execute a memory barrier (Linux membarrier, private expedited: an interrupt to the CPUs running
// the process's threads, about a microsecond), and then scans the threads' records; so either a
// passing thread sees the gate closed, or the closer sees it inside and waits for it. Where the
// kernel refuses membarrier, a passing thread fences instead (one atomic exchange).
//
// Usage: `gate.Enter(); ...; gate.Leave();` (or `if (gate.TryEnter())`), properly nested per
// thread; `gate.Close()` (waits until nobody is inside, new arrivals wait or fail), change the
// guarded state, `gate.Open()` on the same thread. A thread inside a gate must not close it, nor
// exit before leaving it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace plexus::base {

class Gate {
 public:
  Gate() = default;
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  ~Gate() = default;

  // Enters unless the gate is closed: true, and the thread is inside until its Leave(). False
  // when closed (the thread is not inside). Never blocks.
  bool TryEnter();
  // Enters, waiting while the gate is closed.
  void Enter();
  // Leaves the gate this thread entered last (entries nest, last in first out).
  void Leave();
  // Closes the gate and returns once no thread is inside it; threads arriving meanwhile fail
  // TryEnter or wait in Enter. Closers are serialised.
  void Close();
  // Reopens the gate and wakes the threads waiting in Enter; called by the thread that closed it.
  void Open();

  // Whether passing threads fence (the kernel refused membarrier) instead of the closer
  // interrupting them. Tests force it (true) to check the fallback, and give it back (false: what
  // the kernel allows); only while no gate is in use.
  static bool PassersFence();
  static void ForcePassersFenceForTesting(bool fence);

 private:
  // Whether any thread is inside (a record naming this gate, or an overflow entry).
  bool AnyoneInside() const;
  // Enter's wait while the gate is closed.
  [[gnu::noinline]] void EnterClosed();
  void WakeCloser();

  std::atomic<bool> closed_{false};
  // Entries of threads whose record was full (deeply nested gates): counted here, with a fence.
  std::atomic<int64_t> overflow_{0};
  std::mutex close_mu_;  // one closer at a time
  std::mutex mu_;
  std::condition_variable cv_;  // a closer waiting for the last one out; Enter waiting for Open
};

}  // namespace plexus::base
