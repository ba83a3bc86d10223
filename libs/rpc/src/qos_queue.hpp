// The global QoS reorder point of a Server: calls of every connection whose chain passed wait here
// for a handler slot, latency class first (QosPolicy classifies them). One scheduler thread hands
// them to their handlers. Bounded without a limit of its own: every queued call holds one of its
// connection's receive slots (the window), which is not reposted until its response left.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/time/time.h"
#include "plexus/rpc/policy.hpp"

namespace plexus::rpc::internal {

class QosQueue {
 public:
  struct Job {
    // Hands the call to its handler (on the scheduler thread); the call then holds a slot
    // until Done().
    std::function<void()> run;
    // The queue is stopping: fail the call (it never got a slot).
    std::function<void()> drop;
  };
  struct Stats {
    uint64_t latency = 0;  // calls dispatched from the latency queue
    uint64_t bulk = 0;     // from the bulk queue
    uint64_t aged = 0;     // bulk calls dispatched ahead of latency ones by aging (max_wait)
    uint64_t shared = 0;   // ... by the weighted share
    size_t queued = 0;     // waiting now
    size_t max_queued = 0;
    uint32_t running = 0;  // dispatched and not finished
  };

  QosQueue() = default;
  QosQueue(const QosQueue&) = delete;
  QosQueue& operator=(const QosQueue&) = delete;
  ~QosQueue() { Stop(); }

  // Queues a call of class `cls`; `schedule` (when given) becomes the queue's rule from now on.
  // Starts the scheduler thread on first use.
  void Push(QosClass cls, const QosSchedule* schedule, Job job);
  // True while calls wait or one is being handed over: a call that no engine classifies still
  // queues behind them (FIFO, as bulk), so that it overtakes nothing.
  bool Busy() const;
  // A dispatched call finished: its slot is free.
  void Done();
  // Drops the waiting calls (Job::drop) and joins the thread.
  void Stop();
  Stats stats() const;

 private:
  struct Entry {
    absl::Time queued;
    Job job;
  };
  void Run();
  // With mu_: the next call to dispatch (one queue is non-empty).
  Entry PopLocked();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> latency_, bulk_;
  QosSchedule schedule_;
  uint32_t streak_ = 0;     // latency calls dispatched in a row while bulk ones waited
  absl::Time bulk_served_;  // the last bulk dispatch, or when the bulk queue filled
  // Calls queued or being handed over: Busy() without the lock (every call of a server asks).
  std::atomic<size_t> pending_{0};
  bool stop_ = false;
  Stats stats_;
  std::thread thread_;
};

}  // namespace plexus::rpc::internal
