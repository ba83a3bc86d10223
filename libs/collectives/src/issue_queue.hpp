// The order a communicator's calls run in (communicator.cpp): one at a time, in issue order, like
// the kernels of a CUDA stream. A blocking call runs in the caller's thread when nothing is
// queued before it; queued calls run on a worker thread started at the first need. The queue
// also holds the communicator's broken status: once set, every later call is refused with it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plexus/collectives/communicator.hpp"
#include "tracer.hpp"

namespace plexus::collectives::internal {

// The Work of a queued call (communicator.cpp).
class WorkImpl;
// A Work that has already finished with `status`.
std::shared_ptr<Work> FailedWork(absl::Status status);

class IssueQueue {
 public:
  using Fn = std::function<absl::Status()>;

  IssueQueue() = default;
  IssueQueue(const IssueQueue&) = delete;
  IssueQueue& operator=(const IssueQueue&) = delete;
  ~IssueQueue() { Stop(); }

  // Tracing: the queue records every call it runs (null: off).
  void set_tracer(Tracer* trace) { trace_ = trace; }
  // Lets the queued calls finish and joins the worker.
  void Stop();

  // Runs `task` in the caller's thread when nothing is queued or running, else queues it and
  // waits; its validation error when it is one.
  absl::Status Blocking(absl::StatusOr<Fn> task);
  // Queues `task` for the worker (a finished Work with the validation error when it is one).
  std::shared_ptr<Work> Async(absl::StatusOr<Fn> task);
  // Runs issue() and then fn() in the caller's thread when no call is queued or running (the
  // latency path: no closure, no thread hop); nullopt when it must queue. Traced calls take
  // Blocking's path, which records them (and also runs them in the caller's thread when nothing
  // is queued), so that this stays as small as without tracing (one test more; docs/collectives.md,
  // "Current figures", tracing cost).
  template <typename Issue, typename Body>
  std::optional<absl::Status> TryInline(Issue&& issue, Body&& fn) {
    if (trace_ != nullptr) return std::nullopt;
    std::unique_lock<std::mutex> lock(mu_);
    if (!queue_.empty() || busy_) return std::nullopt;
    if (!broken_.ok()) return broken_;
    busy_ = true;
    lock.unlock();
    absl::Status status = issue();
    if (status.ok()) status = fn();
    lock.lock();
    busy_ = false;
    const bool worker = worker_.joinable();
    lock.unlock();
    if (worker) cv_.notify_all();
    return status;
  }
  // Runs fn unless the communicator is broken; issued_ns: when tracing, the moment the caller
  // issued it (0: now).
  absl::Status RunOne(const Fn& fn, int64_t issued_ns = 0);

  // OK while usable; the error that broke the communicator otherwise.
  absl::Status broken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }
  // Breaks the communicator with `status`: unless it is broken already, or in any case with
  // `replace`.
  void Break(absl::Status status, bool replace = false) {
    std::lock_guard<std::mutex> lock(mu_);
    if (replace || broken_.ok()) broken_ = std::move(status);
  }

 private:
  struct Task {
    Fn run;
    std::shared_ptr<WorkImpl> work;
    int64_t issued_ns = 0;  // when tracing: the moment the caller issued it
  };
  void WorkerLoop();

  Tracer* trace_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread worker_;
  absl::Status broken_;  // guarded by mu_
};

}  // namespace plexus::collectives::internal
