// The global QoS reorder points. QosOrder is their one ordering rule: two FIFOs, latency class
// first, a weighted share (latency_burst) and aging of the bulk class (max_wait); the Server's
// QosQueue (below) and the Channels' ClientQos (client_qos.hpp) both run it.
//
// QosQueue, a Server's reorder point: calls of every connection whose chain passed wait here for a
// handler slot, latency class first (QosPolicy classifies them). One scheduler thread hands them
// to their handlers. Bounded without a limit of its own: every queued call holds one of its
// connection's receive slots (the window), which is not reposted until its response left.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "plexus/rpc/policy.hpp"

namespace plexus::rpc::internal {

// Not thread-safe: its owner's lock guards it.
template <typename T>
class QosOrder {
 public:
  struct Counts {
    uint64_t latency = 0;  // items popped from the latency class
    uint64_t bulk = 0;     // from the bulk class
    uint64_t aged = 0;     // bulk items popped ahead of latency ones by aging (max_wait)
    uint64_t shared = 0;   // ... by the weighted share (latency_burst)
    size_t max_queued = 0;
  };

  // The rule from now on (each classified call brings its engine's current one).
  void set_schedule(const QosSchedule& s) { schedule_ = s; }
  const QosSchedule& schedule() const { return schedule_; }

  void Push(QosClass cls, T item, absl::Time now) {
    if (cls == QosClass::kBulk && bulk_.empty()) bulk_served_ = now;  // starts waiting now
    (cls == QosClass::kLatency ? latency_ : bulk_).push_back({now, cls, std::move(item)});
    counts_.max_queued = std::max(counts_.max_queued, size());
  }

  // The next item by the rule, among those `eligible(item)` accepts (a Channel's call whose
  // connection has no free slot waits; FIFO among the eligible ones of a class); nullopt when
  // none is.
  template <typename Eligible>
  std::optional<T> Pop(absl::Time now, Eligible&& eligible) {
    auto first = [&](std::deque<Entry>& q) {
      return std::find_if(q.begin(), q.end(), [&](const Entry& e) { return eligible(e.item); });
    };
    const auto l = first(latency_);
    const auto b = first(bulk_);
    if (l == latency_.end() && b == bulk_.end()) return std::nullopt;
    bool take_bulk = false;
    if (b != bulk_.end()) {
      if (l == latency_.end()) {
        take_bulk = true;
      } else if (now - bulk_served_ >= schedule_.max_wait) {
        take_bulk = true;
        ++counts_.aged;
      } else if (streak_ >= schedule_.latency_burst) {
        take_bulk = true;
        ++counts_.shared;
      }
    }
    T item;
    if (take_bulk) {
      streak_ = 0;
      bulk_served_ = now;
      ++counts_.bulk;
      item = std::move(b->item);
      bulk_.erase(b);
    } else {
      streak_ = bulk_.empty() ? 0 : streak_ + 1;
      ++counts_.latency;
      item = std::move(l->item);
      latency_.erase(l);
    }
    return item;
  }
  std::optional<T> Pop(absl::Time now) {
    return Pop(now, [](const T&) { return true; });
  }

  // Puts back an item Pop returned that could not leave after all (its slot was taken
  // meanwhile): first of its class again, uncounted.
  void Unpop(QosClass cls, T item, absl::Time queued) {
    if (cls == QosClass::kBulk) {
      --counts_.bulk;
      bulk_.push_front({queued, cls, std::move(item)});
    } else {
      --counts_.latency;
      latency_.push_front({queued, cls, std::move(item)});
    }
  }

  // Moves the items `remove(item)` accepts to `out` (cancelled, past their deadline).
  template <typename Remove>
  void Extract(Remove&& remove, std::vector<T>* out) {
    for (auto* q : {&latency_, &bulk_}) {
      for (auto it = q->begin(); it != q->end();) {
        if (remove(it->item)) {
          out->push_back(std::move(it->item));
          it = q->erase(it);
        } else {
          ++it;
        }
      }
    }
  }
  // Calls `fn(item)` for every queued item.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto* q : {&latency_, &bulk_}) {
      for (const Entry& e : *q) fn(e.item);
    }
  }

  size_t size() const { return latency_.size() + bulk_.size(); }
  bool empty() const { return latency_.empty() && bulk_.empty(); }
  const Counts& counts() const { return counts_; }

 private:
  struct Entry {
    absl::Time queued;
    QosClass cls;
    T item;
  };
  std::deque<Entry> latency_, bulk_;
  QosSchedule schedule_;
  uint32_t streak_ = 0;     // latency items popped in a row while bulk ones waited
  absl::Time bulk_served_;  // the last bulk pop, or when the bulk class filled
  Counts counts_;
};

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
  void Run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  QosOrder<Job> order_;
  uint32_t running_ = 0;  // dispatched and not finished
  // Calls queued or being handed over: Busy() without the lock (every call of a server asks).
  std::atomic<size_t> pending_{0};
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace plexus::rpc::internal
